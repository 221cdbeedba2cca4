"""The one place ElasticDL talks to the Kubernetes API.

Every API call of ElasticDL (the client's ``KubernetesBackend``, the master's
``KubernetesPlatform``, the test harness) goes through :class:`K8sClient`, a thin wrapper of
the official ``kubernetes`` Python client that

* loads credentials the way users expect (in-cluster service account when running inside a
  pod, else ``~/.kube/config`` / ``$KUBECONFIG`` with an optional context;
  ``--force_use_kube_config_file`` prefers the file even inside a pod);
* turns "not found" into ``None`` / ``False`` instead of exceptions where callers only care
  whether something exists, and every other API failure into :class:`K8sApiError` with a
  one-line message;
* hides differences between the generations of the ``kubernetes`` client (the
  openapi-generator models of 29.x and the pydantic-based models of later releases, such as
  the pinned 37.x) and API-server quirks: Kubernetes 1.20 answers
  ``DELETE service`` and ``POST pods/binding`` with a ``Status`` object, which the generated
  client fails to deserialize although the call succeeded, so those calls skip
  deserialization;
* offers :meth:`K8sClient.watch_pods`, a watch that survives expired resource versions
  (HTTP 410) by re-listing and synthesising the events the consumer missed
  (:mod:`elasticdl.k8s.pod_watch`).

The ``kubernetes`` package is imported lazily (only when a client is built), so importing
this module is cheap.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from typing import TYPE_CHECKING, Any, Iterator

from elasticdl.common.text_chunks import decoded_chunks
from elasticdl.k8s.api_errors import K8sApiError, K8sConfigError, api_error, api_exception_class
from elasticdl.k8s.pod_watch import watch_pods

if TYPE_CHECKING:
    from elasticdl.common.job_spec import JobSpec


# ---- configuration ---------------------------------------------------------------------------
@dataclasses.dataclass
class KubeConfig:
    """How to reach the API server.

    ``kubeconfig``: path of a kubeconfig file ("" = ``$KUBECONFIG`` or ``~/.kube/config``);
    ``context``: context in that file ("" = its current context);
    ``force_use_kube_config_file``: use the file even when running inside a pod (by default a
    pod uses its service account).
    """

    kubeconfig: str = ""
    context: str = ""
    force_use_kube_config_file: bool = False

    @classmethod
    def from_spec(cls, job: "JobSpec") -> "KubeConfig":
        """From the job's ``kube_context`` and ``force_use_kube_config_file`` (the file itself
        comes from ``$KUBECONFIG``: there is no flag for it)."""
        return cls(
            context=job.kube_context, force_use_kube_config_file=job.force_use_kube_config_file
        )


def in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and os.path.exists(
        "/var/run/secrets/kubernetes.io/serviceaccount/token"
    )


def load_api_client(cfg: KubeConfig | None = None):
    """A ``kubernetes.client.ApiClient`` configured from ``cfg`` (see :class:`KubeConfig`)."""
    from kubernetes import client, config

    cfg = cfg or KubeConfig()
    configuration = client.Configuration()
    if in_cluster() and not cfg.force_use_kube_config_file:
        try:
            config.load_incluster_config(client_configuration=configuration)
            return client.ApiClient(configuration)
        except config.ConfigException as e:
            raise K8sConfigError(f"cannot use the pod's service account: {e}") from None
    path = (
        cfg.kubeconfig
        or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
        or os.path.expanduser("~/.kube/config")
    )
    if not os.path.exists(path):
        raise K8sConfigError(
            f"no kubeconfig at {path}; point $KUBECONFIG at your cluster's kubeconfig "
            "(or run inside a pod)"
        )
    try:
        config.load_kube_config(
            config_file=path,
            context=cfg.context or None,
            client_configuration=configuration,
            persist_config=False,
        )
    except (config.ConfigException, ValueError, KeyError, TypeError) as e:
        where = f" context {cfg.context!r}" if cfg.context else ""
        raise K8sConfigError(f"cannot load kubeconfig {path}{where}: {e}") from None
    return client.ApiClient(configuration)


# ---- models <-> dicts ------------------------------------------------------------------------
def to_dict(obj) -> Any:
    """A model (or list/dict of models) as the JSON-ready dict the API server sees
    (camelCase keys, no ``None`` values)."""
    from kubernetes import client

    return client.ApiClient().sanitize_for_serialization(obj)


def to_model(data: Any, type_name: str):
    """Build a model such as ``V1Affinity`` from its JSON form (camelCase keys).

    Raises :class:`ValueError` naming the first unknown field, so typos in user-supplied
    specs (``nodeAfinity``) are reported instead of silently dropped.
    """
    from kubernetes import client

    cls = getattr(client, type_name)
    if hasattr(cls, "from_dict"):  # pydantic-based clients (>= 30)
        model = cls.from_dict(data)
    else:  # openapi-generator clients (29.x): its private deserializer is the only entry point
        model = client.ApiClient()._ApiClient__deserialize(data, type_name)
    _check_round_trip(data, to_dict(model), type_name)
    return model


def _check_round_trip(given: Any, kept: Any, path: str) -> None:
    if isinstance(given, dict):
        if not isinstance(kept, dict):
            raise ValueError(f"{path}: expected a value, got an object")
        for key, value in given.items():
            if key not in kept:
                if value is None or value == {} or value == []:
                    continue
                raise ValueError(
                    f"{path}: unknown field {key!r}; check the spelling against the Kubernetes API"
                )
            _check_round_trip(value, kept[key], f"{path}.{key}")
    elif isinstance(given, list) and isinstance(kept, list):
        for i, (a, b) in enumerate(zip(given, kept)):
            _check_round_trip(a, b, f"{path}[{i}]")


# ---- the client ------------------------------------------------------------------------------
class K8sClient:
    """Pods, services, secrets and network policies of one namespace. Thread-safe (the
    underlying client is)."""

    def __init__(
        self, namespace: str = "default", api_client=None, config: KubeConfig | None = None
    ) -> None:
        from kubernetes import client

        self.namespace = namespace
        self.api_client = api_client if api_client is not None else load_api_client(config)
        self.core = client.CoreV1Api(self.api_client)
        self.networking = client.NetworkingV1Api(self.api_client)
        self.batch = client.BatchV1Api(self.api_client)

    # -- generic call wrapper --
    def _call(self, what: str, fn, *args, missing_ok: bool = False, **kwargs):
        try:
            return fn(*args, **kwargs)
        except api_exception_class() as e:
            if missing_ok and e.status == 404:
                return None
            raise api_error(e, what) from None

    # -- pods --
    def create_pod(self, pod):
        return self._call(
            f"create pod {pod.metadata.name}", self.core.create_namespaced_pod, self.namespace, pod
        )

    def get_pod(self, name: str):
        """The pod, or ``None`` if it does not exist."""
        return self._call(
            f"get pod {name}", self.core.read_namespaced_pod, name, self.namespace, missing_ok=True
        )

    def list_pods(self, label_selector: str = "") -> list:
        result = self._call(
            "list pods",
            self.core.list_namespaced_pod,
            self.namespace,
            label_selector=label_selector or None,
        )
        return list(result.items)

    def delete_pod(
        self, name: str, grace_seconds: float | None = None, propagation: str | None = None
    ) -> bool:
        """Delete ``name``; False if it did not exist. ``propagation``: Background (default on
        the server), Foreground or Orphan for the pods/services it owns."""
        kwargs: dict[str, Any] = {}
        if grace_seconds is not None:
            kwargs["grace_period_seconds"] = int(max(0, grace_seconds))
        if propagation:
            kwargs["propagation_policy"] = propagation
        result = self._call(
            f"delete pod {name}",
            self.core.delete_namespaced_pod,
            name,
            self.namespace,
            missing_ok=True,
            _preload_content=False,
            **kwargs,
        )
        return result is not None

    def wait_pod_gone(self, name: str, timeout: float) -> bool:
        """Poll until the pod no longer exists; True if it went within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            if self.get_pod(name) is None:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.2)

    def patch_pod_labels(self, name: str, labels: dict[str, str]):
        return self._call(
            f"label pod {name}",
            self.core.patch_namespaced_pod,
            name,
            self.namespace,
            {"metadata": {"labels": labels}},
        )

    def annotate_pod(self, name: str, annotations: dict[str, str]) -> bool:
        """Merge ``annotations`` into the pod's; False if the pod does not exist."""
        result = self._call(
            f"annotate pod {name}",
            self.core.patch_namespaced_pod,
            name,
            self.namespace,
            {"metadata": {"annotations": annotations}},
            missing_ok=True,
        )
        return result is not None

    def patch_pod_status(self, name: str, status: dict, missing_ok: bool = True):
        return self._call(
            f"update status of pod {name}",
            self.core.patch_namespaced_pod_status,
            name,
            self.namespace,
            {"status": status},
            missing_ok=missing_ok,
        )

    def bind_pod(self, name: str, node_name: str) -> None:
        """Assign a pending pod to a node (what a scheduler does)."""
        from kubernetes import client

        body = client.V1Binding(
            metadata=client.V1ObjectMeta(name=name),
            target=client.V1ObjectReference(api_version="v1", kind="Node", name=node_name),
        )
        # 1.20 answers with a Status the generated client cannot parse as V1Binding.
        self._call(
            f"bind pod {name}",
            self.core.create_namespaced_pod_binding,
            name,
            self.namespace,
            body,
            _preload_content=False,
        )

    def read_pod_log(
        self, name: str, tail_lines: int | None = None, container: str | None = None
    ) -> str | None:
        """The pod's log text, or ``None`` if the pod does not exist."""
        kwargs: dict[str, Any] = {}
        if tail_lines:
            kwargs["tail_lines"] = int(tail_lines)
        if container:
            kwargs["container"] = container
        try:
            response = self.core.read_namespaced_pod_log(
                name, self.namespace, _preload_content=False, **kwargs
            )
        except api_exception_class() as e:
            # 404 also comes back when the pod exists but its node/kubelet cannot be found.
            if e.status == 404 and self.get_pod(name) is None:
                return None
            raise api_error(e, f"read log of pod {name}") from None
        return response.data.decode("utf-8", errors="replace")

    def follow_pod_log(self, name: str, container: str | None = None) -> Iterator[str]:
        """The pod's log text as it is written, until its container ends (``container``: one
        of several). The request is made here (errors raise :class:`K8sApiError` now); the
        text comes as the result is iterated."""
        kwargs: dict[str, Any] = {"container": container} if container else {}
        response = self._call(
            f"follow log of pod {name}",
            self.core.read_namespaced_pod_log,
            name,
            self.namespace,
            follow=True,
            _preload_content=False,
            **kwargs,
        )

        def chunks() -> Iterator[str]:
            try:
                yield from decoded_chunks(response.stream(4096))
            finally:
                response.release_conn()

        return chunks()

    # -- service accounts --
    def get_service_account(self, name: str):
        """The ServiceAccount, or ``None`` if it does not exist."""
        return self._call(
            f"get service account {name}",
            self.core.read_namespaced_service_account,
            name,
            self.namespace,
            missing_ok=True,
        )

    # -- services --
    def create_service(self, service):
        return self._call(
            f"create service {service.metadata.name}",
            self.core.create_namespaced_service,
            self.namespace,
            service,
        )

    def create_secret(
        self, name: str, data: dict[str, str], labels: dict[str, str], owner_reference=None
    ):
        """An Opaque Secret with ``data`` (strings); ``owner_reference`` makes the cluster's
        garbage collector remove it with its owner."""
        from kubernetes import client

        secret = client.V1Secret(
            metadata=client.V1ObjectMeta(
                name=name,
                labels=labels,
                owner_references=[owner_reference] if owner_reference is not None else None,
            ),
            string_data=data,
            type="Opaque",
        )
        return self._call(
            f"create secret {name}", self.core.create_namespaced_secret, self.namespace, secret
        )

    def get_secret(self, name: str):
        return self._call(
            f"get secret {name}",
            self.core.read_namespaced_secret,
            name,
            self.namespace,
            missing_ok=True,
        )

    def delete_secret(self, name: str) -> bool:
        result = self._call(
            f"delete secret {name}",
            self.core.delete_namespaced_secret,
            name,
            self.namespace,
            missing_ok=True,
            _preload_content=False,
        )
        return result is not None

    def get_service(self, name: str):
        return self._call(
            f"get service {name}",
            self.core.read_namespaced_service,
            name,
            self.namespace,
            missing_ok=True,
        )

    def list_services(self, label_selector: str = "") -> list:
        result = self._call(
            "list services",
            self.core.list_namespaced_service,
            self.namespace,
            label_selector=label_selector or None,
        )
        return list(result.items)

    def delete_service(self, name: str) -> bool:
        # 1.20 answers with a Status the generated client cannot parse as V1Service.
        result = self._call(
            f"delete service {name}",
            self.core.delete_namespaced_service,
            name,
            self.namespace,
            missing_ok=True,
            _preload_content=False,
        )
        return result is not None

    # -- network policies --
    def create_network_policy(self, policy):
        return self._call(
            f"create network policy {policy.metadata.name}",
            self.networking.create_namespaced_network_policy,
            self.namespace,
            policy,
        )

    def get_network_policy(self, name: str):
        """The NetworkPolicy, or ``None`` if it does not exist."""
        return self._call(
            f"get network policy {name}",
            self.networking.read_namespaced_network_policy,
            name,
            self.namespace,
            missing_ok=True,
        )

    def list_network_policies(self, label_selector: str = "") -> list:
        result = self._call(
            "list network policies",
            self.networking.list_namespaced_network_policy,
            self.namespace,
            label_selector=label_selector or None,
        )
        return list(result.items)

    def delete_network_policy(self, name: str) -> bool:
        result = self._call(
            f"delete network policy {name}",
            self.networking.delete_namespaced_network_policy,
            name,
            self.namespace,
            missing_ok=True,
            _preload_content=False,
        )
        return result is not None

    # -- jobs (the controller that recreates a restartable master's pod) --
    def create_job(self, job):
        return self._call(
            f"create job {job.metadata.name}", self.batch.create_namespaced_job, self.namespace, job
        )

    def get_job(self, name: str):
        """The batch/v1 Job, or ``None`` if it does not exist."""
        return self._call(
            f"get job {name}", self.batch.read_namespaced_job, name, self.namespace, missing_ok=True
        )

    def delete_job(self, name: str) -> bool:
        """Delete the Job and, in the background, everything it owns (the API's default for
        Jobs is to orphan their pods); False if it did not exist."""
        result = self._call(
            f"delete job {name}",
            self.batch.delete_namespaced_job,
            name,
            self.namespace,
            missing_ok=True,
            _preload_content=False,
            propagation_policy="Background",
        )
        return result is not None

    # -- owner references --
    @staticmethod
    def owner_reference(pod):
        """An owner reference to ``pod``: objects carrying it are garbage-collected by the
        cluster when the pod is deleted. ``blockOwnerDeletion`` stays off so creating owned
        objects needs no extra RBAC permission on ``pods/finalizers``."""
        from kubernetes import client

        return client.V1OwnerReference(
            api_version="v1",
            kind="Pod",
            name=pod.metadata.name,
            uid=pod.metadata.uid,
            controller=True,
            block_owner_deletion=False,
        )

    @staticmethod
    def job_owner_reference(name: str, uid: str):
        """An owner reference to the batch/v1 Job ``name``: what it owns is garbage-collected
        with it. Not a *controller* reference: the Job controller would count a replica pod it
        controls as one of the Job's own (its failures against ``backoffLimit``)."""
        from kubernetes import client

        return client.V1OwnerReference(
            api_version="batch/v1",
            kind="Job",
            name=name,
            uid=uid,
            controller=False,
            block_owner_deletion=False,
        )

    # -- watching --
    def watch_pods(
        self, label_selector: str, stop: threading.Event, timeout_seconds: int = 30
    ) -> Iterator[tuple[str, Any]]:
        """Yield ``(event_type, pod)`` for pods matching ``label_selector`` until ``stop`` is
        set: :func:`elasticdl.k8s.pod_watch.watch_pods` (a watch that survives expired
        resource versions)."""
        return watch_pods(self, label_selector, stop, timeout_seconds)


__all__ = [
    "K8sApiError",
    "K8sClient",
    "K8sConfigError",
    "KubeConfig",
    "in_cluster",
    "load_api_client",
    "to_dict",
    "to_model",
]
