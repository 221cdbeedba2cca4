"""The job server as the apiserver-tier tests run it: the real ``elasticdl.server.main``,
given a reader of the stand-in kubelet's log files (``pod_log_files``) because the API
server cannot serve the logs of the pods that kubelet runs.

    python -m elasticdl_tests.k8s.server_main POD_LOG_ROOT [elasticdl server flags]
"""

from __future__ import annotations

import os
import sys

from elasticdl.server.main import main
from elasticdl_tests.k8s.pod_log_files import PodLogFiles


def entry(pod_log_root: str | os.PathLike) -> list[str]:
    """What :class:`elasticdl_testing.server_process.ServerProcess` runs (``entry=``) for a server
    whose pods' logs are files under ``pod_log_root``."""
    return [__name__, str(pod_log_root)]


if __name__ == "__main__":
    root, *flags = sys.argv[1:]
    sys.exit(main(flags, pod_logs=PodLogFiles(root)))
