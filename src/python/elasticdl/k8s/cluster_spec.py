"""Cluster-specific additions to the pods and services ElasticDL creates.

Two ways to describe them (``--cluster_spec`` and ``--cluster_spec_json``, exclusive):

``--cluster_spec spec.py``
    A Python file defining ``cluster``, an object with ``with_pod(pod)`` and
    ``with_service(service)`` methods. Each receives the ``kubernetes.client`` model
    (``V1Pod`` / ``V1Service``) ElasticDL is about to create and returns it (modified in place
    or a new one), e.g. to add labels, tolerations or make a service headless.

``--cluster_spec_json '{...}'`` (or ``@file.json``)
    A JSON object with the optional keys ``pod_spec`` (applied to every pod), then
    ``master_pod_spec`` / ``worker_pod_spec`` / ``ps_pod_spec`` (applied to pods of that
    replica type, after ``pod_spec``), and ``service_spec`` (every service). Each holds any of

    * ``labels``, ``annotations``: string maps merged into the object's metadata (ElasticDL's
      own ``elasticdl-*`` labels cannot be overridden: they identify the job's pods);
    * ``node_selector``: string map merged into ``spec.nodeSelector`` (pods only);
    * ``affinity``: a Kubernetes ``Affinity`` object (camelCase, as in YAML) (pods only);
    * ``tolerations``: a list of ``Toleration`` objects added to the pod's, replacing one
      ElasticDL set for the same key and effect (e.g. those of ``--node_lost_timeout``) (pods
      only);
    * ``env``: ``{"NAME": "value"}`` or ``[{"name": ..., "value": ...}]`` set in every
      container, replacing variables of the same name (pods only).

    Unknown keys and unknown fields inside ``affinity``/``tolerations`` are errors, so a typo
    never silently produces a pod without its intended placement.

The Python file is executed at load time (it is the user's own code, as with any config
file that is a program). Inside a pod (the master creating workers) the path given on the
command line may not exist; the file is then looked up in ``/cluster_spec/`` (where
``elasticdl zoo init --cluster_spec`` puts it in the image).
"""

from __future__ import annotations

import importlib.util
import json
import os
from typing import TYPE_CHECKING, Any

from elasticdl.k8s.client import to_model
from elasticdl.k8s.names import PROTECTED_LABELS

if TYPE_CHECKING:
    from elasticdl.common.job_spec import JobSpec

IMAGE_CLUSTER_SPEC_DIR = "/cluster_spec"
POD_KEYS = ("labels", "annotations", "node_selector", "affinity", "tolerations", "env")
SERVICE_KEYS = ("labels", "annotations")
TOP_KEYS = ("pod_spec", "service_spec", "master_pod_spec", "worker_pod_spec", "ps_pod_spec")


class ClusterSpecError(ValueError):
    """A bad ``--cluster_spec`` / ``--cluster_spec_json``; the message names the field and fix."""


class ClusterSpec:
    """Applies the user's cluster additions; the empty spec changes nothing."""

    def __init__(
        self, patcher: Any = None, json_spec: dict | None = None, source: str = ""
    ) -> None:
        self._patcher = patcher
        self._json = json_spec or {}
        self.source = source

    # ---- loading ------------------------------------------------------------------------------
    @classmethod
    def load(cls, cluster_spec: str = "", cluster_spec_json: str = "") -> "ClusterSpec":
        if cluster_spec and cluster_spec_json:
            raise ClusterSpecError(
                "--cluster_spec and --cluster_spec_json are exclusive; pass only one"
            )
        if cluster_spec:
            return cls.from_python_file(cluster_spec)
        if cluster_spec_json:
            return cls.from_json(cluster_spec_json)
        return cls()

    @classmethod
    def from_spec(cls, job: "JobSpec") -> "ClusterSpec":
        """From the job's ``cluster_spec`` and ``cluster_spec_json``."""
        return cls.load(job.cluster_spec, job.cluster_spec_json)

    @classmethod
    def from_python_file(cls, path: str) -> "ClusterSpec":
        resolved = resolve_spec_path(path)
        spec = importlib.util.spec_from_file_location("elasticdl_user_cluster_spec", resolved)
        if spec is None or spec.loader is None:
            raise ClusterSpecError(f"--cluster_spec {path!r}: not a loadable Python file")
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception as e:
            raise ClusterSpecError(
                f"--cluster_spec {path!r}: loading it raised {type(e).__name__}: {e}"
            ) from None
        patcher = getattr(module, "cluster", None)
        if patcher is None:
            raise ClusterSpecError(
                f"--cluster_spec {path!r} defines no 'cluster'; add e.g. "
                "'cluster = MyCluster()' with "
                "with_pod(pod) and with_service(service) methods"
            )
        for method in ("with_pod", "with_service"):
            if not callable(getattr(patcher, method, None)):
                raise ClusterSpecError(
                    f"--cluster_spec {path!r}: 'cluster' has no method {method}(...); add it"
                )
        return cls(patcher=patcher, source=resolved)

    @classmethod
    def from_json(cls, text: str) -> "ClusterSpec":
        source = "--cluster_spec_json"
        if text.startswith("@"):
            path = text[1:]
            try:
                with open(path) as f:
                    text = f.read()
            except OSError as e:
                raise ClusterSpecError(
                    f"--cluster_spec_json {path!r}: cannot read it ({e.strerror})"
                ) from None
            source = path
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ClusterSpecError(f"--cluster_spec_json is not valid JSON: {e}") from None
        if not isinstance(data, dict):
            raise ClusterSpecError(
                '--cluster_spec_json must be a JSON object like {"pod_spec": {"labels": {...}}}'
            )
        validate_json_spec(data)
        return cls(json_spec=data, source=source)

    @property
    def empty(self) -> bool:
        return self._patcher is None and not self._json

    # ---- applying -----------------------------------------------------------------------------
    def patch_pod(self, pod, replica_type: str):
        """Apply the additions for a pod of ``replica_type`` (master, worker or ps); returns
        the pod to create."""
        protected = {k: v for k, v in (pod.metadata.labels or {}).items() if k in PROTECTED_LABELS}
        for key in ("pod_spec", f"{replica_type}_pod_spec"):
            if key in self._json:
                _apply_pod_patch(pod, self._json[key], key)
        if self._patcher is not None:
            result = self._patcher.with_pod(pod)
            pod = result if result is not None else pod
        if protected:
            pod.metadata.labels = {**(pod.metadata.labels or {}), **protected}
        return pod

    def patch_service(self, service):
        if "service_spec" in self._json:
            patch = self._json["service_spec"]
            service.metadata.labels = {**(service.metadata.labels or {}), **patch.get("labels", {})}
            service.metadata.annotations = {
                **(service.metadata.annotations or {}),
                **patch.get("annotations", {}),
            }
        if self._patcher is not None:
            result = self._patcher.with_service(service)
            service = result if result is not None else service
        return service


