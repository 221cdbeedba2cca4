"""Progress display for image builds and pushes, fed with the Docker Engine API's JSON stream.

Build: one line per Dockerfile step (``[3/6] RUN pip install ...``, ``(cached)`` when the
engine reused the layer) and the output of ``RUN`` steps, indented. Push: on a terminal one
self-redrawing bar over all layers' bytes; elsewhere (CI logs) one line per layer when it is
done, so logs stay short. Both write to a text stream (stderr by default): stdout is kept for
results that scripts read (the image id, the digest).

The engine's chunks are dicts: ``{"stream": "Step 1/5 : FROM x\\n"}``, ``{"aux": {"ID": ..}}``,
``{"status": "Pushing", "id": layer, "progressDetail": {"current": n, "total": m}}``,
``{"error": msg, "errorDetail": {...}}``. Podman's Docker-compatible API says ``STEP 1/5:``.
"""

from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass, field
from typing import TextIO

_STEP = re.compile(r"^(?:Step|STEP) (\d+)/(\d+) ?: ?(.*)$")
_BUILT = re.compile(r"^Successfully built ([0-9a-f]+)$")
# Engine bookkeeping lines that say nothing to a user.
_NOISE = re.compile(
    r"^(?: ---> [0-9a-f]{6,}$| ---> Running in |Removing intermediate container"
    r"|Successfully tagged|COMMIT|--> [0-9a-f]+$)"
)


@dataclass
class BuildProgress:
    out: TextIO = field(default_factory=lambda: sys.stderr)
    steps_total: int = 0
    step: int = 0
    instruction: str = ""
    cached_steps: list[int] = field(default_factory=list)
    image_id: str = ""

    def feed(self, chunk: dict) -> None:
        aux = chunk.get("aux")
        if isinstance(aux, dict) and aux.get("ID"):
            self.image_id = aux["ID"]
        text = chunk.get("stream")
        if not isinstance(text, str):
            return
        for line in text.splitlines():
            self._line(line.rstrip())

    def _line(self, line: str) -> None:
        if not line.strip():
            return
        m = _STEP.match(line)
        if m:
            self.step, self.steps_total, self.instruction = int(m[1]), int(m[2]), m[3]
            self.out.write(f"[{self.step}/{self.steps_total}] {self.instruction}\n")
        elif line.strip() in ("---> Using cache", "--> Using cache"):
            if self.step and self.step not in self.cached_steps:
                self.cached_steps.append(self.step)
            self.out.write("      (cached)\n")
        elif _BUILT.match(line):
            self.image_id = self.image_id or _BUILT.match(line)[1]
        elif not _NOISE.match(line):
            self.out.write(f"      | {line}\n")
        self.out.flush()

    @property
    def where(self) -> str:
        """The step being run, for error messages."""
        return (
            f"at step {self.step}/{self.steps_total} ({self.instruction})"
            if self.step
            else "before the first step"
        )


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


@dataclass
class PushProgress:
    image: str
    out: TextIO = field(default_factory=lambda: sys.stderr)
    tty: bool | None = None
    min_redraw_s: float = 0.1
    layers: dict[str, str] = field(default_factory=dict)  # id -> last status
    current: dict[str, int] = field(default_factory=dict)
    total: dict[str, int] = field(default_factory=dict)
    digest: str = ""
    _last_draw: float = 0.0
    _drawn: bool = False

    def __post_init__(self) -> None:
        if self.tty is None:
            self.tty = bool(getattr(self.out, "isatty", lambda: False)())

    def feed(self, chunk: dict) -> None:
        aux = chunk.get("aux")
        if isinstance(aux, dict) and aux.get("Digest"):
            self.digest = aux["Digest"]
        status, layer = chunk.get("status"), chunk.get("id")
        if not isinstance(status, str):
            return
        if not layer:  # repository-level messages: "The push refers to ...", "v1: digest: ..."
            m = re.search(r"digest: (sha256:[0-9a-f]+)", status)
            if m:
                self.digest = self.digest or m[1]
            return
        detail = chunk.get("progressDetail") or {}
        if detail.get("total"):
            self.total[layer] = int(detail["total"])
            self.current[layer] = int(detail.get("current", 0))
        previous = self.layers.get(layer)
        self.layers[layer] = status
        done = status in ("Pushed", "Layer already exists", "Mounted from") or status.startswith(
            "Mounted from"
        )
        if done and layer in self.total:
            self.current[layer] = self.total[layer]
        if self.tty:
            self._draw(force=done)
        elif done and previous != status:
            self.out.write(f"  {layer}: {status}\n")
            self.out.flush()

    def _draw(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_draw < self.min_redraw_s:
            return
        self._last_draw = now
        total, current = sum(self.total.values()), sum(self.current.values())
        done = sum(
            1
            for s in self.layers.values()
            if s in ("Pushed", "Layer already exists") or s.startswith("Mounted")
        )
        frac = current / total if total else (done / len(self.layers) if self.layers else 0.0)
        width = 30
        bar = "#" * int(frac * width) + "." * (width - int(frac * width))
        self.out.write(
            f"\rpushing {self.image} [{bar}] {frac * 100:3.0f}% {_mb(current)}/{_mb(total)}, "
            f"{done}/{len(self.layers)} layers"
        )
        self.out.flush()
        self._drawn = True

    def finish(self) -> None:
        if self.tty and self._drawn:
            self._draw(force=True)
            self.out.write("\n")
            self.out.flush()

    @property
    def layers_pushed(self) -> int:
        return sum(1 for s in self.layers.values() if s == "Pushed")

    @property
    def layers_existing(self) -> int:
        return sum(
            1
            for s in self.layers.values()
            if s == "Layer already exists" or s.startswith("Mounted")
        )
