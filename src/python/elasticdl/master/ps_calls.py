"""The master's own calls to its parameter servers (changing the PS set, master.ps_rescale):
write a shard of the snapshot, and wait until a new PS answers. Authenticated with the job's
secret like every replica's call, over the job's TLS when it has certificates."""

from __future__ import annotations

import grpc
from elasticdl.common import auth, tls
from elasticdl.proto import elasticdl_pb2 as pb
from elasticdl.proto import elasticdl_pb2_grpc as pb_grpc

# A shard write is bounded by the disk, not the network: generous.
SAVE_TIMEOUT_S = 600.0


class PSCalls:
    def __init__(self, secret: str, tls_config: tls.TLS | None = None) -> None:
        self._secret = secret
        self._tls = tls_config

    def _channel(self, addr: str) -> grpc.Channel:
        return tls.channel(addr, [], self._tls)

    def save_shard(self, addr: str, as_version: int = 0) -> int:
        """The PS at ``addr`` writes its shard to its checkpoint directory (as model version
        ``as_version`` unless 0); returns the version written."""
        with self._channel(addr) as channel:
            stub = pb_grpc.PserverStub(auth.authenticated_channel(channel, self._secret))
            answer = stub.save_checkpoint(
                pb.SaveCheckpointRequest(as_version=as_version), timeout=SAVE_TIMEOUT_S
            )
            return int(answer.version)

    def wait_ready(self, addr: str, timeout: float) -> None:
        """Until the PS at ``addr`` listens (it restores its shard before it does); raises
        ``TimeoutError`` after ``timeout`` seconds."""
        with self._channel(addr) as channel:
            try:
                grpc.channel_ready_future(channel).result(timeout=timeout)
            except grpc.FutureTimeoutError:
                raise TimeoutError(f"PS at {addr} did not answer in {timeout:.0f} s") from None