def resolve_spec_path(path: str) -> str:
    candidates = [
        os.path.expanduser(path),
        os.path.join(IMAGE_CLUSTER_SPEC_DIR, os.path.basename(path)),
    ]
    for candidate in candidates:
        if os.path.isfile(candidate):
            return os.path.abspath(candidate)
    raise ClusterSpecError(
        f"--cluster_spec {path!r} does not exist (also looked in {IMAGE_CLUSTER_SPEC_DIR}/); "
        "check the path"
    )


def _string_map(value: Any, where: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ClusterSpecError(
            f'--cluster_spec_json {where} must map strings to strings, e.g. {{"team": "ml"}}'
        )
    return value


def _env_list(value: Any, where: str) -> list[tuple[str, str]]:
    if isinstance(value, dict):
        return [(k, v) for k, v in _string_map(value, where).items()]
    if isinstance(value, list):
        pairs = []
        for i, item in enumerate(value):
            if (
                not isinstance(item, dict)
                or set(item) - {"name", "value"}
                or not isinstance(item.get("name"), str)
            ):
                raise ClusterSpecError(
                    f'--cluster_spec_json {where}[{i}] must be {{"name": ..., "value": ...}}'
                )
            pairs.append((item["name"], str(item.get("value", ""))))
        return pairs
    raise ClusterSpecError(
        f'--cluster_spec_json {where} must be {{"NAME": "value"}} or a list of name/value'
    )


def validate_json_spec(data: dict) -> None:
    """Check every key and value of a ``--cluster_spec_json`` object (no Kubernetes calls)."""
    for top, patch in data.items():
        if top not in TOP_KEYS:
            raise ClusterSpecError(
                f"--cluster_spec_json: unknown key {top!r}; use one of {', '.join(TOP_KEYS)}"
            )
        if not isinstance(patch, dict):
            raise ClusterSpecError(f"--cluster_spec_json {top} must be an object")
        allowed = SERVICE_KEYS if top == "service_spec" else POD_KEYS
        for key, value in patch.items():
            where = f"{top}.{key}"
            if key not in allowed:
                raise ClusterSpecError(
                    f"--cluster_spec_json: unknown key {where!r}; {top} takes {', '.join(allowed)}"
                )
            if key in ("labels", "annotations", "node_selector"):
                _string_map(value, where)
            elif key == "env":
                _env_list(value, where)
            elif key == "affinity":
                if not isinstance(value, dict):
                    raise ClusterSpecError(
                        f"--cluster_spec_json {where} must be a Kubernetes Affinity object"
                    )
                try:
                    to_model(value, "V1Affinity")
                except ValueError as e:
                    raise ClusterSpecError(
                        f"--cluster_spec_json {where}: {str(e).replace('V1Affinity', 'affinity')}"
                    ) from None
            elif key == "tolerations":
                if not isinstance(value, list):
                    raise ClusterSpecError(
                        f"--cluster_spec_json {where} must be a list of Toleration objects"
                    )
                for i, item in enumerate(value):
                    try:
                        to_model(item, "V1Toleration")
                    except (ValueError, TypeError) as e:
                        raise ClusterSpecError(f"--cluster_spec_json {where}[{i}]: {e}") from None


def _apply_pod_patch(pod, patch: dict, where: str) -> None:
    from kubernetes import client

    if "labels" in patch:
        pod.metadata.labels = {**(pod.metadata.labels or {}), **patch["labels"]}
    if "annotations" in patch:
        pod.metadata.annotations = {**(pod.metadata.annotations or {}), **patch["annotations"]}
    if "node_selector" in patch:
        pod.spec.node_selector = {**(pod.spec.node_selector or {}), **patch["node_selector"]}
    if "affinity" in patch:
        pod.spec.affinity = to_model(patch["affinity"], "V1Affinity")
    if "tolerations" in patch:
        given = [to_model(t, "V1Toleration") for t in patch["tolerations"]]
        taken = {(t.key, t.effect) for t in given}
        kept = [t for t in pod.spec.tolerations or [] if (t.key, t.effect) not in taken]
        pod.spec.tolerations = kept + given
    if "env" in patch:
        pairs = _env_list(patch["env"], f"{where}.env")
        names = {name for name, _ in pairs}
        for container in pod.spec.containers:
            kept = [e for e in (container.env or []) if e.name not in names]
            container.env = kept + [client.V1EnvVar(name=n, value=v) for n, v in pairs]
