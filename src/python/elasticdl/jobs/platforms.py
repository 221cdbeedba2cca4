"""The backend of one platform. Kubernetes support is imported only here, so a laptop user
never loads the Kubernetes SDK."""

from __future__ import annotations

from elasticdl.common.types import PlatformName
from elasticdl.jobs.backend import JobBackend
from elasticdl.jobs.errors import ClientError


def platform_backend(
    platform: str | None, namespace: str = "default", kube_context: str = ""
) -> JobBackend:
    """The backend of ``platform`` (None/"" = local)."""
    platform = platform or PlatformName.LOCAL
    if platform == PlatformName.LOCAL:
        from elasticdl.jobs.local_backend import LocalBackend

        return LocalBackend()
    if platform == PlatformName.KUBERNETES:
        try:
            from elasticdl.jobs.k8s_backend import KubernetesBackend
        except ImportError as e:
            raise ClientError(
                f"the Kubernetes platform is not available ({e}); install the 'kubernetes' package "
                "or use --platform=local"
            ) from None
        return KubernetesBackend(namespace=namespace or "default", kube_context=kube_context or "")
    raise ClientError(
        f"--platform {platform!r} is invalid; use one of {', '.join(p.value for p in PlatformName)}"
    )
