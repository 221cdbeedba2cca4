"""The test control plane itself: an API server that exits during start-up (as it does, with a
klog fatal, when etcd is slow on a loaded machine) is started again, and the reason is shown."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest
from elasticdl_tests.k8s.cluster import (
    APISERVER_START_ATTEMPTS,
    ClusterError,
    LocalCluster,
    default_bin_dir,
    fatal_lines,
    missing_binaries,
)

FATAL = (
    "F1129 01:02:03.000004   77 controller.go:161] Unable to perform initial IP allocation check"
)


def _needs_binaries() -> None:
    missing = missing_binaries()
    if missing:
        message = f"Kubernetes test binaries missing in {default_bin_dir()}"
        if os.environ.get("ELASTICDL_REQUIRE_K8S"):
            pytest.fail(message + " (ELASTICDL_REQUIRE_K8S is set)", pytrace=False)
        pytest.skip(message)


def _bin_dir_whose_apiserver_fails(tmp_path: Path, failures: int) -> Path:
    """The real binaries, with kube-apiserver behind a script that first exits ``failures``
    times as the real one does on a klog fatal (the line, a goroutine dump, status 255)."""
    real = default_bin_dir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("etcd", "kube-controller-manager"):
        (bin_dir / name).symlink_to(real / name)
    count = tmp_path / "starts"
    script = bin_dir / "kube-apiserver"
    script.write_text(
        "#!/bin/sh\n"
        f'n=$(cat "{count}" 2>/dev/null || echo 0); n=$((n + 1)); echo "$n" > "{count}"\n'
        f'if [ "$n" -le {failures} ]; then\n'
        f'  echo "I1129 01:02:03.000001   77 server.go:1] starting"\n'
        f'  echo "{FATAL}"\n'
        '  i=0; while [ $i -lt 200 ]; do echo "goroutine $i [select]:"; i=$((i + 1)); done\n'
        "  exit 255\n"
        "fi\n"
        f'exec "{real / "kube-apiserver"}" "$@"\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return bin_dir


def test_fatal_lines_are_the_klog_fatal_ones():
    log = f"I1129 01:02:03.1 1 a.go:1] fine\nE1129 x\n{FATAL}\ngoroutine 1 [running]:\n"
    assert fatal_lines(log) == [FATAL]


def test_an_apiserver_that_exits_while_starting_is_started_again(tmp_path):
    _needs_binaries()
    bin_dir = _bin_dir_whose_apiserver_fails(tmp_path, failures=APISERVER_START_ATTEMPTS - 1)
    cluster = LocalCluster(state_dir=tmp_path / "state", bin_dir=bin_dir).start()
    try:
        from kubernetes import client

        namespaces = client.CoreV1Api(cluster.api_client()).list_namespace()
        assert "default" in {ns.metadata.name for ns in namespaces.items}
        assert (tmp_path / "starts").read_text().strip() == str(APISERVER_START_ATTEMPTS)
    finally:
        cluster.stop()


def test_an_apiserver_that_keeps_exiting_fails_with_its_fatal_line(tmp_path):
    _needs_binaries()
    bin_dir = _bin_dir_whose_apiserver_fails(tmp_path, failures=APISERVER_START_ATTEMPTS)
    cluster = LocalCluster(state_dir=tmp_path / "state", bin_dir=bin_dir)
    with pytest.raises(ClusterError) as raised:
        cluster.start(timeout=120)
    message = str(raised.value)
    assert "kube-apiserver exited with 255" in message
    assert FATAL in message and "goroutine" not in message
    assert (tmp_path / "starts").read_text().strip() == str(APISERVER_START_ATTEMPTS)
    assert cluster.pids == {}  # etcd stopped too
    shutil.rmtree(tmp_path / "state", ignore_errors=True)
