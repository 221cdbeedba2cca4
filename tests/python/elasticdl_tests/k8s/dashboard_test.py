"""The job server's dashboard for a job on Kubernetes, as a person sees it in Debian's Chromium
(headless, through chromedriver; ``elasticdl_tests.dashboard.chromium``).

Real: the kube-apiserver and controller-manager, the job server (``--platform=kubernetes``,
under deploy/k8s/server.yaml's ServiceAccount and Role, with the token the controller-manager
mints), the client's REST calls, the master, PS and worker (TensorFlow, Fashion-MNIST records
uploaded through ``PUT /v1/data``), the browser. STAND-IN: the kubelet — ``process_kubelet``
runs the pods as local processes on 127.0.0.1 (the image is never pulled; the data volume is a
host path mounted at the same path, so the pods read what the server stored; pod logs are
files the server reads with the stand-in kubelet's log reader, ``server_main``; the master's process reaches the
API server with the admin kubeconfig, where a real pod would have its service account's token).

Two jobs: one that ends (its page once finished: curves, every replica ended) and one that
runs until cancelled from its page (running replicas, a worker killed and replaced, cancel).

What the page shows comes from the cluster: the jobs table and the phase from the master pod,
the curves from the status the master publishes on its pod (thinned, ``JobStatus.published``),
the replicas from that status and the job's pods. Cancel removes the job's pods, so the page
keeps showing the status ``DELETE`` answered (Cancelled) instead of "no job".

Skipped with the reason without the Kubernetes binaries (conftest) or Chromium (chromium.py),
unless ``ELASTICDL_REQUIRE_K8S`` / ``ELASTICDL_REQUIRE_CHROMIUM`` is set. One screenshot of the
job page is kept (see ``chromium.artifacts``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from elasticdl_testing.server_process import ServerProcess, request
from elasticdl_tests.dashboard.chromium import (  # noqa: F401 (fixtures)
    artifacts,
    browser,
    chromium,
    csp_violations,
    sign_in,
    text,
    texts,
    wait,
)
from elasticdl_tests.k8s import server_main
from elasticdl_tests.k8s.cluster import write_kubeconfig
from elasticdl_tests.k8s.server_test import _apply
from elasticdl_tests.k8s.service_accounts import service_account_token
from selenium.webdriver.common.by import By

pytest.importorskip("tensorflow")

SHORT = "k8s-dash-short"  # 8 epochs of 128 records, evaluated every 8 model versions
LONG = "k8s-dash-long"  # trains until cancelled from its page
MODEL_DEF = "mnist.mnist_functional_api.custom_model"
TRAIN_RECORDS = 128
# What the scheduler writes on a pod that fits no node.
WHY = {"reason": "Unschedulable", "message": "0/1 nodes are available: 1 Insufficient cpu."}
VALIDATION_RECORDS = 32


def _apply_rbac(api_client, namespace: str) -> None:
    """The server's ServiceAccount, Role and RoleBinding from deploy/k8s/server.yaml, moved to
    ``namespace``; not its Deployment, whose pod the process kubelet would run here."""
    _apply(api_client, namespace, kinds=("ServiceAccount", "Role", "RoleBinding"))


def _records(split: str, count: int) -> tuple[str, bytes]:
    """The first ``count`` records of the real Fashion-MNIST ``split`` as one RecordIO file
    (from the e2e tests' cache, prepared once per machine)."""
    import tempfile

    from elasticdl.data.datasets import prepare
    from elasticdl.data.recordio import Scanner, Writer

    source = Path.home() / ".cache" / "elasticdl" / "e2e" / "fashion_mnist"
    source = Path(os.environ.get("ELASTICDL_E2E_DATA") or source)
    prepare("fashion_mnist", str(source), progress=False)
    name = sorted(n for n in os.listdir(source / split) if n.endswith(".rio"))[0]
    scanner = Scanner(str(source / split / name), 0, count)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / name
        with Writer(str(out)) as writer:
            record = scanner.record()
            while record is not None:
                writer.write(record)
                record = scanner.record()
        scanner.close()
        return name, out.read_bytes()


@pytest.fixture
def server(k8s_cluster, served_namespace, kubelet, tmp_path, monkeypatch):
    """The job server on Kubernetes, its jobs' pods run by the process kubelet."""
    namespace = served_namespace
    _apply_rbac(k8s_cluster.api_client(), namespace)
    kubeconfig = tmp_path / "kubeconfig"
    token = service_account_token(k8s_cluster.api_client(), namespace, "elasticdl-server")
    write_kubeconfig(kubeconfig, k8s_cluster.server, k8s_cluster.ca_file, token, namespace)
    # The master pod's process inherits the test's environment (the stand-in kubelet's way):
    # it reaches the API server with the admin kubeconfig, where a real pod has its token.
    monkeypatch.setenv("KUBECONFIG", str(k8s_cluster.kubeconfig))
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBE")}
    env["KUBECONFIG"] = str(kubeconfig)
    state = tmp_path / "state"
    data = state / "data"  # the volume jobs mount: a host path at the same path in the pods
    server = ServerProcess(
        state,
        env,
        "--platform=kubernetes",
        f"--namespace={namespace}",
        f"--data_volume=host_path={data},mount_path={data}",
        entry=server_main.entry(kubelet.root),
    )
    server.token = server.add_user("alice")
    server.namespace = namespace
    server.start()
    try:
        yield server
    finally:
        for job in (SHORT, LONG):  # the jobs go on without the server: stop ours
            if request(server.port, "GET", f"/v1/jobs/{job}", server.token)[0] == 200:
                request(server.port, "DELETE", f"/v1/jobs/{job}", server.token)
        server.stop()


def _call(server, method: str, path: str, body=None, expect: int = 200):
    status, data, _ = request(server.port, method, path, server.token, body)
    assert status == expect, f"{method} {path}: {status} {data}"
    return data


def _row(driver, job: str) -> list[str]:
    return texts(driver, f'#jobs tr[data-job="{job}"] td')


def _replicas(driver, names=("master", "ps-0", "worker-0")) -> dict[str, list[str]]:
    """The replicas table: name -> [name, phase, restarts, exit code, reason, replaced by]."""
    rows = {}
    for name in names:
        cells = texts(driver, f'#replicas tr[data-replica="{name}"] td')
        if cells:
            rows[name] = cells
    return rows


def _summary(driver) -> dict[str, str]:
    """The job page's summary: label -> value."""
    return dict(zip(texts(driver, "#summary dt"), texts(driver, "#summary dd")))


def _points(driver, css: str) -> int:
    return len(driver.find_elements(By.CSS_SELECTOR, f"{css} circle.point"))


def _shown_accuracy(driver) -> float | None:
    """The accuracy in the job page's latest-evaluation table, None before there is one."""
    cells = driver.find_elements(By.CSS_SELECTOR, '#eval-latest tr[data-metric="accuracy"] td')
    return float(cells[0].text) if cells and cells[0].text else None


def _open(driver, job: str) -> None:
    driver.find_element(By.LINK_TEXT, "ElasticDL").click()
    wait(driver, f"a row for {job}", lambda d: _row(d, job))
    driver.find_element(By.LINK_TEXT, job).click()
    wait(driver, f"the page of {job}", lambda d: d.find_element(By.ID, "job-name").text == job)


def test_kubernetes_jobs_in_chromium(
    server, kubelet, browser, tmp_path, capsys  # noqa: F811 (the imported fixture)
):
    import mnist.mnist_functional_api
    from elasticdl.platform.local import pick_free_port

    started = time.monotonic()
    for split, count in (("train", TRAIN_RECORDS), ("test", VALIDATION_RECORDS)):
        name, payload = _records(split, count)
        _call(server, "PUT", f"/v1/data/fm/{split}/{name}", payload, expect=201)
    zoo = Path(mnist.mnist_functional_api.__file__).resolve().parent.parent
    for job, epochs in ((SHORT, 8), (LONG, 10_000)):
        spec = {
            "job_name": job,
            "model_def": MODEL_DEF,
            # The image holds the zoo at /model_zoo; the process kubelet runs no image: here.
            "model_zoo": str(zoo),
            "training_data": "fm/train",
            "validation_data": "fm/test",
            "minibatch_size": 16,
            "num_minibatches_per_task": 1,
            "num_epochs": epochs,
            "evaluation_steps": 8,
            "num_workers": 1,
            "num_ps_pods": 1,
            "image_pull_policy": "Never",
            # Every pod of the process kubelet is on this host's network: the job addresses
            # its pods by host ports, the master on one that is free.
            "envs": "ELASTICDL_K8S_NETWORK=host",
            "port": pick_free_port(),
        }
        body = {"command": "train", "spec": spec, "image": "local/elasticdl:test"}
        _call(server, "POST", "/v1/jobs", body, expect=201)

    # The jobs table: a row per job with its phase, from its master pod.
    sign_in(browser, server.url, server.token)
    for job in (SHORT, LONG):
        wait(browser, f"a row for {job}", lambda d: _row(d, job))
        cells = _row(browser, job)
        assert cells[0] == job and cells[1] in ("Pending", "Running", "Succeeded"), cells

    # The short job's page once it ended: the curves the master published on its pod, the
    # master pod among the replicas, the PS it deleted at the end shown deleted (not running).
    _open(browser, SHORT)
    wait(browser, f"{SHORT} to succeed", lambda d: text(d, "#phase") == "Succeeded", timeout=240)
    history = _call(server, "GET", f"/v1/jobs/{SHORT}/metrics")
    wait(browser, "a loss curve with points", lambda d: _points(d, "#loss-chart") > 2)
    assert _points(browser, "#loss-chart") == len(history["loss"]) == 64  # 8 epochs x 8 tasks
    accuracy = '#eval-chart g[data-series="accuracy"]'
    wait(browser, "an evaluation curve of accuracy", lambda d: _points(d, accuracy) > 1)
    assert _points(browser, accuracy) == len(history["evaluation"]) >= 2
    # The accuracy shown is the API's: the job's last evaluation, to the 4 decimals shown.
    expected = _call(server, "GET", f"/v1/jobs/{SHORT}")["evaluation_metrics"]["accuracy"]
    assert history["evaluation"][-1]["metrics"]["accuracy"] == expected
    wait(
        browser,
        f"the API's accuracy {expected:.4f} in the latest evaluation",
        lambda d: _shown_accuracy(d) == pytest.approx(expected, abs=5.01e-5),
    )
    # The master pod outlives the phase it sets by a moment: the page polls until it ended.
    wait(browser, "the master ended", lambda d: _replicas(d)["master"][1] == "Succeeded")
    replicas = _replicas(browser)
    assert replicas["master"][1:5] == ["Succeeded", "0", "0", "Completed"], replicas
    assert replicas["worker-0"][1:5] == ["Succeeded", "0", "0", "Completed"], replicas
    assert replicas["ps-0"][1:3] == ["Deleted", "0"], replicas
    wait(
        browser,
        "the master's log tail",
        lambda d: "trained 1024/1024 records" in d.find_element(By.ID, "log").text,
    )
    assert not browser.find_element(By.ID, "cancel").is_displayed()  # nothing left to cancel

    # The long job's page while it runs: master, PS and worker running, both curves growing.
    _open(browser, LONG)
    wait(
        browser,
        "master, ps-0 and worker-0 running",
        lambda d: {n: c[1:4] for n, c in _replicas(d).items()}
        == {n: ["Running", "0", ""] for n in ("master", "ps-0", "worker-0")},
        timeout=180,
    )
    assert text(browser, "#phase") == "Running"
    wait(browser, "a loss curve with points", lambda d: _points(d, "#loss-chart") > 2)
    wait(browser, "an evaluation curve of accuracy", lambda d: _points(d, accuracy) > 1)
    wait(
        browser,
        "the master's log tail",
        lambda d: "evaluation metrics" in d.find_element(By.ID, "log").text.lower(),
    )
    # The progress over all its epochs (the master counts records of the epochs so far).
    progress = text(browser, "#summary dd:nth-of-type(2)")
    assert progress.endswith("%") and int(progress[:-1]) < 5, progress
    # The log shows its end (the newest lines), as a person expects of a log tail.
    scrolled = (
        "const p = document.getElementById('log');"
        "return p.scrollHeight > p.clientHeight && p.scrollTop + p.clientHeight >= p.scrollHeight - 4;"
    )
    wait(browser, "the log tail scrolled to its end", lambda d: d.execute_script(scrolled), 3)
    # One entry per replica in the log's menu (the master is also a row of the replicas).
    assert texts(browser, "#log-replica option") == ["master", "ps-0", "worker-0"]

    # Its worker's process killed (as an OOM kill or a preempted container looks): the master
    # replaces it by a new worker, and the page tells the exit code, the reason and which.
    # The new worker first finds no room: it waits Pending, and the page says so with the
    # scheduler's reason. STAND-IN for the scheduler: the process kubelet leaves the pod
    # unbound and the test writes the condition the scheduler writes on such a pod.
    from elasticdl.k8s.names import pod_name

    replacement = pod_name(LONG, "worker", 1)
    kubelet.hold(server.namespace, replacement)
    assert kubelet.kill(server.namespace, pod_name(LONG, "worker", 0))
    workers = ("worker-0", "worker-1")
    wait(browser, "worker-1 listed", lambda d: "worker-1" in _replicas(d, workers), timeout=60)
    kubelet.api.patch_namespaced_pod_status(
        replacement,
        server.namespace,
        {"status": {"conditions": [{"type": "PodScheduled", "status": "False", **WHY}]}},
    )
    why = f"{WHY['reason']}: {WHY['message']}"
    wait(
        browser,
        "worker-1 Pending with the scheduler's reason",
        lambda d: _replicas(d, workers)["worker-1"][1:5] == ["Pending", "0", "", why]
        and _summary(d)["Workers"] == "0/1 (1 pending)",
        timeout=60,
    )
    assert _replicas(browser, workers)["worker-0"][1:] == [
        "Failed",
        "0",
        "137",
        "Error",
        "worker-1",
    ]
    kubelet.release(server.namespace, replacement)
    wait(
        browser,
        "worker-0 failed and replaced by worker-1",
        lambda d: [c[1:] for c in _replicas(d, workers).values()]
        == [["Failed", "0", "137", "Error", "worker-1"], ["Running", "0", "", "", ""]],
        timeout=60,
    )
    assert _summary(browser)["Workers"] == "1/1"
    shot = artifacts(tmp_path) / "dashboard-k8s-job.png"
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
    with capsys.disabled():
        print(f"\nkubernetes dashboard screenshot: {shot}")

    # Cancelled from its page: its pods are removed, and the page shows it Cancelled, not an
    # error, also after the next refresh.
    browser.find_element(By.ID, "cancel").click()
    browser.find_element(By.ID, "cancel-yes").click()
    wait(
        browser,
        "the job removed",
        lambda d: "removed" in d.find_element(By.ID, "message").text,
        timeout=90,
    )
    assert text(browser, "#phase") == "Cancelled"
    assert "cancelled by the user" in text(browser, "#message")
    assert not browser.find_element(By.ID, "error").is_displayed()
    assert not browser.find_element(By.ID, "cancel").is_displayed()
    assert not _replicas(browser)
    assert request(server.port, "GET", f"/v1/jobs/{LONG}", server.token)[0] == 404
    time.sleep(2.5)  # the page's refresh period: it stopped polling the job that is gone
    assert text(browser, "#phase") == "Cancelled"

    # The table: the finished job, and no row for the removed one.
    browser.find_element(By.LINK_TEXT, "ElasticDL").click()
    wait(
        browser,
        "the table with only the short job",
        lambda d: _row(d, SHORT)[1:2] == ["Succeeded"] and not _row(d, LONG),
    )
    assert not csp_violations(browser)
    with capsys.disabled():
        print(f"kubernetes dashboard browser test: {time.monotonic() - started:.1f} s")
