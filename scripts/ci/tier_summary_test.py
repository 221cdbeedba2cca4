"""The tier table and CI's skip rules on reports written the way Pants and pytest write them."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import skip_allow_list
import tier_summary
from skip_allow_list import AllowedSkip

SCRIPT = Path(tier_summary.__file__)


def junit(cases: list[tuple[str, str | None]], time: float = 1.5, failures: int = 0) -> str:
    """A pytest (xunit2) report: (test name, skip reason or None) per test case."""
    body = []
    for name, reason in cases:
        if reason is None:
            body.append(f'<testcase classname="x" name="{name}" time="0.1" />')
        else:
            body.append(
                f'<testcase classname="x" name="{name}" time="0.0"><skipped type="pytest.skip" '
                f'message="{reason}">/tmp/sandbox/x.py:3: {reason}</skipped></testcase>'
            )
    skipped = sum(1 for _, r in cases if r is not None)
    return (
        '<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="0" '
        f'failures="{failures}" skipped="{skipped}" tests="{len(cases)}" time="{time}">'
        + "".join(body)
        + "</testsuite></testsuites>"
    )


def write_reports(directory: Path, reports: dict[str, str]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for address, xml in reports.items():
        path, _, target = address.partition(":")
        name = path.replace("/", ".") + (f".{target}" if target else "") + ".xml"
        (directory / name).write_text(xml)
    return directory


def repo(tmp_path: Path, files: list[str]) -> Path:
    root = tmp_path / "repo"
    for f in files:
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        (root / f).write_text("")
    return root


UNIT = "src/python/elasticdl/data/recordio_test.py"
CUDA = "src/python/elasticdl/ops/cuda_test.py"
IMAGES = "tests/python/elasticdl_tests/images/base_image_test.py"
GPU_IMAGE = "tests/python/elasticdl_tests/images/gpu_image_test.py"
NODE = "tests/python/elasticdl_tests/k8s_node/job_test.py"

PANTS_LOG = """\
14:20:41.53 [INFO] Completed: Run Pytest - src/python/elasticdl/ops/cuda_test.py:tests - succeeded.

