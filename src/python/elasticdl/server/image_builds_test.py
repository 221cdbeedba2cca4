"""The build pod's manifest and the build records (the real build runs on the real node:
tests/python/elasticdl_tests/k8s_node/server_build_test.py)."""

from __future__ import annotations

import pytest
from elasticdl.images import oci_build
from elasticdl.server.image_build_records import BuildRecord, BuildRecords, BuildSettings
from elasticdl.server.image_builds import build_pod, write_builder
from elasticdl.server.main import main

PACKAGE = "ab" * 32
SETTINGS = BuildSettings(
    base_image="reg.example:5000/elasticdl:cpu",
    repository="reg.example:5000/jobs",
    state_volume="claim_name=edl-state",
    registry_secret="reg-creds",
    image_pull_secrets="pull-creds",
)


def _record(**kwargs) -> BuildRecord:
    fields = dict(
        job_name="j1",
        owner="alice",
        command="train",
        values={"job_name": "j1"},
        package=PACKAGE,
        image=SETTINGS.image_for(PACKAGE),
    )
    return BuildRecord(**{**fields, **kwargs})


def test_image_name_depends_on_package_and_base():
    image = SETTINGS.image_for(PACKAGE)
    assert image.startswith("reg.example:5000/jobs:pkg-" + PACKAGE[:24])
    oci_build.ImageRef.parse(image)  # a valid reference
    other_base = BuildSettings(
        "reg.example:5000/elasticdl:gpu", SETTINGS.repository, "host_path=/s"
    )
    assert other_base.image_for(PACKAGE) != image
    assert SETTINGS.image_for("cd" * 32) != image


def test_build_pod_is_restricted_and_credentials_reach_only_the_push_step():
    pod = build_pod(SETTINGS, _record(), "ns1", "elasticdl-owner")
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["name"] == "elasticdl-j1-build" and meta["namespace"] == "ns1"
    assert meta["labels"]["elasticdl-owner"] == "alice"
    assert meta["labels"]["elasticdl-job-name"] == "j1"
    assert meta["labels"]["elasticdl-replica-type"] == "image-build"
    assert spec["automountServiceAccountToken"] is False and "hostNetwork" not in spec
    assert spec["securityContext"]["runAsUser"] == 10001 and spec["securityContext"]["runAsNonRoot"]
    (install,), (push,) = spec["initContainers"], spec["containers"]
    for container in (install, push):
        assert container["image"] == SETTINGS.base_image
        ctx = container["securityContext"]
        assert ctx["readOnlyRootFilesystem"] and not ctx["allowPrivilegeEscalation"]
        assert ctx["capabilities"] == {"drop": ["ALL"]}
        package_mount = next(m for m in container["volumeMounts"] if m["mountPath"] == "/package")
        assert package_mount == {
            "name": "state",
            "mountPath": "/package",
            "subPath": f"packages/{PACKAGE}",
            "readOnly": True,
        }
    assert not any("valueFrom" in e for e in install["env"])
    secrets = [e["valueFrom"]["secretKeyRef"] for e in push["env"] if "valueFrom" in e]
    assert secrets == [
        {"name": "reg-creds", "key": "username"},
        {"name": "reg-creds", "key": "password"},
    ]
    assert f"--target={SETTINGS.image_for(PACKAGE)}" in push["command"]
    assert "--insecure" not in push["command"]
    assert spec["imagePullSecrets"] == [{"name": "pull-creds"}]  # the base image's registry
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["state"]["persistentVolumeClaim"] == {"claimName": "edl-state", "readOnly": True}


def test_records_are_the_state(tmp_path):
    records = BuildRecords(tmp_path)
    record = _record()
    records.save(record)
    assert records.taken("j1") and not records.taken("j2")
    assert records.get("alice", "j1") == record and records.get("bob", "j1") is None
    assert [r.job_name for r in records.of("alice")] == ["j1"] and records.of("bob") == []
    assert records.get("alice", "j1").status("ns").phase == "Pending"
    record.phase, record.message = "failed", "image build failed: no such package"
    records.save(record)
    status = records.all()[0].status("ns")
    assert (status.phase, status.message) == ("Failed", "image build failed: no such package")
    assert not records.pushed(record.image)
    records.mark_pushed(record.image)
    assert records.pushed(record.image)
    records.remove("alice", "j1")
    assert records.all() == []


