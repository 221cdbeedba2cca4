"""Image builds' logs, kept after their build pods: ``<state_dir>/build-logs/<user>/<job>.log``.

A build pod is deleted once its image is pushed (or its build failed), and its log with it.
Before that, the server reads the pod's log (both containers: ``install``, then ``push``) and
keeps its last :data:`MAX_LOG_BYTES` here; ``GET /v1/jobs/{name}/logs?replica=build`` serves
the pod's log while it runs and this file after. The file lives as long as the job does.
"""

from __future__ import annotations

from pathlib import Path

from elasticdl.common.job_dir import write_atomically

MAX_LOG_BYTES = 2 << 20
BUILD_REPLICA = "build"  # the logs API's name for a job's image build


def dropped_note(count: int) -> str:
    return f"[elasticdl: the first {count} bytes of this build's log were not kept]\n"


class BuildLogs:
    """The kept logs, one file per (user, job); writes are atomic (tmp + rename)."""

    def __init__(self, root: Path, max_bytes: int = MAX_LOG_BYTES) -> None:
        self.root = root
        self.max_bytes = max_bytes

    def path(self, owner: str, job_name: str) -> Path:
        return self.root / owner / f"{job_name}.log"

    def keep(self, owner: str, job_name: str, text: str) -> None:
        data = text.encode("utf-8", errors="replace")
        if len(data) > self.max_bytes:
            cut = len(data) - self.max_bytes
            # Start at a line's beginning where one is near, so no line is cut in two.
            newline = data.find(b"\n", cut, cut + 4096)
            if newline >= 0:
                cut = newline + 1
            data = dropped_note(cut).encode() + data[cut:]
        path = self.path(owner, job_name)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, data)

    def read(self, owner: str, job_name: str) -> str | None:
        try:
            return self.path(owner, job_name).read_bytes().decode("utf-8", errors="replace")
        except FileNotFoundError:
            return None

    def remove(self, owner: str, job_name: str) -> None:
        self.path(owner, job_name).unlink(missing_ok=True)
