"""Real parameter servers (elasticdl.ps) on 127.0.0.1 with free ports, for the worker tests."""
import pytest
from elasticdl.ps.server import PSConfig, PSServer


class PSCluster:
    def __init__(self, num_ps: int, **config):
        self.servers = []
        for i in range(num_ps):
            server = PSServer(
                PSConfig(
                    ps_id=i,
                    num_ps_pods=num_ps,
                    port=0,
                    bind_host="127.0.0.1",
                    log_every_versions=0,
                    grpc_threads=8,
                    **config,
                ),
                secret=None,  # in-process tests of the PS client; auth: elasticdl.common.auth
            )
            server.start()
            self.servers.append(server)

    @property
    def addrs(self):
        return [f"127.0.0.1:{s.port}" for s in self.servers]

    def stop(self):
        for s in self.servers:
            s.stop(grace_s=0)


@pytest.fixture
def ps_cluster():
    clusters = []

    def start(num_ps=2, **config):
        config.setdefault("use_async", True)
        config.setdefault("opt_type", "SGD")
        config.setdefault("opt_args", "learning_rate=0.1;")
        c = PSCluster(num_ps, **config)
        clusters.append(c)
        return c

    yield start
    for c in clusters:
        c.stop()
