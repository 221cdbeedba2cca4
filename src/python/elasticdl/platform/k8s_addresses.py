"""Where each replica of a job on Kubernetes listens, by network mode:

``pod`` (default, real clusters)
    ``elasticdl-<job>-<type>-<id>.<namespace>.svc:<port>``: the headless service's DNS name,
    which a relaunched replica keeps; every pod has its own IP, so every PS listens on 2222
    and every worker on 3333.
``host`` (all pods share one network namespace, e.g. ``hostNetwork`` pods on one node)
    ``<master IP>:<port>``, a distinct free port per replica, stable for its lifetime.
"""

from __future__ import annotations

import threading

from elasticdl.k8s.names import NETWORK_HOST, service_host
from elasticdl.platform.base import PlatformError, ReplicaType

DEFAULT_PORTS = {ReplicaType.PS: 2222, ReplicaType.WORKER: 3333}


class ReplicaAddresses:
    def __init__(self, job_name: str, namespace: str, network: str, master_host: str) -> None:
        self.job_name = job_name
        self.namespace = namespace
        self.network = network
        self.master_host = master_host
        self._lock = threading.Lock()
        self._ports: dict[tuple[ReplicaType, int], int] = {}

    def port(self, key: tuple[ReplicaType, int]) -> int:
        """The replica's port: chosen once, kept across its relaunches."""
        with self._lock:
            if key not in self._ports:
                self._ports[key] = (
                    self._free_host_port()
                    if self.network == NETWORK_HOST
                    else DEFAULT_PORTS[key[0]]
                )
            return self._ports[key]

    def keep_port(self, key: tuple[ReplicaType, int], port: int) -> None:
        """The port a replica spec names (or a previous master chose) unless one is set."""
        with self._lock:
            self._ports.setdefault(key, port)

    def address(self, key: tuple[ReplicaType, int]) -> str:
        port = self.port(key)
        if self.network == NETWORK_HOST:
            return f"{self.master_host}:{port}"
        return f"{service_host(self.job_name, key[0].value, key[1], self.namespace)}:{port}"

    def reserve(self, key: tuple[ReplicaType, int], address: str) -> None:
        """Keep the address a previous master gave the replica (its peers know it)."""
        host, _, port = address.rpartition(":")
        if not port.isdigit():
            raise PlatformError(f"address {address!r} has no port")
        if self.network == NETWORK_HOST and host != self.master_host:
            raise PlatformError(
                f"address {address!r} is not on this node ({self.master_host}): the host "
                "network mode keeps addresses only on one node"
            )
        with self._lock:
            self._ports[key] = int(port)

    def _free_host_port(self) -> int:
        from elasticdl.platform.local import pick_free_port

        used = set(self._ports.values())
        port = pick_free_port(self.master_host if self.master_host != "0.0.0.0" else "127.0.0.1")
        while port in used:
            port = pick_free_port()
        return port
