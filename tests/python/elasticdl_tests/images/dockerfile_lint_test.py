"""Dockerfile lint: the project's base-image Dockerfiles and `zoo init` output parse and pass;
the linter catches real mistakes. (gpu_image_test.py builds the GPU image.)"""

from __future__ import annotations

import re

import pytest
from elasticdl.client.zoo_dockerfile import ZooInitConfig, render_dockerfile
from elasticdl_tests.images.dockerfile_lint import lint, parse
from elasticdl_tests.images.engine import repo_root


def _read(name: str) -> str:
    return (repo_root() / "deploy" / "docker" / name).read_text()


@pytest.mark.parametrize("name", ["Dockerfile.cpu", "Dockerfile.gpu"])
def test_base_image_dockerfiles_lint_clean(name):
    text = _read(name)
    assert lint(text) == []
    ins = parse(text)
    args = {
        i.args.split("=", 1)[0]: i.args.split("=", 1)[1].strip('"')
        for i in ins
        if i.keyword == "ARG"
    }
    assert {"BASE_IMAGE", "EXTRA_PYPI_INDEX", "TENSORFLOW", "PIP_OPTIONS"} <= set(args)
    assert [i.args for i in ins if i.keyword == "FROM"][0].split()[0] == "${BASE_IMAGE}"
    assert any(i.keyword == "COPY" and i.args.startswith("deps/ ") for i in ins)
    assert any(i.keyword == "COPY" and i.args.startswith("project/ ") for i in ins)
    # The build fails unless the framework and (when installed) the kernels import in the
    # image's own (last) stage.
    last = max(n for n, i in enumerate(ins) if i.keyword == "FROM")
    assert any(
        i.keyword == "RUN" and "import elasticdl.ops" in i.args and "elasticdl_native" in i.args
        for i in ins[last:]
    )


@pytest.mark.parametrize("name", ["Dockerfile.cpu", "Dockerfile.gpu"])
def test_dockerfiles_keep_the_wheels_out_of_the_image(name):
    """The wheels (~500 MB with TensorFlow, ~3 GB with the CUDA libraries) are copied and
    installed in install stages; the images take only what pip installed from them: the
    dependencies image (`deps`) the installed /usr/local, the image pip's --root tree of the
    project's wheels."""
    ins = parse(_read(name))
    froms = [n for n, i in enumerate(ins) if i.keyword == "FROM"]
    assert [ins[n].args for n in froms] == [
        "${BASE_IMAGE} AS runtime",
        "runtime AS deps-install",
        "runtime AS deps",
        "${DEPS_IMAGE} AS install",
        "${DEPS_IMAGE}",
    ]
    assert "DEPS_IMAGE=deps" in [i.args for i in ins[: froms[0]]]  # the whole file builds too
    stages = [ins[a:b] for a, b in zip(froms, froms[1:] + [len(ins)])]
    _, deps_install, deps, install, image = stages

    def copies(stage):
        return [i.args for i in stage if i.keyword in ("COPY", "ADD")]

    assert copies(deps_install) == ["deps/ /tmp/wheels/deps/"]
    assert copies(deps) == ["--from=deps-install /usr/local /usr/local"]
    assert copies(install) == ["project/ /tmp/wheels/project/"]
    assert copies(image) == ["--from=install /staging /"]
    for stage in (deps_install, install):
        assert any(i.keyword == "LABEL" and "${INSTALL_STAGE_ID}" in i.args for i in stage)
    (project_pip,) = [i.args for i in install if i.keyword == "RUN"]
    assert "--no-deps" in project_pip and "--root /staging" in project_pip


@pytest.mark.parametrize("name", ["Dockerfile.cpu", "Dockerfile.gpu"])
def test_the_dependencies_half_reads_no_project_wheel(name):
    """build-images.sh builds the file up to `FROM ${DEPS_IMAGE}` from the third-party side
    (deps/) alone and keys the dependencies image on it: the project's wheels and the project
    half's inputs must not reach it, nor the third-party ones the project half."""
    ins = parse(_read(name))
    split = next(n for n, i in enumerate(ins) if i.args.startswith("${DEPS_IMAGE}"))
    deps_half, project_half = ins[:split], ins[split:]
    assert not any("project/" in i.args or re.search(r"elasticdl[-_*]", i.args) for i in deps_half)
    assert not any("deps/" in i.args or "--from=deps" in i.args for i in project_half)
    # The project's wheels go in without an index: their requirements are the dependencies'.
    assert not any("EXTRA_PYPI_INDEX" in i.args or "PIP_OPTIONS" in i.args for i in project_half)


