"""The two forms of ``--image_base`` (build an image from the model zoo, or run a pre-built
one) as the spec resolves them, the build context and its content tag (no engine here;
tests/python/elasticdl_tests/images/zoo_submit_test.py builds and pushes with a real one,
k8s_node/onprem_guide_test.py runs the job on the real node)."""

from __future__ import annotations

import os

import pytest
from elasticdl.client import zoo_image
from elasticdl.client.main import main
from elasticdl.common import job_spec
from elasticdl.common.cli_parser import StrictArgumentParser
from elasticdl.common.spec_codec import SpecError
from elasticdl.common.types import PlatformName


@pytest.fixture
def zoo(tmp_path):
    root = tmp_path / "model_zoo"
    (root / "mnist").mkdir(parents=True)
    (root / "mnist" / "mnist_functional_api.py").write_text("def custom_model():\n    pass\n")
    (root / "mnist" / "__pycache__").mkdir()
    (root / "mnist" / "__pycache__" / "x.pyc").write_bytes(b"\0")
    return root


def _resolve(*argv: str, command: str = "train"):
    parser = StrictArgumentParser(prog="elasticdl train")
    job_spec.add_job_flags(parser, command)
    given = job_spec.given_values(parser.parse_args(list(argv)))
    return job_spec.spec_from_text(command, given).resolve()


def _build_form(zoo, *extra: str):
    """A job of the build form: ``--image_base`` and a model zoo on this machine (without the
    cluster-only flags that do not matter here)."""
    return (
        "--image_base=elasticdl:ci",
        f"--model_zoo={zoo}",
        "--model_def=mnist.mnist_functional_api.custom_model",
        "--training_data=/data/mnist/train",
        "--validation_data=/data/mnist/test",
        "--job_name=test-mnist",
        *extra,
    )


def test_build_form_goes_to_kubernetes_and_keeps_the_base(zoo):
    spec, notices = _resolve(*_build_form(zoo, "--docker_image_prefix=reg.docker.com/user/"))
    assert spec.platform == PlatformName.KUBERNETES
    assert (spec.image_base, spec.image_name) == ("elasticdl:ci", "")
    assert spec.docker_image_prefix == "reg.docker.com/user/"
    assert any("--image_base is set" in n for n in notices), notices


def test_prebuilt_form_runs_the_image_with_its_zoo():
    spec, notices = _resolve(
        "--image_base=reg.docker.com/user/elasticdl:mnist",
        "--model_zoo=/model_zoo",
        "--model_def=mnist_functional_api.mnist_functional_api.custom_model",
        "--training_data=/data/mnist/train",
        "--job_name=test-mnist",
    )
    assert spec.image_name == "reg.docker.com/user/elasticdl:mnist"
    assert spec.image_base == "" and spec.model_zoo == "/model_zoo"
    assert any("pre-built image holds it" in n for n in notices), notices
    assert spec.resolve()[0] == spec  # the master resolves it again: nothing changes


def test_the_original_image_flag_is_image_name():
    spec, _ = _resolve(
        "--image=reg.docker.alibaba-inc.com/bright/elasticdl-wnd:1.0",
        "--model_def=my_model_repo.models.wnd.custom_model",
        "--training_data=/data/mnist/train",
        "--job_name=test-mnist",
    )
    assert spec.image_name == "reg.docker.alibaba-inc.com/bright/elasticdl-wnd:1.0"
    assert spec.platform == PlatformName.KUBERNETES


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--image_name=reg.io/x:1"], "--image_base and --image_name are exclusive"),
        (["--platform=local"], "--image_base builds an image for Kubernetes"),
        (["--docker_image_prefix=Reg Bad/"], "--docker_image_prefix 'Reg Bad/' is not a registry"),
        (["--image_base=Bad Base"], "--image_base 'Bad Base' is not an image name"),
        (["--cluster_spec=/no/spec.py"], "--cluster_spec '/no/spec.py' is not a file"),
    ],
)
def test_bad_combinations_name_the_field(zoo, argv, message):
    with pytest.raises(SpecError) as info:
        _resolve(*_build_form(zoo), *argv)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_build_form_needs_the_zoo_here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = ["--image_base=elasticdl:ci", "--model_def=a.b.c", "--training_data=/d"]
    with pytest.raises(SpecError, match="--model_zoo 'nozoo' is not a directory on this machine"):
        _resolve(*argv, "--job_name=j", "--model_zoo=nozoo")
    with pytest.raises(SpecError, match="--docker_image_prefix: nothing to build or push"):
        _resolve(*argv, "--job_name=j", "--model_zoo=/model_zoo", "--docker_image_prefix=r.io/")
    (tmp_path / "zoo").mkdir()
    with pytest.raises(SpecError, match="--model_def 'a.b.c': no file a/b.py"):
        _resolve(*argv, "--job_name=j", "--model_zoo=zoo")


