"""Which program the client starts as the master."""

import importlib.util
import os
import sys
from pathlib import Path

import pytest
from elasticdl.jobs import master_runtime
from elasticdl.jobs.master_runtime import (
    MASTER_MODULE,
    PANTS_MASTER_PEX,
    MasterRuntimeNotFound,
    client_pex_root,
    resolve_master_runtime,
    source_checkout_root,
)


def test_env_executable_runs_directly(tmp_path):
    pex = tmp_path / "master.pex"
    pex.write_text("#!/bin/sh\n")
    pex.chmod(0o755)
    runtime = resolve_master_runtime(
        {"ELASTICDL_MASTER_PEX": str(pex)}, pex_root=None, checkout_root=None
    )
    assert runtime.command(["--job_name=a"]) == [str(pex), "--job_name=a"]
    assert runtime.env == {}


def test_env_non_executable_runs_with_this_python(tmp_path):
    script = tmp_path / "master.py"
    script.write_text("")
    runtime = resolve_master_runtime(
        {"ELASTICDL_MASTER_PEX": str(script)}, pex_root=None, checkout_root=None, python="/py"
    )
    assert runtime.argv == ["/py", str(script)]


def test_env_pointing_nowhere_is_an_error(tmp_path):
    with pytest.raises(MasterRuntimeNotFound, match=r"\$ELASTICDL_MASTER_PEX=.*is not a file"):
        resolve_master_runtime(
            {"ELASTICDL_MASTER_PEX": str(tmp_path / "missing.pex")},
            pex_root=None,
            checkout_root=None,
        )


def _pex(root):
    pex = root / PANTS_MASTER_PEX
    pex.parent.mkdir(parents=True)
    pex.write_text("#!/bin/sh\necho owned\n")
    pex.chmod(0o755)
    return pex


def test_master_pex_beside_the_client_pex(tmp_path):
    pex = _pex(tmp_path)
    client = tmp_path / "dist" / "src.python.client" / "elasticdl.pex"
    assert client_pex_root({"PEX": str(client)}) == tmp_path.resolve()
    runtime = resolve_master_runtime({"PEX": str(client)}, checkout_root=None)
    assert runtime.argv == [str(pex.resolve())]


def test_pex_in_the_working_directory_or_its_parents_is_never_run(tmp_path, monkeypatch):
    planted = _pex(tmp_path)
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    monkeypatch.chdir(deep)
    assert client_pex_root({}) not in (tmp_path, deep)
    assert source_checkout_root() not in (tmp_path, deep)
    try:
        runtime = resolve_master_runtime({}, search_interpreter=False)
    except MasterRuntimeNotFound:
        return
    assert str(planted) not in runtime.argv  # this checkout's own dist/, if it has one


def test_a_source_checkout_prefers_its_interpreter_then_its_own_dist(tmp_path):
    here = Path(master_runtime.__file__).resolve()
    assert source_checkout_root() == here.parents[4]
    pex = _pex(tmp_path)
    runtime = resolve_master_runtime(
        {}, pex_root=None, checkout_root=tmp_path, search_interpreter=False
    )
    assert runtime.argv == [str(pex)]
    if importlib.util.find_spec("tensorflow") is not None:
        runtime = resolve_master_runtime({}, pex_root=None, checkout_root=tmp_path)
        assert runtime.argv == [sys.executable, "-m", MASTER_MODULE]


def test_env_wins_over_pants_pex(tmp_path):
    (tmp_path / PANTS_MASTER_PEX).parent.mkdir(parents=True)
    (tmp_path / PANTS_MASTER_PEX).write_text("")
    script = tmp_path / "mine.py"
    script.write_text("")
    runtime = resolve_master_runtime(
        {"ELASTICDL_MASTER_PEX": str(script)}, pex_root=None, checkout_root=None, python="/py"
    )
    assert runtime.argv == ["/py", str(script)]


def test_interpreter_fallback_when_tensorflow_is_installed(tmp_path):
    import importlib.util

    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("this interpreter has no TensorFlow")
    runtime = resolve_master_runtime({}, pex_root=None, checkout_root=None)
    assert runtime.argv == [sys.executable, "-m", MASTER_MODULE]
    assert all(p in runtime.env["PYTHONPATH"].split(os.pathsep) for p in sys.path if p)


def test_nothing_found_says_how_to_build_it(tmp_path):
    with pytest.raises(MasterRuntimeNotFound) as info:
        resolve_master_runtime({}, pex_root=None, checkout_root=None, search_interpreter=False)
    message = str(info.value)
    assert "./pants package src/python/elasticdl/master:master" in message
    assert "pip install elasticdl" in message
    assert "\n" not in message
    assert isinstance(info.value, ValueError)