def test_gpu_dockerfile_is_the_cpu_base_with_cuda_wheels():
    """No NVIDIA base image: the CPU image's Debian + Python 3.11 base, TensorFlow with its CUDA
    wheels, and torch's CUDA build over them."""
    args = {
        name: {
            i.args.split("=", 1)[0]: i.args.split("=", 1)[1].strip('"')
            for i in parse(_read(name))
            if i.keyword == "ARG"
        }
        for name in ("Dockerfile.cpu", "Dockerfile.gpu")
    }
    gpu = args["Dockerfile.gpu"]
    assert gpu["BASE_IMAGE"] == args["Dockerfile.cpu"]["BASE_IMAGE"]
    assert gpu["TENSORFLOW"] == "tensorflow[and-cuda]==2.16.2"
    assert gpu["TORCH"] == "torch==2.2.2"
    assert gpu["PYTHON_PPA"] == ""  # only for NVIDIA's Ubuntu images


def test_server_dockerfile_adds_one_layer_of_new_files_to_the_base():
    """The job server's image: the CPU base plus what its install stage put under /staging
    (pip --root: only what the base lacks); the wheels stay in that stage; it runs as 10001."""
    text = _read("Dockerfile.server")
    assert lint(text) == []
    ins = parse(text)
    froms = [n for n, i in enumerate(ins) if i.keyword == "FROM"]
    assert [ins[n].args for n in froms] == ["${BASE_IMAGE} AS install", "${BASE_IMAGE}"]
    assert ins[0].args == "BASE_IMAGE=elasticdl:cpu"
    install, image = ins[froms[0] : froms[1]], ins[froms[1] :]
    assert any(i.keyword == "COPY" and i.args.startswith("*.whl ") for i in install)
    assert any(i.keyword == "RUN" and "--root /staging" in i.args for i in install)
    assert any(i.keyword == "LABEL" and "${INSTALL_STAGE_ID}" in i.args for i in install)
    assert [i.args for i in image if i.keyword in ("COPY", "ADD")] == [
        "--from=install /staging/usr/local /usr/local"
    ]
    assert any(i.keyword == "RUN" and "elasticdl-server --help" in i.args for i in image)
    assert [i.args for i in image if i.keyword == "USER"][-1] == "10001:10001"
    assert [i.args for i in image if i.keyword == "ENTRYPOINT"] == ['["elasticdl-server"]']


def test_zoo_init_output_lints_clean(tmp_path):
    (tmp_path / "zoo").mkdir()
    (tmp_path / "zoo" / "requirements.txt").write_text("")
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "x-1-py3-none-any.whl").write_bytes(b"")
    (tmp_path / "spec.py").write_text("")
    cfg = ZooInitConfig(
        model_zoo="zoo",
        local_pkg_dir="w",
        cluster_spec="spec.py",
        extra_pypi_index="https://m/simple",
    )
    assert lint(render_dockerfile(cfg, tmp_path)) == []


def test_parse_joins_continuations_and_skips_comments():
    ins = parse("# c\nARG A=1\nFROM x\nRUN a \\\n  # inner comment\n  && b\n")
    assert [(i.line, i.keyword, i.args) for i in ins] == [
        (2, "ARG", "A=1"),
        (3, "FROM", "x"),
        (4, "RUN", "a && b"),
    ]


@pytest.mark.parametrize(
    "text, problem",
    [
        ("FROMM x\n", "line 1: unknown instruction FROMM"),
        ("RUN true\n", "line 1: RUN before the first FROM"),
        ("ARG A\n", "line 1: no FROM instruction"),
        ("FROM $IMG\n", "line 1: FROM uses $IMG, not declared by an ARG before the first FROM"),
        ("ARG V=1\nFROM x\nRUN echo ok\n", "line 1: ARG V is never used"),
        (
            "ARG V=1\nFROM x\nRUN echo ${V}\n",
            "line 3: $V is an ARG of the global scope; re-declare it",
        ),
        ("FROM x\nCOPY onlyone\n", "line 2: COPY needs a source and a destination"),
        ('FROM x\nCMD ["python3",]\n', "line 2: CMD exec form must be a JSON list of strings"),
    ],
)
def test_lint_catches(text, problem):
    assert any(p.startswith(problem) for p in lint(text)), lint(text)
