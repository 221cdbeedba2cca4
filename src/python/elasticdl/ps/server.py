"""Assembles one parameter server process: model state, optimizer, update policy, checkpoints,
master reports and the gRPC server.

On start the PS restores from `--checkpoint_dir_for_init` if given, else from the newest valid
checkpoint in `--checkpoint_dir` (how a relaunched PS recovers after being killed); otherwise it
waits for a worker to push the initial model.
"""
from __future__ import annotations

import logging
from concurrent import futures
from dataclasses import dataclass, fields

import grpc
from elasticdl.common import auth, message_caps, tls
from elasticdl.common.replica_spec import PSSpec
from elasticdl.proto import elasticdl_pb2_grpc as pb_grpc
from elasticdl.ps import checkpoint, memory_fit
from elasticdl.ps.checkpointer import CheckpointConfig, Checkpointer
from elasticdl.ps.errors import PSError
from elasticdl.ps.load_meter import LoadMeter
from elasticdl.ps.master_reporter import MasterReporter
from elasticdl.ps.optimizer import Optimizer, parse_optimizer_config
from elasticdl.ps.parameters import Parameters
from elasticdl.ps.request_cap import RequestCap
from elasticdl.ps.servicer import PserverServicer, wire_handlers
from elasticdl.ps.updater import ParameterServer, UpdatePolicy

logger = logging.getLogger(__name__)

GRPC_MAX_MESSAGE_BYTES = message_caps.TRANSPORT_MAX_BYTES


@dataclass(frozen=True)
class PSConfig(PSSpec):
    """A PS server's configuration: the spec the master derived (see ``PSSpec`` for each
    field) plus what only the process hosting the server chooses."""

    grpc_threads: int = 64

    @classmethod
    def from_spec(cls, spec: PSSpec, **extra) -> "PSConfig":
        return cls(**{f.name: getattr(spec, f.name) for f in fields(spec)}, **extra)

    def __post_init__(self):
        super().__post_init__()
        if self.num_ps_pods < 1:
            raise PSError(f"--num_ps_pods must be >= 1, got {self.num_ps_pods}")
        if not 0 <= self.ps_id < self.num_ps_pods:
            raise PSError(f"--ps_id must be in [0, {self.num_ps_pods}), got {self.ps_id}")
        if not 0 <= self.port < 65536:
            raise PSError(f"--port must be in [0, 65535], got {self.port}")
        if self.evaluation_steps < 0:
            raise PSError(f"--evaluation_steps must be >= 0, got {self.evaluation_steps}")


def _bind_address(host: str, port: int) -> str:
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # IPv6 literal such as "::"
    return f"{host}:{port}"


