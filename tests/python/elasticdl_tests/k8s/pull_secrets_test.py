"""--image_pull_secrets (a registry that needs credentials to pull) against the real
kube-apiserver: ``elasticdl train`` puts them on the master pod, and the master, which reads
its spec from the master pod's argv, puts them on every worker and PS pod it creates. No pod
runs here (nothing pulls): the test checks what the API server stored. The Secret itself is
never read by ElasticDL (only the kubelet does), so it need not exist for this."""

from __future__ import annotations

import pytest
from elasticdl.client.job_commands import job_parser, spec_from_flags
from elasticdl.client.main import main
from elasticdl.common.job_spec import spec_from_master_argv
from elasticdl.jobs.config import ClientConfig, ServerSettings, with_config
from elasticdl.jobs.k8s_backend import KubernetesBackend
from elasticdl.k8s.names import master_pod_name
from elasticdl.k8s.pods import PodTemplate
from elasticdl.platform.base import ReplicaSpec, ReplicaType
from elasticdl.platform.kubernetes import KubernetesPlatform


def _flags(namespace: str, *extra: str) -> list[str]:
    return [
        "--job_name=pulls",
        "--image_name=registry.example:5000/team/elasticdl:v1",
        "--platform=kubernetes",
        "--model_def=mnist.mnist_functional_api.custom_model",
        "--training_data=/data/mnist/train",
        f"--namespace={namespace}",
        *extra,
    ]


def test_every_pod_of_the_job_pulls_with_the_secrets(k8s, namespace):
    # From the config file (a private registry's default), as `elasticdl train` reads it.
    config = ClientConfig(image_pull_secrets="regcred,team-pull")
    args = job_parser("train").parse_args(_flags(namespace))
    spec, _ = spec_from_flags("train", args, config)
    KubernetesBackend(namespace=namespace, k8s=k8s).submit(spec)
    master = k8s.get_pod(master_pod_name("pulls"))
    assert [s.name for s in master.spec.image_pull_secrets] == ["regcred", "team-pull"]

    # The master's side: its spec from the stored pod's argv, its platform's worker pod.
    container = master.spec.containers[0]
    argv = list(container.command or []) + list(container.args or [])
    job = spec_from_master_argv(argv[argv.index("elasticdl.master.main") + 1 :])
    platform = KubernetesPlatform(
        "pulls", k8s, image=job.image_name, template=PodTemplate.from_spec(job)
    )
    try:
        platform.launch(
            ReplicaSpec(replica_type=ReplicaType.WORKER, replica_id=0, module="x", args=[])
        )
        worker = k8s.get_pod("elasticdl-pulls-worker-0")
        assert [s.name for s in worker.spec.image_pull_secrets] == ["regcred", "team-pull"]
    finally:
        platform.shutdown()


def test_flag_wins_and_a_server_config_adds_none():
    given = {"image_pull_secrets": "other"}
    assert with_config(given, ClientConfig(image_pull_secrets="regcred")) == given
    served = ClientConfig(image_pull_secrets="regcred", server=ServerSettings("https://s", "t"))
    assert "image_pull_secrets" not in with_config({}, served)


@pytest.mark.parametrize(
    "value, words",
    [
        ("regcred,", "--image_pull_secrets 'regcred,' has an empty Secret name"),
        ("Reg_Cred", "--image_pull_secrets: 'Reg_Cred' is not a Secret name"),
    ],
)
def test_a_bad_secret_name_is_one_line_and_creates_nothing(
    k8s_cluster, k8s, namespace, tmp_path, monkeypatch, capsys, value, words
):
    monkeypatch.setenv("KUBECONFIG", str(k8s_cluster.kubeconfig))
    monkeypatch.setenv("ELASTICDL_HOME", str(tmp_path))
    monkeypatch.delenv("ELASTICDL_CONFIG", raising=False)
    code = main(["train", *_flags(namespace, f"--image_pull_secrets={value}")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and words in err, err
    assert k8s.list_pods() == []
