"""The dashboard as a person sees it: Debian's Chromium (headless, driven by chromedriver through
Selenium) against the real job server (``python -m elasticdl.server`` on 127.0.0.1) running two
real local Fashion-MNIST jobs (master, PS and worker processes; TensorFlow).

Chromium and chromedriver, and the browser's set-up: ``elasticdl_tests.dashboard.chromium``
(skipped with the reason where they cannot be installed, unless ``ELASTICDL_REQUIRE_CHROMIUM``
is set). The browser resolves no host name: it reaches nothing but the server on 127.0.0.1.

One screenshot of the job page is kept: under Pants in ``dist/`` (the sandbox's
``extra-output/``), else in ``$ELASTICDL_TEST_ARTIFACTS`` or the test's tmp path; the test prints
where.
"""

from __future__ import annotations

import gzip
import io
import os
import tarfile
import time
from pathlib import Path

import pytest
from elasticdl_testing.server_process import ServerProcess, request
from elasticdl_tests.dashboard.chromium import above as _above
from elasticdl_tests.dashboard.chromium import artifacts as _artifacts
from elasticdl_tests.dashboard.chromium import (  # noqa: F401 (fixtures)
    browser,
    chromium,
    csp_violations,
)
from elasticdl_tests.dashboard.chromium import text as _text
from elasticdl_tests.dashboard.chromium import texts as _texts
from elasticdl_tests.dashboard.chromium import wait as _wait
from selenium.webdriver.common.by import By

MODEL_DEF = "mnist.mnist_functional_api.custom_model"
SHORT = "dash-short"  # trains 4,096 records once, evaluating every 16 model versions
LONG = "dash-long"  # trains for minutes unless cancelled from the page
FINAL = ("Succeeded", "Failed", "Cancelled")


def _zoo_package() -> bytes:
    """The model zoo's mnist directory as the tarball a user uploads."""
    model = _above("model_zoo/mnist/mnist_functional_api.py")
    assert model is not None, "model_zoo/mnist is missing (a files() dependency of this test)"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in ("__init__.py", "mnist_functional_api.py"):
            tar.add(model.parent / name, arcname=f"mnist/{name}")
    return gzip.compress(buf.getvalue())


def _fashion_mnist() -> Path:
    """The prepared dataset (the e2e tests' cache: ~/.cache/elasticdl/e2e/fashion_mnist)."""
    from elasticdl.data.datasets import prepare

    default = Path.home() / ".cache" / "elasticdl" / "e2e" / "fashion_mnist"
    out = Path(os.environ.get("ELASTICDL_E2E_DATA") or default)
    prepare("fashion_mnist", str(out), progress=False)
    return out


class Api:
    """The REST calls a user's CLI would make, to set up what the browser then looks at."""

    def __init__(self, server: ServerProcess, token: str) -> None:
        self.server, self.token = server, token

    def call(self, method: str, path: str, body=None, expect: int = 200):
        status, data, _ = request(self.server.port, method, path, self.token, body)
        assert status == expect, f"{method} {path}: {status} {data}"
        return data

    def submit(self, package: str, **spec) -> None:
        body = {"command": "train", "spec": {"model_def": MODEL_DEF, **spec}, "package": package}
        self.call("POST", "/v1/jobs", body, expect=201)

    def phase(self, name: str) -> str:
        return self.call("GET", f"/v1/jobs/{name}")["phase"]


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    state = tmp_path_factory.mktemp("dashboard") / "state"
    server = ServerProcess(state)
    token = server.add_user("alice")
    server.start()
    api = Api(server, token)
    api.package = api.call("POST", "/v1/packages", _zoo_package(), expect=201)["id"]
    data = _fashion_mnist()
    for split in ("train", "test"):
        first = sorted(p for p in (data / split).iterdir() if p.suffix == ".rio")[0]
        api.call("PUT", f"/v1/data/fm/{split}/{first.name}", first.read_bytes(), expect=201)
    try:
        yield api
    finally:
        for name in (SHORT, LONG):  # a job goes on without the server: stop ours
            if request(server.port, "GET", f"/v1/jobs/{name}", token)[0] == 200:
                request(server.port, "DELETE", f"/v1/jobs/{name}", token)
        server.stop()


def _shown_accuracy(driver) -> float | None:
    """The accuracy in the job page's latest-evaluation table, None before there is one."""
    cells = driver.find_elements(By.CSS_SELECTOR, '#eval-latest tr[data-metric="accuracy"] td')
    return float(cells[0].text) if cells and cells[0].text else None


