"""A tiny progress bar on stderr (no third-party dependency).

It only draws when enabled and stderr is a terminal, so logs and CI output stay clean.
"""
from __future__ import annotations

import sys
import time
from typing import Optional, TextIO


class Progress:
    def __init__(
        self,
        total: int,
        desc: str,
        enabled: bool = True,
        stream: Optional[TextIO] = None,
        width: int = 30,
    ):
        self.stream = stream if stream is not None else sys.stderr
        isatty = getattr(self.stream, "isatty", lambda: False)
        self.enabled = bool(enabled) and isatty()
        self.total = max(int(total), 0)
        self.desc = desc
        self.width = width
        self.count = 0
        self._start = time.monotonic()
        self._last_draw = 0.0

    def update(self, n: int = 1) -> None:
        self.count += n
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last_draw >= 0.1 or self.count >= self.total:
            self._last_draw = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        frac = min(self.count / self.total, 1.0) if self.total else 1.0
        filled = int(frac * self.width)
        rate = self.count / max(now - self._start, 1e-9)
        bar = "#" * filled + "-" * (self.width - filled)
        self.stream.write(
            f"\r{self.desc} [{bar}] {self.count}/{self.total} ({frac:4.0%}) {rate:,.0f} rec/s"
        )
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self._draw(time.monotonic())
            self.stream.write("\n")
            self.stream.flush()
            self.enabled = False

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
