"""KubernetesBackend (the client side) against a real kube-apiserver.

The master pods submitted here are NOT run (their namespace is not served by the process
kubelet) except where a test says so: these tests check what the client creates, reads and
deletes. Logs come from the process kubelet's log files (its ``pod_logs`` reader) because the
API server cannot proxy logs from a kubelet that does not exist.
"""

from __future__ import annotations

import json
import time

import pytest
import yaml
from elasticdl.client.job_commands import job_parser, spec_from_flags
from elasticdl.common.job_spec import JobSpec
from elasticdl.common.types import JobPhase
from elasticdl.jobs.config import ClientConfig
from elasticdl.jobs.errors import ClientError, JobConflictError, JobNotFoundError
from elasticdl.jobs.k8s_backend import KubernetesBackend
from elasticdl.k8s.client import K8sClient, to_dict
from elasticdl.k8s.names import STATUS_ANNOTATION, master_pod_name
from elasticdl.k8s.pods import PodTemplate, build_pod, build_service


def _args(namespace: str, *extra: str, job: str = "sub") -> JobSpec:
    """The spec `elasticdl train <flags>` submits (without a config file)."""
    args = job_parser("train").parse_args(
        [
            f"--job_name={job}",
            "--image_name=local/elasticdl:test",
            "--platform=kubernetes",
            "--model_def=mnist.mnist_functional_api.custom_model",
            "--training_data=/data/mnist/train",
            f"--namespace={namespace}",
            "--num_workers=2",
            "--num_ps_pods=1",
            "--master_resource_request=cpu=0.2,memory=512Mi",
            "--master_resource_limit=cpu=1,memory=1Gi",
            "--envs=EDL_A=1,EDL_B=x,y",
            "--secret_envs=EDL_TOKEN=edl-creds/token",
            "--volume=host_path=/tmp/edl,mount_path=/data",
            *extra,
        ]
    )
    spec, _ = spec_from_flags("train", args, ClientConfig())
    return spec


