"""Jobs on Kubernetes: a job is its master pod ``elasticdl-<job>-master`` plus what the
master creates (worker/PS pods and services, all owned by the master pod).

* ``submit`` builds the master pod (``python -m elasticdl.master.main <job flags>
  --platform=kubernetes``; resources, priority, volumes, ``--envs``, cluster spec,
  ``MY_POD_IP`` from the downward API) and creates it — or, with ``--yaml FILE``, only writes
  its manifest (no cluster access at all). Everything is built and checked before the first
  API call, so bad input creates nothing. If the namespace has the ServiceAccount
  ``elasticdl`` (``elasticdl rbac``, ``deploy/k8s/rbac.yaml``), the master runs under it.
  Right after the master pod it creates the job's NetworkPolicy (ingress only from the job's
  own pods, :mod:`elasticdl.k8s.network_policy`), owned by the master pod.
* ``status``/``list_jobs`` read the master pod: its phase, the ``status`` label the master
  sets when it ends, the JSON progress the master publishes in the ``elasticdl-status``
  annotation (:data:`STATUS_ANNOTATION`), and the job's replica pods (a replica the master
  last published unfinished shows how its pod ended: :func:`settle_replicas`). Exit codes and
  causes come from :func:`elasticdl.k8s.termination.read_termination`, the reading the
  master's platform acts on, so ``elasticdl status`` tells what the master saw.
* ``logs`` reads pod logs through the API server. Where the cluster cannot serve logs (a node
  without a reachable kubelet, e.g. the process kubelet of the test harness), set
  ``ELASTICDL_K8S_POD_LOG_DIR`` to a directory holding ``<namespace>/<pod>.log`` files (a
  shared log volume) and they are read from there instead.
* ``cancel`` labels the master ``status=Cancelled`` and deletes it; the cluster's garbage
  collector removes the pods, services, Secret and NetworkPolicy it owns. ``cancel`` waits
  until no pod, service or NetworkPolicy of the job is left.

A restartable master (issue #19; a job submitted with ``--job_dir`` on a ``--volume``): the
master pod is the template of a batch/v1 Job ``elasticdl-<job>-master`` (``restartPolicy:
Never``, ``backoffLimit`` :data:`MASTER_RESTARTS`) that creates a new master pod (named
``elasticdl-<job>-master-<suffix>`` by the Job controller) whenever one fails; the new master
resumes from the journal in ``--job_dir`` (see ``elasticdl.platform.kubernetes``). The Job,
not a master pod, owns the job's objects (NetworkPolicy, the master's headless Service, and
what the master creates), and ``cancel`` deletes the Job: nothing recreates a master after it.
The job's current master is its newest master pod. Why a Job and not a ReplicaSet: a
ReplicaSet's pods must have ``restartPolicy: Always``, so a master that *finished* the job
would be started again; a Job ends when its pod exits 0 and gives up after ``backoffLimit``
failures, so a master that crashes at every start does not loop forever. The master exits 0
whenever it ended the job itself (outcome in its ``status`` label and published status) and
non-zero only when it died. Without ``--job_dir`` the master is a bare pod as before: a
master that dies ends the job (nothing outside its pod to resume from).

The ``kubernetes`` package is imported only when this backend is used.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from pathlib import Path
from typing import Iterator

from elasticdl.client.backend import JobBackend, JobHandle
from elasticdl.client.errors import ClientError, JobConflictError, JobNotFoundError
from elasticdl.common.job_spec import JobSpec, master_argv
from elasticdl.common.job_status import JobStatus, ReplicaStatus
from elasticdl.common.types import JobPhase, PlatformName
from elasticdl.k8s.client import K8sApiError, K8sClient, K8sConfigError, KubeConfig, to_dict
from elasticdl.k8s.cluster_spec import ClusterSpec
from elasticdl.k8s.names import (
    LABEL_JOB,
    LABEL_REPLICA_INDEX,
    LABEL_REPLICA_TYPE,
    LABEL_STATUS,
    MASTER_TYPE,
    PS_TYPE,
    SERVICE_ACCOUNT,
    STATUS_ANNOTATION,
    WORKER_TYPE,
    job_selector,
    master_pod_name,
    masters_selector,
    pod_name,
    replicas_selector,
)
from elasticdl.k8s.termination import (
    DELETED,
    FAILED,
    REASON_DELETED,
    RUNNING,
    SUCCEEDED,
    TERMINAL_PHASES,
    PodTermination,
    read_termination,
)

logger = logging.getLogger(__name__)

MASTER_MODULE = "elasticdl.master.main"
POD_LOG_DIR_ENV = "ELASTICDL_K8S_POD_LOG_DIR"
_CANCEL_WAIT_SECONDS = 60.0
_FINAL_LABELS = {JobPhase.SUCCEEDED, JobPhase.FAILED, JobPhase.CANCELLED}
# How many times the Job starts a new master after one died (restartable masters only).
MASTER_RESTARTS = 6
# How long submit waits for the Job controller's first master pod.
_FIRST_MASTER_WAIT_SECONDS = 60.0


def restartable(job: JobSpec) -> bool:
    """A master whose journal outlives its pod (``--job_dir`` on a volume) can be restarted."""
    return bool(job.job_dir)


def check_job_dir(job: JobSpec) -> None:
    """``--job_dir`` on Kubernetes must lie under a writable ``--volume`` mount: the journal
    a restarted master resumes from must outlive the master's pod."""
    from elasticdl.k8s.volumes import parse_volumes

    path = os.path.normpath(job.job_dir)
    hint = (
        "mount a volume there, e.g. --volume='claim_name=<pvc>,mount_path=/data' "
        "--job_dir=/data/jobs/<job>, or leave --job_dir out (a master that dies then ends the job)"
    )
    if not os.path.isabs(path):
        raise ClientError(f"--job_dir {job.job_dir!r} must be an absolute path in the pods; {hint}")
    try:
        volumes = parse_volumes(job.volume) if job.volume else []
    except ValueError as e:
        raise ClientError(str(e)) from None
    for volume in volumes:
        mount_path = os.path.normpath(volume.mount_path)
        inside = path == mount_path or path.startswith(mount_path.rstrip("/") + "/")
        if inside and not volume.read_only:
            return
    raise ClientError(f"--job_dir {job.job_dir!r} is on no writable --volume; {hint}")


