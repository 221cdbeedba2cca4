import types

from elasticdl.k8s.node_fit import unfit_warnings


def _node(cpu, memory, unschedulable=False, **extra):
    return types.SimpleNamespace(
        spec=types.SimpleNamespace(unschedulable=unschedulable),
        status=types.SimpleNamespace(allocatable={"cpu": cpu, "memory": memory, **extra}),
    )


def test_warns_per_kind_no_schedulable_node_holds():
    nodes = [_node("3900m", "7Gi"), _node("2", "30Gi"), _node("64", "1Ti", unschedulable=True)]
    warnings = unfit_warnings(
        {"worker": "cpu=4,memory=1Gi", "ps": "cpu=1,memory=16Gi", "master": "cpu=0.1"}, nodes
    )
    assert len(warnings) == 1
    assert (
        "a worker's request (cpu=4,memory=1Gi; the most any node offers: cpu 3.9, memory 30Gi)"
        in (warnings[0])
    )
    assert "--worker_resource_request" in warnings[0]


def test_a_gpu_request_needs_a_node_offering_gpus():
    nodes = [_node("8", "32Gi"), _node("8", "32Gi", **{"nvidia.com/gpu": "1"})]
    assert unfit_warnings({"worker": "cpu=1,gpu=1"}, nodes) == []
    (warning,) = unfit_warnings({"worker": "cpu=1,gpu=2"}, nodes)
    assert "nvidia.com/gpu 1" in warning


def test_nothing_to_compare_with_says_nothing():
    assert unfit_warnings({"worker": "cpu=100"}, []) == []
    unknown = types.SimpleNamespace(spec=None, status=types.SimpleNamespace(allocatable=None))
    assert unfit_warnings({"worker": "cpu=100"}, [unknown]) == []