def test_checkpoint_steps_without_dir_gets_the_default(zoo, tmp_path):
    spec, notices = _resolve(*_build_form(zoo, "--checkpoint_steps=10"))
    assert spec.checkpoint_dir == job_spec.POD_CHECKPOINT_DIR
    [notice] = [n for n in notices if n.startswith("checkpoint_dir:")]
    assert "lost with the pods" in notice and "--volume" in notice
    # Restartable master: under its --job_dir, which lies on a volume.
    spec, _ = _resolve(*_build_form(zoo, "--checkpoint_steps=10", "--job_dir=/data/jobs/j"))
    assert spec.checkpoint_dir == "/data/jobs/j/checkpoint_dir"
    # Local: in the job directory, as the original wrote it beside the master.
    spec, notices = _resolve(
        f"--model_zoo={zoo}",
        "--model_def=mnist.mnist_functional_api.custom_model",
        f"--training_data={zoo}",
        "--job_name=j",
        f"--job_dir={tmp_path / 'job'}",
        "--checkpoint_steps=10",
    )
    assert spec.checkpoint_dir == str(tmp_path / "job" / "checkpoint_dir")
    assert f"checkpoint_dir: {tmp_path / 'job' / 'checkpoint_dir'} (" in "".join(notices)


def test_bad_combination_on_the_command_line_is_one_line(zoo, capsys):
    argv = [
        "train",
        *_build_form(zoo),
        "--docker_image_prefix=reg.io/t/",
        "--image_name=reg.io/x:1",
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--image_base and --image_name are exclusive" in err, err


def _tag(zoo, tmp_path, name: str, base_id: str = "sha256:aa", **kwargs) -> str:
    request = zoo_image.ZooImageRequest(base_image="elasticdl:ci", model_zoo=str(zoo), **kwargs)
    context = tmp_path / name
    context.mkdir()
    zoo_image.write_context(request, context)
    return zoo_image.content_tag(context, base_id)


def test_context_is_zoo_inits_and_the_tag_follows_the_content(zoo, tmp_path):
    spec_py = tmp_path / "spec.py"
    spec_py.write_text("cluster = None\n")
    request = zoo_image.ZooImageRequest(
        base_image="elasticdl:ci", model_zoo=str(zoo), cluster_spec=str(spec_py)
    )
    context = tmp_path / "ctx"
    context.mkdir()
    zoo_image.write_context(request, context)
    dockerfile = (context / "Dockerfile").read_text()
    assert "FROM elasticdl:ci" in dockerfile
    assert "COPY spec.py /cluster_spec/spec.py" in dockerfile
    assert "COPY model_zoo /model_zoo" in dockerfile
    assert (context / "model_zoo" / "mnist" / "mnist_functional_api.py").is_file()
    assert not (context / "model_zoo" / "mnist" / "__pycache__").exists()

    first = _tag(zoo, tmp_path, "a")
    assert first == _tag(zoo, tmp_path, "b")  # same zoo, same base: same image
    assert len(first) == zoo_image.TAG_LENGTH
    assert _tag(zoo, tmp_path, "c", base_id="sha256:bb") != first  # a rebuilt base
    (zoo / "mnist" / "__pycache__" / "y.pyc").write_bytes(b"1")
    assert _tag(zoo, tmp_path, "d") == first  # what the image leaves out does not count
    (zoo / "mnist" / "mnist_functional_api.py").write_text("def custom_model():\n    return 1\n")
    edited = _tag(zoo, tmp_path, "e")
    assert edited != first
    os.chmod(zoo / "mnist" / "mnist_functional_api.py", 0o755)
    assert _tag(zoo, tmp_path, "f") != edited


def test_image_names_and_the_spec_the_job_runs_with(zoo):
    assert zoo_image.image_name("reg.io/team/", "abc") == "reg.io/team/elasticdl:abc"
    assert zoo_image.image_name("reg.io/team", "abc") == "reg.io/team/elasticdl:abc"
    assert zoo_image.image_name("", "abc") == "elasticdl:abc"
    spec, _ = _resolve(*_build_form(zoo, "--docker_image_prefix=reg.io/team/"))
    pushed = zoo_image.ZooImage("reg.io/team/elasticdl:abc", built=True, pushed=True)
    run, notices = zoo_image.spec_with_image(spec, pushed)
    assert (run.image_name, run.model_zoo, run.image_base) == (pushed.image, "/model_zoo", "")
    assert run.image_pull_policy == "Always" and notices == []
    assert run.resolve()[0] == run
    # Not pushed: only this engine has it, so the node must not try to pull it.
    local = zoo_image.ZooImage("elasticdl:abc", built=True, pushed=False)
    run, notices = zoo_image.spec_with_image(spec.replace(docker_image_prefix=""), local)
    assert run.image_pull_policy == "IfNotPresent"
    assert len(notices) == 1 and "not pushed" in notices[0]