class PSServer:
    def __init__(self, config: PSConfig, *, secret: str | None):
        """``secret``: the job's secret, which every call must carry (and which the PS's own
        reports to the master carry); None serves without authentication, for tests that
        drive a PS in-process only."""
        self.secret = secret
        self.config = config
        c = config
        self.optimizer = Optimizer(parse_optimizer_config(c.opt_type, c.opt_args))
        self.policy = UpdatePolicy(
            use_async=c.use_async,
            grads_to_wait=c.grads_to_wait,
            lr_staleness_modulation=c.lr_staleness_modulation,
            sync_version_tolerance=c.sync_version_tolerance,
        )
        self.checkpointer = Checkpointer(
            CheckpointConfig(c.checkpoint_dir, c.checkpoint_steps, c.keep_checkpoint_max),
            c.ps_id,
            c.num_ps_pods,
        )
        try:
            self.tls = tls.TLS.of(c)
        except tls.TLSError as e:
            raise PSError(str(e)) from None
        self.params = Parameters(c.ps_id, c.num_ps_pods)
        self.params.check_new_tables = self._check_tables_fit
        self._last_periodic_save = 0  # the version of this run's newest periodic checkpoint
        self.ps = ParameterServer(
            self.params, self.optimizer, self.policy, self._on_version, self._on_state
        )
        # Versions for evaluation rounds, the load for --num_workers=auto.
        self.reporter = (
            MasterReporter(
                c.master_addr,
                c.ps_id,
                secret=secret,
                tls_config=self.tls,
                load_meter=LoadMeter(self.ps.lock),
            )
            if c.master_addr
            else None
        )
        self.restored_from = self._restore()
        self.request_cap = RequestCap(self.params, c.minibatch_size)
        self.servicer = PserverServicer(
            self.ps,
            self.checkpointer,
            request_cap=self.request_cap,
            # The stream channel's frames are not encrypted: none for a job with TLS.
            stream_host=None if self.tls is not None else config.bind_host,
        )
        self._server: grpc.Server | None = None
        self.port: int | None = None

    def _check_tables_fit(self, tables: list[memory_fit.TableDemand]) -> None:
        slots, num_ps = len(self.optimizer.slot_names), self.config.num_ps_pods
        room = memory_fit.memory_room()
        if self.config.shared_host:
            room = memory_fit.split(room, num_ps)
        memory_fit.check_fit(tables, num_ps, slots, room)

    # ------------------------------------------------------------------ start-up restore
    def _restore(self) -> str | None:
        c = self.config
        restored = None
        if c.checkpoint_dir_for_init:
            source = checkpoint.resolve_version_dir(c.checkpoint_dir_for_init)
            restored = checkpoint.restore(source, c.ps_id, c.num_ps_pods), source
        elif c.checkpoint_dir:
            restored = checkpoint.restore_newest_readable(c.checkpoint_dir, c.ps_id, c.num_ps_pods)
        if restored is None:
            logger.info("PS %d starts empty; waiting for a worker to push the model", c.ps_id)
            return None
        model, source = restored
        self.ps.restore(model)
        logger.info(
            "PS %d restored version %d from %s: %d dense parameters, %d state variables, "
            "embedding tables %s",
            c.ps_id,
            self.params.version,
            source,
            len(self.params.dense),
            len(self.params.state),
            {n: len(t) for n, t in self.params.embedding_tables.items()},
        )
        return source

    # ------------------------------------------------------------------ version hook
    def _on_version(self, version: int) -> None:
        # Runs under the model lock right after an update: only cheap work here.
        c = self.config
        if c.log_every_versions and version % c.log_every_versions == 0:
            logger.info("PS %d reached version %d", c.ps_id, version)
        if self.reporter is not None and c.evaluation_steps and version % c.evaluation_steps == 0:
            self.reporter.report_version(version)
        if self.checkpointer.due(version):
            self._last_periodic_save = version
            self.checkpointer.save_periodic(self.params)

    def _on_state(self, version: int) -> None:
        # State sent alone (a task cut short) belongs to the current version: when this run
        # checkpointed that version, write it again (replaced whole), so the checkpoint an
        # evaluation job starts from holds the statistics of every step it contains. While
        # that version's write still runs (its snapshot predates the state), once it ended.
        if version and version == self._last_periodic_save:
            self.checkpointer.save_periodic(self.params, after_write=self._rewrite_state)

    def _rewrite_state(self) -> None:
        with self.ps.lock:
            version = self.params.version
            if version == self._last_periodic_save:
                self.checkpointer.save_periodic(self.params)

    # ------------------------------------------------------------------ gRPC lifecycle
    def start(self) -> int:
        c = self.config
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=c.grpc_threads, thread_name_prefix="ps-rpc"),
            options=[
                ("grpc.max_send_message_length", GRPC_MAX_MESSAGE_BYTES),
                ("grpc.max_receive_message_length", GRPC_MAX_MESSAGE_BYTES),
            ],
            interceptors=(
                [auth.TokenServerInterceptor(self.secret)] if self.secret is not None else []
            ),
        )
        generated = message_caps.HandlerCollector()
        pb_grpc.add_PserverServicer_to_server(self.servicer, generated)
        handlers = [wire_handlers(self.servicer)] + generated.handlers  # the wire ones first
        server.add_generic_rpc_handlers((message_caps.CappedHandlers(handlers, self.request_cap),))
        address = _bind_address(c.bind_host, c.port)
        port = tls.add_port(server, address, self.tls)
        if port == 0:
            raise PSError(f"cannot listen on {address}: port in use or host not local")
        server.start()
        self._server, self.port = server, port
        logger.info(
            "PS %d of %d listening on %s (%s, optimizer %s, job %r)",
            c.ps_id,
            c.num_ps_pods,
            _bind_address(c.bind_host, port),
            "async" if self.policy.use_async else f"sync grads_to_wait={self.policy.grads_to_wait}",
            self.optimizer.config.opt_type,
            c.job_name,
        )
        return port

    def wait(self, timeout: float | None = None) -> bool:
        return self._server.wait_for_termination(timeout) if self._server else True

    def stop(self, grace_s: float = 2.0) -> None:
        if self._server is not None:
            self._server.stop(grace_s).wait()
            self._server = None
        self.servicer.close()
        self.checkpointer.close()
        if self.reporter is not None:
            self.reporter.close()
        logger.info("PS %d stopped at version %d", self.config.ps_id, self.params.version)
