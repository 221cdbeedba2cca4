"""--pod_security: every pod of a job (master, PS, workers) is restricted unless the job says
``none``; the base images run as the same non-root user the pods are given."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("kubernetes")

from elasticdl.client.zoo_dockerfile import RUN_AS_USER as ZOO_USER  # noqa: E402
from elasticdl.common.job_spec import JobSpec  # noqa: E402
from elasticdl.common.spec_codec import SpecError  # noqa: E402
from elasticdl.k8s import security  # noqa: E402
from elasticdl.k8s.client import to_dict  # noqa: E402
from elasticdl.k8s.pods import PodTemplate, build_pod  # noqa: E402


def _pod(replica_type: str, template: PodTemplate, envs: dict[str, str] | None = None) -> dict:
    pod = build_pod(
        template,
        name=f"elasticdl-j-{replica_type}-0",
        job_name="j",
        replica_type=replica_type,
        replica_id=0,
        image="img",
        command=["python", "-m", "x"],
        env=envs,
    )
    return to_dict(pod)  # what the API server receives


@pytest.mark.parametrize("replica_type", ["master", "ps", "worker"])
def test_every_replica_pod_is_restricted_by_default(replica_type):
    job = JobSpec(job_name="j", volume="host_path=/data,mount_path=/data")
    pod = _pod(replica_type, PodTemplate.from_spec(job))
    spec = pod["spec"]
    assert spec["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 10001,
        "runAsGroup": 10001,
        "fsGroup": 10001,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    (container,) = spec["containers"]
    assert container["securityContext"] == {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
    }
    # The read-only root filesystem leaves /tmp (and HOME) writable on a pod-private emptyDir;
    # the job's own volumes stay as given.
    assert spec["volumes"] == [
        {"name": "volume-0", "hostPath": {"path": "/data"}},
        {"name": "tmp", "emptyDir": {}},
    ]
    assert container["volumeMounts"] == [
        {"name": "volume-0", "mountPath": "/data"},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    assert {"name": "HOME", "value": "/tmp"} in container["env"]


def test_a_jobs_own_tmp_volume_and_home_win():
    template = PodTemplate(volume="claim_name=scratch,mount_path=/tmp", envs={"HOME": "/data"})
    pod = _pod("worker", template)
    assert [v["name"] for v in pod["spec"]["volumes"]] == ["volume-0"]
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["HOME"] == "/data"


def test_none_leaves_the_images_defaults():
    job = JobSpec(job_name="j", pod_security="none")
    pod = _pod("worker", PodTemplate.from_spec(job))
    assert "securityContext" not in pod["spec"]
    assert "securityContext" not in pod["spec"]["containers"][0]
    assert "volumes" not in pod["spec"]
    assert "HOME" not in {e["name"] for e in pod["spec"]["containers"][0]["env"]}


def test_a_bad_mode_is_one_line_naming_the_flag():
    with pytest.raises(SpecError, match=r"^--pod_security 'privileged' is invalid; use one of"):
        JobSpec(job_name="j", pod_security="privileged")


def _repo_file(*parts: str) -> Path:
    for parent in Path(__file__).resolve().parents:
        if (parent / parts[0]).is_dir():
            return parent.joinpath(*parts)
    pytest.fail(f"{'/'.join(parts)} not found")


@pytest.mark.parametrize("dockerfile", ["Dockerfile.cpu", "Dockerfile.gpu"])
def test_the_base_images_run_as_the_pods_user(dockerfile):
    text = _repo_file("deploy", "docker", dockerfile).read_text()
    user = f"{security.RUN_AS_USER}:{security.RUN_AS_GROUP}"
    instructions = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("USER ")]
    assert instructions == [f"USER {user}"]
    assert f"elasticdl:x:{user}:" in text  # the passwd entry
    assert ZOO_USER == user  # zoo images switch back to it after installing as root
