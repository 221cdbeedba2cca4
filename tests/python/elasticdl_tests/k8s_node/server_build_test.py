"""The job server builds a package's image IN the cluster, on the REAL node, and runs the job:

1. the CPU base image (``base_image``, shared by the real-node tests) is pushed to the node's
   registry, where the server's builds take it from (``--build_base_image``);
2. ``elasticdl server --platform=kubernetes`` runs as a process here, with the node's admin
   kubeconfig, its state directory a hostPath volume of the build pods (``--state_volume``)
   and its ``data/`` the jobs' ``/data``;
3. alice uploads Fashion-MNIST shards and the ``mnist`` model zoo with the SDK
   (``JobServerClient``) and submits a job from the package: the job is Pending while the build
   pod (restricted, non-root, no service-account token) installs the requirements and pushes
   the image; the server is SIGKILLed mid-build and a new one on the same state directory
   carries on; the job runs in real containers from the built image and Succeeds; its log is
   read through ``GET /v1/jobs/{name}/logs``;
4. a package whose requirements cannot be installed: the job Fails with the pip error in its
   status; a job cancelled while building leaves no build pod.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from elasticdl.client.main import main
from elasticdl.data.datasets import prepare
from elasticdl.jobs.server_client import JobServerClient
from elasticdl_testing.server_process import ServerProcess
from elasticdl_tests.k8s_node.node import repo_root
from elasticdl_tests.k8s_node.server_jobs import server_job_spec
from elasticdl_tests.waiting import wait_for

TRAIN_RECORDS = 256
RECORDS_PER_SHARD = 128


@pytest.fixture(scope="module")
def registry_base(k8s_node, base_image) -> str:
    """The base image in the node's registry (the build pods run it and mount its layers)."""
    name, _ = base_image
    pushed = f"{k8s_node.registry}/elasticdl:cpu"
    k8s_node.docker("tag", name, pushed)
    k8s_node.docker("push", pushed, timeout=600)
    k8s_node.pull_everywhere(pushed)  # the other nodes' engines: now, not when a pod lands there
    return pushed


def _zoo(tmp_path: Path, requirements: str) -> Path:
    zoo = tmp_path / f"zoo-{uuid.uuid4().hex[:6]}"
    shutil.copytree(
        repo_root() / "model_zoo" / "mnist",
        zoo / "mnist",
        ignore=shutil.ignore_patterns("__pycache__", "BUILD", "*_test.py"),
    )
    (zoo / "requirements.txt").write_text(requirements)
    return zoo