def test_builder_file_is_the_module(tmp_path):
    path = write_builder(tmp_path)
    assert path.read_text() == open(oci_build.__file__).read()
    assert path.stat().st_mode & 0o777 == 0o644


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--build_base_image=r.io/b:1"], "is for --platform=kubernetes"),
        (
            ["--platform=kubernetes", "--build_base_image=r.io/b:1"],
            "need --build_repository, --state_volume",
        ),
        (
            [
                "--platform=kubernetes",
                "--build_base_image=r.io/b:1",
                "--build_repository=q.io/j",
                "--state_volume=claim_name=s",
            ],
            "in the registry of --build_repository",
        ),
        (
            [
                "--platform=kubernetes",
                "--build_base_image=r.io/b:1",
                "--build_repository=r.io/j",
                "--state_volume=/srv",
            ],
            "--state_volume '/srv': use claim_name=PVC or host_path=DIR",
        ),
        (
            ["--platform=kubernetes", "--image_pull_secrets=regcred,"],
            "--image_pull_secrets 'regcred,' has an empty Secret name",
        ),
        (["--image_pull_secrets=regcred"], "are for --platform=kubernetes"),
    ],
)
def test_bad_build_flags_are_one_line(tmp_path, capsys, flags, words):
    assert main([f"--state_dir={tmp_path}", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and words in err, err


def _service(tmp_path):
    import asyncio
    import gzip
    import io
    import tarfile

    from elasticdl.server.data_store import DataStore
    from elasticdl.server.jobs import JobService, KubernetesTarget
    from elasticdl.server.packages import PackageStore

    for d in ("packages", "tmp", "data", "sums", "jobs"):
        (tmp_path / d).mkdir()
    packages = PackageStore(tmp_path / "packages", tmp_path / "tmp", 1 << 20, 1 << 20, 100)
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        data = b"def custom_model():\n    return 1\n"
        info = tarfile.TarInfo("mnist/model.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    body = gzip.compress(raw.getvalue())

    async def chunks():
        yield body

    info, _ = asyncio.run(packages.add(chunks(), len(body), user="alice"))
    data_store = DataStore(tmp_path / "data", tmp_path / "sums", tmp_path / "tmp", 1 << 20)
    target = KubernetesTarget("ns1", "", "host_path=/srv/data,mount_path=/data")
    service = JobService(
        tmp_path / "jobs", packages, data_store, "kubernetes", kubernetes=target, builds=SETTINGS
    )
    return service, info.id


@pytest.mark.parametrize(
    "spec, words",
    [
        (
            {"model_def": "mnist.nope.custom_model"},
            "--model_def 'mnist.nope.custom_model': no file",
        ),
        ({"model_zoo": "/elsewhere"}, "spec.model_zoo cannot be set"),
        ({"image_pull_secrets": "mine"}, "spec.image_pull_secrets cannot be set"),
    ],
)
def test_package_jobs_are_checked_before_any_build(tmp_path, spec, words):
    """Refused at POST (the build would take minutes before the master found out); no record."""
    from elasticdl.jobs.job_request import JobRequest
    from elasticdl.server.errors import Unprocessable

    service, package = _service(tmp_path)
    fields = {"job_name": "j1", "model_def": "mnist.model.custom_model", "training_data": "t"}
    with pytest.raises(Unprocessable) as refused:
        service.submit("alice", JobRequest(spec={**fields, **spec}, package=package))
    assert words in refused.value.reason and str(tmp_path) not in refused.value.reason
    assert service.records.all() == []
    with pytest.raises(Unprocessable, match="either image or package"):
        service.submit("alice", JobRequest(spec=fields, package=package, image="r.io/x:1"))
