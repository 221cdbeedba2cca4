import socket
import time

from elasticdl.ps.master_reporter import MasterReporter


def test_unreachable_master_never_blocks_the_caller():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    reporter = MasterReporter(f"127.0.0.1:{port}", ps_id=1, timeout_s=0.5, max_pending=2)
    start = time.monotonic()
    for version in range(10):  # more than max_pending: extra reports are dropped, not queued
        reporter.report_version(version)
    assert time.monotonic() - start < 0.5
    reporter.close(timeout_s=5)
    assert reporter.reported == []
