"""The job's NetworkPolicy (what the API server does with it: tests/python/elasticdl_tests/k8s/
backend_test.py) and the static example in deploy/k8s/ agree."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from elasticdl.k8s.network_policy import policy_dict


def _example() -> Path:
    for parent in Path(__file__).resolve().parents:
        candidate = parent / "deploy" / "k8s" / "networkpolicy.yaml"
        if candidate.exists():
            return candidate
    pytest.fail("deploy/k8s/networkpolicy.yaml not found")


def test_the_example_is_what_a_job_gets():
    assert yaml.safe_load(_example().read_text()) == policy_dict("mnist", "default")


def test_only_the_same_jobs_pods_may_connect():
    spec = policy_dict("a", "ns")["spec"]
    assert spec["podSelector"] == {"matchLabels": {"elasticdl-job-name": "a"}}
    assert spec["policyTypes"] == ["Ingress"]
    (rule,) = spec["ingress"]
    # No namespaceSelector, no ipBlock, no ports: the same job's pods in the same namespace.
    assert rule == {"from": [{"podSelector": {"matchLabels": {"elasticdl-job-name": "a"}}}]}
