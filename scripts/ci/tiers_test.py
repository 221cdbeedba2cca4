from __future__ import annotations

from pathlib import Path

import pytest
import tiers


@pytest.mark.parametrize(
    "path, tier",
    [
        ("src/python/elasticdl/ps/checkpointer_test.py", "unit"),
        ("./model_zoo/mnist/mnist_functional_api_test.py", "unit"),
        ("benchmarks/ps/wire_test.py", "benchmarks"),
        ("tests/python/elasticdl_tests/k8s/server_test.py", "k8s"),
        ("tests/python/elasticdl_tests/k8s_node/job_test.py", "k8s-node"),
        ("tests/python/elasticdl_tests/bad_inputs/bad_inputs_test.py", "bad-inputs"),
        ("tests/python/elasticdl_tests/images/zoo_engine_test.py", "images"),
        ("tests/python/elasticdl_tests/images/gpu_image_test.py", "gpu-image"),
        ("scripts/ci/tiers_test.py", "unit"),
        ("docs/x_test.py", "docs"),
    ],
)
def test_tier_of(path, tier):
    assert tiers.tier_of(path) == tier


def _tree(root: Path, files: list[str]) -> Path:
    for f in files:
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        (root / f).write_text("")
    return root


def test_the_repository_tiers_come_from_its_test_files(tmp_path):
    root = _tree(
        tmp_path,
        [
            "src/python/elasticdl/data/recordio_test.py",
            "src/python/elasticdl/data/recordio.py",  # not a test
            "src/python/elasticdl/ops/test_ops.py",
            "tests/python/elasticdl_tests/k8s_node/job_test.py",
            "tests/python/elasticdl_tests/k8s_node/conftest.py",
            "tests/python/elasticdl_tests/images/gpu_image_test.py",
            "tests/python/elasticdl_tests/images/base_image_test.py",
            "src/python/elasticdl/__pycache__/stale_test.py",
        ],
    )
    assert tiers.all_tiers(root) == {
        "unit": [
            "src/python/elasticdl/data/recordio_test.py",
            "src/python/elasticdl/ops/test_ops.py",
        ],
        "images": ["tests/python/elasticdl_tests/images/base_image_test.py"],
        "gpu-image": ["tests/python/elasticdl_tests/images/gpu_image_test.py"],
        "k8s-node": ["tests/python/elasticdl_tests/k8s_node/job_test.py"],
    }


def test_exclude_specs_leave_a_tier_out_of_pants(tmp_path):
    known = tiers.all_tiers(
        _tree(
            tmp_path,
            [
                "src/python/elasticdl/data/recordio_test.py",
                "tests/python/elasticdl_tests/k8s_node/job_test.py",
                "tests/python/elasticdl_tests/bad_inputs/bad_inputs_test.py",
                "tests/python/elasticdl_tests/images/gpu_image_test.py",
            ],
        )
    )
    assert tiers.exclude_specs(tiers.parse_names("k8s-node, gpu-image bad-inputs"), known) == [
        "-tests/python/elasticdl_tests/k8s_node::",
        "-tests/python/elasticdl_tests/bad_inputs::",
        r"--filter-address-regex=-^(?:tests/python/elasticdl_tests/images/gpu_image_test\.py):",
    ]
    with pytest.raises(tiers.UnknownTier, match="unknown tier 'k8s_node'; the tiers are "):
        tiers.exclude_specs(["k8s_node"], known)


def test_the_command_line_prints_the_specs_and_refuses_unknown_tiers(tmp_path, capsys):
    root = _tree(tmp_path, ["tests/python/elasticdl_tests/images/gpu_image_test.py"])
    assert tiers.main(["exclude-specs", "gpu-image"], root) == 0
    assert capsys.readouterr().out == (
        r"--filter-address-regex=-^(?:tests/python/elasticdl_tests/images/gpu_image_test\.py):" "\n"
    )
    assert tiers.main(["exclude-specs", ""], root) == 0
    assert capsys.readouterr().out == "\n"
    assert tiers.main(["specs", "gpu-image"], root) == 0
    assert capsys.readouterr().out == "tests/python/elasticdl_tests/images/gpu_image_test.py\n"
    assert tiers.main(["exclude-specs", "gpus"], root) == 2
    assert "unknown tier 'gpus'" in capsys.readouterr().err
