"""The securityContext of a job's pods (``--pod_security``), in one place.

``restricted`` (the default) gives every pod of a job -- master, PS and workers -- what the
Kubernetes "restricted" Pod Security Standard asks for, so that a compromised replica holds as
little as possible on its node:

* the pod runs as the fixed non-root user :data:`RUN_AS_USER` / group :data:`RUN_AS_GROUP`
  (``runAsNonRoot``), the user the CPU and GPU base images create and switch to (``USER`` in
  ``deploy/docker/Dockerfile.*``); ``fsGroup`` makes volumes that support ownership
  management (emptyDir, most PersistentVolumeClaims) writable for it. hostPath volumes keep
  their owner and mode: a data directory must be readable, a checkpoint directory writable,
  by that user or group (``deploy/k8s/README.md``);
* its container may not gain privileges (``allowPrivilegeEscalation: false``), drops every
  capability and runs under the runtime's default seccomp profile;
* its root filesystem is read-only; ``/tmp`` is a writable, pod-private emptyDir and
  ``HOME`` points there (Keras' config, the model zoo's runtime environment cache), unless the
  job mounts its own volume at ``/tmp`` or sets ``HOME`` in ``--envs``.

``none`` leaves all of it to the image and the cluster (for images that must run as root).
"""

from __future__ import annotations

import copy

from elasticdl.common.job_spec import POD_SECURITY_NONE, POD_SECURITY_RESTRICTED
from elasticdl.k8s.client import to_model

# The non-root user (and group) of the base images; fixed, so a hostPath directory can be
# prepared for it before the job starts (chown 10001:10001 DIR).
RUN_AS_USER = 10001
RUN_AS_GROUP = 10001
TMP_VOLUME = "tmp"  # the writable emptyDir of a restricted pod
TMP_PATH = "/tmp"
HOME_ENV = "HOME"

__all__ = [
    "HOME_ENV",
    "POD_SECURITY_NONE",
    "POD_SECURITY_RESTRICTED",
    "RUN_AS_GROUP",
    "RUN_AS_USER",
    "TMP_PATH",
    "TMP_VOLUME",
    "container_security_context",
    "container_security_context_json",
    "pod_security_context",
    "pod_security_context_json",
    "restricted",
]


def restricted(mode: str) -> bool:
    if mode not in (POD_SECURITY_RESTRICTED, POD_SECURITY_NONE):
        raise ValueError(
            f"--pod_security {mode!r} is invalid; use {POD_SECURITY_RESTRICTED} or "
            f"{POD_SECURITY_NONE}"
        )
    return mode == POD_SECURITY_RESTRICTED


# The restricted settings, in the JSON form of the API (camelCase keys).
RESTRICTED_POD_SECURITY = {
    "runAsNonRoot": True,
    "runAsUser": RUN_AS_USER,
    "runAsGroup": RUN_AS_GROUP,
    "fsGroup": RUN_AS_GROUP,
    "seccompProfile": {"type": "RuntimeDefault"},
}
RESTRICTED_CONTAINER_SECURITY = {
    "runAsNonRoot": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "readOnlyRootFilesystem": True,
}


def pod_security_context_json(mode: str) -> dict | None:
    """The pod's ``securityContext`` as JSON (None: the image's and cluster's defaults)."""
    return copy.deepcopy(RESTRICTED_POD_SECURITY) if restricted(mode) else None


def container_security_context_json(mode: str) -> dict | None:
    """The ``securityContext`` of the pod's containers as JSON (None: defaults)."""
    return copy.deepcopy(RESTRICTED_CONTAINER_SECURITY) if restricted(mode) else None


def pod_security_context(mode: str):
    """The ``V1PodSecurityContext`` of a pod (None: the image's and cluster's defaults)."""
    data = pod_security_context_json(mode)
    return None if data is None else to_model(data, "V1PodSecurityContext")


def container_security_context(mode: str):
    """The ``V1SecurityContext`` of the pod's container (None: defaults)."""
    data = container_security_context_json(mode)
    return None if data is None else to_model(data, "V1SecurityContext")