def test_package_job_built_in_cluster_runs(
    k8s_node, registry_base, node_namespace, node_k8s, tmp_path, monkeypatch, capsys
):
    node, ns = k8s_node, node_namespace
    capsys.readouterr()
    assert main(["rbac", f"--namespace={ns}"]) == 0  # the masters' ServiceAccount
    rbac = tmp_path / "rbac.yaml"
    rbac.write_text(capsys.readouterr().out)
    node.kubectl("apply", "-f", str(rbac))

    state = tmp_path / "state"
    repository = f"{node.registry}/elasticdl-built-{ns}"
    flags = [
        "--platform=kubernetes",
        f"--namespace={ns}",
        f"--data_volume=host_path={state / 'data'},mount_path=/data",
        f"--build_base_image={registry_base}",
        f"--build_repository={repository}",
        f"--state_volume=host_path={state}",
        "--registry_insecure",
        "--build_host_network",
    ]
    env = {**os.environ, "KUBECONFIG": node.kubeconfig}
    server = ServerProcess(state, env, *flags)
    token = server.add_user("alice")
    server.start()
    try:
        client = JobServerClient(server.url, token)
        data = tmp_path / "fashion"
        prepare(
            "fashion_mnist",
            str(data),
            progress=False,
            limit=TRAIN_RECORDS,
            records_per_shard=RECORDS_PER_SHARD,
        )
        client.upload(str(data / "train"), "fashion/train")

        def diagnose() -> str:
            out = node.kubectl("get", "pods", "-n", ns, "-o", "wide", check=False)
            for pod in node.kubectl("get", "pods", "-n", ns, "-o", "name", check=False).split():
                out += f"\n--- {pod} ---\n"
                out += node.kubectl(
                    "logs", "-n", ns, pod, "--all-containers", "--tail=30", check=False
                )
            return out + server.log()[-3000:]

        # --- a job from a package: Pending while its image is built ----------------------
        job = f"built-{uuid.uuid4().hex[:4]}"
        zoo = _zoo(tmp_path, "numpy\n")  # in the base image already: pip installs nothing
        t0 = time.monotonic()
        status = client.submit_job(server_job_spec(job), package_dir=zoo)
        assert status.phase == "Pending" and "building image" in status.message, status
        build = f"elasticdl-{job}-build"
        pod = wait_for(lambda: node_k8s.get_pod(build), 30, "the build pod", diagnose)
        labels = pod.metadata.labels
        assert labels["elasticdl-owner"] == "alice" and labels["elasticdl-job-name"] == job
        assert pod.spec.automount_service_account_token is False
        assert pod.spec.security_context.run_as_user == 10001
        assert all(c.security_context.read_only_root_filesystem for c in pod.spec.containers)
        assert pod.spec.containers[0].image == registry_base

        # The server dies mid-build; its successor on the same state carries on.
        server.kill()
        server.start()
        client = JobServerClient(server.url, token)
        assert [s.job_name for s in client.list_jobs()] == [job]

        final = client.wait(job, timeout=600)
        job_s = time.monotonic() - t0
        assert final.phase == "Succeeded", f"{final.message}\n{diagnose()}"
        master = node_k8s.get_pod(f"elasticdl-{job}-master")
        image = master.spec.containers[0].image
        assert image.startswith(f"{repository}:pkg-"), image
        assert node_k8s.get_pod(build) is None  # the build pod went once the job was submitted
        repo_path = repository.split("/", 1)[1]
        with urllib.request.urlopen(f"http://{node.registry}/v2/{repo_path}/tags/list") as r:
            tags = json.load(r)["tags"]
        assert tags == [image.rsplit(":", 1)[1]]
        log = "".join(client.tail_logs(job))
        assert f"trained {TRAIN_RECORDS}/{TRAIN_RECORDS} records" in log, log[-3000:]
        # The build pod is gone, its log kept: both containers' (pip's, then the push).
        build_log = "".join(client.tail_logs(job, replica="build"))
        assert "+ " in build_log and f"pushed {image}@" in build_log, build_log[-3000:]
        # The dashboard's loss curve, from the status the master published on its pod.
        curves = client._json("GET", f"/v1/jobs/{job}/metrics")
        versions = [point["model_version"] for point in curves["loss"]]
        assert versions and versions == sorted(versions) and versions[-1] > 0, curves

        # --- the same package again: the image is reused, no build pod ---------------------
        again = f"{job}-2"
        status = client.submit_job(server_job_spec(again), package_dir=zoo)
        assert status.phase in ("Pending", "Running") and "building" not in status.message
        assert node_k8s.get_pod(f"elasticdl-{again}-build") is None
        client.stop_job(again)

        # --- a build that fails: the job Fails with pip's reason -----------------------------
        bad = f"bad-{uuid.uuid4().hex[:4]}"
        status = client.submit_job(
            server_job_spec(bad),
            package_dir=_zoo(tmp_path, "--no-index\nelasticdl-no-such-package==1.0\n"),
        )
        # Followed from the start: the pod's containers through the API, then the kept log.
        followed = "".join(client.tail_logs(bad, replica="build", follow=True))
        assert "elasticdl-no-such-package" in followed, followed[-3000:]
        failed = client.wait(bad, timeout=300)
        assert failed.phase == "Failed", failed
        assert "image build failed" in failed.message, failed.message
        assert "elasticdl-no-such-package" in failed.message, failed.message
        bad_log = "".join(client.tail_logs(bad, replica="build"))
        assert "elasticdl-no-such-package" in bad_log, bad_log[-3000:]
        # The server deletes the failed build's pod before it reports Failed; the API may
        # still show it while the kubelet confirms.
        assert node_k8s.wait_pod_gone(f"elasticdl-{bad}-build", 30), diagnose()

        # --- cancelled while building: the build pod goes with it ---------------------------
        gone = f"cancel-{uuid.uuid4().hex[:4]}"
        client.submit_job(server_job_spec(gone), package_dir=_zoo(tmp_path, "numpy\n# other\n"))
        wait_for(lambda: node_k8s.get_pod(f"elasticdl-{gone}-build"), 30, "the build pod", diagnose)
        assert client.stop_job(gone).phase == "Cancelled"
        wait_for(
            lambda: node_k8s.get_pod(f"elasticdl-{gone}-build") is None,
            60,
            "the cancelled build pod to go",
            diagnose,
        )
        assert gone not in [s.job_name for s in client.list_jobs()]
        print(f"package job: submit -> Succeeded {job_s:.1f} s (build, restart, run)")
    finally:
        server.stop()
        # The built images the kubelet pulled (their base layers stay: the base image's).
        for where, listed in node.docker_each(
            "images", "--format", "{{.Repository}}:{{.Tag}}", check=False
        ).items():
            for pulled in listed.split():
                if pulled.startswith(f"{repository}:"):
                    node.docker_on(where, "rmi", pulled, check=False)
