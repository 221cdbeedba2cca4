"""The NetworkPolicy of a job: ingress to its pods only from pods of the same job.

Every pod of a job carries the label ``elasticdl-job-name=<job>``
(:func:`elasticdl.k8s.names.job_labels`); the policy selects those pods and admits
connections from pods with the same label in the same namespace, nothing else. It is defence
in depth beside the job secret every RPC must carry (``SECURITY.md``): other pods, other jobs
and other namespaces cannot even reach the master's, the PS' or the AllReduce store's ports.

The client creates it right after the master pod, owned by that pod, so the cluster's garbage
collector removes it with the job (``elasticdl cancel``). It takes effect where the cluster's
network plugin enforces NetworkPolicies; pods on the host network
(``ELASTICDL_K8S_NETWORK=host``) are outside any NetworkPolicy.
"""

from __future__ import annotations

from typing import Any

from elasticdl.k8s.names import LABEL_JOB, job_object_labels, network_policy_name


def policy_dict(job_name: str, namespace: str) -> dict:
    """The policy as the API server sees it (camelCase), without an owner."""

    def same_job() -> dict:  # a fresh dict each time: no YAML anchors in the example
        return {"matchLabels": {LABEL_JOB: job_name}}

    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": network_policy_name(job_name),
            "namespace": namespace,
            "labels": job_object_labels(job_name),
        },
        "spec": {
            "podSelector": same_job(),
            "policyTypes": ["Ingress"],
            # A podSelector without a namespaceSelector means: in the policy's namespace.
            "ingress": [{"from": [{"podSelector": same_job()}]}],
        },
    }


def build_network_policy(job_name: str, namespace: str, owner_reference: Any = None):
    """The ``V1NetworkPolicy`` of job ``job_name``; ``owner_reference``: the master pod."""
    from elasticdl.k8s.client import to_model

    policy = to_model(policy_dict(job_name, namespace), "V1NetworkPolicy")
    if owner_reference is not None:
        policy.metadata.owner_references = [owner_reference]
    return policy
