"""The shared-memory regions workers attached to this PS (see elasticdl.common.shared_memory).

A region is found by the id the PS gave it; ids are random 63-bit numbers, so a relaunched PS
never mistakes an id of its predecessor for one of its own (it answers FAILED_PRECONDITION and
the worker attaches again). Each worker holds at most one region here: attaching again (after
its model changed, say) replaces the old one. A region no push used for `idle_expiry_s` (its
worker died without detaching) is unmapped at the next attach, so memory held for dead workers
is bounded.
"""
from __future__ import annotations

import logging
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, Optional

from elasticdl.common.shared_memory import SharedRegion
from elasticdl.ps.errors import RegionNotAttachedError

logger = logging.getLogger(__name__)

DEFAULT_IDLE_EXPIRY_S = 600.0


@dataclass
class _Entry:
    region: SharedRegion
    worker_id: int
    last_used: float


class SharedRegions:
    def __init__(
        self,
        idle_expiry_s: float = DEFAULT_IDLE_EXPIRY_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.idle_expiry_s = idle_expiry_s
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: Dict[int, _Entry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, region: SharedRegion, worker_id: int) -> int:
        """Keep `region` for `worker_id` (replacing that worker's previous one); its new id."""
        now = self._clock()
        with self._lock:
            stale = [
                rid
                for rid, e in self._entries.items()
                if e.worker_id == worker_id or now - e.last_used > self.idle_expiry_s
            ]
            for rid in stale:
                self._entries.pop(rid).region.close()
            region_id = secrets.randbits(63) or 1
            while region_id in self._entries:
                region_id = secrets.randbits(63) or 1
            self._entries[region_id] = _Entry(region, worker_id, now)
        if stale:
            logger.info("unmapped %d shared-memory region(s) replaced or idle", len(stale))
        return region_id

    def get(self, region_id: int) -> SharedRegion:
        with self._lock:
            entry = self._entries.get(region_id)
            if entry is None:
                raise RegionNotAttachedError(
                    f"shared-memory region {region_id} is not attached on this PS (it was "
                    "relaunched or the region expired): attach it again"
                )
            entry.last_used = self._clock()
            return entry.region

    def remove(self, region_id: int) -> Optional[SharedRegion]:
        with self._lock:
            entry = self._entries.pop(region_id, None)
        if entry is not None:
            entry.region.close()
            return entry.region
        return None

    def close(self) -> None:
        with self._lock:
            entries, self._entries = list(self._entries.values()), {}
        for e in entries:
            e.region.close()
