"""Runs the replicas of a job as Kubernetes pods (the master's side of ElasticDL on k8s).

* PS ``i`` -> pod ``elasticdl-<job>-ps-<i>`` + headless service of the same name; worker
  ``i`` -> pod ``elasticdl-<job>-worker-<i>`` (a service too if it listens on a port), named
  and labelled by :mod:`elasticdl.k8s.names`, built by :mod:`elasticdl.k8s.pods`. All are
  owned by the master pod (``ownerReferences``), so deleting it deletes the job (for a
  restartable master, by its batch/v1 Job: see below).
* One watch thread turns the job's pod changes into replica events, one terminal event per
  pod, read by :func:`elasticdl.k8s.termination.read_termination`: ``Failed`` carries the
  container's exit code and the cause (``OOMKilled``, ``Preempted``, ``Evicted``,
  ``Error``...), a pod deleted by :meth:`delete` reports ``Deleted`` / ``DeletedByMaster``,
  one deleted by anyone else ``Deleted`` with the cause the reading finds once it is gone.
* Who ended a pod from outside is read from the pod's Events where its status does not say
  (:func:`elasticdl.platform.k8s_pod_events.cause_of_events`): ``Preempted`` (the scheduler
  deleted it for a higher-priority pod), ``Evicted`` (the taint manager deleted it from a
  lost node; the kubelet evicted it). A pod being deleted by someone else is ended as soon
  as its Events say so — its tasks go back to the queue at once, and a lost node's pod, which
  stays ``Terminating`` while its node is away, does not hold its worker forever; any other
  end by someone else is looked up once it is gone.
* A Pending pod reports the scheduler's reason for not placing it (``Unschedulable``, "0/2
  nodes are available: 2 Insufficient cpu.") with each change.

Addresses, chosen by ``network`` (``pod`` by default, ``host`` where all pods share one network
namespace): :mod:`elasticdl.platform.k8s_addresses`. Pod changes become replica events by
:mod:`elasticdl.platform.k8s_pod_events` (one terminal event per pod). A pod left
``Terminating`` by a node that died is removed by :mod:`elasticdl.platform.k8s_lost_pods`.

A restartable master (docs/architecture.md, "When the master dies") runs in the pod of a
batch/v1 Job, which then owns every pod and service this platform creates; the platform
records each replica's pod name and UID (``replica_identity``), adopts the pods that still
have both, and stops a pod under a name it never recorded (``reclaim``). Events of pods it
neither launched nor adopted are held back until ``adopt`` reports each pod's state.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import posixpath
import queue
import threading
import time
from typing import TYPE_CHECKING, Any

from elasticdl.k8s import volumes
from elasticdl.k8s.client import K8sApiError, K8sClient, KubeConfig
from elasticdl.k8s.names import (
    LABEL_STATUS,
    MASTER_TYPE,
    NETWORK_ENV,
    NETWORK_HOST,
    NETWORK_POD,
    POD_IP_ENV,
    POD_NAME_ENV,
    STATUS_ANNOTATION,
    job_labels,
    master_pod_name,
    pod_name,
    replicas_selector,
    secret_name,
)
from elasticdl.k8s.pods import PodTemplate, build_pod, build_service
from elasticdl.k8s.termination import read_termination
from elasticdl.platform.base import (
    REASON_DELETED_BY_MASTER,
    REASON_NODE_LOST,
    REASON_OOM_KILLED,
    LaunchSpec,
    Platform,
    PlatformError,
    PlatformTraits,
    ReplicaEvent,
    ReplicaPhase,
    ReplicaType,
)
from elasticdl.platform.k8s_addresses import DEFAULT_PORTS, ReplicaAddresses
from elasticdl.platform.k8s_lost_pods import DEFAULT_MARGIN_SECONDS as LOST_POD_MARGIN_SECONDS
from elasticdl.platform.k8s_lost_pods import LostPodReaper
from elasticdl.platform.k8s_pod_events import (
    OUTSIDE_CAUSES,
    PodEventTranslator,
    cause_of_events,
    events_of_pod,
)

if TYPE_CHECKING:
    from elasticdl.common.job_spec import JobSpec
    from elasticdl.common.job_status import JobStatus

logger = logging.getLogger(__name__)

__all__ = ["DEFAULT_PORTS", "NETWORK_HOST", "NETWORK_POD", "KubernetesPlatform"]
# How long launch() waits for a previous pod of the same name to go: a pod evicted from a lost
# node goes only when the lost-pod reaper removes it, its grace period (30 s by default) plus
# the reaper's margin after the eviction.
_RELAUNCH_WAIT_SECONDS = 120.0
_GONE_POLL_SECONDS = 0.2
# How often the Events of pods being deleted by someone else are read, and how long a pod
# that went without a telling Event is given for one to appear (the scheduler records its
# "Preempted" right after it asked for the deletion).
_CAUSE_POLL_SECONDS = 1.0
_CAUSE_GRACE_SECONDS = 1.0


class KubernetesPlatform(Platform):
    def __init__(
        self,
        job_name: str,
        k8s: K8sClient,
        image: str,
        template: PodTemplate | None = None,
        network: str = NETWORK_POD,
        master_pod: str | None = None,
        master_host: str | None = None,
        watch_timeout_seconds: int = 5,
        lost_pod_margin_seconds: float = LOST_POD_MARGIN_SECONDS,
    ) -> None:
        super().__init__(job_name)
        if network not in (NETWORK_POD, NETWORK_HOST):
            raise ValueError(
                f"{NETWORK_ENV}={network!r} is invalid; use '{NETWORK_POD}' or '{NETWORK_HOST}'"
            )
        self.k8s = k8s
        self.namespace = k8s.namespace
        self.image = image
        self.template = template or PodTemplate(namespace=k8s.namespace)
        self.network = network
        self.master_host = master_host or os.environ.get(POD_IP_ENV) or "127.0.0.1"
        self._lock = threading.RLock()
        self._addresses = ReplicaAddresses(job_name, k8s.namespace, network, self.master_host)
        self._pod_events = PodEventTranslator()
        self._closed = False
        self._secret_data: dict[str, str] | None = None  # what the job's Secret holds
        # The pod this master runs in: a restartable master's has a name the Job chose.
        self.master_pod = (
            master_pod
            if master_pod is not None
            else os.environ.get(POD_NAME_ENV) or master_pod_name(job_name)
        )
        self._owner = self._find_owner(self.master_pod)
        # Pods launched or adopted here (uids); events of any other pod are held back.
        self._ours: set[str] = set()
        self._held: dict[str, list[ReplicaEvent]] = {}
        self._uids: dict[tuple[ReplicaType, int], str] = {}
        # One ordered stream of events from the watch and from adopt(), each with its pod's uid
        # (``(None, uid)``: the pod is gone, forget it; ``None``: stop).
        self._events: "queue.Queue[tuple[ReplicaEvent | None, str] | None]" = queue.Queue()
        # Pods of ours being deleted by someone else, by uid -> name: their Events may say why.
        self._suspects: dict[str, str] = {}
        # uid -> (name, creation time) of each pod the watch showed: its Events are listed by
        # name (not every Event names the pod's uid).
        self._identity: dict[str, tuple[str, Any]] = {}
        self._dispatcher = threading.Thread(
            target=self._dispatch, name="k8s-platform-dispatch", daemon=True
        )
        self._dispatcher.start()
        self._stop = threading.Event()
        self._lost_pods = LostPodReaper(
            k8s, self._stop, margin_seconds=lost_pod_margin_seconds, on_lost=self._node_lost
        )
        self._watch_timeout = watch_timeout_seconds
        self._watcher = threading.Thread(
            target=self._watch, name="k8s-platform-events", daemon=True
        )
        self._watcher.start()
        self._cause_reader = threading.Thread(
            target=self._read_causes, name="k8s-platform-causes", daemon=True
        )
        self._cause_reader.start()

    @classmethod
    def from_spec(cls, job: "JobSpec") -> "KubernetesPlatform":
        """From the job's ``job_name``, ``namespace``, ``worker_image`` / ``image_name``, its
        kubeconfig fields and its pod template fields (:meth:`PodTemplate.from_spec`)."""
        k8s = K8sClient(job.namespace or "default", config=KubeConfig.from_spec(job))
        image = job.worker_image or job.image_name
        if not image:
            raise PlatformError("--image_name is required on Kubernetes")
        return cls(
            job_name=job.job_name,
            k8s=k8s,
            image=image,
            template=PodTemplate.from_spec(job),
            network=os.environ.get(NETWORK_ENV, NETWORK_POD) or NETWORK_POD,
        )

    def _find_owner(self, name: str):
        if not name:
            return None
        try:
            pod = self.k8s.get_pod(name)
        except K8sApiError as e:
            raise PlatformError(f"cannot read the master pod {name}: {e}") from None
        if pod is None:
            logger.warning(
                "master pod %s not found in namespace %s: replicas get no owner reference and are "
                "only removed by shutdown()",
                name,
                self.namespace,
            )
            return None
        for ref in pod.metadata.owner_references or []:
            if ref.kind == "Job" and ref.controller:  # a restartable master: the Job owns all
                return K8sClient.job_owner_reference(ref.name, ref.uid)
        return K8sClient.owner_reference(pod)

    @property
    def restarts_dead_master(self) -> bool:
        """A Job runs this master: one that exits non-zero is started again."""
        return self.replicas_outlive_master

    @property
    def replicas_outlive_master(self) -> bool:
        """Under a Job (which starts a new master when this one dies), the replicas are the
        Job's and keep running for the next master to adopt."""
        return self._owner is not None and self._owner.kind == "Job"

    def master_still_wanted(self) -> bool:
        """Whether the job still wants a master after this one was told to stop (SIGTERM): its
        Job exists and is not being deleted, so the pod was deleted or evicted by itself and
        the Job starts a new master. ``elasticdl cancel`` deletes the Job first: False then,
        and False whenever the Job cannot be read (stopping is what the signal asked for)."""
        if not self.restarts_dead_master:
            return False
        try:
            job = self.k8s.get_job(self._owner.name)
        except K8sApiError as e:
            logger.warning("cannot read the master's Job %s: %s", self._owner.name, e)
            return False
        return (
            job is not None
            and job.metadata.uid == self._owner.uid
            and job.metadata.deletion_timestamp is None
        )

    @property
    def shares_host_network(self) -> bool:
        """True when all pods share one network namespace (``host`` mode)."""
        return self.network == NETWORK_HOST

    @property
    def traits(self) -> PlatformTraits:
        # On the host network the master's port may be taken by another process on the node,
        # and servers listen on the pod (= node) IP only, not on every interface of the node.
        if self.shares_host_network:
            return PlatformTraits(
                bind_host=self.master_host, port_may_be_taken=True, requests_on_master=True
            )
        return PlatformTraits(bind_host="0.0.0.0", port_may_be_taken=False, requests_on_master=True)

    def _pod_name(self, replica_type: ReplicaType | str, replica_id: int) -> str:
        return pod_name(self.job_name, ReplicaType(replica_type).value, replica_id)

    # ---- addresses -----------------------------------------------------------------------
    def address(self, replica_type: ReplicaType, replica_id: int) -> str:
        return self._addresses.address((ReplicaType(replica_type), replica_id))

    def master_address(self, port: int) -> str:
        if self.replicas_outlive_master and self.network == NETWORK_POD:
            # A new master pod has a new IP; the Service the client made keeps the name.
            return f"{master_pod_name(self.job_name)}.{self.namespace}.svc:{port}"
        return f"{self.master_host}:{port}"

    def reserve_address(self, replica_type: ReplicaType, replica_id: int, address: str) -> None:
        self._addresses.reserve((ReplicaType(replica_type), replica_id), address)

    def log_location(self, replica_type: ReplicaType, replica_id: int) -> str:
        name = self._pod_name(replica_type, replica_id)
        return f"kubectl logs -n {self.namespace} {name}"

    # ---- lifecycle -----------------------------------------------------------------------
    def launch(self, spec: LaunchSpec) -> None:
        key = (spec.replica_type, spec.replica_id)
        name = self._pod_name(*key)
        with self._lock:
            if self._closed:
                raise PlatformError("platform is shut down; cannot launch more replicas")
            if spec.port is not None:
                self._addresses.keep_port(key, spec.port)
        try:
            self._clear_previous(name)
            pod = build_pod(
                self.template,
                name=name,
                job_name=self.job_name,
                replica_type=spec.replica_type.value,
                replica_id=spec.replica_id,
                image=spec.image or self.image,
                command=spec.command("python"),
                env=spec.env,
                resource_request=spec.resource_request,
                resource_limit=spec.resource_limit,
                priority_class=spec.priority,
                owner_reference=self._owner,
                port=spec.port,
                secret_env=self._secret_refs(spec.secret_env),
            )
            with self._lock:  # shutdown() then either finds it to delete or stops its making
                if self._closed:
                    raise PlatformError(f"platform is shut down; {name} not launched")
                created = self.k8s.create_pod(pod)
                self._own(key, created.metadata.uid)
            if spec.port is not None:
                self._ensure_service(name, spec)
        except K8sApiError as e:
            raise PlatformError(f"cannot launch {name}: {e}") from None
        except ValueError as e:  # bad resource / volume strings
            raise PlatformError(f"cannot launch {name}: {e}") from None
        logger.info("launched pod %s", name)

    def _own(self, key: tuple[ReplicaType, int], uid: str) -> None:
        """From now on report the events of pod ``uid``, the ones held back so far first."""
        with self._lock:
            self._uids[key] = uid
            self._ours.add(uid)
            for event in self._held.pop(uid, []):
                self._events.put((event, uid))

    # ---- a restarted master ----------------------------------------------------------------
    def replica_identity(self, replica_type: ReplicaType, replica_id: int) -> dict | None:
        key = (ReplicaType(replica_type), replica_id)
        with self._lock:
            uid = self._uids.get(key)
        return {"pod": self._pod_name(*key), "uid": uid} if uid else None

    def reclaim(self, replica_type: ReplicaType, replica_id: int) -> int:
        """The pod of this replica, if any, was created by a master that did not live to record
        it: delete it (and wait), so launching it again makes no twin."""
        name = self._pod_name(replica_type, replica_id)
        try:
            pod = self.k8s.get_pod(name)
            if pod is None:
                return 0
            logger.warning(
                "Deleting pod %s: a previous master started it but never recorded it", name
            )
            self.k8s.delete_pod(name, grace_seconds=0)
            self.k8s.wait_pod_gone(name, _RELAUNCH_WAIT_SECONDS)
        except K8sApiError as e:
            raise PlatformError(f"cannot delete {name}: {e}") from None
        return 1

    def adopt(self, spec: LaunchSpec, identity: dict | None) -> bool:
        """Take over the pod a previous master launched as ``spec`` if it still exists with the
        recorded name and UID: report its state as read now (``Running``, or how it ended) and
        its changes from then on. A pod under that name with another UID is not this replica:
        it is deleted, and the replica reported ``Deleted``."""
        key = (spec.replica_type, spec.replica_id)
        name = self._pod_name(*key)
        if spec.port is not None:
            self._addresses.keep_port(key, spec.port)
        uid = (identity or {}).get("uid")
        with self._lock:  # the watch computes no event of this pod meanwhile
            if self._closed:
                raise PlatformError("platform is shut down; cannot adopt replicas")
            try:
                pod = self.k8s.get_pod(name)
            except K8sApiError as e:
                raise PlatformError(f"cannot read {name}: {e}") from None
            if pod is None or not uid or pod.metadata.uid != uid:
                if pod is not None:
                    self._pod_events.deleted_by_master(pod.metadata.uid)
                    self.k8s.delete_pod(name, grace_seconds=0)
                self._events.put(
                    (
                        ReplicaEvent(
                            spec.replica_type,
                            spec.replica_id,
                            ReplicaPhase.DELETED,
                            reason="Deleted",
                            message="pod gone while the master was away",
                        ),
                        "",
                    )
                )
                return False
            self._held.pop(uid, None)  # what it did before: superseded by the reading below
            self._uids[key] = uid
            self._ours.add(uid)
            reading = read_termination(pod)
            try:
                phase = ReplicaPhase(reading.phase)
            except ValueError:  # "Unknown": the watch reports the definite answer
                phase = ReplicaPhase.RUNNING
            self._pod_events.adopted(uid, key, phase)
            if phase.is_terminal:
                self._events.put(
                    (
                        ReplicaEvent(
                            *key,
                            phase,
                            exit_code=reading.exit_code,
                            reason=reading.reason,
                            message=reading.message,
                        ),
                        uid,
                    )
                )
                return False
            self._events.put((ReplicaEvent(*key, phase), uid))
        logger.info("adopted pod %s (uid %s)", name, uid)
        return True

    def _clear_previous(self, name: str) -> None:
        """A pod of the same name may still exist (a finished replica, or one being
        deleted): remove it and wait, so the relaunch keeps the name (and the PS its DNS)."""
        old = self.k8s.get_pod(name)
        if old is None:
            return
        reading = read_termination(old)
        if not reading.terminating and not reading.is_terminal:
            raise PlatformError(
                f"{name} is still {reading.phase}; delete it before launching it again"
            )
        if not reading.terminating:
            self.k8s.delete_pod(name, grace_seconds=0)
        deadline = time.monotonic() + _RELAUNCH_WAIT_SECONDS
        while self.k8s.get_pod(name) is not None:
            if self._closed:  # the job ended meanwhile: nothing to launch any more
                raise PlatformError(f"platform is shut down; {name} not launched")
            if time.monotonic() >= deadline:
                raise PlatformError(
                    f"previous pod {name} did not go away within {_RELAUNCH_WAIT_SECONDS:.0f}s"
                )
            self._stop.wait(_GONE_POLL_SECONDS)

    def _secret_refs(self, secret_env: dict[str, str]) -> dict[str, tuple[str, str]]:
        """Put ``secret_env``'s values in the job's Secret (created once, owned by the master
        pod) and return where each variable reads its value from."""
        if not secret_env:
            return {}
        name = secret_name(self.job_name)
        with self._lock:
            if self._secret_data is None:
                try:
                    self.k8s.create_secret(
                        name,
                        dict(secret_env),
                        labels=job_labels(self.job_name, MASTER_TYPE),
                        owner_reference=self._owner,
                    )
                except K8sApiError as e:
                    if e.status != 409:
                        raise
                    # Left by an earlier master of this job name: replace it.
                    self.k8s.delete_secret(name)
                    self.k8s.create_secret(
                        name,
                        dict(secret_env),
                        labels=job_labels(self.job_name, MASTER_TYPE),
                        owner_reference=self._owner,
                    )
                self._secret_data = dict(secret_env)
            elif self._secret_data != secret_env:
                raise PlatformError("a job has one secret; replicas asked for different ones")
        return {var: (name, var) for var in secret_env}

    def _ensure_service(self, name: str, spec: LaunchSpec) -> None:
        service = build_service(
            self.template,
            name=name,
            job_name=self.job_name,
            replica_type=spec.replica_type.value,
            replica_id=spec.replica_id,
            port=spec.port,
            owner_reference=self._owner,
        )
        try:
            self.k8s.create_service(service)
        except K8sApiError as e:
            if e.status != 409:  # already there from the replica's previous life: keep it
                raise

    def delete(
        self, replica_type: ReplicaType, replica_id: int, grace_seconds: float = 10.0
    ) -> None:
        name = self._pod_name(replica_type, replica_id)
        try:
            pod = self.k8s.get_pod(name)
            if pod is None:
                return
            with self._lock:
                self._pod_events.deleted_by_master(pod.metadata.uid)
            self.k8s.delete_pod(name, grace_seconds=grace_seconds)
        except K8sApiError as e:
            raise PlatformError(f"cannot delete {name}: {e}") from None
        logger.info("deleting pod %s (grace %.0fs)", name, grace_seconds)

    def retire(self, replica_type: ReplicaType, replica_id: int) -> None:
        """Delete the Service of a replica id the job no longer has (the pod is stopped by
        :meth:`delete`); its address is forgotten so a later set may use the id again."""
        name = self._pod_name(replica_type, replica_id)
        try:
            if self.k8s.delete_service(name):
                logger.info("deleted service %s", name)
        except K8sApiError as e:
            raise PlatformError(f"cannot delete service {name}: {e}") from None

    def shared_dir_problem(self, path: str) -> str:
        """Every pod of the job mounts the template's volumes (``--volume``), the PS of a new
        set too: ``path`` is one directory to all of them when it lies on a writable
        PersistentVolumeClaim or host path mount (a host path is one directory only where
        every node mounts the same file system there)."""
        pod_volumes, mounts = (
            volumes.volumes_and_mounts(self.template.volume) if self.template.volume else ([], [])
        )
        shareable = {v.name for v in pod_volumes if v.claim_name or v.host_path}
        wanted = posixpath.normpath(path)
        for mount in mounts:
            root = posixpath.normpath(mount.mount_path)
            inside = wanted == root or wanted.startswith(root.rstrip("/") + "/")
            if inside and mount.name in shareable and not mount.read_only:
                return ""
        return (
            f"--checkpoint_dir {path} is on no volume every PS pod mounts, and changing the PS "
            "count re-shards through it: resubmit with "
            "--volume='claim_name=<pvc>,mount_path=<dir>' and --checkpoint_dir under <dir>"
        )

    def master_annotations(self) -> dict | None:
        pod = self.k8s.get_pod(self.master_pod)
        if pod is None:
            return {}
        return dict(pod.metadata.annotations or {})

    def annotate_master(self, annotations: dict) -> bool:
        return self.k8s.annotate_pod(self.master_pod, annotations)

    def mark_job_status(self, status: str) -> bool:
        """Label the master pod ``status=<status>`` (e.g. ``Succeeded``/``Failed``) so users and
        the client see the outcome after the master exits. False if there is no master pod."""
        name = self.master_pod
        try:
            if self.k8s.get_pod(name) is None:
                return False
            self.k8s.patch_pod_labels(name, {LABEL_STATUS: status})
        except K8sApiError as e:
            logger.warning("cannot label master pod %s status=%s: %s", name, status, e)
            return False
        return True

    def publish_status(self, status: "JobStatus") -> bool:
        """Store the job's status snapshot (the dict the master writes to ``status.json``
        locally) as JSON in the master pod's ``elasticdl-status`` annotation, where
        ``elasticdl status`` and the job server (its dashboard's curves) read it. The curves
        are thinned to keep the pod object small (:meth:`JobStatus.published`). False if
        there is no master pod or the update failed."""
        slim = status.published()
        name = self.master_pod
        text = json.dumps(slim, default=str, sort_keys=True)
        try:
            return self.k8s.annotate_pod(name, {STATUS_ANNOTATION: text})
        except Exception as e:  # API trouble, unreachable server: status is best effort
            logger.debug("cannot publish status on %s: %s", name, e)
            return False

    def shutdown(self, delete_all: bool = True) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if delete_all:
            selector = replicas_selector(self.job_name)
            try:
                for pod in self.k8s.list_pods(selector):
                    with self._lock:
                        self._pod_events.deleted_by_master(pod.metadata.uid)
                    self.k8s.delete_pod(pod.metadata.name, grace_seconds=5)
                for service in self.k8s.list_services(selector):
                    self.k8s.delete_service(service.metadata.name)
            except K8sApiError as e:
                logger.warning("cleanup of job %s incomplete: %s", self.job_name, e)
        self._stop.set()
        self._watcher.join(self._watch_timeout + 5)
        self._cause_reader.join(5)
        self._events.put(None)
        self._dispatcher.join(5)

    # ---- events --------------------------------------------------------------------------
    def _watch(self) -> None:
        for kind, pod in self.k8s.watch_pods(
            replicas_selector(self.job_name), self._stop, timeout_seconds=self._watch_timeout
        ):
            self._lost_pods.saw(kind, pod)
            with self._lock:  # computed and queued in one step: adopt() sees no half
                uid = pod.metadata.uid
                try:
                    event = self._translate(kind, pod)
                except Exception:  # a malformed pod must not kill the event thread
                    logger.exception("cannot translate event %s of pod %s", kind, pod.metadata.name)
                    event = None
                if event is not None and uid in self._ours:
                    self._events.put((event, uid))
                elif event is not None and not self._closed:  # not (yet) known as ours
                    self._held.setdefault(uid, []).append(event)
                if kind == "DELETED" and uid not in self._held:
                    # A pod's identity serves its events, the last of which is now queued.
                    self._events.put((None, uid))

    def _dispatch(self) -> None:
        while True:
            item = self._events.get()
            if item is None:
                return
            event, uid = item
            if event is None:  # the pod is gone and its events are handled
                with self._lock:
                    self._identity.pop(uid, None)
                continue
            try:
                if uid and _may_have_outside_cause(event):
                    event = self._with_outside_cause(event, uid)
                self._emit(event)
            except Exception:
                logger.exception("event listener failed on %s", event)

    def _node_lost(self, uid: str) -> None:
        with self._lock:
            self._pod_events.node_lost(uid)

    # ---- who ended a pod from outside: its Events ------------------------------------------
    def _pod_cause(self, uid: str) -> tuple[str, str]:
        """``(cause, message)`` from the Events of pod ``uid`` (``("", "")`` when none tells or
        they cannot be read)."""
        name, created = self._identity.get(uid, ("", None))
        selector = f"involvedObject.name={name}" if name else f"involvedObject.uid={uid}"
        try:
            events = self.k8s.core.list_namespaced_event(
                self.namespace, field_selector=selector
            ).items
        except Exception as e:  # no permission, API trouble: the pod status is all there is
            logger.debug("cannot read the events of pod %s: %s", uid, e)
            return "", ""
        return cause_of_events(events_of_pod(events, uid, created))

    def _with_outside_cause(self, event: ReplicaEvent, uid: str) -> ReplicaEvent:
        """``event`` (a pod gone or failed, not by the master's hand) with the cause its
        Events give; a pod that went is given a moment for the Event to be recorded."""
        cause, message = self._pod_cause(uid)
        if not cause and event.phase == ReplicaPhase.DELETED and not self._stop.is_set():
            self._stop.wait(_CAUSE_GRACE_SECONDS)
            cause, message = self._pod_cause(uid)
        if not cause:
            return event
        logger.info(
            "%s-%d: %s (%s)", event.replica_type, event.replica_id, cause, message or "pod event"
        )
        return dataclasses.replace(event, reason=cause, message=message or event.message)

    def _read_causes(self) -> None:
        """End each pod being deleted by someone else as soon as its Events say who did."""
        while not self._stop.wait(_CAUSE_POLL_SECONDS):
            with self._lock:
                suspects = dict(self._suspects)
            for uid, name in suspects.items():
                cause, message = self._pod_cause(uid)
                if cause not in OUTSIDE_CAUSES:
                    continue
                with self._lock:
                    if self._suspects.pop(uid, None) is None:
                        continue  # its end was reported meanwhile
                    event = self._pod_events.ended_by(uid, cause, message)
                    if event is not None and uid in self._ours:
                        logger.info("pod %s is being deleted: %s (%s)", name, cause, message)
                        self._events.put((event, ""))

    def _translate(self, kind: str, pod) -> ReplicaEvent | None:
        """The replica event of a watch change; a pod of ours being deleted by someone else
        becomes a suspect whose Events :meth:`_read_causes` reads until its end is known."""
        with self._lock:
            event = self._pod_events.translate(kind, pod)
            uid = pod.metadata.uid
            self._identity[uid] = (pod.metadata.name, pod.metadata.creation_timestamp)
            if kind == "DELETED" or event is not None and event.phase.is_terminal:
                self._suspects.pop(uid, None)
            elif pod.metadata.deletion_timestamp and self._pod_events.ends_from_outside(uid):
                self._suspects[uid] = pod.metadata.name
            return event


def _may_have_outside_cause(event: ReplicaEvent) -> bool:
    """A pod that ended or went without its status naming a cause the master acts on."""
    return event.phase.is_terminal and event.reason not in (
        REASON_DELETED_BY_MASTER,
        REASON_OOM_KILLED,
        REASON_NODE_LOST,
        *OUTSIDE_CAUSES,
    )
