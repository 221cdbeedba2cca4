"""STAND-IN for the Kubernetes API's pod logs, for tests only: the logs of pods that the
stand-in kubelet (``process_kubelet``) ran, read from its files.

The API server serves a pod's log by asking the pod's kubelet over the kubelet's port; the
stand-in kubelet has none, so it writes each pod's stdout+stderr to
``<root>/<namespace>/<pod>.log`` and the tests give this reader to what reads pod logs (the
Kubernetes backend, the job server: ``elasticdl_tests.k8s.server_main``). One file holds the
whole pod's output: containers are not told apart.
"""

from __future__ import annotations

import codecs
import os
import time
from pathlib import Path
from typing import Callable, Iterator, Sequence

from elasticdl.k8s.pod_logs import POLL_SECONDS, PodLogs, pod_ended


class PodLogFiles(PodLogs):
    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)

    def path(self, namespace: str, pod: str) -> Path:
        return self.root / namespace / f"{pod}.log"

    def read(self, k8s, pod: str, containers: Sequence[str] = ()) -> str | None:
        try:
            return self.path(k8s.namespace, pod).read_bytes().decode("utf-8", errors="replace")
        except FileNotFoundError:
            return None

    def follow(
        self,
        k8s,
        pod: str,
        containers: Sequence[str] = (),
        active: Callable[[], bool] = lambda: True,
    ) -> Iterator[str]:
        path = self.path(k8s.namespace, pod)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        offset = 0
        while True:
            # Ended is seen before the last read, so that read has all the pod wrote.
            ended = not active() or _ended(k8s, pod)
            try:
                with open(path, "rb") as f:
                    f.seek(offset)
                    data = f.read()
            except FileNotFoundError:
                data = b""
            offset += len(data)
            text = decoder.decode(data, final=ended)
            if text:
                yield text
            if ended:
                return
            time.sleep(POLL_SECONDS)


def _ended(k8s, pod: str) -> bool:
    try:
        return pod_ended(k8s.get_pod(pod))
    except Exception:  # the API server away for a moment: not ended
        return False
