"""The `zoo` command through the real `elasticdl` entry point (no engine needed here: the
build/push tests against a real engine are in tests/python/elasticdl_tests/images)."""

from __future__ import annotations

import pytest
from elasticdl.client import (  # noqa: F401  (main imports it by name; this makes it a dependency)
    zoo,
)
from elasticdl.client.image_builder import ImageError, split_image_name
from elasticdl.client.main import main


def test_init_writes_dockerfile_in_cwd(tmp_path, monkeypatch, capsys):
    (tmp_path / "zoo").mkdir()
    monkeypatch.chdir(tmp_path)
    assert main(["zoo", "init", "--model_zoo=zoo", "--base_image=local/base"]) == 0
    assert "FROM local/base\n" in (tmp_path / "Dockerfile").read_text()
    assert "wrote Dockerfile" in capsys.readouterr().err


def test_init_bad_flag_is_exit_2_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["zoo", "init", "--model_zoo=missing"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == ["elasticdl: error: --model_zoo=missing is not a directory"]


@pytest.mark.parametrize(
    "argv", [["build", "--image=t/m:v1", "."], ["push", "127.0.0.1:5000/t/m:v1"]]
)
def test_unreachable_engine_is_one_line(tmp_path, monkeypatch, capsys, argv):
    pytest.importorskip("docker")
    (tmp_path / "Dockerfile").write_text("FROM local/base\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent.sock")
    assert main(["zoo", *argv]) == 1
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "elasticdl: error: cannot reach the container engine at unix:///nonexistent.sock"
    )


def test_split_image_name():
    assert split_image_name("127.0.0.1:5000/a/b:v1") == ("127.0.0.1:5000/a/b", "v1")
    assert split_image_name("127.0.0.1:5000/a/b") == ("127.0.0.1:5000/a/b", "latest")
    assert split_image_name("b") == ("b", "latest")
    with pytest.raises(ImageError):
        split_image_name("a b")


def test_zoo_does_not_import_docker_at_startup():
    import subprocess
    import sys

    code = "import sys, elasticdl.client.zoo; print('docker' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "False"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["build", "--image=t/m:v1", "."], "--dockerfile: no Dockerfile in ."),
        (["build", "--image=t/m:v1", "nodir"], "build context nodir is not a directory"),
        (["build", "--image=Bad Image", "."], "--image: 'Bad Image' is not an image name"),
        (["push", "Bad Image"], "IMAGE: 'Bad Image' is not an image name"),
    ],
)
def test_bad_build_and_push_input_is_exit_2_before_the_engine(
    tmp_path, monkeypatch, capsys, argv, message
):
    if "Bad Image" in argv[1] or argv[0] == "push":
        (tmp_path / "Dockerfile").write_text("FROM local/base\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent.sock")
    assert main(["zoo", *argv]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"elasticdl: error: {message}")
