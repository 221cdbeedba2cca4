"""Serves the master's synchronous servicer with gRPC's asyncio server, on its own thread.

Why: with grpc's thread-pool server every call is handed from the polling thread to a pool
thread and back, and that hand-off, not the task manager, bounds how many tasks per second a
master dispatches (~1,000/s on 2 cores). The asyncio server runs handlers on its event loop.
`get_task`, `report_task_result`, their combination `report_task_result_and_get_task` and
`lease_tasks` (short, lock-protected bookkeeping) run right there; every other method may take
longer (metrics computation, status snapshots, rendezvous waits) and runs in a thread pool, so
it never stalls the loop.

The servicer keeps its synchronous interface (`method(request, context)`, errors through
`context.abort(code, details)`), so the same class also runs under a plain `grpc.server`.
"""
from __future__ import annotations

import asyncio
import logging
import threading
from concurrent import futures

import grpc
from elasticdl.common import auth

logger = logging.getLogger(__name__)

# Handlers cheap enough to run on the event loop itself.
INLINE_METHODS = frozenset(
    {"get_task", "report_task_result", "report_task_result_and_get_task", "lease_tasks"}
)


class _Abort(Exception):
    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(details)
        self.code, self.details = code, details


class _SyncContext:
    """A synchronous ServicerContext over an asyncio one: `abort` raises (as in sync gRPC),
    everything else (peer, invocation_metadata, ...) is the asyncio context's."""

    def __init__(self, context):
        self._context = context

    def abort(self, code, details=""):
        raise _Abort(code, details)

    def __getattr__(self, name):
        return getattr(self._context, name)


def _async_handler(method, inline: bool, pool: futures.Executor, secret: str | None):
    async def handle(request, context):
        # The job secret is checked here, in the handler the call runs anyway: an asyncio
        # interceptor would add a coroutine per call (a fifth of the dispatch rate).
        if secret is not None and not auth.carries_secret(context.invocation_metadata(), secret):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, auth.DENIED)
        shim = _SyncContext(context)
        try:
            if inline:
                return method(request, shim)
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(pool, method, request, shim)
        except _Abort as e:
            await context.abort(e.code, e.details)

    return handle


class _AsyncAdapter:
    """Has an async method for every RPC the sync servicer implements."""

    def __init__(self, servicer, rpc_names, pool, secret: str | None):
        for name in rpc_names:
            method = getattr(servicer, name)
            setattr(self, name, _async_handler(method, name in INLINE_METHODS, pool, secret))


class AsyncServer:
    """Runs a `grpc.aio.server` on a private event loop thread; `stop()` / `wait_for_termination`
    behave like `grpc.Server`'s."""

    def __init__(
        self, add_servicer_fn, servicer, rpc_names, options, threads: int, secret: str | None
    ):
        self._pool = futures.ThreadPoolExecutor(
            max_workers=threads, thread_name_prefix="master-rpc"
        )
        self._adapter = _AsyncAdapter(servicer, rpc_names, self._pool, secret)
        self._add = add_servicer_fn
        self._options = options
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="master-grpc-aio", daemon=True
        )
        self._thread.start()
        self._server = self._run(self._create())
        self._stopped = threading.Event()

    def _run(self, coro, timeout=None):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _create(self):
        server = grpc.aio.server(options=self._options)
        self._add(self._adapter, server)
        return server

    def add_insecure_port(self, address: str) -> int:
        return self._run(self._add_port(address))

    async def _add_port(self, address):
        return self._server.add_insecure_port(address)

    def add_secure_port(self, address: str, credentials) -> int:
        return self._run(self._add_secure_port(address, credentials))

    async def _add_secure_port(self, address, credentials):
        return self._server.add_secure_port(address, credentials)

    def start(self) -> None:
        self._run(self._server.start())

    def stop(self, grace=None) -> threading.Event:
        if not self._stopped.is_set():
            try:
                self._run(self._server.stop(grace), timeout=(grace or 0) + 10)
            except Exception as e:  # noqa: BLE001 - stopping must not fail the caller
                logger.warning("Stopping the master gRPC server: %s", e)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._stopped.set()
        return self._stopped

    def wait_for_termination(self, timeout=None) -> bool:
        return not self._stopped.wait(timeout)