\x1b[32m✓\x1b[0m src/python/elasticdl/data/recordio_test.py:tests succeeded in 3.20s.
✓ src/python/elasticdl/ops/cuda_test.py:tests succeeded in 2.29s (cached locally).
✓ tests/python/elasticdl_tests/images/base_image_test.py:tests succeeded in 198.00s.
✕ tests/python/elasticdl_tests/k8s_node/job_test.py:tests failed in 600.10s.
"""


def test_report_names_map_back_to_test_files():
    assert tier_summary.report_path("src.python.elasticdl.ops.cuda_test.py.tests.xml") == CUDA
    assert tier_summary.report_path("model_zoo.mnist.mnist_test.py.xml") == (
        "model_zoo/mnist/mnist_test.py"
    )
    assert tier_summary.report_path("notes.txt") is None


def test_reports_and_the_pants_log_make_one_row_per_tier(tmp_path):
    reports = write_reports(
        tmp_path / "reports",
        {
            f"{UNIT}:tests": junit([("a", None), ("b", None), ("c", "no tmpfs")], time=2.0),
            f"{CUDA}:tests": junit([("g1", "no CUDA build or no CUDA device is visible")] * 2),
            f"{IMAGES}:tests": junit([("real", None)], time=190.0),
            # job_test timed out: Pants wrote no report for it
        },
    )
    log = tmp_path / "pants.log"
    log.write_text(PANTS_LOG)
    results = tier_summary.read_reports(reports)
    tier_summary.read_pants_log(log, results)

    assert results[UNIT].tests == 3 and results[UNIT].skips == [("c", "no tmpfs")]
    assert results[UNIT].seconds == 3.2  # Pants' wall seconds, not pytest's 2.0
    assert results[CUDA].cached and results[CUDA].seconds == 0.0
    assert results[NODE].status == "failed" and results[NODE].failed == 1
    assert not results[NODE].reported

    rows = {r.name: r for r in tier_summary.tier_rows(results)}
    assert set(rows) == {"unit", "images", "k8s-node"}
    unit = rows["unit"]
    assert (unit.files, unit.tests, unit.passed, unit.skips, unit.cached) == (2, 5, 2, 3, 1)
    assert unit.seconds == pytest.approx(3.2)
    assert rows["images"].seconds == 198.0 and rows["images"].passed == 1
    assert rows["k8s-node"].passed == 0 and rows["k8s-node"].failed == 1
    # The slowest tier first.
    assert [r.name for r in tier_summary.tier_rows(results)][0] == "k8s-node"


def test_the_slowest_files_are_listed_slowest_first_without_cached_ones(tmp_path):
    reports = write_reports(
        tmp_path / "reports",
        {
            f"{UNIT}:tests": junit([("a", None)], time=2.0),
            f"{IMAGES}:tests": junit([("real", None)], time=190.0),
        },
    )
    log = tmp_path / "pants.log"
    log.write_text(PANTS_LOG)
    results = tier_summary.read_reports(reports)
    tier_summary.read_pants_log(log, results)
    verdict = tier_summary.judge(results, [], None)
    out = tier_summary.render(results, verdict, [], strict=False)

    start = next(i for i, line in enumerate(out) if line.startswith("slowest files"))
    listed = []
    for line in out[start + 1 :]:
        if not line.startswith("  "):
            break
        listed.append(line.split())
    # The cached CUDA file is not listed; the timed-out file is, and says it failed.
    assert [row[1] for row in listed] == [NODE, IMAGES, UNIT]
    assert listed[0] == ["600s", NODE, "FAILED"] and listed[1][0] == "198s"


def test_a_run_stopped_before_its_summary_is_read_from_its_progress_lines(tmp_path):
    log = tmp_path / "pants.log"
    log.write_text(
        "12:00:31.00 [INFO] Long running tasks:\n"
        f"  31.10s\tRun Pytest for {IMAGES}:tests\n"
        f"  31.20s\tRun Pytest for {NODE}:tests\n"
        f"12:00:40.00 [INFO] Completed: Run Pytest - {UNIT}:tests - succeeded.\n"
        f"12:00:45.00 [INFO] Completed: Run Pytest - {IMAGES}:tests - failed (exit code 1).\n"
        "12:01:01.00 [INFO] Long running tasks:\n"
        f"  61.20s\tRun Pytest for {NODE}:tests\n"
    )
    results: dict = {}
    tier_summary.read_pants_log(log, results)

    assert results[UNIT].status == "succeeded" and results[UNIT].failed == 0
    assert results[IMAGES].status == "failed" and results[IMAGES].seconds == 31.1
    node = results[NODE]
    assert node.status == "unfinished" and node.failed == 1 and node.seconds == 61.2
    out = tier_summary.render(results, tier_summary.judge(results, [], None), [], strict=True)
    assert f"      61s  {NODE}  UNFINISHED (still running)" in out


ENTRIES = [AllowedSkip(CUDA, r"no CUDA device", "GPU-only", lambda: True)]


def test_a_skip_off_the_allow_list_is_refused_and_one_on_it_allowed():
    results = {
        UNIT: tier_summary.FileResult(UNIT, tests=2, skips=[("c", "no tmpfs"), ("d", "no tmpfs")]),
        CUDA: tier_summary.FileResult(CUDA, tests=1, skips=[("g", "no CUDA device is visible")]),
    }
    verdict = tier_summary.judge(results, [], None, ENTRIES)
    assert verdict.refused == [(UNIT, "no tmpfs", 2)]
    assert verdict.allowed == [(CUDA, "no CUDA device is visible", 1, "GPU-only")]
    assert not verdict.ok


def test_an_entry_holds_only_where_its_condition_does():
    results = {CUDA: tier_summary.FileResult(CUDA, tests=1, skips=[("g", "no CUDA device")])}
    on_a_gpu_machine = [AllowedSkip(CUDA, r"no CUDA device", "GPU-only", lambda: False)]
    assert tier_summary.judge(results, [], None, on_a_gpu_machine).refused == [
        (CUDA, "no CUDA device", 1)
    ]


def test_skips_of_an_opted_out_tier_are_allowed():
    results = {NODE: tier_summary.FileResult(NODE, tests=3, skips=[("t", "no cgroup v1")] * 3)}
    verdict = tier_summary.judge(results, ["k8s-node"], ["k8s-node", "unit"], ENTRIES)
    assert verdict.refused == [] and verdict.allowed == [
        (NODE, "no cgroup v1", 3, "tier opted out")
    ]
    assert verdict.missing_tiers == ["unit"]


def test_a_tier_whose_tests_all_skipped_did_not_run():
    results = {
        UNIT: tier_summary.FileResult(UNIT, tests=1),
        IMAGES: tier_summary.FileResult(IMAGES, tests=2, skips=[("a", "x"), ("b", "x")]),
    }
    everything_allowed = [AllowedSkip("*", ".*", "test", lambda: True)]
    verdict = tier_summary.judge(results, [], ["images", "unit"], everything_allowed)
    assert verdict.refused == [] and verdict.missing_tiers == ["images"]


def test_the_shipped_allow_list_is_short_and_says_why():
    assert 0 < len(skip_allow_list.ALLOWED_SKIPS) <= 10
    for entry in skip_allow_list.ALLOWED_SKIPS:
        assert entry.why and entry.path and entry.reason
    # A missing capability under CI is no allowed skip.
    for path, reason in [
        ("src/python/elasticdl/ps/checkpointer_test.py", "mounting a tmpfs needs root"),
        (IMAGES, "no container engine: the engine setup needs root"),
        (UNIT, "elasticdl_native is not built"),
    ]:
        assert skip_allow_list.allowed(path, reason) is None


def run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60
    )


def test_the_script_prints_the_table_and_fails_under_ci_only(tmp_path):
    root = repo(tmp_path, [UNIT, CUDA, IMAGES, GPU_IMAGE, NODE])
    reports = write_reports(
        tmp_path / "reports",
        {
            f"{UNIT}:tests": junit([("a", None), ("c", "mounting a tmpfs needs root")]),
            f"{IMAGES}:tests": junit([("real", None)]),
            f"{NODE}:tests": junit([("job", None)]),
        },
    )
    setup = tmp_path / "setup.tsv"
    setup.write_text("kubernetes build\t612.4\tbackground\npants package\t95\n")
    common = ["--root", str(root), "--reports", str(reports), "--setup", str(setup)]

    lenient = run_script(*common, "--wall-seconds", "1500")
    assert lenient.returncode == 0, lenient.stderr
    out = lenient.stdout.splitlines()
    assert out[-1].startswith("skip check would fail under CI: 1 skips not on")
    assert "wall time: 25 min 0 s" in out
    assert "tiers opted out (ELASTICDL_CI_SKIP_TIERS): none" in out
    header = next(i for i, line in enumerate(out) if line.split()[:2] == ["tier", "files"])
    assert out[header].split() == ["tier", "files", "tests", "skips", "failed", "cached", "seconds"]
    assert any(line.split()[:2] == ["kubernetes", "build"] for line in out[:header])
    unit = next(line.split() for line in out if line.split()[:1] == ["unit"])
    assert unit[1:6] == ["1", "2", "1", "0", "0"]
    assert any("NOT on scripts/ci/skip_allow_list.py" in line and UNIT in line for line in out)

    strict = run_script(*common, "--strict", "--expect-all-tiers", "--skip-tiers", "gpu-image")
    assert strict.returncode == 1
    last = strict.stdout.splitlines()[-1]
    assert last.startswith("skip check FAILED: 1 skips not on scripts/ci/skip_allow_list.py")
    assert "tiers opted out (ELASTICDL_CI_SKIP_TIERS): gpu-image" in strict.stdout

    # gpu-image is a tier of the repository: without the opt-out it must have run.
    (reports / "src.python.elasticdl.data.recordio_test.py.tests.xml").write_text(
        junit([("a", None)])
    )
    ok = run_script(*common, "--strict", "--expect-all-tiers", "--skip-tiers", "gpu-image")
    assert ok.returncode == 0, ok.stdout
    assert ok.stdout.splitlines()[-1] == "skip check passed: 0 skips, all allowed"
    assert "tiers ran: " in ok.stdout
    missing = run_script(*common, "--strict", "--expect-all-tiers")
    assert missing.returncode == 1
    assert "tiers that did not run: gpu-image" in missing.stdout.splitlines()[-1]


def test_an_unknown_opted_out_tier_is_a_one_line_error(tmp_path):
    root = repo(tmp_path, [UNIT])
    done = run_script("--root", str(root), "--reports", str(tmp_path), "--skip-tiers", "gpu")
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "tier_summary: error: ELASTICDL_CI_SKIP_TIERS: unknown tier 'gpu'; the tiers are unit"
    )
