"""Debian's Chromium, headless and driven by chromedriver through Selenium, for the dashboard's
browser tests (local jobs here, Kubernetes jobs in ``elasticdl_tests/k8s``).

Chromium and chromedriver come from scripts/chromium/install.sh (run here when they are missing
and the machine can install them: root and apt). Where it cannot, the test is skipped with the
reason, unless ``ELASTICDL_REQUIRE_CHROMIUM`` is set (CI), where that is an error. The browser is
told to resolve no host name, so it reaches nothing but a server on 127.0.0.1.

Use: ``from elasticdl_tests.dashboard.chromium import browser, chromium  # noqa: F401`` makes the
fixtures available to a test module.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

selenium = pytest.importorskip("selenium")
from selenium import webdriver  # noqa: E402
from selenium.common.exceptions import (  # noqa: E402
    NoSuchElementException,
    StaleElementReferenceException,
    TimeoutException,
)
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


def above(relative: str) -> Path | None:
    """``relative`` in the checkout (or Pants' sandbox) holding this file."""
    for parent in Path(__file__).resolve().parents:
        if (parent / relative).is_file():
            return parent / relative
    return None


def _tools() -> tuple[str, str] | None:
    found = [
        shutil.which(n) or shutil.which(n, path="/usr/bin") for n in ("chromium", "chromedriver")
    ]
    return (found[0], found[1]) if all(found) else None


@pytest.fixture(scope="module")
def chromium() -> tuple[str, str]:
    """(chromium, chromedriver), installed with scripts/chromium/install.sh when missing."""
    tools = _tools()
    if tools is not None:
        return tools
    script = above("scripts/chromium/install.sh")
    if script is None:
        why = "scripts/chromium/install.sh not found"
    elif os.geteuid() != 0 or not shutil.which("apt-get"):
        why = "installing them needs root and apt-get (run scripts/chromium/install.sh as root)"
    else:
        proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=900)
        tools = _tools()
        if proc.returncode == 0 and tools is not None:
            return tools
        why = (proc.stderr.strip().splitlines() or ["install.sh failed"])[-1]
    reason = f"chromium and chromedriver are not installed: {why}"
    if os.environ.get("ELASTICDL_REQUIRE_CHROMIUM"):
        pytest.fail(f"{reason} (ELASTICDL_REQUIRE_CHROMIUM is set)", pytrace=False)
    pytest.skip(reason)


def artifacts(tmp_path: Path) -> Path:
    """Where a test keeps its screenshot: under Pants in ``dist/`` (the sandbox's
    ``extra-output/dashboard``), else ``$ELASTICDL_TEST_ARTIFACTS`` or ``tmp_path``."""
    if os.environ.get("ELASTICDL_TEST_ARTIFACTS"):
        out = Path(os.environ["ELASTICDL_TEST_ARTIFACTS"])
    elif not (Path.cwd() / ".git").exists():  # Pants' sandbox: extra-output/ goes to dist/
        out = Path.cwd() / "extra-output" / "dashboard"
    else:
        out = tmp_path
    out.mkdir(parents=True, exist_ok=True)
    return out


@pytest.fixture
def browser(chromium, tmp_path):
    binary, driver_path = chromium
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in (
        "--headless=new",
        "--window-size=1280,1500",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-extensions",
        # Loopback only: no host name resolves; the server is addressed as 127.0.0.1.
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
        "--proxy-server=direct://",
    ):
        options.add_argument(arg)
    if os.geteuid() == 0:
        options.add_argument("--no-sandbox")  # Chromium's sandbox refuses to run as root
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path=driver_path, log_output=str(tmp_path / "chromedriver.log"))
    driver = webdriver.Chrome(options=options, service=service)
    try:
        yield driver
    finally:
        driver.quit()


# The pages re-render their tables every 2 s: an element found a moment ago may be gone.
_REDRAWN = (NoSuchElementException, StaleElementReferenceException)


def wait(driver, what: str, condition, timeout: float = 90):
    """``condition(driver)`` once truthy; else an error showing what the page shows."""
    try:
        return WebDriverWait(
            driver, timeout, poll_frequency=0.25, ignored_exceptions=_REDRAWN
        ).until(lambda d: condition(d))
    except TimeoutException:
        page = driver.find_element(By.TAG_NAME, "body").text
        raise AssertionError(f"never saw {what} in {timeout}s; the page shows:\n{page}") from None


def texts(driver, css: str) -> list[str]:
    """The texts of the elements CSS selects, read again if a redraw replaced them meanwhile."""
    for _ in range(20):
        try:
            return [e.text for e in driver.find_elements(By.CSS_SELECTOR, css)]
        except StaleElementReferenceException:
            time.sleep(0.1)
    raise AssertionError(f"{css}: the page kept redrawing these elements for 2 s")


def text(driver, css: str) -> str:
    return wait(driver, css, lambda d: d.find_element(By.CSS_SELECTOR, css).text, timeout=10)


def sign_in(driver, base_url: str, token: str) -> None:
    """Open the jobs table and give the token (the page holds no data before that)."""
    driver.get(f"{base_url}/dashboard/")
    wait(driver, "the sign-in form", lambda d: d.find_element(By.ID, "login").is_displayed())
    driver.find_element(By.ID, "token").send_keys(token + "\n")


def csp_violations(driver) -> list[str]:
    """The console's Content-Security-Policy complaints (what the strict policy blocked)."""
    return [
        e["message"] for e in driver.get_log("browser") if "Content Security Policy" in e["message"]
    ]