class KubernetesBackend(JobBackend):
    platform = PlatformName.KUBERNETES

    def __init__(
        self,
        namespace: str = "default",
        kube_context: str = "",
        k8s: K8sClient | None = None,
        force_use_kube_config_file: bool = False,
    ) -> None:
        self.namespace = namespace or "default"
        self._config = KubeConfig(
            context=kube_context, force_use_kube_config_file=force_use_kube_config_file
        )
        self._k8s = k8s

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
        from elasticdl.k8s.pods import PodTemplate, build_pod

        if not job.image_name:
            raise ClientError(
                "--image_name is required on Kubernetes; build one with 'elasticdl zoo build'"
            )
        try:
            cluster_spec = ClusterSpec.from_spec(job)
            template = PodTemplate.from_spec(job, cluster_spec=cluster_spec)
        except ValueError as e:
            raise ClientError(str(e)) from None
        template.namespace = self.namespace
        template.service_account = service_account
        # Never restarted in place: a restartable master's Job makes a new pod instead (each
        # life's exit code and log stay readable); a bare master pod is not restarted at all.
        template.restart_policy = "Never"
        if restartable(job):
            check_job_dir(job)
        # The whole job in one argument; only the fields that differ from their defaults, so
        # the manifest stays readable.
        sent = job.replace(platform=PlatformName.KUBERNETES, namespace=self.namespace)
        command = ["python", "-m", MASTER_MODULE, *master_argv(spec=sent)]
        try:
            return build_pod(
                template,
                name=master_pod_name(job.job_name),
                job_name=job.job_name,
                replica_type=MASTER_TYPE,
                replica_id=0,
                image=job.image_name,
                command=command,
                resource_request=job.master_resource_request,
                resource_limit=job.master_resource_limit,
                priority_class=job.master_pod_priority,
                # A port a restartable master declares would, on the host network, be a host
                # port its dead predecessor's pod still holds for the scheduler: the next master
                # would never be scheduled. It listens all the same.
                port=None if restartable(job) else job.port,
            )
        except ValueError as e:
            raise ClientError(str(e)) from None

    def build_master_job(self, pod, job: JobSpec):
        """The batch/v1 Job whose pod template is the master pod ``pod`` (restartable)."""
        from kubernetes import client

        return client.V1Job(
            api_version="batch/v1",
            kind="Job",
            metadata=client.V1ObjectMeta(
                name=master_pod_name(job.job_name),
                namespace=self.namespace,
                labels=dict(pod.metadata.labels or {}),
            ),
            spec=client.V1JobSpec(
                backoff_limit=MASTER_RESTARTS,
                completions=1,
                parallelism=1,
                template=client.V1PodTemplateSpec(
                    metadata=client.V1ObjectMeta(
                        labels=dict(pod.metadata.labels or {}),
                        annotations=pod.metadata.annotations,
                    ),
                    spec=pod.spec,
                ),
            ),
        )

    def submit(self, job: JobSpec, yaml_path: str = "") -> JobHandle:
        if yaml_path:
            pod = self.build_master_pod(job)
            write_manifest(self.build_master_job(pod, job) if restartable(job) else pod, yaml_path)
            return JobHandle(
                job_name=job.job_name,
                platform=self.platform,
                created_at=time.time(),
                namespace=self.namespace,
                master=pod.metadata.name,
                yaml_path=yaml_path,
            )
        pod = self.build_master_pod(job)  # validate everything before touching the cluster
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
        if restartable(job):
            return self._submit_restartable(job, pod)
        created = self._create(job.job_name, self.k8s.create_pod, pod)
        self._restrict_ingress(
            job.job_name,
            K8sClient.owner_reference(created),
            undo=lambda: self.k8s.delete_pod(created.metadata.name, grace_seconds=0),
        )
        created_at = (
            created.metadata.creation_timestamp.timestamp()
            if created.metadata.creation_timestamp
            else time.time()
        )
        return JobHandle(
            job_name=job.job_name,
            platform=self.platform,
            created_at=created_at,
            namespace=self.namespace,
            master=created.metadata.name,
        )

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
        )
        try:
            self.k8s.create_service(service)
        except K8sApiError as e:
            undo()
            raise ClientError(f"cannot submit job {job.job_name}: its Service: {e}") from None
        deadline = time.monotonic() + _FIRST_MASTER_WAIT_SECONDS
        master = self._find_master(job.job_name)
        while master is None and time.monotonic() < deadline:
            time.sleep(0.2)
            master = self._find_master(job.job_name)
        return JobHandle(
            job_name=job.job_name,
            platform=self.platform,
            created_at=created.metadata.creation_timestamp.timestamp()
            if created.metadata.creation_timestamp
            else time.time(),
            namespace=self.namespace,
            master=master.metadata.name if master is not None else created.metadata.name,
        )

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

    def _find_master(self, name: str):
        """The job's master pod (a restartable master's: the newest, the running one first),
        or None."""
        pod = self._get_pod(master_pod_name(name))
        if pod is not None:
            return pod
        try:
            pods = self.k8s.list_pods(job_selector(name, MASTER_TYPE))
        except K8sApiError as e:
            raise ClientError(str(e)) from None
        return _current_master(pods)

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
        try:
            masters = self.k8s.list_pods(masters_selector())
        except K8sApiError as e:
            raise ClientError(str(e)) from None
        jobs = [self._status_of(p) for p in current_masters(masters)]
        return sorted(jobs, key=lambda s: s.created_at or 0)

    def _status_of(self, master, with_replicas: bool = False) -> JobStatus:
        labels = master.metadata.labels or {}
        job_name = labels.get(LABEL_JOB) or master.metadata.name
        published: dict = {}
        raw = (master.metadata.annotations or {}).get(STATUS_ANNOTATION)
        if raw:
            try:
                published = json.loads(raw)
            except ValueError:
                logger.warning(
                    "ignoring malformed %s annotation on %s",
                    STATUS_ANNOTATION,
                    master.metadata.name,
                )
        reading = read_termination(master)
        phase = _job_phase(labels.get(LABEL_STATUS, ""), reading.phase, published.get("phase", ""))
        message = published.get("message", "") or ""
        if phase == JobPhase.FAILED and not labels.get(LABEL_STATUS) and self._restarting(master):
            phase = JobPhase.RUNNING
            message = (
                f"the master pod {master.metadata.name} died ({_master_failure(reading)}); "
                "its Job starts a new master, which resumes the job"
            )
        if phase == JobPhase.FAILED and not message:
            message = _master_failure(reading)
        created = (
            master.metadata.creation_timestamp.timestamp()
            if master.metadata.creation_timestamp
            else None
        )
        status = JobStatus.from_dict(
            published,
            job_name=job_name,
            platform=self.platform,
            phase=phase,
            message=message,
            namespace=self.namespace,
            created_at=created,
        )
        if with_replicas:
            pods = self._replica_pods(job_name)
            if status.replicas:
                status.replicas = settle_replicas(status.replicas, pods, status.is_final)
            else:
                status.replicas = _replicas_of_pods(pods)
        return status

    def _restarting(self, master) -> bool:
        """A dead master pod whose Job has not given up: a new master is on its way."""
        controller = _master_job(master)
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

    def _replicas(self, job_name: str) -> list[ReplicaStatus]:
        """The job's PS and workers as their pods show them."""
        return _replicas_of_pods(self._replica_pods(job_name))

    # ---- logs ----------------------------------------------------------------------------
    def _pod_for_replica(self, name: str, replica: str) -> str:
        if replica in ("", MASTER_TYPE):
            return self._master(name).metadata.name
        rtype, _, rid = replica.rpartition("-")
        if rtype not in (WORKER_TYPE, PS_TYPE) or not rid.isdigit():
            raise ClientError(f"replica {replica!r} is invalid; use master, worker-<i> or ps-<i>")
        return pod_name(name, rtype, int(rid))

    def logs(self, name: str, replica: str = "master", follow: bool = False) -> Iterator[str]:
        pod = self._pod_for_replica(name, replica)
        self._master(name)  # unknown job -> JobNotFoundError
        if os.environ.get(POD_LOG_DIR_ENV):
            yield from self._file_logs(
                name, pod, Path(os.environ[POD_LOG_DIR_ENV]) / self.namespace / f"{pod}.log", follow
            )
            return
        if not follow:
            try:
                text = self.k8s.read_pod_log(pod)
            except K8sApiError as e:
                raise ClientError(f"logs of {pod} are not available: {e}") from None
            if text is None:
                raise ClientError(f"no pod {pod} in namespace {self.namespace}")
            yield text
            return
        yield from self._follow_api_logs(name, pod)

    def _follow_api_logs(self, name: str, pod: str) -> Iterator[str]:
        while True:  # logs exist once the container started
            current = self._get_pod(pod)
            if current is None:
                raise ClientError(f"no pod {pod} in namespace {self.namespace}")
            if read_termination(current).phase in (RUNNING, SUCCEEDED, FAILED):
                break
            time.sleep(0.5)
        try:
            chunks = self.k8s.follow_pod_log(pod)
        except Exception as e:  # K8sApiError, or the server unreachable
            raise ClientError(f"logs of {pod} are not available: {e}") from None
        yield from chunks

    def _file_logs(self, name: str, pod: str, path: Path, follow: bool) -> Iterator[str]:
        offset = 0
        while True:
            if path.exists():
                with open(path, "rb") as f:
                    f.seek(offset)
                    data = f.read()
                if data:
                    offset += len(data)
                    yield data.decode("utf-8", errors="replace")
            if not follow:
                if not path.exists():
                    raise ClientError(f"no log file {path} for pod {pod}")
                return
            current = self._get_pod(pod)
            if current is None or read_termination(current).is_terminal:
                # One last read for output written just before the end.
                if path.exists() and path.stat().st_size > offset:
                    continue
                return
            time.sleep(0.3)

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
        controller = _master_job(master)
        try:
            if controller:  # the Job goes, not the pod: nothing may start a master after cancel
                self.k8s.delete_job(controller)
            else:
                self.k8s.delete_pod(master.metadata.name, propagation="Background")
        except K8sApiError as e:
            raise ClientError(f"cannot cancel job {name}: {e}") from None
        leftovers = self._wait_job_gone(name, _CANCEL_WAIT_SECONDS, controller)
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


