"""Resource strings: accepted forms, canonical names (gpu -> nvidia.com/gpu), one-line errors."""

from decimal import Decimal

import pytest
from elasticdl.common.job_spec.resources import (
    ResourceError,
    check_limit_not_below_request,
    parse_quantity,
    parse_resource,
)


def test_full_string():
    assert parse_resource("cpu=250m,memory=32Mi,disk=64Mi,gpu=1,ephemeral-storage=32Mi") == {
        "cpu": "250m",
        "memory": "32Mi",
        "disk": "64Mi",
        "nvidia.com/gpu": "1",
        "ephemeral-storage": "32Mi",
    }


def test_spaces_are_tolerated():
    assert parse_resource("  cpu = 0.2 ,  memory=1024Mi , gpu=2 ") == {
        "cpu": "0.2",
        "memory": "1024Mi",
        "nvidia.com/gpu": "2",
    }


def test_empty_is_empty():
    assert parse_resource("") == {}
    assert parse_resource("   ") == {}


@pytest.mark.parametrize(
    "name", ["amd.com/gpu", "intel.com/gpu", "nvidia.com/tesla-p100", "nvidia.com/mig-1g.5gb"]
)
def test_vendor_and_model_gpus(name):
    assert parse_resource(f"cpu=1,{name}=2") == {"cpu": "1", name: "2"}


@pytest.mark.parametrize("cpu", ["1", "0.5", "250m", ".5", "2"])
def test_cpu_forms(cpu):
    assert parse_resource(f"cpu={cpu}")["cpu"] == cpu


@pytest.mark.parametrize(
    "bad, message",
    [
        ("gpu=0.1", "GPUs must be a whole number"),
        ("amd.com/gpu=1.5", "GPUs must be a whole number"),
        ("cpu=abc", "cpu=abc"),
        ("cpu=1c", "cpu=1c"),
        ("memory=1XB", "memory=1XB"),
        ("cpu=1,abc=2", "unknown resource 'abc'"),
        ("cpu=1,/gpu=1", "unknown resource '/gpu'"),
        ("cpu", "is not name=value"),
        ("cpu=", "has no value"),
        ("cpu=1,,memory=1Mi", "empty item"),
        ("cpu=1,cpu=2", "cpu is given twice"),
        ("gpu=1,nvidia.com/gpu=2", "nvidia.com/gpu is given twice"),
    ],
)
def test_errors(bad, message):
    with pytest.raises(ResourceError, match=message):
        parse_resource(bad)


def test_is_a_value_error():
    assert issubclass(ResourceError, ValueError)


def test_quantities():
    assert parse_quantity("250m") == Decimal("0.25")
    assert parse_quantity("1Gi") == 2**30
    assert parse_quantity("2M") == 2 * 10**6
    assert parse_quantity("0.5") == Decimal("0.5")


def test_limit_below_request():
    check_limit_not_below_request("cpu=1,memory=1Gi", "cpu=2,memory=2048Mi")
    with pytest.raises(ResourceError, match="memory limit 512Mi is below the request 1Gi"):
        check_limit_not_below_request("cpu=1,memory=1Gi", "memory=512Mi")