def test_jobs_table_curves_replicas_and_cancel_in_chromium(
    api, browser, tmp_path, capsys  # noqa: F811 (the imported fixture)
):
    started = time.monotonic()
    api.submit(
        api.package,
        job_name=SHORT,
        training_data="fm/train",
        validation_data="fm/test",
        evaluation_steps=16,
        num_epochs=1,
        minibatch_size=64,
        num_minibatches_per_task=4,
        num_workers=1,
        num_ps_pods=1,
    )
    base = api.server.url

    # The page holds no data until the token is given: a sign-in form and nothing else.
    browser.get(f"{base}/dashboard/")
    _wait(browser, "the sign-in form", lambda d: d.find_element(By.ID, "login").is_displayed())
    assert not browser.find_element(By.ID, "content").is_displayed()
    browser.find_element(By.ID, "token").send_keys("not-a-token\n")
    _wait(
        browser,
        "the rejected token",
        lambda d: "invalid token" in d.find_element(By.ID, "error").text,
    )
    browser.find_element(By.ID, "token").send_keys(api.token + "\n")

    # The jobs table: a row for the job with its phase, progress, replicas and age.
    row = f'#jobs tr[data-job="{SHORT}"]'
    _wait(browser, f"a row for {SHORT}", lambda d: d.find_elements(By.CSS_SELECTOR, row))
    assert not browser.find_element(By.ID, "login").is_displayed()
    cells = _texts(browser, f"{row} td")
    assert cells[0] == SHORT and cells[1] in ("Pending", "Running", "Succeeded"), cells
    assert cells[4].endswith("s"), cells  # the age, e.g. "3s"

    # Its page: the loss curve over model versions, an evaluation metric, the replicas.
    browser.find_element(By.LINK_TEXT, SHORT).click()
    _wait(browser, "the job page", lambda d: d.find_element(By.ID, "job-name").text == SHORT)
    points = "#loss-chart circle.point"
    _wait(
        browser,
        "a loss curve with points",
        lambda d: len(d.find_elements(By.CSS_SELECTOR, points)) > 1,
    )
    _wait(
        browser,
        "the accuracy of an evaluation round",
        lambda d: d.find_elements(By.CSS_SELECTOR, '#eval-latest tr[data-metric="accuracy"]')
        and d.find_elements(By.CSS_SELECTOR, '#eval-chart g[data-series="accuracy"] circle.point'),
    )
    _wait(
        browser,
        "the job's end",
        lambda d: d.find_element(By.ID, "phase").text in FINAL,
        timeout=120,
    )
    assert _text(browser, "#phase") == "Succeeded"
    # The accuracy shown is the API's: the job's last evaluation, to the 4 decimals shown.
    accuracy = api.call("GET", f"/v1/jobs/{SHORT}")["evaluation_metrics"]["accuracy"]
    _wait(
        browser,
        f"the API's accuracy {accuracy:.4f} in the latest evaluation",
        lambda d: _shown_accuracy(d) == pytest.approx(accuracy, abs=5.01e-5),
    )
    assert not browser.find_element(By.ID, "cancel").is_displayed()  # nothing left to cancel
    losses = browser.find_elements(By.CSS_SELECTOR, points)
    assert len(losses) > 1
    replicas = {
        r.get_attribute("data-replica")
        for r in browser.find_elements(By.CSS_SELECTOR, "#replicas tr[data-replica]")
    }
    assert {"ps-0", "worker-0"} <= replicas, replicas
    worker = _texts(browser, '#replicas tr[data-replica="worker-0"] td')
    assert (
        worker[1] == "Succeeded" and worker[2] == "0" and worker[3] == "0"
    ), worker  # restarts, exit code
    _wait(
        browser,
        "the master's log tail",
        lambda d: "evaluation metrics" in d.find_element(By.ID, "log").text.lower(),
    )
    # What the curves are drawn from: the history the master wrote, for its owner only.
    history = api.call("GET", f"/v1/jobs/{SHORT}/metrics")
    assert len(history["loss"]) == len(losses) and history["phase"] == "Succeeded"
    assert [e["model_version"] for e in history["evaluation"]][-1] == history["model_version"]
    assert history["evaluation"][-1]["metrics"]["accuracy"] == accuracy
    other = api.server.add_user("bob")
    assert request(api.server.port, "GET", f"/v1/jobs/{SHORT}/metrics", other)[0] == 404
    shot = _artifacts(tmp_path) / "dashboard-job.png"
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
    with capsys.disabled():
        print(f"\ndashboard screenshot: {shot}")

    # A second job, submitted while the table is open: the table refreshes itself to show it.
    browser.find_element(By.LINK_TEXT, "ElasticDL").click()
    _wait(
        browser,
        "the jobs table",
        lambda d: d.find_elements(By.CSS_SELECTOR, f'#jobs tr[data-job="{SHORT}"]'),
    )
    api.submit(
        api.package,
        job_name=LONG,
        training_data="fm/train",
        num_epochs=200,
        minibatch_size=64,
        num_workers=1,
        num_ps_pods=1,
    )
    _wait(
        browser,
        f"a row for {LONG} without reloading",
        lambda d: d.find_elements(By.CSS_SELECTOR, f'#jobs tr[data-job="{LONG}"]'),
    )
    # Cancelled from its page.
    browser.find_element(By.LINK_TEXT, LONG).click()
    _wait(browser, f"{LONG} running", lambda d: d.find_element(By.ID, "phase").text == "Running")
    browser.find_element(By.ID, "cancel").click()
    browser.find_element(By.ID, "cancel-yes").click()
    _wait(
        browser,
        "the phase Cancelled",
        lambda d: d.find_element(By.ID, "phase").text == "Cancelled",
        timeout=60,
    )
    assert api.phase(LONG) == "Cancelled"
    browser.find_element(By.LINK_TEXT, "ElasticDL").click()
    _wait(
        browser,
        "both jobs' final phases in the table",
        lambda d: _texts(d, f'#jobs tr[data-job="{LONG}"] td.phase') == ["Cancelled"]
        and _texts(d, f'#jobs tr[data-job="{SHORT}"] td.phase') == ["Succeeded"],
    )

    # The strict Content-Security-Policy broke nothing the page needs.
    blocked = csp_violations(browser)
    assert not blocked, blocked
    with capsys.disabled():
        print(f"dashboard browser test: {time.monotonic() - started:.1f} s")