def _replica_of_pod(pod) -> ReplicaStatus | None:
    labels = pod.metadata.labels or {}
    try:
        replica_id = int(labels.get(LABEL_REPLICA_INDEX, "0"))
    except ValueError:
        return None
    reading = read_termination(pod)
    rtype = labels.get(LABEL_REPLICA_TYPE, "")
    return ReplicaStatus(
        name=f"{rtype}-{replica_id}",
        type=rtype,
        id=replica_id,
        phase=reading.phase,
        exit_code=reading.exit_code,
        message=reading.reason,
    )


def _replicas_of_pods(pods: list) -> list[ReplicaStatus]:
    """The replicas of ``pods`` (PS and workers), in (type, id) order."""
    replicas = (_replica_of_pod(p) for p in pods)
    return sorted((r for r in replicas if r is not None), key=lambda r: (r.type, r.id))


def settle_replicas(
    published: list[ReplicaStatus], pods: list, job_final: bool
) -> list[ReplicaStatus]:
    """The replicas the master published (restarts, replacements: what only it knows), each
    that it still shows unfinished brought up to date with its pod. The master publishes every
    few seconds, and for the last time right after deleting the replicas left at the job's
    end, before their pods are gone: without this a finished job would show its PS running.
    An unfinished replica takes its pod's phase, exit code and reason once the pod ended; of
    a finished job, one whose pod is gone is Deleted."""
    live = {r.name: r for r in map(_replica_of_pod, pods) if r is not None}
    settled = []
    for replica in published:
        if replica.phase not in TERMINAL_PHASES:
            pod = live.get(replica.name)
            if pod is not None and pod.phase in TERMINAL_PHASES:
                replica = dataclasses.replace(
                    replica, phase=pod.phase, exit_code=pod.exit_code, message=pod.message
                )
            elif pod is None and job_final:
                replica = dataclasses.replace(replica, phase=DELETED, message=REASON_DELETED)
        settled.append(replica)
    return settled