def test_submit_status_list_cancel(k8s, namespace):
    backend = KubernetesBackend(namespace=namespace, k8s=k8s)
    args = _args(namespace)
    handle = backend.submit(args)
    assert (
        handle.master == "elasticdl-sub-master"
        and handle.namespace == namespace
        and not handle.yaml_path
    )

    pod = to_dict(k8s.get_pod("elasticdl-sub-master"))
    assert pod["metadata"]["labels"] == {
        "app": "elasticdl",
        "elasticdl-job-name": "sub",
        "elasticdl-replica-type": "master",
        "elasticdl-replica-index": "0",
    }
    container = pod["spec"]["containers"][0]
    command = container["command"]
    assert command[:3] == ["python", "-m", "elasticdl.master.main"]
    # The master reads exactly the spec the client resolved, in one argument.
    from elasticdl.master.main import read_job_spec

    assert len(command) == 4 and command[3].startswith("--job_spec={")
    # ... with the unset priorities defaulted to ElasticDL's PriorityClasses, which the test
    # cluster has (elasticdl.k8s.priority_classes).
    defaulted = {"master_pod_priority": "high", "ps_pod_priority": "high"}
    assert read_job_spec(command[3:]) == args.replace(
        namespace=namespace, worker_pod_priority="low", **defaulted
    )
    sent = read_job_spec(command[3:])
    assert sent.job_name == "sub" and sent.num_workers == 2 and sent.envs == "EDL_A=1,EDL_B=x,y"
    assert sent.platform == "kubernetes" and sent.namespace == namespace
    env = {e["name"]: e for e in container["env"]}
    assert env["MY_POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert env["EDL_B"]["value"] == "x,y"
    assert container["resources"] == {
        "requests": {"cpu": "200m", "memory": "512Mi"},
        "limits": {"cpu": "1", "memory": "1Gi"},
    }
    # --secret_envs: the kubelet reads the value from the Secret; only the reference is in the
    # pod spec and in the job spec argument.
    assert "value" not in env["EDL_TOKEN"]
    assert env["EDL_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "edl-creds", "key": "token"}}
    assert sent.secret_envs == "EDL_TOKEN=edl-creds/token"
    volume, tmp = pod["spec"]["volumes"]  # the API server defaults hostPath.type to ""
    assert volume["name"] == "volume-0" and volume["hostPath"]["path"] == "/tmp/edl"
    assert tmp == {"name": "tmp", "emptyDir": {}}
    assert container["volumeMounts"] == [
        {"name": "volume-0", "mountPath": "/data"},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    assert pod["spec"]["restartPolicy"] == "Never"
    # Restricted by default, as the API server stored it.
    assert pod["spec"]["securityContext"]["runAsUser"] == 10001
    assert pod["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"] == {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
    }

    # The job's NetworkPolicy: ingress to the job's pods from the job's pods only, owned by the
    # master pod.
    policy = to_dict(k8s.get_network_policy("elasticdl-sub-ingress"))
    same_job = {"matchLabels": {"elasticdl-job-name": "sub"}}
    assert policy["spec"] == {
        "podSelector": same_job,
        "policyTypes": ["Ingress"],
        "ingress": [{"from": [{"podSelector": same_job}]}],
    }
    assert [(o["kind"], o["name"]) for o in policy["metadata"]["ownerReferences"]] == [
        ("Pod", "elasticdl-sub-master")
    ]

    status = backend.status("sub")
    assert status.phase == JobPhase.PENDING and status.namespace == namespace and status.created_at
    assert [j.job_name for j in backend.list_jobs()] == ["sub"]

    with pytest.raises(JobConflictError, match="already exists"):
        backend.submit(args)

    # The master publishes progress; the client shows it.
    k8s.core.patch_namespaced_pod(
        "elasticdl-sub-master",
        namespace,
        {
            "metadata": {
                "annotations": {
                    STATUS_ANNOTATION: json.dumps(
                        {"phase": "Running", "tasks_done": 3, "model_version": 7}
                    )
                }
            }
        },
    )
    k8s.patch_pod_status("elasticdl-sub-master", {"phase": "Running"})
    status = backend.status("sub")
    assert (status.phase, status.tasks_done, status.model_version) == (JobPhase.RUNNING, 3, 7)

    # Replicas owned by the master; cancel removes them through the garbage collector.
    master = k8s.get_pod("elasticdl-sub-master")
    owner = K8sClient.owner_reference(master)
    template = PodTemplate(namespace=namespace)
    k8s.create_pod(
        build_pod(
            template,
            name="elasticdl-sub-worker-0",
            job_name="sub",
            replica_type="worker",
            replica_id=0,
            image="img",
            command=["true"],
            owner_reference=owner,
        )
    )
    k8s.create_service(
        build_service(
            template,
            name="elasticdl-sub-ps-0",
            job_name="sub",
            replica_type="ps",
            replica_id=0,
            port=2222,
            owner_reference=owner,
        )
    )
    assert [r.name for r in backend.status("sub").replicas] == ["worker-0"]

    final = backend.cancel("sub")
    assert final.phase == JobPhase.CANCELLED and "still" not in final.message
    assert (
        k8s.list_pods("elasticdl-job-name=sub") == []
        and k8s.list_services("elasticdl-job-name=sub") == []
        and k8s.get_network_policy("elasticdl-sub-ingress") is None
    )
    with pytest.raises(JobNotFoundError):
        backend.status("sub")


def test_yaml_writes_manifest_and_creates_nothing(k8s, namespace, tmp_path):
    backend = KubernetesBackend(namespace=namespace, k8s=k8s)
    out = tmp_path / "job.yaml"
    args = _args(
        namespace, "--cluster_spec_json", '{"master_pod_spec": {"labels": {"team": "ml"}}}'
    )
    handle = backend.submit(args, yaml_path=str(out))
    assert handle.yaml_path == str(out)
    manifest = yaml.safe_load(out.read_text())
    assert manifest["kind"] == "Pod" and manifest["metadata"]["name"] == "elasticdl-sub-master"
    assert manifest["metadata"]["labels"]["team"] == "ml"
    assert manifest["spec"]["containers"][0]["command"][:3] == [
        "python",
        "-m",
        "elasticdl.master.main",
    ]
    assert k8s.list_pods() == []
    # The manifest is valid for the API server as written.
    from kubernetes import client

    created = client.CoreV1Api(k8s.api_client).create_namespaced_pod(namespace, manifest)
    assert created.metadata.name == "elasticdl-sub-master"


@pytest.mark.parametrize(
    "extra, fragment",
    [
        (["--cluster_spec_json", '{"pod_spec": {"labelz": {}}}'], "unknown key 'pod_spec.labelz'"),
        (["--cluster_spec", "/no/such/spec.py"], "does not exist"),
    ],
)
def test_invalid_input_is_one_line_error_and_creates_nothing(k8s, namespace, extra, fragment):
    backend = KubernetesBackend(namespace=namespace, k8s=k8s)
    args = _args(namespace, *extra)
    with pytest.raises(ClientError) as info:
        backend.submit(args)
    assert fragment in str(info.value) and "\n" not in str(info.value)
    assert k8s.list_pods() == []


def test_bad_resources_are_rejected_before_the_cluster(k8s, namespace):
    with pytest.raises(ValueError, match="memory=lots"):
        _args(namespace, "--master_resource_request=cpu=1,memory=lots")
    assert k8s.list_pods() == []


def test_status_and_logs_of_a_finished_master(k8s, served_namespace, kubelet):
    """A master pod run by the FAKE process kubelet: status follows the pod, logs come from
    the kubelet's files."""
    backend = KubernetesBackend(namespace=served_namespace, k8s=k8s, pod_logs=kubelet.pod_logs)
    pod = build_pod(
        PodTemplate(namespace=served_namespace),
        name=master_pod_name("logs"),
        job_name="logs",
        replica_type="master",
        replica_id=0,
        image="img",
        command=["python", "-c", "import sys; print('hello from the master'); sys.exit(3)"],
    )
    k8s.create_pod(pod)
    status = backend.wait("logs", timeout=30, poll_interval=0.2)
    assert status.phase == JobPhase.FAILED and "exited with 3" in status.message
    assert "hello from the master" in "".join(backend.logs("logs"))
    assert "hello from the master" in "".join(backend.logs("logs", follow=True))
    with pytest.raises(ClientError, match="replica"):
        list(backend.logs("logs", "chief-0"))
    with pytest.raises(JobNotFoundError):
        list(backend.logs("nope"))
    # The Kubernetes API's pod log (the default) is asked and says why it cannot help.
    backend = KubernetesBackend(namespace=served_namespace, k8s=k8s)
    with pytest.raises(ClientError, match="logs of elasticdl-logs-master are not available"):
        list(backend.logs("logs"))


def test_cli_submit_yaml_and_errors(k8s_cluster, namespace, tmp_path, monkeypatch, capsys):
    """The real CLI entry point with a kubeconfig (TLS verified against the test CA)."""
    main = pytest.importorskip("elasticdl.client.main").main
    monkeypatch.setenv("KUBECONFIG", str(k8s_cluster.kubeconfig))
    monkeypatch.setenv("ELASTICDL_HOME", str(tmp_path / "home"))
    common = [
        "train",
        "--job_name=cli",
        "--image_name=local/elasticdl:test",
        "--platform=kubernetes",
        "--model_def=mnist.mnist_functional_api.custom_model",
        "--training_data=/data/x",
        f"--namespace={namespace}",
        "--num_ps_pods=1",
    ]
    out = tmp_path / "cli.yaml"
    assert main(common + [f"--yaml={out}"]) == 0
    assert yaml.safe_load(out.read_text())["metadata"]["name"] == "elasticdl-cli-master"
    k8s = K8sClient(namespace, api_client=k8s_cluster.api_client())
    assert k8s.list_pods() == []
    assert main(common + ["--worker_resource_request=gpu=0.5"]) == 2
    assert "gpu" in capsys.readouterr().err
    assert k8s.list_pods() == []
    assert main(common + ["--detach"]) == 0
    deadline = time.monotonic() + 10
    while k8s.get_pod("elasticdl-cli-master") is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert k8s.get_pod("elasticdl-cli-master") is not None
    assert main(["cancel", "cli", f"--namespace={namespace}", "--platform=kubernetes"]) in (0, 1)
    assert k8s.get_pod("elasticdl-cli-master") is None


def _local_job(home, name: str) -> None:
    """A local job that ran and ended, as the client and master leave it."""
    job = home / "jobs" / name
    (job / "logs").mkdir(parents=True)
    (job / ".elasticdl-job").write_text(json.dumps({"job_name": name, "created_dir": True}))
    (job / "job.json").write_text(json.dumps({"job_name": name, "pid": None}))
    (job / "exit_code").write_text("0\n")
    (job / "logs" / "master.log").write_text(f"{name} done\n")


def test_commands_find_a_job_by_name_without_platform(
    k8s_cluster, k8s, namespace, tmp_path, monkeypatch, capsys
):
    """status/logs/wait/cancel JOB look in the local job directories, then in the configured
    cluster (here: $KUBECONFIG and --namespace); list shows both."""
    from elasticdl.client.main import main

    monkeypatch.setenv("KUBECONFIG", str(k8s_cluster.kubeconfig))
    monkeypatch.setenv("ELASTICDL_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("ELASTICDL_CONFIG", raising=False)
    _local_job(tmp_path / "home", "here")
    _local_job(tmp_path / "home", "both")
    for job in ("there", "both"):
        k8s.create_pod(
            build_pod(
                PodTemplate(namespace=namespace),
                name=master_pod_name(job),
                job_name=job,
                replica_type="master",
                replica_id=0,
                image="img",
                command=["true"],
            )
        )
    ns = f"--namespace={namespace}"
    capsys.readouterr()

    assert main(["status", "here", ns, "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["platform"] == "local"
    assert main(["logs", "here", ns]) == 0
    assert capsys.readouterr().out == "here done\n"
    assert main(["wait", "here", ns, "--timeout=5"]) == 0
    assert main(["status", "there", ns, "-o", "json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert (found["platform"], found["namespace"]) == ("kubernetes", namespace)

    # In both places, or in neither: one line saying so, exit 2.
    for argv, expect in (
        (["status", "both", ns], "exists both locally and in Kubernetes namespace"),
        (["cancel", "both", ns], "pass --platform=local or --platform=kubernetes"),
        (
            ["status", "nowhere", ns],
            f"no local job named 'nowhere' and none in Kubernetes namespace {namespace}",
        ),
        (["logs", "nowhere", ns], "no local job named 'nowhere'"),
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert expect in err and err.count("\n") == 1, (argv, err)
    assert k8s.get_pod(master_pod_name("both")) is not None  # the ambiguous cancel did nothing

    # The SDK looks jobs up the same way.
    from elasticdl import api

    assert api.status("here", namespace=namespace).platform == "local"
    assert api.status("there", namespace=namespace).platform == "kubernetes"
    with pytest.raises(api.ClientError, match="exists both locally and in Kubernetes namespace"):
        api.status("both", namespace=namespace)
    with pytest.raises(api.JobNotFoundError, match="none in Kubernetes namespace"):
        api.status("nowhere", namespace=namespace)
    assert sorted((j.job_name, j.platform) for j in api.list_jobs(namespace=namespace)) == [
        ("both", "kubernetes"),
        ("both", "local"),
        ("here", "local"),
        ("there", "kubernetes"),
    ]

    # --platform still picks one.
    assert main(["status", "both", ns, "--platform=kubernetes", "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["platform"] == "kubernetes"

    # list: the jobs of this machine and of the namespace.
    assert main(["list", ns, "-o", "json"]) == 0
    listed = sorted((j["job_name"], j["platform"]) for j in json.loads(capsys.readouterr().out))
    assert listed == [
        ("both", "kubernetes"),
        ("both", "local"),
        ("here", "local"),
        ("there", "kubernetes"),
    ]

    # cancel finds the cluster's job and removes it.
    assert main(["cancel", "there", ns]) == 0
    assert k8s.get_pod(master_pod_name("there")) is None

    # A cluster that cannot be asked: the local job is still found; list says what is missing.
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-such-kubeconfig"))
    assert main(["status", "here", ns]) == 0
    capsys.readouterr()
    assert main(["status", "there", ns]) == 2
    err = capsys.readouterr().err
    assert "could not be asked" in err and err.count("\n") == 1, err
    assert main(["list", ns, "-o", "json"]) == 0
    out = capsys.readouterr()
    assert {j["platform"] for j in json.loads(out.out)} == {"local"}
    assert "not listed" in out.err


def test_a_job_its_network_policy_cannot_protect_is_not_left_running(k8s, namespace):
    """A NetworkPolicy of the job's name that ElasticDL did not create is left alone and the
    submission fails in one line with no master pod left; one of an earlier job of the same
    name is replaced by the new job's."""
    from elasticdl.k8s.network_policy import build_network_policy

    backend = KubernetesBackend(namespace=namespace, k8s=k8s)
    foreign = build_network_policy("np", namespace)
    foreign.metadata.labels = {"team": "ours"}
    k8s.create_network_policy(foreign)
    with pytest.raises(ClientError) as info:
        backend.submit(_args(namespace, job="np"))
    assert "that ElasticDL did not create" in str(info.value) and "\n" not in str(info.value)
    assert k8s.wait_pod_gone(master_pod_name("np"), 30)
    assert k8s.get_network_policy("elasticdl-np-ingress").metadata.labels == {"team": "ours"}

    k8s.delete_network_policy("elasticdl-np-ingress")
    k8s.create_network_policy(build_network_policy("np", namespace))  # an earlier job's
    backend.submit(_args(namespace, job="np"))
    policy = k8s.get_network_policy("elasticdl-np-ingress")
    assert [o.name for o in policy.metadata.owner_references] == [master_pod_name("np")]
    backend.cancel("np")
    assert k8s.get_network_policy("elasticdl-np-ingress") is None


def test_a_cluster_that_does_not_answer_does_not_hold_up_local_jobs(
    k8s_cluster, tmp_path, monkeypatch, capsys
):
    """The configured cluster is a loopback port that accepts connections and never answers
    (as an unreachable API server looks): a local job is still found; a name found nowhere
    is one line once the cluster refuses."""
    import socket

    from elasticdl.client.main import main
    from elasticdl_tests.k8s.cluster import write_kubeconfig

    monkeypatch.setenv("ELASTICDL_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("ELASTICDL_CONFIG", raising=False)
    _local_job(tmp_path / "home", "here")
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        config = tmp_path / "silent.kubeconfig"
        server = f"https://127.0.0.1:{silent.getsockname()[1]}"
        write_kubeconfig(config, server, k8s_cluster.ca_file, "token")
        monkeypatch.setenv("KUBECONFIG", str(config))
        capsys.readouterr()
        assert main(["status", "here", "-o", "json"]) == 0
        assert json.loads(capsys.readouterr().out)["platform"] == "local"
    finally:
        silent.close()
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there now: connections are refused
    write_kubeconfig(config, f"https://127.0.0.1:{port}", k8s_cluster.ca_file, "token")
    assert main(["status", "nowhere"]) == 2
    err = capsys.readouterr().err
    assert "could not be asked" in err and err.count("\n") == 1, err
    assert main(["list", "-o", "json"]) == 0
    out = capsys.readouterr()
    assert [j["job_name"] for j in json.loads(out.out)] == ["here"]
    assert "not listed" in out.err and out.err.count("\n") == 1, out.err


def test_the_jobs_tls_files_come_from_a_secret_volume(k8s, namespace):
    """Mutual TLS on Kubernetes: the master pod mounts the user's Secret as 0440 files (the
    API server's record) and the job spec it reads names the paths under that mount."""
    backend = KubernetesBackend(namespace=namespace, k8s=k8s)
    args = _args(
        namespace,
        "--volume=secret_name=job-tls,mount_path=/etc/elasticdl-tls",
        "--tls_cert_file=/etc/elasticdl-tls/tls.crt",
        "--tls_key_file=/etc/elasticdl-tls/tls.key",
        "--tls_ca_file=/etc/elasticdl-tls/ca.crt",
        job="tls",
    )
    backend.submit(args)
    pod = to_dict(k8s.get_pod(master_pod_name("tls")))
    volume = pod["spec"]["volumes"][0]
    assert volume["name"] == "volume-0"
    assert volume["secret"]["secretName"] == "job-tls" and volume["secret"]["defaultMode"] == 0o440
    container = pod["spec"]["containers"][0]
    assert {"name": "volume-0", "mountPath": "/etc/elasticdl-tls"} in container["volumeMounts"]
    from elasticdl.master.main import read_job_spec

    sent = read_job_spec(container["command"][3:])
    assert sent.tls_key_file == "/etc/elasticdl-tls/tls.key"
    assert sent.tls_ca_file == "/etc/elasticdl-tls/ca.crt"
    backend.cancel("tls")
