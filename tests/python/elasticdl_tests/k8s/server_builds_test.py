"""The job server on Kubernetes against the real kube-apiserver, the server process under
deploy/k8s/server.yaml's Role: image builds (it creates the build pod with the server's
imagePullSecrets, keeps its log and submits the job) and the dashboard's curves of a job.

STAND-IN: nothing here runs the build pod's containers (the real node does that:
tests/python/elasticdl_tests/k8s_node/server_build_test.py). The test plays the kubelet for
the build pod: it writes the pod's log file where the server, run with the stand-in kubelet's
log reader (``server_main``, ``pod_log_files``), reads it, and reports the pod's phase through
``pods/status``, as a kubelet does.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from elasticdl.jobs.errors import ClientError, JobNotFoundError
from elasticdl.jobs.server_client import JobServerClient
from elasticdl.k8s.client import K8sClient
from elasticdl.k8s.image_build_pod import build_pod_name
from elasticdl.k8s.names import master_pod_name
from elasticdl_testing.server_process import ServerProcess
from elasticdl_tests.k8s import server_main
from elasticdl_tests.k8s.cluster import write_kubeconfig
from elasticdl_tests.k8s.server_test import _apply
from elasticdl_tests.k8s.service_accounts import service_account_token

BASE = "registry.test:5000/elasticdl:cpu"
REPOSITORY = "registry.test:5000/jobs"


@pytest.fixture
def builds(k8s_cluster, namespace, tmp_path):
    _apply(k8s_cluster.api_client(), namespace)
    kubeconfig = tmp_path / "kubeconfig"
    token = service_account_token(k8s_cluster.api_client(), namespace, "elasticdl-server")
    write_kubeconfig(kubeconfig, k8s_cluster.server, k8s_cluster.ca_file, token, namespace)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBE")}
    env["KUBECONFIG"] = str(kubeconfig)
    state = tmp_path / "state"
    server = ServerProcess(
        state,
        env,
        "--platform=kubernetes",
        f"--namespace={namespace}",
        "--data_volume=host_path=/srv/edl/data,mount_path=/data",
        f"--build_base_image={BASE}",
        f"--build_repository={REPOSITORY}",
        f"--state_volume=host_path={state}",
        "--image_pull_secrets=regcred",  # a registry that needs credentials to pull
        entry=server_main.entry(tmp_path / "pod-logs"),
    )
    server.tokens = {u: server.add_user(u) for u in ("alice", "bob")}
    server.start()
    server.pod_logs = tmp_path / "pod-logs" / namespace
    server.pod_logs.mkdir(parents=True)
    yield server
    server.stop()


def _zoo(tmp_path: Path, marker: str) -> Path:
    zoo = tmp_path / f"zoo-{marker}"
    (zoo / "mnist").mkdir(parents=True)
    (zoo / "mnist" / "model.py").write_text(f"# {marker}\ndef custom_model():\n    pass\n")
    (zoo / "requirements.txt").write_text("")
    return zoo


def _spec(job: str) -> dict:
    return {"job_name": job, "model_def": "mnist.model.custom_model", "training_data": "t"}


def _until(predicate, what: str, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    pytest.fail(f"timed out after {timeout}s waiting for {what}")


def _set_phase(admin: K8sClient, pod: str, phase: str, exit_code: int = 0) -> None:
    """What a kubelet reports (the init container ran; the container runs or ended)."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if phase == "Running":
        state = {"running": {"startedAt": now}}
    else:
        state = {"terminated": {"exitCode": exit_code, "reason": "Completed", "finishedAt": now}}
    done = {"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": now}}
    statuses = lambda name, s: [  # noqa: E731
        {"name": name, "state": s, "ready": False, "restartCount": 0, "image": BASE, "imageID": ""}
    ]
    admin.core.patch_namespaced_pod_status(
        pod,
        admin.namespace,
        {
            "status": {
                "phase": phase,
                "initContainerStatuses": statuses("install", done),
                "containerStatuses": statuses("push", state),
            }
        },
    )


