"""Submitting ``elasticdl train`` jobs whose pods the stand-in kubelet (``process_kubelet``)
runs: what the CLI does, with the settings every such job needs."""

from __future__ import annotations


def submit_train(kubelet, namespace: str, flags: list[str]):
    """``elasticdl train <flags>`` into ``namespace`` as the CLI submits it, through a
    Kubernetes backend that reads pod logs from ``kubelet``; returns (backend, handle).

    Added for the stand-in kubelet: its pods are local processes sharing this host's network
    (``ELASTICDL_K8S_NETWORK=host`` addressing) and its images are never pulled. The one thing
    the CLI cannot do: the master's default port 50001 may be taken on this host by other
    jobs, so the spec's port is set to a free one."""
    from elasticdl.client.job_commands import spec_from_flags
    from elasticdl.client.main import build_parser
    from elasticdl.jobs.k8s_backend import KubernetesBackend
    from elasticdl.platform.local import pick_free_port

    argv = [
        "train",
        *flags,
        "--platform=kubernetes",
        f"--namespace={namespace}",
        "--image_pull_policy=Never",
        "--envs=ELASTICDL_K8S_NETWORK=host",
        "--detach",
    ]
    spec, _ = spec_from_flags("train", build_parser().parse_args(argv))
    backend = KubernetesBackend(namespace, pod_logs=kubelet.pod_logs)
    return backend, backend.submit(spec.replace(port=pick_free_port()))
