import pytest
from elasticdl.common.job_spec import spec_from_values
from elasticdl.k8s import priority_classes as pc


def _job(**values):
    spec, _ = spec_from_values(
        "train",
        {
            "job_name": "j",
            "image_name": "img",
            "platform": "kubernetes",
            "model_def": "m.f",
            "training_data": "/d",
            **values,
        },
    ).resolve(check_local_paths=False)
    return spec


def test_high_and_low_name_elasticdls_classes_other_names_pass_through():
    assert pc.class_name("high") == "elasticdl-high"
    assert pc.class_name(" low ") == "elasticdl-low"
    assert pc.class_name("team-batch") == "team-batch"
    assert pc.class_name("") == ""
    assert pc.worker_classes("") == set()
    assert pc.worker_classes("0.5") == {"elasticdl-high", "elasticdl-low"}
    assert pc.worker_classes("0") == {"elasticdl-low"}
    assert pc.worker_classes("1.0") == {"elasticdl-high"}


def test_defaults_only_where_both_classes_exist():
    job = _job(ps_pod_priority="team-ps")
    everything = lambda name: True  # noqa: E731
    resolved, notices = pc.resolve(job, everything)
    assert (resolved.master_pod_priority, resolved.ps_pod_priority) == ("high", "team-ps")
    assert resolved.worker_pod_priority == "low" and len(notices) == 1
    # Cannot tell (RBAC): unchanged, no error.
    assert pc.resolve(job, lambda name: None) == (job, [])
    # Only one of them: no defaults.
    only_high = lambda name: name != "elasticdl-low"  # noqa: E731
    assert pc.resolve(_job(), only_high) == (_job(), [])


def test_a_class_the_cluster_does_not_have_is_one_line():
    with pytest.raises(pc.MissingPriorityClass) as e:
        pc.resolve(_job(worker_pod_priority="0.5"), lambda name: name != "elasticdl-low")
    assert str(e.value).startswith("--worker_pod_priority=0.5: PriorityClass 'elasticdl-low'")
    assert "\n" not in str(e.value)
