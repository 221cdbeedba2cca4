"""deploy/k8s/rbac.yaml grants a master exactly what it needs, in its namespace only.

Real API server with RBAC authorization; the token is the real service-account token that
kube-controller-manager mints for the ``elasticdl`` ServiceAccount of the manifest.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from elasticdl.client.main import main
from elasticdl.k8s import rbac
from elasticdl.k8s.client import K8sApiError, K8sClient, to_model
from elasticdl.k8s.names import master_pod_name
from elasticdl.k8s.pods import PodTemplate, build_pod
from elasticdl.platform.base import LaunchSpec, ReplicaType
from elasticdl.platform.kubernetes import KubernetesPlatform
from elasticdl_tests.k8s.service_accounts import service_account_token


def _manifest() -> Path:
    for parent in Path(__file__).resolve().parents:
        candidate = parent / "deploy" / "k8s" / "rbac.yaml"
        if candidate.exists():
            return candidate
    candidate = Path.cwd() / "deploy" / "k8s" / "rbac.yaml"
    if candidate.exists():
        return candidate
    pytest.fail("deploy/k8s/rbac.yaml not found")


def test_the_shipped_manifest_is_the_rendered_one_for_default(capsys):
    assert _manifest().read_text() == rbac.render("default")
    # `elasticdl rbac --namespace=NS` prints it for NS: every object and the subject there.
    assert main(["rbac", "--namespace=ml-team"]) == 0
    docs = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    assert [d["kind"] for d in docs] == ["ServiceAccount", "Role", "RoleBinding"]
    assert {d["metadata"]["namespace"] for d in docs} == {"ml-team"}
    assert docs[2]["subjects"] == [
        {"kind": "ServiceAccount", "name": "elasticdl", "namespace": "ml-team"}
    ]
    # A namespace is a name, never text pasted into YAML.
    assert main(["rbac", "--namespace=ml-team\nkind: ClusterRole"]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.count("\n") == 1 and "--namespace" in out.err


def _apply(api_client, namespace: str) -> None:
    """What `elasticdl rbac --namespace=<namespace> | kubectl apply -f -` does."""
    from kubernetes import client

    core, rbac_api = client.CoreV1Api(api_client), client.RbacAuthorizationV1Api(api_client)
    for doc in yaml.safe_load_all(rbac.render(namespace)):
        if doc is None:
            continue
        kind = doc["kind"]
        if kind == "ServiceAccount":
            core.create_namespaced_service_account(namespace, to_model(doc, "V1ServiceAccount"))
        elif kind == "Role":
            rbac_api.create_namespaced_role(namespace, to_model(doc, "V1Role"))
        elif kind == "RoleBinding":
            rbac_api.create_namespaced_role_binding(namespace, to_model(doc, "V1RoleBinding"))
        else:
            pytest.fail(f"unexpected kind {kind} in the RBAC manifest")


def test_master_operations_need_only_the_role_and_stay_in_namespace(k8s_cluster, namespace):
    from kubernetes import client

    admin = k8s_cluster.api_client()
    _apply(admin, namespace)
    token = service_account_token(admin, namespace, "elasticdl")
    assert token.count(".") == 2  # a signed JWT, not the static admin token

    # The master pod itself is created by the user (admin here).
    admin_k8s = K8sClient(namespace, api_client=admin)
    admin_k8s.create_pod(
        build_pod(
            PodTemplate(namespace=namespace),
            name=master_pod_name("rbac"),
            job_name="rbac",
            replica_type="master",
            replica_id=0,
            image="img",
            command=["python", "-c", "pass"],
        )
    )

    sa = K8sClient(namespace, api_client=k8s_cluster.api_client(token))
    platform = KubernetesPlatform("rbac", sa, image="img")  # reads the master pod: get
    try:
        platform.launch(
            LaunchSpec(
                ReplicaType.PS,
                0,
                "elasticdl.ps.main",
                [],
                port=2222,
                secret_env={"ELASTICDL_JOB_SECRET": "the-jobs-secret"},
            )
        )  # pods+services+secrets create
        platform.launch(LaunchSpec(ReplicaType.WORKER, 0, "elasticdl.worker.main", []))
        assert {p.metadata.name for p in sa.list_pods("elasticdl-job-name=rbac")} == {
            "elasticdl-rbac-master",
            "elasticdl-rbac-ps-0",
            "elasticdl-rbac-worker-0",
        }
        assert admin_k8s.get_service("elasticdl-rbac-ps-0") is not None
        # The job's secret is in a Secret owned by the master pod, not in the PS's pod spec.
        ps_pod = admin_k8s.get_pod("elasticdl-rbac-ps-0")
        (ref,) = [e for e in ps_pod.spec.containers[0].env if e.name == "ELASTICDL_JOB_SECRET"]
        assert ref.value is None
        assert ref.value_from.secret_key_ref.name == "elasticdl-rbac-secret"
        assert "the-jobs-secret" not in str(ps_pod.to_dict())
        secret = client.CoreV1Api(admin).read_namespaced_secret("elasticdl-rbac-secret", namespace)
        assert [o.name for o in secret.metadata.owner_references] == ["elasticdl-rbac-master"]
        # events list: who ended a replica pod from outside (a preemption, an eviction).
        worker_uid = admin_k8s.get_pod("elasticdl-rbac-worker-0").metadata.uid
        assert platform._pod_cause(worker_uid) == ("", "")
        assert client.CoreV1Api(sa.api_client).list_namespaced_event(namespace).items == []
        platform.delete(ReplicaType.WORKER, 0)  # pods delete
        assert platform.mark_job_status("Succeeded")  # pods patch
    finally:
        platform.shutdown()  # pods list/delete, services list/delete
    assert sa.list_services("elasticdl-job-name=rbac") == []

    # Nothing beyond the Role: reading secrets in its own namespace (it may only create its
    # job's), reading services or logs, reading one event or writing any, NetworkPolicies
    # (the client makes the job's), anything in another namespace.
    core = client.CoreV1Api(sa.api_client)
    for forbidden_call in (
        lambda: core.list_namespaced_secret(namespace),
        lambda: core.read_namespaced_secret("elasticdl-rbac-secret", namespace),
        lambda: core.read_namespaced_service("elasticdl-rbac-ps-0", namespace),
        lambda: core.read_namespaced_pod_log("elasticdl-rbac-master", namespace),
        lambda: core.read_namespaced_event("any", namespace),
        lambda: core.create_namespaced_event(
            namespace,
            client.CoreV1Event(
                metadata=client.V1ObjectMeta(name="forged"),
                involved_object=client.V1ObjectReference(kind="Pod", name="x"),
            ),
        ),
        lambda: sa.list_network_policies(),
    ):
        with pytest.raises((client.exceptions.ApiException, K8sApiError)) as info:
            forbidden_call()
        assert info.value.status == 403
    client.CoreV1Api(admin).create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=f"{namespace}-x"))
    )
    try:
        other = K8sClient(f"{namespace}-x", api_client=k8s_cluster.api_client(token))
        with pytest.raises(K8sApiError) as forbidden:
            other.create_pod(
                build_pod(
                    PodTemplate(namespace=f"{namespace}-x"),
                    name="elasticdl-rbac-worker-9",
                    job_name="rbac",
                    replica_type="worker",
                    replica_id=9,
                    image="img",
                    command=["true"],
                )
            )
        assert forbidden.value.status == 403 and "forbidden" in str(forbidden.value).lower()
        with pytest.raises(K8sApiError) as forbidden_list:
            other.list_pods()
        assert forbidden_list.value.status == 403
    finally:
        client.CoreV1Api(admin).delete_namespace(f"{namespace}-x", _preload_content=False)


def test_unbound_user_can_do_nothing(k8s_cluster, namespace):
    user = K8sClient(namespace, api_client=k8s_cluster.api_client(k8s_cluster.user_token))
    with pytest.raises(K8sApiError) as info:
        user.list_pods()
    assert info.value.status == 403