def write_manifest(pod, path: str) -> None:
    """Write ``pod`` as YAML to ``path`` ("-" = stdout)."""
    import yaml

    text = yaml.safe_dump(to_dict(pod), sort_keys=False, default_flow_style=False)
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


def _master_job(master) -> str:
    """The name of the Job that runs this master pod (a restartable master), or ""."""
    for ref in master.metadata.owner_references or []:
        if ref.kind == "Job" and ref.controller:
            return ref.name
    return ""


def _current_master(pods: list):
    """Of one job's master pods (a restartable master leaves its dead lives behind), the
    newest live one, else the newest."""
    if not pods:
        return None

    def key(pod):
        created = pod.metadata.creation_timestamp
        return (not read_termination(pod).is_terminal, created.timestamp() if created else 0)

    return max(pods, key=key)


def current_masters(pods: list) -> list:
    """One master pod per job (:func:`_current_master`) of the master pods ``pods``."""
    by_job: dict[str, list] = {}
    for pod in pods:
        by_job.setdefault((pod.metadata.labels or {}).get(LABEL_JOB, pod.metadata.name), []).append(
            pod
        )
    return [_current_master(group) for group in by_job.values()]


def _job_phase(label: str, pod_phase: str | None, published: str) -> str:
    if label in _FINAL_LABELS:
        return label
    if pod_phase == "Succeeded":
        # A restartable master exits 0 also when the job failed (so its Job does not start it
        # again); its published phase says how the job ended when its label could not.
        return published if published in _FINAL_LABELS else JobPhase.SUCCEEDED
    if pod_phase == "Failed":
        return JobPhase.FAILED
    if pod_phase == "Running":
        return published if published in (JobPhase.RUNNING, JobPhase.PENDING) else JobPhase.RUNNING
    return JobPhase.PENDING


def _master_failure(reading: PodTermination) -> str:
    """Why the master pod failed, for a master that could not say so itself."""
    if reading.exit_code is not None:
        cause = f" ({reading.reason})" if reading.reason else ""
        return f"master exited with {reading.exit_code}{cause}"
    return ": ".join(part for part in (reading.reason, reading.message) if part)
