"""A FAKE kubelet (and scheduler) that runs pods as local processes — for tests only.

The test cluster (``elasticdl_tests.k8s.cluster``) has a real API server but no nodes, no
container runtime and no kubelet; without something playing their part every pod would stay
``Pending`` forever. :class:`ProcessKubelet` is that something:

* it watches pods in all namespaces and binds every unscheduled ``Pending`` pod to the fake
  node ``process-node`` (the scheduler's job);
* it runs the FIRST container's ``command`` + ``args`` as a local process (own process group)
  with the container's ``env``. Container IMAGES ARE NOT RUN: the command runs on this host
  in the test's own Python environment — ``python``/``python3`` resolve to the test's
  interpreter (a PATH shim) and ``PYTHONPATH`` is the test's import path. Volumes, resources,
  probes, init containers, restart policies other than ``Never`` are ignored;
* every pod gets IP ``127.0.0.1`` (all pods share the host's network, like ``hostNetwork``
  pods on a one-node cluster — so replicas must use distinct ports);
* env values from Secrets (``secretKeyRef``) are read through the API server; values from the
  downward API are resolved for ``metadata.name``, ``metadata.namespace``,
  ``metadata.uid``, ``metadata.labels['k']``, ``metadata.annotations['k']``,
  ``spec.nodeName``, ``spec.serviceAccountName``, ``status.podIP`` and ``status.hostIP``;
  ``$(VAR)`` references in command, args and env values are expanded like the kubelet does;
* it reports status through ``pods/status``: ``Running`` once started, then ``Succeeded`` or
  ``Failed`` with the exit code (``128 + N`` for a process killed by signal N, as container
  runtimes report, so SIGKILL gives 137 with reason ``Error``);
* on graceful deletion (``deletionTimestamp``) it sends SIGTERM to the process group, SIGKILL
  after the grace period (capped at :attr:`max_grace_seconds`), reports the final status and
  deletes the pod with grace period 0 — what the real kubelet does;
* it cannot serve ``kubectl logs`` (the API server proxies logs to a real kubelet's port);
  instead each pod's stdout+stderr go to :meth:`log_path` (``<root>/<namespace>/<pod>.log``),
  which :attr:`pod_logs` reads for what the tests give a pod-log reader.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

from elasticdl_tests.k8s.cluster import die_with_parent

logger = logging.getLogger(__name__)

NODE_NAME = "process-node"
POD_IP = "127.0.0.1"
_VAR_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)|\$\$")
_FIELD_INDEX = re.compile(r"^metadata\.(labels|annotations)\['([^']+)'\]$")


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion: known variables are substituted, unknown references
    stay as they are, ``$$`` is a literal ``$``."""

    def sub(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env[name] if name in env else match.group(0)

    return _VAR_REF.sub(sub, value)


def field_value(pod, path: str) -> str:
    """The downward-API value of ``path`` for ``pod`` (see module docstring for the list)."""
    simple = {
        "metadata.name": pod.metadata.name,
        "metadata.namespace": pod.metadata.namespace,
        "metadata.uid": pod.metadata.uid,
        "spec.nodeName": NODE_NAME,
        "spec.serviceAccountName": pod.spec.service_account_name or "default",
        "status.podIP": POD_IP,
        "status.hostIP": POD_IP,
    }
    if path in simple:
        return simple[path] or ""
    match = _FIELD_INDEX.match(path)
    if match:
        source = pod.metadata.labels if match.group(1) == "labels" else pod.metadata.annotations
        return (source or {}).get(match.group(2), "")
    raise ValueError(f"the process kubelet does not support fieldRef {path!r}")


@dataclasses.dataclass
class _Running:
    namespace: str
    name: str
    uid: str
    container: str
    image: str
    proc: subprocess.Popen
    deleting: bool = False
    reported: bool = False


class ProcessKubelet:
    """See the module docstring. ``api`` is a ``CoreV1Api`` with rights on all namespaces."""

    def __init__(
        self,
        api,
        root: str | os.PathLike,
        max_grace_seconds: float = 5.0,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self.api = api
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.max_grace_seconds = max_grace_seconds
        self.extra_env = dict(extra_env or {})
        # Only pods of these namespaces are run (tests that want pods to stay Pending simply
        # do not register their namespace).
        self._namespaces: set[str] = set()
        self._lock = threading.RLock()
        self._running: dict[str, _Running] = {}  # by pod uid
        self._started_uids: set[str] = set()
        self._lost: set[str] = set()  # pods of a lost node: never reported again
        self._lost_namespaces: set[str] = set()  # until served again
        self._held: set[tuple[str, str]] = set()  # (namespace, pod name): left unscheduled
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._shim = self.root / ".bin"
        self._shim.mkdir(exist_ok=True)
        for name in ("python", "python3"):
            link = self._shim / name
            if not link.exists():
                link.symlink_to(sys.executable)

    # ---- public -----------------------------------------------------------------------------
    def start(self) -> "ProcessKubelet":
        for target, name in (
            (self._watch_loop, "kubelet-watch"),
            (self._reap_loop, "kubelet-reap"),
        ):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        """Stop watching and SIGKILL every process still running (pods are left as they are)."""
        self._stop.set()
        with self._lock:
            running = list(self._running.values())
            self._running.clear()
        for r in running:
            _kill_group(r.proc, signal.SIGKILL)
            r.proc.wait()
        for thread in self._threads:
            thread.join(10)

    def serve(self, namespace: str) -> None:
        """Run the pods of ``namespace`` from now on (including those already Pending)."""
        from kubernetes.client.exceptions import ApiException

        with self._lock:
            self._namespaces.add(namespace)
            self._lost_namespaces.discard(namespace)
        try:
            pods = self.api.list_namespaced_pod(namespace).items
        except ApiException:
            return
        for pod in pods:
            self._handle("MODIFIED", pod)

    def hold(self, namespace: str, name: str) -> None:
        """Leave the pod ``name`` (created now or later) unscheduled and Pending, as the
        scheduler does with a pod that fits no node, until :meth:`release`."""
        with self._lock:
            self._held.add((namespace, name))

    def release(self, namespace: str, name: str) -> None:
        """Schedule and run the held pod ``name`` now (as when capacity returns)."""
        from kubernetes.client.exceptions import ApiException

        with self._lock:
            self._held.discard((namespace, name))
        try:
            pod = self.api.read_namespaced_pod(name, namespace)
        except ApiException:
            return
        self._handle("MODIFIED", pod)

    def forget(self, namespace: str) -> None:
        with self._lock:
            self._namespaces.discard(namespace)

    def _secret_value(self, namespace: str, ref) -> str:
        """What a real kubelet does for ``secretKeyRef``: read the key from the Secret."""
        import base64

        secret = self.api.read_namespaced_secret(ref.name, namespace)
        data = (secret.data or {}).get(ref.key)
        if data is None:
            raise ValueError(f"secret {ref.name} has no key {ref.key}")
        return base64.b64decode(data).decode()

    def log_path(self, namespace: str, name: str) -> Path:
        return self.root / namespace / f"{name}.log"

    @property
    def pod_logs(self):
        """What reads the logs of the pods run here (the API server cannot: see
        ``pod_log_files``)."""
        from elasticdl_tests.k8s.pod_log_files import PodLogFiles

        return PodLogFiles(self.root)

    def pid_of(self, namespace: str, name: str) -> int | None:
        """PID of the running process of pod ``namespace/name`` (the group leader)."""
        with self._lock:
            for r in self._running.values():
                if r.namespace == namespace and r.name == name and r.proc.poll() is None:
                    return r.proc.pid
        return None

    def lose(self, namespace: str) -> None:
        """The node dies for ``namespace``: its pods' processes are SIGKILLed and nothing of
        them is reported or confirmed from now on (their status stays as it was, a deletion
        stays ``Terminating``), as when the machine of a real kubelet goes away."""
        with self._lock:
            self._namespaces.discard(namespace)
            self._lost_namespaces.add(namespace)
            lost = [uid for uid, r in self._running.items() if r.namespace == namespace]
            running = [self._running.pop(uid) for uid in lost]
            self._lost.update(lost)
        for r in running:
            _kill_group(r.proc, signal.SIGKILL)
            r.proc.wait()

    def kill(self, namespace: str, name: str, sig: int = signal.SIGKILL) -> bool:
        """Send ``sig`` to the pod's process group (simulates OOM kills, preemption, crashes)."""
        pid = self.pid_of(namespace, name)
        if pid is None:
            return False
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return False
        return True

    # ---- watch --------------------------------------------------------------------------------
    def _watch_loop(self) -> None:
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        resource_version = None
        while not self._stop.is_set():
            try:
                if resource_version is None:
                    listing = self.api.list_pod_for_all_namespaces()
                    for pod in listing.items:
                        self._handle("MODIFIED", pod)
                    resource_version = listing.metadata.resource_version
                w = watch.Watch()
                for event in w.stream(
                    self.api.list_pod_for_all_namespaces,
                    resource_version=resource_version,
                    timeout_seconds=2,
                ):
                    pod = event["object"]
                    if event["type"] == "ERROR" or not hasattr(pod, "metadata"):
                        resource_version = None
                        break
                    resource_version = pod.metadata.resource_version
                    self._handle(event["type"], pod)
                    if self._stop.is_set():
                        w.stop()
                        break
            except ApiException as e:
                if e.status != 410:
                    logger.warning("process kubelet: watch failed: %s", e.reason)
                    self._stop.wait(0.5)
                resource_version = None
            except Exception:  # the API server went away (end of a test session) or a bug
                if self._stop.is_set():
                    return
                logger.exception("process kubelet: watch loop error")
                self._stop.wait(0.5)
                resource_version = None

    def _handle(self, kind: str, pod) -> None:
        uid = pod.metadata.uid
        with self._lock:
            if uid in self._lost:
                return
            if pod.metadata.namespace not in self._namespaces and uid not in self._running:
                return
        if kind == "DELETED":  # force-deleted (grace 0) while running: just kill it
            with self._lock:
                running = self._running.pop(uid, None)
            if running is not None:
                _kill_group(running.proc, signal.SIGKILL)
                running.proc.wait()
            return
        if pod.metadata.deletion_timestamp:
            with self._lock:
                running = self._running.get(uid)
                if running is not None:
                    if running.deleting:
                        return
                    running.deleting = True
            grace = pod.metadata.deletion_grace_period_seconds or 0
            threading.Thread(
                target=self._terminate, args=(pod, running, grace), daemon=True
            ).start()
            return
        if pod.status and pod.status.phase not in (None, "Pending"):
            return
        if pod.spec.node_name not in (None, NODE_NAME):  # another scheduler's
            return
        with self._lock:
            if (pod.metadata.namespace, pod.metadata.name) in self._held:
                return
            if uid in self._started_uids:
                return
            self._started_uids.add(uid)
        try:
            self._start_pod(pod)
        except Exception as e:  # report instead of dying: the test sees a Failed pod
            logger.exception(
                "process kubelet: cannot start %s/%s", pod.metadata.namespace, pod.metadata.name
            )
            self._patch_status(
                pod.metadata.namespace,
                pod.metadata.name,
                uid,
                {"phase": "Failed", "reason": "ProcessKubeletError", "message": str(e)[:500]},
            )

    # ---- pod lifecycle ----------------------------------------------------------------------
    def _start_pod(self, pod) -> None:
        ns, name, uid = pod.metadata.namespace, pod.metadata.name, pod.metadata.uid
        container = pod.spec.containers[0]
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        # A binding names its pod only by name, and this API server does not check a uid in it:
        # an event read late must not bind a successor of the same name (which, bound, would
        # then never be started: its own events show it scheduled).
        try:
            current = self.api.read_namespaced_pod(name, ns)
        except ApiException as e:
            if e.status == 404:
                return
            raise
        if current.metadata.uid != uid:
            return
        if not current.spec.node_name:
            body = client.V1Binding(
                metadata=client.V1ObjectMeta(name=name),
                target=client.V1ObjectReference(api_version="v1", kind="Node", name=NODE_NAME),
            )
            self.api.create_namespaced_pod_binding(name, ns, body, _preload_content=False)

        env = dict(os.environ)
        env["PATH"] = f"{self._shim}{os.pathsep}{env.get('PATH', '')}"
        # Absolute: the process runs in another directory (test runners like Pants put
        # relative source roots on sys.path).
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in sys.path if p)
        env["PYTHONUNBUFFERED"] = "1"
        env["HOSTNAME"] = name
        env.update(self.extra_env)
        pod_env: dict[str, str] = {}
        for var in container.env or []:
            if var.value_from is not None and var.value_from.secret_key_ref is not None:
                value = self._secret_value(ns, var.value_from.secret_key_ref)
            elif var.value_from is not None:
                if var.value_from.field_ref is None:
                    raise ValueError(
                        f"env {var.name}: only value, fieldRef and secretKeyRef are supported "
                        "by the process kubelet"
                    )
                value = field_value(pod, var.value_from.field_ref.field_path)
            else:
                value = expand(var.value or "", {**pod_env})
            pod_env[var.name] = value
        env.update(pod_env)
        argv = [
            expand(a, pod_env) for a in list(container.command or []) + list(container.args or [])
        ]
        if not argv:
            raise ValueError(
                "container has no command: the process kubelet cannot run image entrypoints"
            )
        log_path = self.log_path(ns, name)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        cwd = (
            container.working_dir
            if container.working_dir and os.path.isdir(container.working_dir)
            else self.root
        )
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                argv,
                env=env,
                cwd=cwd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        running = _Running(ns, name, uid, container.name, container.image, proc)
        started = self._patch_status(
            ns,
            name,
            uid,
            {
                "phase": "Running",
                "hostIP": POD_IP,
                "podIP": POD_IP,
                "podIPs": [{"ip": POD_IP}],
                "startTime": _now(),
                "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": _now()}],
                "containerStatuses": [
                    {
                        "name": container.name,
                        "image": container.image,
                        "imageID": "",
                        "ready": True,
                        "restartCount": 0,
                        "started": True,
                        "state": {"running": {"startedAt": _now()}},
                    }
                ],
            },
        )
        if not started:  # deleted, or replaced by a pod of the same name, meanwhile
            _kill_group(proc, signal.SIGKILL)
            proc.wait()
            return
        with self._lock:
            dead = ns in self._lost_namespaces  # lost while it started
            if dead:
                self._lost.add(pod.metadata.uid)
            else:
                self._running[pod.metadata.uid] = running
        if dead:
            _kill_group(proc, signal.SIGKILL)
            proc.wait()
            return
        logger.info("process kubelet: started %s/%s as pid %d", ns, name, proc.pid)

    def _report_exit(self, running: _Running) -> None:
        if running.reported:
            return
        running.reported = True
        rc = running.proc.returncode
        exit_code = 128 - rc if rc < 0 else rc
        self._patch_status(
            running.namespace,
            running.name,
            running.uid,
            {
                "phase": "Succeeded" if exit_code == 0 else "Failed",
                "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": _now()}],
                "containerStatuses": [
                    {
                        "name": running.container,
                        "image": running.image,
                        "imageID": "",
                        "ready": False,
                        "restartCount": 0,
                        "started": False,
                        "state": {
                            "terminated": {
                                "exitCode": exit_code,
                                "reason": "Completed" if exit_code == 0 else "Error",
                                "finishedAt": _now(),
                            }
                        },
                    }
                ],
            },
        )

    def _terminate(self, pod, running: _Running | None, grace: float) -> None:
        ns, name = pod.metadata.namespace, pod.metadata.name
        if running is not None:
            _kill_group(running.proc, signal.SIGTERM)
            try:
                running.proc.wait(min(grace, self.max_grace_seconds))
            except subprocess.TimeoutExpired:
                _kill_group(running.proc, signal.SIGKILL)
                running.proc.wait()
            self._report_exit(running)
            with self._lock:
                self._running.pop(running.uid, None)
        try:
            from kubernetes import client

            self.api.delete_namespaced_pod(
                name,
                ns,
                grace_period_seconds=0,
                _preload_content=False,
                body=client.V1DeleteOptions(
                    grace_period_seconds=0,
                    preconditions=client.V1Preconditions(uid=pod.metadata.uid),
                ),
            )
        except Exception as e:
            if getattr(e, "status", None) not in (404, 409):
                logger.warning("process kubelet: final delete of %s/%s failed: %s", ns, name, e)

    def _reap_loop(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                done = [
                    r
                    for r in self._running.values()
                    if not r.deleting and r.proc.poll() is not None
                ]
                for r in done:
                    self._running.pop(r.uid, None)
            for r in done:
                self._report_exit(r)
                logger.info(
                    "process kubelet: %s/%s exited with %s", r.namespace, r.name, r.proc.returncode
                )
            self._stop.wait(0.1)

    def _patch_status(self, ns: str, name: str, uid: str, status: dict) -> bool:
        """Set the status of pod ``uid``; False when it is gone. The uid in the patch is a
        precondition: a pod deleted at once (grace 0) may already have a successor of the same
        name, whose status this must not touch (the API server refuses the patch: the uid is
        immutable)."""
        try:
            self.api.patch_namespaced_pod_status(
                name, ns, {"metadata": {"uid": uid}, "status": status}
            )
        except Exception as e:
            code = getattr(e, "status", None)
            if code == 404 or code in (409, 422) and self._replaced(ns, name, uid):
                return False
            logger.warning("process kubelet: status update of %s/%s failed: %s", ns, name, e)
        return True

    def _replaced(self, ns: str, name: str, uid: str) -> bool:
        try:
            return self.api.read_namespaced_pod(name, ns).metadata.uid != uid
        except Exception as e:
            return getattr(e, "status", None) == 404


def _kill_group(proc: subprocess.Popen, sig: int) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
