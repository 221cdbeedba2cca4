"""Which program the client starts as the master."""

import os
import sys
from pathlib import Path

import pytest
from elasticdl.client import master_runtime
from elasticdl.client.master_runtime import (
    MASTER_MODULE,
    PANTS_MASTER_PEX,
    MasterRuntimeNotFound,
    install_roots,
    resolve_master_runtime,
)


def test_env_executable_runs_directly(tmp_path):
    pex = tmp_path / "master.pex"
    pex.write_text("#!/bin/sh\n")
    pex.chmod(0o755)
    runtime = resolve_master_runtime({"ELASTICDL_MASTER_PEX": str(pex)}, roots=[])
    assert runtime.command(["--job_name=a"]) == [str(pex), "--job_name=a"]
    assert runtime.env == {}


def test_env_non_executable_runs_with_this_python(tmp_path):
    script = tmp_path / "master.py"
    script.write_text("")
    runtime = resolve_master_runtime({"ELASTICDL_MASTER_PEX": str(script)}, roots=[], python="/py")
    assert runtime.argv == ["/py", str(script)]


def test_env_pointing_nowhere_is_an_error(tmp_path):
    with pytest.raises(MasterRuntimeNotFound, match=r"\$ELASTICDL_MASTER_PEX=.*is not a file"):
        resolve_master_runtime({"ELASTICDL_MASTER_PEX": str(tmp_path / "missing.pex")}, roots=[])


def test_pants_pex_found_where_the_client_was_installed(tmp_path):
    pex = tmp_path / PANTS_MASTER_PEX
    pex.parent.mkdir(parents=True)
    pex.write_text("")
    pex.chmod(0o755)
    runtime = resolve_master_runtime({}, roots=[tmp_path])
    assert runtime.argv == [str(pex)]


def test_pex_in_the_working_directory_or_its_parents_is_never_run(tmp_path, monkeypatch):
    planted = tmp_path / PANTS_MASTER_PEX
    planted.parent.mkdir(parents=True)
    planted.write_text("#!/bin/sh\necho owned\n")
    planted.chmod(0o755)
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    monkeypatch.chdir(deep)
    roots = install_roots({})
    assert tmp_path not in roots and deep not in roots
    with pytest.raises(MasterRuntimeNotFound):
        resolve_master_runtime({}, roots=[], search_interpreter=False)


def test_install_roots_are_this_checkout_and_the_client_pex_dist(tmp_path):
    here = Path(master_runtime.__file__).resolve()
    pex = tmp_path / "dist" / "src.python.client" / "elasticdl.pex"
    roots = install_roots({"PEX": str(pex)})
    assert roots == [here.parents[4], tmp_path.resolve()]


def test_env_wins_over_pants_pex(tmp_path):
    (tmp_path / PANTS_MASTER_PEX).parent.mkdir(parents=True)
    (tmp_path / PANTS_MASTER_PEX).write_text("")
    script = tmp_path / "mine.py"
    script.write_text("")
    runtime = resolve_master_runtime({"ELASTICDL_MASTER_PEX": str(script)}, roots=[], python="/py")
    assert runtime.argv == ["/py", str(script)]


def test_interpreter_fallback_when_tensorflow_is_installed(tmp_path):
    import importlib.util

    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("this interpreter has no TensorFlow")
    runtime = resolve_master_runtime({}, roots=[])
    assert runtime.argv == [sys.executable, "-m", MASTER_MODULE]
    assert all(p in runtime.env["PYTHONPATH"].split(os.pathsep) for p in sys.path if p)


def test_nothing_found_says_how_to_build_it(tmp_path):
    with pytest.raises(MasterRuntimeNotFound) as info:
        resolve_master_runtime({}, roots=[], search_interpreter=False)
    message = str(info.value)
    assert "./pants package src/python/elasticdl/master:master" in message
    assert "pip install elasticdl" in message
    assert "\n" not in message
    assert isinstance(info.value, ValueError)
