"""A real job on the real cluster changes its PS count 1 -> 2 -> 1 through the client
(``elasticdl scale-ps --platform=kubernetes``): the request travels as an annotation on the
master pod (the client's user patches it), the master re-shards through the checkpoint
directory every PS pod mounts (a host path on the one machine both nodes run on), launches the
new PS pods in the default ``pod`` network mode with a Service per new PS id, deletes the
Service of the id the smaller set gives up, and the job Succeeds with every record trained
once. Not run by the helper that wrote it: the coordinator runs this tier."""

from __future__ import annotations

import json
import uuid

from elasticdl.client.main import main

# The job's fixtures and argv: the same job as job_test.py's.
from elasticdl_tests.k8s_node.job_test import (  # noqa: F401  (fixtures, used by name)
    TRAIN_RECORDS,
    _checkpoint_dir,
    _rbac,
    _train_argv,
    cli_env,
    data_dir,
    mnist_image,
)
from elasticdl_tests.waiting import wait_for

EPOCHS = 12  # enough work left after both changes


def test_a_job_on_the_cluster_scales_its_ps_up_and_down(
    k8s_node,
    cli_env,  # noqa: F811
    mnist_image,  # noqa: F811
    data_dir,  # noqa: F811
    node_namespace,
    node_k8s,
    monkeypatch,
    capsys,
    tmp_path,
):
    node, ns = k8s_node, node_namespace
    image, ctx, _ = mnist_image
    _rbac(node, ns, capsys)
    monkeypatch.chdir(ctx)
    checkpoints = _checkpoint_dir(tmp_path)
    job = f"psrescale-{uuid.uuid4().hex[:4]}"
    assert (
        main(_train_argv(job, ns, image, data_dir, EPOCHS, checkpoints)) == 0
    ), capsys.readouterr().err[-3000:]
    target = [f"--namespace={ns}", "--platform=kubernetes"]
    total = TRAIN_RECORDS * EPOCHS

    def diagnose() -> str:
        return (
            node.kubectl("get", "pods,services", "-n", ns, "-o", "wide", check=False)
            + "\n--- master ---\n"
            + node.kubectl("logs", "-n", ns, f"elasticdl-{job}-master", "--tail=80", check=False)
        )

    def status() -> dict:
        capsys.readouterr()
        assert main(["status", job, "-o", "json", *target]) == 0
        return json.loads(capsys.readouterr().out)

    def scale(num_ps: int, generation: int) -> dict:
        capsys.readouterr()
        code = main(["scale-ps", job, f"--num_ps={num_ps}", "--timeout=120", *target])
        said = capsys.readouterr().err
        assert code == 0 and f"-> {num_ps}" in said, (said, diagnose())

        def done():
            changes = status().get("ps_scaling", {}).get("changes", [])
            if len(changes) == generation and changes[-1]["state"] in ("done", "failed"):
                return changes[-1]
            return None

        change = wait_for(done, 400, f"the change to {num_ps} PS", diagnose)
        assert change["state"] == "done", (change, diagnose())
        now = status()
        assert now["phase"] == "Running" and now["records_trained"] < total, (
            "the job must outlive the change: raise EPOCHS",
            now["records_trained"],
        )
        return change

    wait_for(lambda: status()["records_trained"] >= 256, 400, "the job to train", diagnose)
    up = scale(2, generation=1)
    assert (up["from_ps"], up["to_ps"]) == (1, 2), up
    assert node_k8s.get_service(f"elasticdl-{job}-ps-1") is not None, diagnose()
    down = scale(1, generation=2)
    assert (down["from_ps"], down["to_ps"]) == (2, 1), down
    # Read while the job runs: once it has ended, its pods' containers may be gone.
    ps0_log = node_k8s.read_pod_log(f"elasticdl-{job}-ps-0") or ""
    assert f"restored version {down['version']}" in ps0_log, ps0_log[-2000:]
    wait_for(
        lambda: node_k8s.get_service(f"elasticdl-{job}-ps-1") is None,
        60,
        "the Service of ps-1 to go",
        diagnose,
    )
    assert main(["wait", job, "--timeout=900", *target]) == 0, diagnose()
    final = status()
    assert final["phase"] == "Succeeded", final
    assert final["records_trained"] == final["records_expected"] == total, final
    assert final["ps_scaling"]["num_ps"] == 1 and final["ps_scaling"]["generation"] == 2
    with capsys.disabled():
        for change in (up, down):
            print(
                f"\nPS {change['from_ps']} -> {change['to_ps']} on the cluster: paused "
                f"{change['pause_s']:.2f}s (drain {change['drain_s']:.2f}, snapshot "
                f"{change['snapshot_s']:.2f}, swap {change['swap_s']:.2f})"
            )
    assert main(["cancel", job, *target]) == 0
