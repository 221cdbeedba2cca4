"""Workers ended from outside and workers waiting, on a real kube-apiserver.

1. Preemption and eviction never use the relaunch budget: the master's replica manager and
   Kubernetes platform run sleeper workers (process kubelet); this test STANDS IN FOR THE
   SCHEDULER AND THE TAINT MANAGER, which this tier does not run: it records the Event each
   records on its victim (``Preempted`` from default-scheduler, ``TaintManagerEviction``
   from the taint controller) and deletes the pod as each does (graceful). The eviction's
   pod keeps a finalizer, standing in for a lost node: its pod stays Terminating, as one on a
   node whose kubelet is gone does. The relaunch budget is 0, so only a cause read from the
   Events relaunches a worker; a plain deletion by someone else does not. The lead's
   real-cluster tests run the real scheduler's preemption.
2. Pending visibility: the real master (``Job`` in this process) in a namespace no kubelet
   serves, so its workers stay Pending; the test writes the ``PodScheduled=False`` condition
   the scheduler would. The reason reaches the master's published status, ``elasticdl
   status`` / ``list`` (read from the master pod's annotation by the client) and the status
   the job server's dashboard is given.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import pytest
from elasticdl.k8s.client import K8sClient
from elasticdl.k8s.names import master_pod_name, pod_name
from elasticdl.k8s.pods import PodTemplate, build_pod
from elasticdl.master.replica_manager import ReplicaManager, ReplicaManagerConfig
from elasticdl.master.task_manager import TaskManager, TaskManagerConfig
from elasticdl.platform.base import LaunchSpec, ReplicaType
from elasticdl.platform.kubernetes import NETWORK_HOST, KubernetesPlatform
from elasticdl_tests.waiting import wait_for

JOB = "disrupt"
SLEEPER = "elasticdl_tests.k8s.sleeper"
W = ReplicaType.WORKER
WHY = "0/2 nodes are available: 2 Insufficient cpu."
# What keeps the pod of a "lost node" Terminating (removed by the test at the end).
FINALIZER = "elasticdl.test/lost-node"


def _record_event(k8s: K8sClient, pod, reason: str, message: str, component: str) -> None:
    """The Event the scheduler (or the taint manager) records on the pod it deletes."""
    from kubernetes import client

    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    event = client.CoreV1Event(
        metadata=client.V1ObjectMeta(name=f"{pod.metadata.name}.{uuid.uuid4().hex[:12]}"),
        involved_object=client.V1ObjectReference(
            api_version="v1",
            kind="Pod",
            name=pod.metadata.name,
            namespace=pod.metadata.namespace,
            uid=pod.metadata.uid,
        ),
        reason=reason,
        message=message,
        type="Normal",
        source=client.V1EventSource(component=component),
        first_timestamp=now,
        last_timestamp=now,
        count=1,
    )
    k8s.core.create_namespaced_event(k8s.namespace, event)


def _owner(k8s: K8sClient) -> None:
    k8s.create_pod(
        build_pod(
            PodTemplate(namespace=k8s.namespace),
            name=master_pod_name(JOB),
            job_name=JOB,
            replica_type="master",
            replica_id=0,
            image="local/elasticdl:test",
            command=["python", "-c", "pass"],
        )
    )


def test_preempted_and_evicted_workers_are_relaunched_without_the_budget(
    k8s, served_namespace, kubelet
):
    _owner(k8s)
    platform = KubernetesPlatform(
        JOB, k8s, image="local/elasticdl:test", network=NETWORK_HOST, master_host="127.0.0.1"
    )
    tm = TaskManager(TaskManagerConfig(records_per_task=10), training_shards=[("d", 0, 100)])
    rm = ReplicaManager(
        platform,
        ReplicaManagerConfig(num_ps=0, num_workers=3, relaunch_on_worker_failure=0),
        lambda i: LaunchSpec(W, i, module=SLEEPER, args=["--seconds", "3600"]),
        lambda i: pytest.fail("no PS in this job"),
        tm,
    )
    evicted_name = pod_name(JOB, "worker", 1)

    def workers() -> dict:
        return {s.replica_id: s for s in rm.replicas() if s.replica_type == W}

    def phases() -> str:
        return str({i: (str(s.phase), s.reason, s.ended_by) for i, s in workers().items()})

    try:
        rm.start()
        wait_for(
            lambda: all(str(s.phase) == "Running" for s in workers().values()),
            60,
            "three running workers",
            phases,
        )
        held = {i: tm.get(i).task_id for i in range(3)}  # each worker holds a task

        # The scheduler preempts worker 0 for a higher-priority pod.
        victim = k8s.get_pod(pod_name(JOB, "worker", 0))
        _record_event(
            k8s,
            victim,
            "Preempted",
            f"Preempted by {k8s.namespace}/online-0 on node process-node",
            "default-scheduler",
        )
        k8s.delete_pod(victim.metadata.name)  # graceful, as the scheduler deletes
        wait_for(lambda: 3 in workers(), 60, "worker 0's replacement", phases)
        w0 = workers()[0]
        assert (str(w0.phase), w0.reason, w0.ended_by, w0.replaced_by) == (
            "Deleted",
            "Preempted",
            "preempted",
            3,
        )
        assert workers()[3].relaunch_count == 0  # the budget (0) is untouched
        assert tm.get(3).task_id == held[0]  # its task went back to the queue

        # Worker 1's node is lost: the taint manager deletes its pod, which stays Terminating.
        k8s.core.patch_namespaced_pod(
            evicted_name, k8s.namespace, {"metadata": {"finalizers": [FINALIZER]}}
        )
        evicted = k8s.get_pod(evicted_name)
        _record_event(
            k8s,
            evicted,
            "TaintManagerEviction",
            f"Marking for deletion Pod {k8s.namespace}/{evicted_name}",
            "taint-controller",
        )
        k8s.delete_pod(evicted_name)
        wait_for(lambda: 4 in workers(), 60, "worker 1's replacement", phases)
        assert k8s.get_pod(evicted_name).metadata.deletion_timestamp is not None  # still there
        w1 = workers()[1]
        assert (w1.reason, w1.ended_by, w1.replaced_by) == ("Evicted", "evicted", 4)
        assert tm.get(4).task_id == held[1]

        # Someone else deletes worker 2 without a cause (kubectl delete, a drain on a cluster
        # without disruption conditions): it ends on SIGTERM, which only comes from outside, so
        # it is relaunched without the budget; its status names no cause.
        k8s.delete_pod(pod_name(JOB, "worker", 2))
        wait_for(lambda: 5 in workers(), 60, "worker 2's replacement", phases)
        w2 = workers()[2]
        assert (str(w2.phase), w2.exit_code, w2.ended_by, w2.replaced_by) == (
            "Deleted",
            143,
            "",
            5,
        ), phases()
        assert workers()[5].relaunch_count == 0
    finally:
        rm.stop()
        if k8s.get_pod(evicted_name) is not None:
            k8s.core.patch_namespaced_pod(
                evicted_name, k8s.namespace, {"metadata": {"finalizers": None}}
            )


def _records(directory: Path, count: int) -> str:
    from elasticdl.data.recordio import Writer

    directory.mkdir()
    with Writer(str(directory / "data-00000.rio")) as w:
        for i in range(count):
            w.write(b"record-%d" % i)
    return str(directory)


def test_pending_workers_and_why_reach_status_and_list(k8s_cluster, k8s, namespace, tmp_path):
    pytest.importorskip("tensorflow")
    import mnist.mnist_functional_api
    from elasticdl.client.output import jobs_table, status_text
    from elasticdl.common.job_spec import spec_from_values
    from elasticdl.jobs.k8s_backend import KubernetesBackend
    from elasticdl.master.job import Job
    from elasticdl.platform.local import pick_free_port

    zoo = Path(mnist.mnist_functional_api.__file__).resolve().parent.parent
    spec, _ = spec_from_values(
        "train",
        {
            "job_name": JOB,
            "image_name": "local/elasticdl:test",
            "platform": "kubernetes",
            "namespace": namespace,
            "model_zoo": str(zoo),
            "model_def": "mnist.mnist_functional_api.custom_model",
            "training_data": _records(tmp_path / "train", 64),
            "num_workers": 3,
            "num_ps_pods": 1,
            "relaunch_on_worker_failure": 0,
            "port": pick_free_port(),
        },
    ).resolve(check_local_paths=False)
    _owner(k8s)  # the master pod the client would have created; its annotation is the status
    platform = KubernetesPlatform(
        job_name=spec.job_name,
        k8s=k8s,
        image=spec.image_name,
        template=PodTemplate.from_spec(spec),
        network=NETWORK_HOST,
    )
    job = Job(spec, platform=platform)
    runner = threading.Thread(target=job.run, daemon=True)
    runner.start()
    backend = KubernetesBackend(namespace=namespace, k8s=k8s)
    try:
        wait_for(
            lambda: len([p for p in k8s.list_pods() if "-worker-" in p.metadata.name]) == 3,
            60,
            "three worker pods",
        )
        # The scheduler cannot place workers 1 and 2 (this stands in for it).
        for i in (1, 2):
            k8s.patch_pod_status(
                pod_name(JOB, "worker", i),
                {
                    "conditions": [
                        {
                            "type": "PodScheduled",
                            "status": "False",
                            "reason": "Unschedulable",
                            "message": WHY,
                            "lastTransitionTime": time.strftime(
                                "%Y-%m-%dT%H:%M:%SZ", time.gmtime()
                            ),
                        }
                    ]
                },
                missing_ok=False,
            )

        def published():
            status = backend.status(JOB)
            pending = status.workers()["Pending"]
            return status if sum(r.waiting_message == WHY for r in pending) == 2 else None

        status = wait_for(published, 60, "the scheduler's reason in the published status")
        text = status_text(status)
        assert "Workers:     0 running, 3 pending" in text, text
        assert f"pending worker-1, worker-2: Unschedulable: {WHY}" in text, text
        (row,) = jobs_table(backend.list_jobs()).splitlines()[1:]
        assert "0/3 (3 pending)" in row, row

        # The scheduler preempts worker 0 (Pending here: deleted at once): it comes back as
        # worker 3 without using the budget (0), and the status says so.
        victim = k8s.get_pod(pod_name(JOB, "worker", 0))
        _record_event(k8s, victim, "Preempted", "Preempted by x/online-0", "default-scheduler")
        k8s.delete_pod(victim.metadata.name)

        def preempted():
            status = backend.status(JOB)
            replicas = {r.name: r for r in status.replicas}
            w0 = replicas.get("worker-0")
            return status if w0 and w0.ended_by == "preempted" and "worker-3" in replicas else None

        status = wait_for(preempted, 60, "worker 0 preempted and relaunched as worker 3")
        text = status_text(status)
        assert "ended from outside: 1 preempted" in text, text
    finally:
        job.cancel()
        runner.join(timeout=60)
    assert not runner.is_alive()
