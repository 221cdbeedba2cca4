"""Jobs on Kubernetes: a job is its master pod ``elasticdl-<job>-master`` plus what the
master creates (worker/PS pods and services, all owned by the master pod, or by the master's
Job for a restartable master: :mod:`elasticdl.k8s.master_manifest`).

* ``submit`` builds the master's objects and checks everything before the first API call, so
  bad input creates nothing; with ``--yaml FILE`` it only writes the manifest (no cluster
  access at all). If the namespace has the ServiceAccount ``elasticdl`` (``elasticdl rbac``,
  ``deploy/k8s/rbac.yaml``), the master runs under it. Right after the master it creates the
  job's NetworkPolicy (ingress only from the job's own pods,
  :mod:`elasticdl.k8s.network_policy`) and, for a restartable master, the master's Service
  (the address a restarted master keeps), both owned by what owns the job.
* ``status``/``list_jobs`` read the job's current master pod (:mod:`elasticdl.jobs.k8s_status`)
  and its replica pods.
* ``logs`` reads pod logs through a :class:`~elasticdl.k8s.pod_logs.PodLogs` (the Kubernetes
  API's, unless another is given).
* ``cancel`` labels the master ``status=Cancelled`` and deletes it (a restartable master's
  Job: nothing may start a master after cancel); the cluster's garbage collector removes what
  it owns. ``cancel`` waits until no pod, service or NetworkPolicy of the job is left.

The ``kubernetes`` package is imported only when this backend is used.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Iterator

from elasticdl.common.job_spec import JobSpec
from elasticdl.common.job_status import JobStatus
from elasticdl.common.types import JobPhase, PlatformName
from elasticdl.jobs import k8s_status
from elasticdl.jobs.backend import JobBackend, JobHandle, Progress, refuse_package_path
from elasticdl.jobs.errors import ClientError, JobConflictError, JobNotFoundError
from elasticdl.k8s import master_manifest
from elasticdl.k8s.client import K8sApiError, K8sClient, K8sConfigError, KubeConfig, to_dict
from elasticdl.k8s.names import (
    LABEL_STATUS,
    MASTER_TYPE,
    PS_TYPE,
    SERVICE_ACCOUNT,
    WORKER_TYPE,
    job_selector,
    master_pod_name,
    masters_selector,
    pod_name,
    replicas_selector,
)
from elasticdl.k8s.pod_logs import ApiPodLogs, PodLogs

logger = logging.getLogger(__name__)

CANCEL_WAIT_SECONDS = 60.0
# How long submit waits for the Job controller's first master pod.
FIRST_MASTER_WAIT_SECONDS = 60.0


class KubernetesBackend(JobBackend):
    platform = PlatformName.KUBERNETES

    def __init__(
        self,
        namespace: str = "default",
        kube_context: str = "",
        k8s: K8sClient | None = None,
        force_use_kube_config_file: bool = False,
        pod_logs: PodLogs | None = None,
    ) -> None:
        self.namespace = namespace or "default"
        self.kube_context = kube_context
        self._config = KubeConfig(
            context=kube_context, force_use_kube_config_file=force_use_kube_config_file
        )
        self._k8s = k8s
        self.pod_logs = pod_logs or ApiPodLogs()

    @property
    def k8s(self) -> K8sClient:
        if self._k8s is None:
            try:
                self._k8s = K8sClient(self.namespace, config=self._config)
            except K8sConfigError as e:
                raise ClientError(str(e)) from None
        return self._k8s

    # ---- submit --------------------------------------------------------------------------
    def build_master_pod(self, job: JobSpec, service_account: str = ""):
        """The master pod for a resolved job spec (no API calls)."""
        try:
            return master_manifest.master_pod(job, self.namespace, service_account)
        except ValueError as e:
            raise ClientError(str(e)) from None

    def build_master_job(self, pod, job: JobSpec):
        """The batch/v1 Job whose pod template is the master pod ``pod`` (restartable)."""
        return master_manifest.master_job(pod, job, self.namespace)

    def _handle(self, job: JobSpec, created, master: str, yaml_path: str = "") -> JobHandle:
        return JobHandle(
            job_name=job.job_name,
            platform=self.platform,
            created_at=(created is not None and k8s_status.created_at(created)) or time.time(),
            namespace=self.namespace,
            kube_context=self.kube_context,
            master=master,
            yaml_path=yaml_path,
        )

    def submit(
        self,
        job: JobSpec,
        yaml_path: str = "",
        package_path: str = "",
        progress: Progress | None = None,
    ) -> JobHandle:
        refuse_package_path(package_path)
        pod = self.build_master_pod(job)  # validate everything before touching the cluster
        if yaml_path:
            restartable = master_manifest.restartable(job)
            write_manifest(self.build_master_job(pod, job) if restartable else pod, yaml_path)
            return self._handle(job, None, pod.metadata.name, yaml_path)
        job, notices = self._checked_by_cluster(job)
        pod = self.build_master_pod(job)
        service_account = self._job_service_account()
        if service_account:
            pod.spec.service_account_name = pod.spec.service_account_name or service_account
        existing = self._find_master(job.job_name)
        if existing is not None:
            status = self._status_of(existing)
            raise JobConflictError(
                f"job {job.job_name} already exists in namespace {self.namespace} "
                f"({status.phase}); "
                f"remove it with 'elasticdl cancel {job.job_name}' or use another --job_name"
            )
        if master_manifest.restartable(job):
            handle = self._submit_restartable(job, pod)
            handle.notices = notices
            return handle
        created = self._create(job.job_name, self.k8s.create_pod, pod)
        self._restrict_ingress(
            job.job_name,
            K8sClient.owner_reference(created),
            undo=lambda: self.k8s.delete_pod(created.metadata.name, grace_seconds=0),
        )
        handle = self._handle(job, created, created.metadata.name)
        handle.notices = notices
        return handle

    def _checked_by_cluster(self, job: JobSpec) -> tuple[JobSpec, list[str]]:
        """:mod:`elasticdl.k8s.submit_checks`: the job's priorities resolved against the
        cluster's PriorityClasses, and warnings about requests no node can hold."""
        from elasticdl.k8s import submit_checks
        from elasticdl.k8s.priority_classes import MissingPriorityClass

        try:
            return submit_checks.check(job, self.k8s.api_client)
        except MissingPriorityClass as e:
            raise ClientError(str(e)) from None

    def _create(self, job_name: str, create, obj):
        """``create(obj)`` for the job's master object; a taken name is a JobConflictError, any
        other refusal one ClientError line."""
        try:
            return create(obj)
        except K8sApiError as e:
            if e.status == 409:
                raise JobConflictError(
                    f"job {job_name} already exists in namespace {self.namespace}"
                ) from None
            raise ClientError(f"cannot submit job {job_name}: {e}") from None

    def _submit_restartable(self, job: JobSpec, pod) -> JobHandle:
        """Create the master's Job, then what it owns: the NetworkPolicy and the master's
        Service (the address a restarted master keeps), and wait for its first pod."""
        from elasticdl.k8s.pods import PodTemplate, build_service

        created = self._create(job.job_name, self.k8s.create_job, self.build_master_job(pod, job))
        owner = K8sClient.job_owner_reference(created.metadata.name, created.metadata.uid)

        def undo() -> None:
            self.k8s.delete_job(created.metadata.name)

        self._restrict_ingress(job.job_name, owner, undo=undo)
        service = build_service(
            PodTemplate(namespace=self.namespace),
            name=master_pod_name(job.job_name),
            job_name=job.job_name,
            replica_type=MASTER_TYPE,
            replica_id=0,
            port=job.port,
            owner_reference=owner,
            publish_not_ready=False,
        )
        try:
            self.k8s.create_service(service)
        except K8sApiError as e:
            undo()
            raise ClientError(f"cannot submit job {job.job_name}: its Service: {e}") from None
        deadline = time.monotonic() + FIRST_MASTER_WAIT_SECONDS
        master = self._find_master(job.job_name)
        while master is None and time.monotonic() < deadline:
            time.sleep(0.2)
            master = self._find_master(job.job_name)
        first = master.metadata.name if master is not None else created.metadata.name
        return self._handle(job, created, first)

    def _restrict_ingress(self, job_name: str, owner_reference, undo) -> None:
        """The job's NetworkPolicy (:mod:`elasticdl.k8s.network_policy`), owned by what owns
        the job (its master pod, or the master's Job). A job its policy cannot protect is not
        left running: ``undo`` removes it again."""
        from elasticdl.k8s.network_policy import build_network_policy

        policy = build_network_policy(job_name, self.namespace, owner_reference)
        name = policy.metadata.name
        try:
            try:
                self.k8s.create_network_policy(policy)
            except K8sApiError as e:
                if e.status != 409:
                    raise
                # One of an earlier job of this name (its owner gone, the garbage collector not
                # done yet) is replaced; one the project did not create is never touched.
                old = self.k8s.get_network_policy(name)
                labels = (old.metadata.labels or {}) if old is not None else {}
                if old is not None and labels != policy.metadata.labels:
                    raise ClientError(
                        f"a NetworkPolicy {name} that ElasticDL did not create exists in "
                        f"namespace {self.namespace}; rename the job or remove that policy"
                    ) from None
                self.k8s.delete_network_policy(name)
                self.k8s.create_network_policy(policy)
        except (K8sApiError, ClientError) as e:
            try:  # a job its policy does not protect is not left running
                undo()
            except K8sApiError:
                pass
            if isinstance(e, ClientError):
                raise
            raise ClientError(
                f"cannot submit job {job_name}: its NetworkPolicy was refused ({e}); the user "
                f"needs permission to create networkpolicies in namespace {self.namespace}"
            ) from None

    def _job_service_account(self) -> str:
        """``elasticdl`` if that ServiceAccount exists here (rbac.yaml), else the default."""
        try:
            found = self.k8s.get_service_account(SERVICE_ACCOUNT) is not None
        except Exception:  # we may not read service accounts: use the default
            return ""
        return SERVICE_ACCOUNT if found else ""

    # ---- status --------------------------------------------------------------------------
    def _get_pod(self, name: str):
        try:
            return self.k8s.get_pod(name)
        except K8sApiError as e:
            raise ClientError(str(e)) from None

    def _list_pods(self, selector: str) -> list:
        try:
            return self.k8s.list_pods(selector)
        except K8sApiError as e:
            raise ClientError(str(e)) from None

    def _find_master(self, name: str):
        """The job's master pod (a restartable master's: the newest, the running one first),
        or None."""
        pod = self._get_pod(master_pod_name(name))
        if pod is not None:
            return pod
        return k8s_status.current_master(self._list_pods(job_selector(name, MASTER_TYPE)))

    def _master(self, name: str):
        pod = self._find_master(name)
        if pod is None:
            raise JobNotFoundError(
                f"no job {name!r} in namespace {self.namespace} (see 'elasticdl list')"
            )
        return pod

    def status(self, name: str) -> JobStatus:
        return self._status_of(self._master(name), with_replicas=True)

    def list_jobs(self) -> list[JobStatus]:
        masters = k8s_status.current_masters(self._list_pods(masters_selector()))
        return sorted((self._status_of(p) for p in masters), key=lambda s: s.created_at or 0)

    def _status_of(self, master, with_replicas: bool = False) -> JobStatus:
        status = k8s_status.master_status(
            master, self.namespace, restarting=lambda: self._restarting(master)
        )
        if with_replicas:
            pods = self._replica_pods(status.job_name)
            if status.replicas:
                status.replicas = k8s_status.settle_replicas(status.replicas, pods, status.is_final)
            else:
                status.replicas = k8s_status.replicas_of_pods(pods)
        return status

    def _restarting(self, master) -> bool:
        """A dead master pod whose Job has not given up: a new master is on its way."""
        controller = k8s_status.master_job_name(master)
        if not controller:
            return False
        try:
            job = self.k8s.get_job(controller)
        except K8sApiError:
            return False
        if job is None or job.metadata.deletion_timestamp is not None:
            return False
        conditions = (job.status.conditions or []) if job.status else []
        return not any(c.type in ("Failed", "Complete") and c.status == "True" for c in conditions)

    def _replica_pods(self, job_name: str) -> list:
        try:
            return self.k8s.list_pods(replicas_selector(job_name))
        except K8sApiError:
            return []

    def _replicas(self, job_name: str):
        """The job's PS and workers as their pods show them."""
        return k8s_status.replicas_of_pods(self._replica_pods(job_name))

    # ---- logs ----------------------------------------------------------------------------
    def _pod_for_replica(self, name: str, replica: str) -> str:
        if replica in ("", MASTER_TYPE):
            return self._master(name).metadata.name
        rtype, _, rid = replica.rpartition("-")
        if rtype not in (WORKER_TYPE, PS_TYPE) or not rid.isdigit():
            raise ClientError(f"replica {replica!r} is invalid; use master, worker-<i> or ps-<i>")
        return pod_name(name, rtype, int(rid))

    # ---- changing the PS count ------------------------------------------------------------
    def scale_ps(self, name: str, num_ps: int, timeout: float | None = None) -> str:
        from elasticdl.jobs import k8s_ps_count

        master = self._master(name)
        status = self._status_of(master)
        if status.phase != JobPhase.RUNNING:
            raise ClientError(
                f"job {name} is {status.phase or 'not started'}: its PS count can change only "
                f"while it runs; see 'elasticdl status {name}'"
            )
        return k8s_ps_count.request_ps_count(
            self.k8s,
            master.metadata.name,
            name,
            num_ps,
            timeout=timeout or k8s_ps_count.DEFAULT_TIMEOUT_S,
        )

    def logs(self, name: str, replica: str = "master", follow: bool = False) -> Iterator[str]:
        pod = self._pod_for_replica(name, replica)
        self._master(name)  # unknown job -> JobNotFoundError
        if not follow:
            try:
                text = self.pod_logs.read(self.k8s, pod)
            except K8sApiError as e:
                raise ClientError(f"logs of {pod} are not available: {e}") from None
            if text is None:
                raise ClientError(f"no pod {pod} in namespace {self.namespace}")
            yield text
            return
        if self._get_pod(pod) is None:
            raise ClientError(f"no pod {pod} in namespace {self.namespace}")
        try:
            yield from self.pod_logs.follow(self.k8s, pod)
        except ClientError:
            raise
        except Exception as e:  # K8sApiError, or the server unreachable
            raise ClientError(f"logs of {pod} are not available: {e}") from None

    # ---- cancel --------------------------------------------------------------------------
    def cancel(self, name: str) -> JobStatus:
        master = self._master(name)
        status = self._status_of(master)
        if not status.is_final:
            try:
                self.k8s.patch_pod_labels(master.metadata.name, {LABEL_STATUS: JobPhase.CANCELLED})
            except K8sApiError as e:
                logger.warning("cannot label %s cancelled: %s", master.metadata.name, e)
            status.phase = JobPhase.CANCELLED
            status.message = "cancelled by the user"
        controller = k8s_status.master_job_name(master)
        try:
            if controller:  # the Job goes, not the pod: nothing may start a master after cancel
                self.k8s.delete_job(controller)
            else:
                self.k8s.delete_pod(master.metadata.name, propagation="Background")
        except K8sApiError as e:
            raise ClientError(f"cannot cancel job {name}: {e}") from None
        leftovers = self._wait_job_gone(name, CANCEL_WAIT_SECONDS, controller)
        if leftovers:
            status.message = (status.message + "; " if status.message else "") + (
                f"still terminating: {', '.join(leftovers)}"
            )
        return status

    def _wait_job_gone(self, name: str, timeout: float, controller: str = "") -> list[str]:
        """Wait until no pod, service or NetworkPolicy of the job (nor its master's Job
        ``controller``) is left; returns what remains."""
        deadline = time.monotonic() + timeout
        selector = job_selector(name)
        while True:
            try:
                left = [p.metadata.name for p in self.k8s.list_pods(selector)]
                left += [f"service/{s.metadata.name}" for s in self.k8s.list_services(selector)]
                left += [
                    f"networkpolicy/{p.metadata.name}"
                    for p in self.k8s.list_network_policies(selector)
                ]
                if controller and self.k8s.get_job(controller) is not None:
                    left.append(f"job/{controller}")
            except K8sApiError as e:
                raise ClientError(str(e)) from None
            if not left or time.monotonic() >= deadline:
                return left
            time.sleep(0.3)


def write_manifest(obj, path: str) -> None:
    """Write ``obj`` (a pod or a Job) as YAML to ``path`` ("-" = stdout)."""
    import yaml

    text = yaml.safe_dump(to_dict(obj), sort_keys=False, default_flow_style=False)
    if path == "-":
        import sys

        sys.stdout.write(text)
        return
    try:
        parent = os.path.dirname(os.path.abspath(path))
        os.makedirs(parent, exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    except OSError as e:
        raise ClientError(f"--yaml {path!r}: cannot write it ({e.strerror})") from None
