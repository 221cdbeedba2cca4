"""The per-tier table printed at the end of every scripts/run-tests.sh run, and CI's skip rules.

Reads the JUnit XML reports Pants writes for every test file (``[test] report = true``, in
dist/test/reports; also for results replayed from Pants' cache) and, when given, the console
log of ``./pants test`` (whether each file ran or came from the cache, and its wall seconds).
Prints the set-up steps' times, one row per tier (files, tests, skips, failed, cached,
seconds), every skip with its reason, and last the tiers that ran.

    python3 scripts/ci/tier_summary.py --reports dist/test/reports --pants-log pants-test.log \\
        [--setup setup-times.tsv] [--wall-seconds N] [--strict [--expect-all-tiers]] \\
        [--skip-tiers k8s-node,gpu-image]

--strict (CI): exit 1 when a test was skipped for a reason scripts/ci/skip_allow_list.py does
not accept, or, with --expect-all-tiers, when a tier of the repository that was not opted out
(--skip-tiers, from ELASTICDL_CI_SKIP_TIERS) has no passing test. Without --strict the same
problems are printed as warnings and the exit status is 0. Test failures are Pants' to report.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

import skip_allow_list
import tiers

# "✓ src/python/x_test.py:tests succeeded in 2.29s (cached locally)." (pants/core/goals/test.py)
_SUMMARY_LINE = re.compile(
    r"^(?P<sigil>\S)\s+(?P<address>\S+)\s+(?P<status>succeeded|failed)"
    r"(?:\s+in\s+(?P<seconds>[\d.]+)s)?(?:\s+\((?P<source>[^)]*)\))?\.\s*$"
)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# Lines Pants prints while it runs, which a run stopped before its summary still has:
# "12:00:01.00 [INFO] Completed: Run Pytest - a_test.py:tests - succeeded." and, every 30 s,
# "  184.40s\tRun Pytest for a_test.py:tests" under "Long running tasks:".
_COMPLETED_LINE = re.compile(
    r"Completed: Run Pytest - (?P<address>\S+) - (?P<status>succeeded|failed)"
)
_RUNNING_LINE = re.compile(r"^\s*(?P<seconds>[\d.]+)s\s+Run Pytest for (?P<address>\S+)\s*$")
_REPORT_NAME = re.compile(r"^(?P<path>.*)\.py(?:\.(?P<target>[^.]*))?$")


@dataclass
class FileResult:
    path: str
    tests: int = 0
    failed: int = 0  # failures and errors
    skips: list[tuple[str, str]] = field(default_factory=list)  # (test, reason)
    pytest_seconds: float = 0.0
    reported: bool = False  # a JUnit report was found
    status: str = ""  # from the Pants log: succeeded | failed
    pants_seconds: float | None = None
    source: str = ""  # from the Pants log: "" (ran), memoized, cached locally, ...

    @property
    def cached(self) -> bool:
        return bool(self.source)

    @property
    def passed(self) -> int:
        return max(0, self.tests - self.failed - len(self.skips))

    @property
    def seconds(self) -> float:
        """Seconds this run spent on the file: 0 when its result came from the cache."""
        if self.cached:
            return 0.0
        return self.pants_seconds if self.pants_seconds is not None else self.pytest_seconds


def report_path(name: str) -> str | None:
    """The test file of a Pants report name (the address' path_safe_spec + .xml)."""
    if not name.endswith(".xml"):
        return None
    m = _REPORT_NAME.match(name[: -len(".xml")])
    return m["path"].replace(".", "/") + ".py" if m else None


def read_reports(directory: Path) -> dict[str, FileResult]:
    results: dict[str, FileResult] = {}
    if not directory.is_dir():
        return results
    for xml in sorted(directory.iterdir()):
        path = report_path(xml.name)
        if path is None:
            continue
        r = results.setdefault(path, FileResult(path))
        r.reported = True
        root = ET.parse(xml).getroot()
        suites = [root] if root.tag == "testsuite" else root.iter("testsuite")
        for suite in suites:
            r.tests += int(suite.get("tests", 0))
            r.failed += int(suite.get("failures", 0)) + int(suite.get("errors", 0))
            r.pytest_seconds += float(suite.get("time", 0.0))
            for case in suite.iter("testcase"):
                skipped = case.find("skipped")
                if skipped is not None:
                    reason = skipped.get("message") or (skipped.text or "").strip()
                    r.skips.append((case.get("name", "?"), reason))
    return results


def read_pants_log(path: Path, results: dict[str, FileResult]) -> None:
    """Status, seconds and cache source of each file from ``./pants test``'s summary lines.

    Where the run was stopped before its summary (the CI deadline), the progress lines tell
    instead: a file that completed has its status (its seconds at least its last long-running
    figure), and a file still running then counts as failed with ``status`` "unfinished"."""
    text = _ANSI.sub("", path.read_text(errors="replace"))
    running: dict[str, float] = {}
    completed: dict[str, str] = {}
    summarised: set[str] = set()
    for line in text.splitlines():
        m = _RUNNING_LINE.match(line)
        if m:
            file = m["address"].split(":", 1)[0]
            running[file] = max(running.get(file, 0.0), float(m["seconds"]))
            continue
        m = _COMPLETED_LINE.search(line)
        if m:
            completed[m["address"].split(":", 1)[0]] = m["status"]
            continue
        m = _SUMMARY_LINE.match(line.strip())
        if m and m["sigil"] in ("✓", "✕"):
            summarised.add(m["address"].split(":", 1)[0])
    for file in (set(running) | set(completed)) - summarised:
        r = results.setdefault(file, FileResult(file))
        r.status = completed.get(file, "unfinished")
        if file in running:
            r.pants_seconds = running[file]
        if r.status != "succeeded" and not r.reported:
            r.failed = max(r.failed, 1)
    for line in text.splitlines():
        m = _SUMMARY_LINE.match(line.strip())
        if not m or m["sigil"] not in ("✓", "✕"):
            continue
        file = m["address"].split(":", 1)[0]
        r = results.setdefault(file, FileResult(file))
        r.status = m["status"]
        r.pants_seconds = float(m["seconds"]) if m["seconds"] else None
        r.source = "" if m["source"] in (None, "ran") else m["source"]
        if m["status"] == "failed" and not r.reported:
            r.failed = max(r.failed, 1)  # no report: timed out, or pytest did not start


@dataclass
class TierRow:
    name: str
    files: int = 0
    tests: int = 0
    passed: int = 0
    skips: int = 0
    failed: int = 0
    cached: int = 0
    seconds: float = 0.0

    def add(self, r: FileResult) -> None:
        self.files += 1
        self.tests += r.tests
        self.passed += r.passed
        self.skips += len(r.skips)
        self.failed += r.failed
        self.cached += int(r.cached)
        self.seconds += r.seconds


def tier_rows(results: dict[str, FileResult]) -> list[TierRow]:
    rows: dict[str, TierRow] = {}
    for path, r in sorted(results.items()):
        name = tiers.tier_of(path)
        rows.setdefault(name, TierRow(name)).add(r)
    # The slowest first: where the time goes.
    return sorted(rows.values(), key=lambda t: (-t.seconds, t.name))


@dataclass
class Verdict:
    allowed: list[tuple[str, str, int, str]]  # path, reason, count, why
    refused: list[tuple[str, str, int]]  # path, reason, count
    missing_tiers: list[str]  # expected tiers with no passing test

    @property
    def ok(self) -> bool:
        return not self.refused and not self.missing_tiers


def judge(
    results: dict[str, FileResult],
    opted_out: list[str],
    expected_tiers: list[str] | None,
    entries=None,
) -> Verdict:
    """Which skips the allow-list accepts, which it does not, and which expected tiers did not
    run. Skips in opted-out tiers are accepted (the tier was not meant to run)."""
    allowed, refused = [], []
    for path, r in sorted(results.items()):
        counts: dict[str, int] = {}
        for _, reason in r.skips:
            counts[reason] = counts.get(reason, 0) + 1
        for reason, n in counts.items():
            if tiers.tier_of(path) in opted_out:
                allowed.append((path, reason, n, "tier opted out"))
                continue
            why = skip_allow_list.allowed(path, reason, entries)
            if why is None:
                refused.append((path, reason, n))
            else:
                allowed.append((path, reason, n, why))
    missing = []
    if expected_tiers is not None:
        ran = {row.name for row in tier_rows(results) if row.passed > 0}
        missing = sorted(t for t in expected_tiers if t not in ran and t not in opted_out)
    return Verdict(allowed, refused, missing)


# The files that take most of the run's time: where to look when the run grows.
SLOWEST_FILES = 15


def _seconds(s: float) -> str:
    return f"{s:.0f}s" if s >= 10 else f"{s:.1f}s"


def _minutes(s: float) -> str:
    return f"{int(s // 60)} min {int(s % 60)} s" if s >= 60 else f"{s:.0f} s"


def read_setup(path: Path) -> list[tuple[str, float, str]]:
    """Set-up steps written by run-tests.sh: ``step<TAB>seconds[<TAB>note]`` lines."""
    steps = []
    for line in path.read_text().splitlines():
        parts = line.split("\t")
        if len(parts) >= 2:
            try:
                steps.append((parts[0], float(parts[1]), parts[2] if len(parts) > 2 else ""))
            except ValueError:
                continue
    return steps


def render(
    results: dict[str, FileResult],
    verdict: Verdict,
    opted_out: list[str],
    strict: bool,
    setup: list[tuple[str, float, str]] = (),
    wall_seconds: float | None = None,
) -> list[str]:
    out = ["", "== test summary (scripts/ci/tier_summary.py) =="]
    if setup:
        out.append("set-up (overlapping steps run at once):")
        width = max(len(s) for s, _, _ in setup)
        for step, secs, note in setup:
            out.append(f"  {step:<{width}}  {_seconds(secs):>7}" + (f"  {note}" if note else ""))
    rows = tier_rows(results)
    header = ("tier", "files", "tests", "skips", "failed", "cached", "seconds")
    table = [header] + [
        (t.name, t.files, t.tests, t.skips, t.failed, t.cached, _seconds(t.seconds)) for t in rows
    ]
    total = TierRow("all")
    for r in results.values():
        total.add(r)
    table.append(
        (
            "all",
            total.files,
            total.tests,
            total.skips,
            total.failed,
            total.cached,
            _seconds(total.seconds),
        )
    )
    cells = [[str(c) for c in row] for row in table]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    for i, row in enumerate(cells):
        first = row[0].ljust(widths[0])
        out.append("  " + "  ".join([first] + [c.rjust(w) for c, w in zip(row[1:], widths[1:])]))
        if i == 0 or i == len(cells) - 2:
            out.append("  " + "  ".join("-" * w for w in widths))
    out.append(
        "  (seconds: the test processes' wall time in this run, summed per tier; files run in "
        "parallel; 0 for results from Pants' cache)"
    )
    slowest = sorted((r for r in results.values() if r.seconds > 0), key=lambda r: -r.seconds)
    if slowest:
        out.append(f"slowest files (of {len(slowest)} that ran):")
        for r in slowest[:SLOWEST_FILES]:
            mark = {"failed": "  FAILED", "unfinished": "  UNFINISHED (still running)"}
            out.append(f"  {_seconds(r.seconds):>7}  {r.path}{mark.get(r.status, '')}")
    if verdict.allowed or verdict.refused:
        out.append("skipped tests:")
        for path, reason, n, why in verdict.allowed:
            out.append(f"  {path}: {n} x {reason!r} -- allowed: {why}")
        for path, reason, n in verdict.refused:
            out.append(f"  {path}: {n} x {reason!r} -- NOT on scripts/ci/skip_allow_list.py")
    ran = [t for t in rows if t.passed > 0]
    not_run = [t for t in rows if t.passed == 0]
    out.append(
        "tiers ran: "
        + (", ".join(f"{t.name} {_seconds(t.seconds)} ({t.skips} skips)" for t in ran) or "none")
    )
    if not_run:
        out.append(
            "tiers with no passing test: "
            + ", ".join(f"{t.name} ({t.skips} skips, {t.failed} failed)" for t in not_run)
        )
    out.append("tiers opted out (ELASTICDL_CI_SKIP_TIERS): " + (", ".join(opted_out) or "none"))
    problems = []
    if verdict.refused:
        n = sum(c for _, _, c in verdict.refused)
        problems.append(f"{n} skips not on scripts/ci/skip_allow_list.py")
    if verdict.missing_tiers:
        problems.append("tiers that did not run: " + ", ".join(verdict.missing_tiers))
    if wall_seconds is not None:
        out.append(f"wall time: {_minutes(wall_seconds)}")
    if problems:
        word = "FAILED" if strict else "would fail under CI"
        out.append(f"skip check {word}: " + "; ".join(problems))
    else:
        skips = sum(c for _, _, c, _ in verdict.allowed)
        out.append(f"skip check passed: {skips} skips, all allowed")
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reports", type=Path, default=Path("dist/test/reports"))
    p.add_argument("--pants-log", type=Path)
    p.add_argument("--setup", type=Path)
    p.add_argument("--wall-seconds", type=float)
    p.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[2])
    p.add_argument("--strict", action="store_true")
    p.add_argument("--expect-all-tiers", action="store_true")
    p.add_argument("--skip-tiers", default=os.environ.get("ELASTICDL_CI_SKIP_TIERS", ""))
    args = p.parse_args(argv)

    known = tiers.all_tiers(args.root)
    opted_out = tiers.parse_names(args.skip_tiers)
    try:
        tiers.check_names(opted_out, known)
    except tiers.UnknownTier as e:
        print(f"tier_summary: error: {e}", file=sys.stderr)
        return 2
    results = read_reports(args.reports)
    if args.pants_log is not None and args.pants_log.is_file():
        read_pants_log(args.pants_log, results)
    verdict = judge(results, opted_out, sorted(known) if args.expect_all_tiers else None)
    setup = read_setup(args.setup) if args.setup and args.setup.is_file() else []
    lines = render(results, verdict, opted_out, args.strict, setup, args.wall_seconds)
    print("\n".join(lines), flush=True)
    return 1 if args.strict and not verdict.ok else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
