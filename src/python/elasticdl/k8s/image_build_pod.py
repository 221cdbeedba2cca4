"""The pod that builds a job's image from an uploaded model-zoo package, in the cluster.

It runs the BASE image itself, under the restricted settings of every job pod
(:mod:`elasticdl.k8s.security`), without a service-account token: its init container
``install`` pip-installs the package's ``requirements.txt`` (user code may run there, so it
gets no registry credentials), its container ``push`` packs and pushes the image
(``elasticdl.images.oci_build``, mounted from the volume that holds the package).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from elasticdl.k8s import security
from elasticdl.k8s.names import APP_LABEL, APP_NAME, LABEL_JOB, LABEL_REPLICA_TYPE

BUILD_TYPE = "image-build"  # the build pod's elasticdl-replica-type
BUILDER_FILE = "oci_build.py"  # the build program, in the volume's builder/ directory
CONTAINERS = ("install", "push")  # the init container, then the container
PACKAGE_DIR = "/package"
STAGE_DIR = "/work/stage"
RESOURCES = {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "2Gi"}}


def build_pod_name(job_name: str) -> str:
    return f"elasticdl-{job_name}-build"


@dataclasses.dataclass(frozen=True)
class ImageBuild:
    """One image build: ``package`` (its directory ``packages/<package>`` and the build
    program ``builder/``, both in the volume ``state_volume``, a pod volume source) made into
    ``image`` on ``base_image``."""

    job_name: str
    package: str
    image: str
    base_image: str
    state_volume: dict[str, Any]
    registry_secret: str = ""  # a Secret with keys username and password (push credentials)
    insecure: bool = False  # plain HTTP to the registry
    host_network: bool = False  # a one-node cluster whose registry is on the node's loopback
    timeout_seconds: int = 1800
    image_pull_secrets: str = ""  # what the kubelet pulls the base image with (comma-separated)


def image_build_pod(build: ImageBuild, namespace: str, labels: dict[str, str]) -> dict[str, Any]:
    """The build pod's manifest (a dict the API takes as it is), with ``labels`` added."""
    program = ["python3", f"/builder/{BUILDER_FILE}"]
    mounts = [
        {
            "name": "state",
            "mountPath": PACKAGE_DIR,
            "subPath": f"packages/{build.package}",
            "readOnly": True,
        },
        {"name": "state", "mountPath": "/builder", "subPath": "builder", "readOnly": True},
        {"name": "work", "mountPath": "/work"},
        {"name": security.TMP_VOLUME, "mountPath": security.TMP_PATH},
    ]
    env = [
        {"name": security.HOME_ENV, "value": security.TMP_PATH},
        {"name": "TMPDIR", "value": "/work"},
        {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
    ]
    push_env = list(env)
    if build.registry_secret:
        for var, key in (
            ("ELASTICDL_REGISTRY_USERNAME", "username"),
            ("ELASTICDL_REGISTRY_PASSWORD", "password"),
        ):
            secret = {"secretKeyRef": {"name": build.registry_secret, "key": key}}
            push_env.append({"name": var, "valueFrom": secret})
    push = [
        *program,
        "push",
        f"--package={PACKAGE_DIR}",
        f"--stage={STAGE_DIR}",
        f"--base={build.base_image}",
        f"--target={build.image}",
        *(["--insecure"] if build.insecure else []),
    ]
    install = [*program, "install", f"--package={PACKAGE_DIR}", f"--stage={STAGE_DIR}"]
    restricted = security.POD_SECURITY_RESTRICTED

    def container(name: str, command: list[str], container_env: list) -> dict[str, Any]:
        return {
            "name": name,
            "image": build.base_image,
            "command": command,
            "env": container_env,
            "volumeMounts": mounts,
            "securityContext": security.container_security_context_json(restricted),
            "resources": RESOURCES,
        }

    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        # The build runs the user's requirements: no token to the API server.
        "automountServiceAccountToken": False,
        "activeDeadlineSeconds": build.timeout_seconds,
        "securityContext": security.pod_security_context_json(restricted),
        "initContainers": [container(CONTAINERS[0], install, env)],
        "containers": [container(CONTAINERS[1], push, push_env)],
        "volumes": [
            {"name": "state", **build.state_volume},
            {"name": "work", "emptyDir": {}},
            {"name": security.TMP_VOLUME, "emptyDir": {}},
        ],
    }
    if build.host_network:
        spec["hostNetwork"] = True
    pull = [s.strip() for s in build.image_pull_secrets.split(",") if s.strip()]
    if pull:
        spec["imagePullSecrets"] = [{"name": secret} for secret in pull]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": build_pod_name(build.job_name),
            "namespace": namespace,
            "labels": {
                APP_LABEL: APP_NAME,
                LABEL_JOB: build.job_name,
                LABEL_REPLICA_TYPE: BUILD_TYPE,
                **labels,
            },
        },
        "spec": spec,
    }
