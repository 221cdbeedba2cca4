"""The master's gRPC server: thread pool of 64; requests capped at what the job sends (an
evaluation task's outputs travel in one message: elasticdl.common.message_caps)."""

from __future__ import annotations

import logging
from concurrent import futures

import grpc
from elasticdl.common import auth, message_caps, tls
from elasticdl.master.aio_server import AsyncServer
from elasticdl.proto import elasticdl_pb2 as pb
from elasticdl.proto import elasticdl_pb2_grpc as pb_grpc

logger = logging.getLogger(__name__)

GRPC_MAX_MESSAGE_BYTES = message_caps.TRANSPORT_MAX_BYTES
GRPC_THREADS = 64


class MasterServerError(RuntimeError):
    pass


def create_master_server(
    servicer: pb_grpc.MasterServicer,
    port: int,
    bind_host: str = "0.0.0.0",
    use_asyncio: bool = True,
    *,
    secret: str | None,
    max_message_bytes: int = GRPC_MAX_MESSAGE_BYTES,
    tls_config: tls.TLS | None = None,
) -> tuple[grpc.Server, int]:
    """Start serving ``servicer`` on ``bind_host:port`` (port 0 = any free port).

    ``secret``: the job's secret, which every call must carry (``elasticdl.common.auth``);
    None serves without authentication, for tests that drive a servicer in-process only.
    ``use_asyncio``: serve with grpc's asyncio server (see ``aio_server``, about twice the
    dispatch rate) instead of the thread-pool server.
    ``max_message_bytes``: the largest request accepted (``message_caps.master_cap``); gRPC
    answers larger ones RESOURCE_EXHAUSTED before any servicer code runs.
    ``tls_config``: serve mutual TLS (``elasticdl.common.tls``) instead of plain TCP.

    Returns the started server and the port it is bound to.
    """
    options = [
        ("grpc.max_send_message_length", GRPC_MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", int(max_message_bytes)),
        # One master per port: fail loudly instead of sharing it with a stale master.
        ("grpc.so_reuseport", 0),
    ]
    if use_asyncio:
        rpcs = [m.name for m in pb.DESCRIPTOR.services_by_name["Master"].methods]
        server = AsyncServer(
            pb_grpc.add_MasterServicer_to_server, servicer, rpcs, options, GRPC_THREADS, secret
        )
    else:
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=GRPC_THREADS, thread_name_prefix="master-rpc"),
            options=options,
            interceptors=[auth.TokenServerInterceptor(secret)] if secret is not None else [],
        )
        pb_grpc.add_MasterServicer_to_server(servicer, server)
    host = f"[{bind_host}]" if ":" in bind_host and not bind_host.startswith("[") else bind_host
    try:
        bound = tls.add_port(server, f"{host}:{port}", tls_config)
    except RuntimeError as e:  # grpc raises RuntimeError when it cannot bind
        bound = 0
        cause = e
    else:
        cause = None
    if not bound:
        raise MasterServerError(
            f"cannot listen on {host}:{port} (port in use?): pass another --port"
        ) from cause
    server.start()
    logger.info("Master gRPC server listening on %s:%d", host, bound)
    return server, bound
