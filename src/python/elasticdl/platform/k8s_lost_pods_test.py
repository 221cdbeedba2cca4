"""The lost-pod rule on its own clock: a pod is force-deleted only once it is past its deletion
deadline and the margin, only if it is still the same pod, and never when it was not being
deleted. (Against a real API server with a kubelet that dies:
tests/python/elasticdl_tests/k8s/platform_test.py.)"""

from __future__ import annotations

import datetime
import threading
from types import SimpleNamespace

from elasticdl.platform.k8s_lost_pods import LostPodReaper

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)


def _pod(name: str, uid: str, deleting_at: datetime.datetime | None):
    return SimpleNamespace(
        metadata=SimpleNamespace(name=name, uid=uid, deletion_timestamp=deleting_at),
        spec=SimpleNamespace(node_name="node-2"),
    )


class _K8s:
    def __init__(self) -> None:
        self.pods: dict[str, object] = {}
        self.deleted: list[tuple[str, float | None]] = []

    def get_pod(self, name):
        return self.pods.get(name)

    def delete_pod(self, name, grace_seconds=None):
        self.deleted.append((name, grace_seconds))
        self.pods.pop(name, None)
        return True


def _reaper(k8s, now):
    stopped = threading.Event()
    stopped.set()  # no sweeping thread: the test sweeps
    lost: list[str] = []
    reaper = LostPodReaper(
        k8s, stopped, margin_seconds=15, clock=lambda: now[0], on_lost=lost.append
    )
    return reaper, lost


def test_a_pod_past_its_deadline_and_the_margin_is_force_deleted_once():
    k8s, now = _K8s(), [T0]
    reaper, lost = _reaper(k8s, now)
    pod = _pod("w-1", "u1", T0 + datetime.timedelta(seconds=30))
    k8s.pods["w-1"] = pod
    reaper.saw("MODIFIED", pod)
    now[0] = T0 + datetime.timedelta(seconds=44)
    reaper.sweep()
    assert k8s.deleted == [] and lost == []  # a live kubelet may still confirm
    now[0] = T0 + datetime.timedelta(seconds=45)
    reaper.sweep()
    assert k8s.deleted == [("w-1", 0)] and lost == ["u1"] and reaper.force_deleted == ["w-1"]
    reaper.sweep()
    assert k8s.deleted == [("w-1", 0)]


def test_pods_not_being_deleted_gone_or_replaced_are_left_alone():
    k8s, now = _K8s(), [T0 + datetime.timedelta(hours=1)]
    reaper, lost = _reaper(k8s, now)
    running = _pod("w-1", "u1", None)
    k8s.pods["w-1"] = running
    reaper.saw("MODIFIED", running)
    confirmed = _pod("w-2", "u2", T0)
    reaper.saw("MODIFIED", confirmed)
    reaper.saw("DELETED", confirmed)  # its kubelet confirmed
    replaced = _pod("ps-0", "old", T0)
    reaper.saw("MODIFIED", replaced)
    k8s.pods["ps-0"] = _pod("ps-0", "new", None)  # the same name, another pod
    reaper.sweep()
    assert k8s.deleted == [] and lost == []
    assert reaper.due() == []
