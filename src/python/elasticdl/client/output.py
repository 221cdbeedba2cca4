"""kubectl-style rendering of job lists and statuses (table, JSON, YAML)."""

from __future__ import annotations

import json
import time
from typing import Any, Iterable, Sequence

from elasticdl.common.job_status import JobStatus

OUTPUT_FORMATS = ("table", "json", "yaml")


def format_age(since: float | None, now: float | None = None) -> str:
    """kubectl-style age: 45s, 3m, 2h, 5d."""
    if since is None:
        return "-"
    seconds = max(0, int((now if now is not None else time.time()) - since))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 2 * 3600:
        return f"{seconds // 60}m"
    if seconds < 2 * 86400:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    rows = [[str(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    lines = ["   ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
    lines += ["   ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)


def dump(data: Any, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(data, indent=2, sort_keys=False, default=str)
    if fmt == "yaml":
        import yaml  # only for -o yaml

        return yaml.safe_dump(data, sort_keys=False, default_flow_style=False).rstrip()
    raise ValueError(f"-o {fmt!r} is invalid; use one of {', '.join(OUTPUT_FORMATS)}")


def jobs_table(jobs: Sequence[JobStatus]) -> str:
    """One row per job; WORKERS is running / all it has now (``2/4 (2 pending)``)."""
    if not jobs:
        return "No jobs found."
    return table(
        ("NAME", "PLATFORM", "PHASE", "AGE", "VERSION", "WORKERS", "PROGRESS"),
        [
            (
                j.job_name,
                j.platform,
                j.phase,
                format_age(j.created_at),
                j.model_version,
                j.workers_summary,
                j.progress,
            )
            for j in jobs
        ],
    )


def status_text(status: JobStatus) -> str:
    lines = [
        f"Name:        {status.job_name}",
        f"Platform:    {status.platform}"
        + (f" (namespace {status.namespace})" if status.namespace else ""),
        f"Phase:       {status.phase}",
    ]
    if status.message:
        lines.append(f"Message:     {status.message}")
    lines += [
        f"Age:         {format_age(status.created_at)}",
        f"Version:     {status.model_version}",
        f"Epoch:       {status.epoch}",
        f"Progress:    {status.progress}"
        + (
            f" ({status.records_trained}/{status.records_expected} records)"
            if status.records_expected
            else ""
        )
        + _speed_and_eta(status),
        f"Tasks:       todo {status.tasks_todo}, doing {status.tasks_doing}, done {status.tasks_done}, "
        f"retried {status.tasks_retried}",
    ]
    if status.job_dir:
        lines.append(f"Job dir:     {status.job_dir}")
    lines += _worker_lines(status)
    lines += _straggler_and_scaling_lines(status)
    if status.evaluation_metrics:
        metrics = ", ".join(
            f"{k}={_fmt_metric(v)}" for k, v in sorted(status.evaluation_metrics.items())
        )
        lines.append(f"Evaluation:  {metrics}")
    if status.replicas:
        lines.append("Replicas:")
        replica_rows = [
            (
                r.name,
                r.phase,
                "-" if r.exit_code is None else r.exit_code,
                r.restarts,
                _replica_message(r),
            )
            for r in status.replicas
        ]
        lines += [
            "  " + line
            for line in table(
                ("NAME", "PHASE", "EXIT", "RESTARTS", "MESSAGE"), replica_rows
            ).splitlines()
        ]
    return "\n".join(lines)


def _speed_and_eta(status: JobStatus) -> str:
    """``, 412 records/s now, ETA 4m10s``: the master's recent window, not the average."""
    if status.is_final or status.records_per_second is None:
        return ""
    text = f", {status.records_per_second:.4g} records/s now"
    if status.eta_seconds is not None:
        return text + f", ETA {status.eta}"
    return text + ", ETA unknown (no progress lately)"


def _worker_lines(status: JobStatus) -> list[str]:
    """Running vs pending workers, and why the pending ones wait (the scheduler's words)."""
    if status.workers_summary == "-" or status.is_final:
        return []
    workers = status.workers()
    lines = [f"Workers:     {len(workers['Running'])} running, {len(workers['Pending'])} pending"]
    why: dict[str, list[str]] = {}
    for replica in workers["Pending"]:
        reason = _waiting(replica) or "not scheduled yet"
        why.setdefault(reason, []).append(replica.name)
    lines += [f"  pending {', '.join(names)}: {reason}" for reason, names in why.items()]
    outside = [r for r in status.replicas if r.ended_by]
    if outside:
        counts: dict[str, int] = {}
        for replica in outside:
            counts[replica.ended_by] = counts.get(replica.ended_by, 0) + 1
        lines.append(
            "  ended from outside: "
            + ", ".join(f"{n} {cause}" for cause, n in sorted(counts.items()))
            + " (relaunched without using the relaunch budget)"
        )
    return lines


def _waiting(replica) -> str:
    if replica.waiting_reason and replica.waiting_message:
        return f"{replica.waiting_reason}: {replica.waiting_message}"
    return replica.waiting_reason or replica.waiting_message


def _replica_message(replica) -> str:
    if replica.phase == "Pending" and _waiting(replica):
        return _waiting(replica)
    if replica.ended_by:
        return replica.ended_by + (
            f": {replica.message}"
            if replica.message and replica.message.lower() != replica.ended_by
            else ""
        )
    return replica.message


def _straggler_and_scaling_lines(status: JobStatus) -> list[str]:
    """Slow workers and --num_workers=auto's decisions, when the master reported any."""
    lines = []
    s = status.stragglers or {}
    if s.get("ever_slow") or s.get("backups_issued") or s.get("tasks_withheld"):
        slow = ", ".join(
            f"worker-{w['worker']} ({w['times_median']}x the median time per record)"
            for w in s.get("slow_workers", [])
        )
        lines.append(
            f"Stragglers:  {slow or 'none now'}; ever slow: "
            f"{', '.join(f'worker-{w}' for w in s.get('ever_slow', [])) or '-'}; "
            f"tasks backed up {s.get('backups_issued', 0)} (backup first {s.get('backups_won', 0)}), "
            f"withheld {s.get('tasks_withheld', 0)}"
        )
    a = status.autoscaling or {}
    if a:
        lines.append(
            f"Autoscaling: {a.get('min_workers')}..{a.get('max_workers')} workers, "
            f"target {a.get('target')}"
        )
        lines += [
            f"  {d.get('action')} -> {d.get('workers')}: {d.get('reason')}"
            for d in a.get("decisions", [])[-10:]
        ]
    p = status.ps_scaling or {}
    if p.get("changes"):
        lines.append(f"PS scaling:  {p.get('num_ps')} PS now")
        lines += [
            f"  {c.get('from_ps')} -> {c.get('to_ps')} PS: {c.get('state')}"
            + (
                f", training paused {c.get('pause_s', 0):.2f} s at model version {c.get('version')}"
                if c.get("state") == "done"
                else ""
            )
            + (f": {c.get('error')}" if c.get("error") else "")
            for c in p["changes"]
        ]
    return lines


def _fmt_metric(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
