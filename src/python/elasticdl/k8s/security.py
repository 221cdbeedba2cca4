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

from elasticdl.common.job_spec import POD_SECURITY_NONE, POD_SECURITY_RESTRICTED

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
    "pod_security_context",
    "restricted",
]


def restricted(mode: str) -> bool:
    if mode not in (POD_SECURITY_RESTRICTED, POD_SECURITY_NONE):
        raise ValueError(
            f"--pod_security {mode!r} is invalid; use {POD_SECURITY_RESTRICTED} or "
            f"{POD_SECURITY_NONE}"
        )
    return mode == POD_SECURITY_RESTRICTED


def pod_security_context(mode: str):
    """The ``V1PodSecurityContext`` of a pod (None: the image's and cluster's defaults)."""
    if not restricted(mode):
        return None
    from kubernetes import client

    return client.V1PodSecurityContext(
        run_as_non_root=True,
        run_as_user=RUN_AS_USER,
        run_as_group=RUN_AS_GROUP,
        fs_group=RUN_AS_GROUP,
        seccomp_profile=client.V1SeccompProfile(type="RuntimeDefault"),
    )


def container_security_context(mode: str):
    """The ``V1SecurityContext`` of the pod's container (None: defaults)."""
    if not restricted(mode):
        return None
    from kubernetes import client

    return client.V1SecurityContext(
        run_as_non_root=True,
        allow_privilege_escalation=False,
        capabilities=client.V1Capabilities(drop=["ALL"]),
        read_only_root_filesystem=True,
    )
