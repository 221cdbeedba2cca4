"""A Kubernetes job from a given image runs the zoo where `elasticdl zoo build` put it: the SDK
never sends model_zoo, and the master refuses an empty one (seen on the real node)."""

from __future__ import annotations

from elasticdl.client.zoo_dockerfile import MODEL_ZOO_DIR
from elasticdl.jobs.job_request import JobRequest
from elasticdl.server.data_store import DataStore
from elasticdl.server.jobs import JobService, KubernetesTarget
from elasticdl.server.packages import PackageStore


def _values(tmp_path, spec: dict) -> dict:
    for d in ("packages", "tmp", "data", "sums", "jobs"):
        (tmp_path / d).mkdir()
    packages = PackageStore(tmp_path / "packages", tmp_path / "tmp", 1 << 20, 1 << 20, 100)
    data = DataStore(tmp_path / "data", tmp_path / "sums", tmp_path / "tmp", 1 << 20)
    target = KubernetesTarget("ns1", "", "host_path=/srv/data,mount_path=/data")
    service = JobService(tmp_path / "jobs", packages, data, "kubernetes", kubernetes=target)
    fields = {"job_name": "j1", "model_def": "mnist.model.custom_model", **spec}
    return service.placement.values("alice", JobRequest(spec=fields, image="r.io/z:1"))


def test_given_image_runs_the_zoo_where_zoo_build_puts_it(tmp_path):
    values = _values(tmp_path, {})
    assert values["model_zoo"] == MODEL_ZOO_DIR == "/model_zoo"
    assert values["image_name"] == "r.io/z:1"


def test_given_image_with_its_own_zoo_path(tmp_path):
    assert _values(tmp_path, {"model_zoo": "/opt/zoo"})["model_zoo"] == "/opt/zoo"
