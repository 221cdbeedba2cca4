"""Best-effort, non-blocking reports from a PS to the master: `report_version` and, every
few seconds, `report_ps_load`.

The master starts an evaluation round when a PS reports a version that is a multiple of
`--evaluation_steps`, and sizes a `--num_workers=auto` job by the PS's load
(elasticdl.ps.load_meter). Gradient pushes must never wait on the master, so reports go through
a bounded queue served by one daemon thread, which also sends the load when it has been idle
for `load_interval_s`; failures are logged (rate-limited), never raised.
"""
from __future__ import annotations

import logging
import queue
import threading
import time

import grpc
from elasticdl.common import auth, tls
from elasticdl.common.process_cpu import own_cpu_seconds
from elasticdl.proto import elasticdl_pb2 as pb
from elasticdl.proto import elasticdl_pb2_grpc as pb_grpc
from elasticdl.ps.load_meter import LoadMeter

logger = logging.getLogger(__name__)

_STOP = object()


class MasterReporter:
    def __init__(
        self,
        master_addr: str,
        ps_id: int,
        timeout_s: float = 10.0,
        max_pending: int = 64,
        secret: str | None = None,
        tls_config: tls.TLS | None = None,
        load_meter: LoadMeter | None = None,
        load_interval_s: float = 2.0,
    ):
        self.master_addr = master_addr
        self.secret = secret
        self.tls_config = tls_config
        self.ps_id = ps_id
        self.timeout_s = timeout_s
        self.load_meter = load_meter
        self.load_interval_s = load_interval_s
        self.loads_reported = 0
        self._queue: queue.Queue = queue.Queue(maxsize=max_pending)
        self._thread = threading.Thread(target=self._run, name="ps-master-reporter", daemon=True)
        self._last_warning = 0.0
        self.reported: list[int] = []  # versions the master acknowledged, for logs and tests
        self._thread.start()

    def report_version(self, version: int) -> None:
        try:
            self._queue.put_nowait(int(version))
        except queue.Full:
            self._warn(f"dropping report of version {version}: master {self.master_addr} is slow")

    def close(self, timeout_s: float = 5.0) -> None:
        """Send what is queued (within timeout_s), then stop the thread."""
        try:
            self._queue.put(_STOP, timeout=timeout_s)
        except queue.Full:
            pass
        self._thread.join(timeout_s)

    def _warn(self, message: str) -> None:
        now = time.monotonic()
        if now - self._last_warning > 30.0:
            self._last_warning = now
            logger.warning("PS %d: %s", self.ps_id, message)

    def _run(self) -> None:
        channel = tls.channel(self.master_addr, [], self.tls_config)
        if self.secret is not None:
            channel = auth.authenticated_channel(channel, self.secret)
        stub = pb_grpc.MasterStub(channel)
        try:
            next_load = time.monotonic() + self.load_interval_s
            while True:
                wait = max(0.0, next_load - time.monotonic()) if self.load_meter else None
                try:
                    item = self._queue.get(timeout=wait)
                except queue.Empty:
                    next_load = time.monotonic() + self.load_interval_s
                    self._report_load(stub)
                    continue
                if item is _STOP:
                    return
                try:
                    stub.report_version(
                        pb.ReportVersionRequest(model_version=item, ps_id=self.ps_id),
                        timeout=self.timeout_s,
                    )
                    self.reported.append(item)
                    logger.debug("PS %d reported version %d to the master", self.ps_id, item)
                except grpc.RpcError as e:
                    self._warn(
                        f"report_version({item}) to master {self.master_addr} failed: "
                        f"{e.code().name} {e.details()}"
                    )
        finally:
            channel.close()

    def _report_load(self, stub) -> None:
        load = self.load_meter.window()
        try:
            stub.report_ps_load(
                pb.ReportPSLoadRequest(
                    ps_id=self.ps_id,
                    window_seconds=load.window_s,
                    cpu_fraction=load.cpu_fraction,
                    lock_busy_fraction=load.lock_busy_fraction,
                    lock_wait_ms=load.lock_wait_ms,
                    requests=load.requests,
                    cpu_seconds=own_cpu_seconds(),
                ),
                timeout=self.timeout_s,
            )
            self.loads_reported += 1
        except grpc.RpcError as e:
            self._warn(
                f"report_ps_load to master {self.master_addr} failed: "
                f"{e.code().name} {e.details()}"
            )