def test_build_log_is_followed_then_kept(builds, k8s_cluster, namespace, tmp_path):
    alice = JobServerClient(builds.url, builds.tokens["alice"])
    bob = JobServerClient(builds.url, builds.tokens["bob"])
    admin = K8sClient(namespace, api_client=k8s_cluster.api_client())
    package = alice.upload_package(_zoo(tmp_path, "one"))
    status = alice.submit_job(_spec("blog"), package_id=package)
    assert status.phase == "Pending" and "building image" in status.message
    pod = build_pod_name("blog")
    build = _until(lambda: admin.get_pod(pod), "the build pod")
    assert [s.name for s in build.spec.image_pull_secrets] == ["regcred"]
    log_file = builds.pod_logs / f"{pod}.log"
    log_file.write_text("Collecting numpy\n")
    _set_phase(admin, pod, "Running")

    # Followed while the pod runs: the first line arrives before the build ends.
    followed: list[str] = []
    follower = threading.Thread(
        target=lambda: followed.extend(alice.tail_logs("blog", replica="build", follow=True)),
        daemon=True,
    )
    follower.start()
    _until(lambda: "Collecting numpy" in "".join(followed), "the followed first line")
    assert follower.is_alive()
    with open(log_file, "a") as f:
        f.write("pushed the image\n")
    _set_phase(admin, pod, "Succeeded")

    # The build pod goes, the job runs from the built image, the log stays.
    master = _until(lambda: admin.get_pod(master_pod_name("blog")), "the job's master pod")
    assert master.spec.containers[0].image.startswith(f"{REPOSITORY}:pkg-{package[:24]}")
    assert [s.name for s in master.spec.image_pull_secrets] == ["regcred"]
    assert '"image_pull_secrets":"regcred"' in " ".join(master.spec.containers[0].command)
    _until(lambda: admin.get_pod(pod) is None, "the build pod's deletion")
    follower.join(timeout=30)
    assert not follower.is_alive()
    full = "Collecting numpy\npushed the image\n"
    assert "".join(followed) == full
    assert "".join(alice.tail_logs("blog", replica="build")) == full
    assert "".join(alice.tail_logs("blog", replica="build", tail=1)) == "pushed the image\n"
    assert (builds.state_dir / "build-logs" / "alice" / "blog.log").read_text() == full
    with pytest.raises(JobNotFoundError):
        list(bob.tail_logs("blog", replica="build"))

    # The same package again: its image is reused, no build, so no build log.
    alice.submit_job(_spec("again"), package_id=package)
    assert admin.get_pod(build_pod_name("again")) is None
    with pytest.raises(JobNotFoundError, match="no image build log"):
        list(alice.tail_logs("again", replica="build"))

    # A failed build: its log is kept too, and the job's status tells its last lines.
    other = alice.upload_package(_zoo(tmp_path, "two"))
    alice.submit_job(_spec("bfail"), package_id=other)
    failing = build_pod_name("bfail")
    _until(lambda: admin.get_pod(failing), "the second build pod")
    (builds.pod_logs / f"{failing}.log").write_text(
        "Collecting nope==9\nERROR: No matching distribution found for nope==9\n"
    )
    _set_phase(admin, failing, "Failed", exit_code=1)
    failed = _until(
        lambda: (s := alice.get_job_status("bfail")).phase == "Failed" and s, "the failed build"
    )
    assert "No matching distribution found for nope==9" in failed.message
    _until(lambda: admin.get_pod(failing) is None, "the failed build pod's deletion")
    kept = "".join(alice.tail_logs("bfail", replica="build", follow=True))
    assert kept == "Collecting nope==9\nERROR: No matching distribution found for nope==9\n"

    # Cancel: the job and its kept build log go.
    alice.stop_job("blog")
    with pytest.raises(ClientError):
        list(alice.tail_logs("blog", replica="build"))
    assert not (builds.state_dir / "build-logs" / "alice" / "blog.log").exists()


def test_dashboard_curves_of_a_kubernetes_job(builds, k8s_cluster, namespace):
    """GET /v1/jobs/{name}/metrics (the dashboard's curves) of a job on Kubernetes: read from
    the status the master publishes on its pod, written here by the master's own code
    (StatusWriter -> KubernetesPlatform.publish_status) as the master would (the real master
    does it in e2e_test)."""
    from elasticdl.common.job_status import PUBLISHED_LOSS_SAMPLES, JobStatus
    from elasticdl.master.status_writer import LossHistory, StatusWriter
    from elasticdl.platform.kubernetes import KubernetesPlatform
    from elasticdl_testing.server_process import request

    alice = JobServerClient(builds.url, builds.tokens["alice"])
    spec = dict(_spec("curves"), model_zoo="/model_zoo")
    alice.submit_job(spec, image="local/elasticdl:test")
    status, body, _ = request(builds.port, "GET", "/v1/jobs/curves/metrics", builds.tokens["alice"])
    assert status == 200 and body["loss"] == [] and body["evaluation"] == []

    admin = K8sClient(namespace, api_client=k8s_cluster.api_client())
    platform = KubernetesPlatform("curves", admin, image="local/elasticdl:test")
    losses = LossHistory()
    for version in range(1, 1501):
        losses.add(version, 2.0 / version)
    evaluations = [{"model_version": v, "metrics": {"accuracy": v / 1500}} for v in (500, 1000)]

    def snapshot() -> JobStatus:
        return JobStatus(
            job_name="curves",
            platform="kubernetes",
            phase="Running",
            model_version=1500,
            loss_history=losses.samples(),
            evaluation_history=evaluations,
            evaluation_metrics=evaluations[-1]["metrics"],
        )

    try:
        StatusWriter(None, snapshot, publish=platform.publish_status).write()
    finally:
        platform.shutdown(delete_all=False)
    status, body, _ = request(builds.port, "GET", "/v1/jobs/curves/metrics", builds.tokens["alice"])
    assert status == 200 and body["model_version"] == 1500  # (its phase: its pod's, Pending)
    assert len(body["loss"]) == PUBLISHED_LOSS_SAMPLES
    versions = [point["model_version"] for point in body["loss"]]
    assert versions[0] == 1 and versions == sorted(versions) and versions[-1] > 1400
    assert body["evaluation"] == evaluations
    # Bob's token reaches none of it.
    assert request(builds.port, "GET", "/v1/jobs/curves/metrics", builds.tokens["bob"])[0] == 404
