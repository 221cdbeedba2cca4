"""The elasticdl command line: startup cost, help, errors, version, dataset command."""

import json
import os
import subprocess
import sys

import pytest
from elasticdl.client.main import main
from elasticdl.version import __version__

HEAVY = ("tensorflow", "numpy", "grpc", "kubernetes", "docker", "yaml", "google.protobuf")


def _python(code, **env):
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), **env),
        timeout=60,
    )


def test_help_imports_nothing_heavy():
    code = (
        "import json, sys\n"
        "from elasticdl.client.main import main\n"
        "rc = main(['--help'])\n"
        "for c in ['train', 'list', 'status']:\n"
        "    main([c, '--help'])\n"
        f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "print(json.dumps({'rc': rc, 'heavy': heavy}))\n"
    )
    result = _python(code)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report == {"rc": 0, "heavy": []}
    assert "train" in result.stdout and "--num_workers" in result.stdout


def test_module_entry_point_and_version():
    result = subprocess.run(
        [sys.executable, "-m", "elasticdl.client", "version"],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
        timeout=60,
    )
    assert result.returncode == 0
    assert result.stdout.startswith(f"elasticdl {__version__} ")


def test_unknown_flag_exit_2_one_line(capsys):
    assert main(["train", "--job_name=a", "--num_worker=2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "elasticdl: error: unrecognized arguments: --num_worker=2 (--num_worker -> did you mean --num_workers?) "
        "(see 'elasticdl train --help')"
    )


def test_unknown_command(capsys):
    assert main(["trian"]) == 2
    assert "invalid choice: 'trian'" in capsys.readouterr().err


def test_missing_required_flag(capsys):
    assert main(["train"]) == 2
    assert "--job_name is required" in capsys.readouterr().err


def test_no_command_prints_help(capsys):
    assert main([]) == 0
    assert "COMMAND" in capsys.readouterr().out


def test_version(capsys):
    assert main(["version"]) == 0
    assert __version__ in capsys.readouterr().out


@pytest.mark.parametrize("timeout", ["0", "-1", "nan", "inf", "-inf", "1e999"])
def test_wait_timeout_must_be_positive_and_finite(capsys, tmp_path, monkeypatch, timeout):
    # nan compares false with everything: it used to pass the check and wait forever.
    monkeypatch.setenv("ELASTICDL_HOME", str(tmp_path))
    assert main(["wait", "x", f"--timeout={timeout}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("elasticdl: error: --timeout must be a finite number of seconds > 0")
    assert "\n" not in err


def test_list_empty(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("ELASTICDL_HOME", str(tmp_path))
    monkeypatch.delenv("ELASTICDL_CONFIG", raising=False)
    assert main(["list"]) == 0
    out, err = capsys.readouterr()
    assert out == "" and "no jobs found" in err
    assert main(["list", "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_kubernetes_without_image_is_a_usage_error(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("ELASTICDL_HOME", str(tmp_path))
    rc = main(
        [
            "train",
            "--job_name=a",
            "--model_def=a.b.c",
            "--training_data=/d",
            "--platform=kubernetes",
        ]
    )
    assert rc == 2
    assert "--image_name is required on Kubernetes" in capsys.readouterr().err
    assert not (tmp_path / "jobs").exists()


def test_dataset_prepare_unknown_name(capsys, tmp_path):
    import importlib.util

    rc = main(["dataset", "prepare", "no-such-dataset", "--output", str(tmp_path / "out")])
    assert rc == 2
    err = capsys.readouterr().err
    if importlib.util.find_spec("elasticdl.data.datasets") is None:
        assert "dataset preparation is not available" in err
    else:
        assert "unknown dataset 'no-such-dataset'" in err
    assert not (tmp_path / "out").exists()


def test_dataset_list(capsys):
    import importlib.util

    if importlib.util.find_spec("elasticdl.data.datasets") is None:
        assert main(["dataset", "list"]) == 2
        return
    from elasticdl.data.datasets import DATASETS

    assert main(["dataset", "list"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["NAME", "DESCRIPTION"]
    assert all(name in out for name in DATASETS)


def test_job_command_usage_is_short(capsys):
    assert main(["train", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == (
        "usage: elasticdl train --job_name=NAME --model_def=MODULE.FUNCTION --training_data=PATH [flags]"
    )
    assert "--num_ps_pods" in out and "--detach" in out


def test_dataset_prepare_schema_original_is_passed_and_checked(capsys, tmp_path):
    import importlib.util

    if importlib.util.find_spec("elasticdl.data.datasets") is None:
        return
    out = str(tmp_path / "out")
    rc = main(["dataset", "prepare", "movielens", "--output", out, "--schema", "original"])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert "--schema original: the original ElasticDL had no movielens schema" in err
    assert "\n" not in err and "Traceback" not in err
    assert main(["dataset", "prepare", "census", "--output", out, "--schema", "v1"]) == 2
    assert "invalid choice: 'v1'" in capsys.readouterr().err


def test_dataset_prepare_limit_keeps_the_first_rows_of_each_split(capsys, tmp_path):
    import importlib.util

    if importlib.util.find_spec("elasticdl.data.datasets") is None:
        return
    from elasticdl.data import recordio

    out = tmp_path / "out"
    argv = ["dataset", "prepare", "fashion_mnist", "--output", str(out), "--no-progress"]
    assert main([*argv, "--limit", "100"]) == 0, capsys.readouterr().err
    for split in ("train", "test"):
        files = sorted((out / split).iterdir())
        assert sum(recordio.Index(str(f)).num_records() for f in files) == 100, split
    assert main([*argv, "--limit", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "elasticdl: error: --limit must be positive, got 0", err


def test_scale_ps_refuses_a_bad_count_and_a_job_that_does_not_run(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("ELASTICDL_HOME", str(tmp_path))
    monkeypatch.delenv("ELASTICDL_CONFIG", raising=False)
    assert main(["scale-ps", "j", "--num_ps=0"]) == 2
    assert capsys.readouterr().err.strip() == (
        "elasticdl: error: --num_ps must be >= 1, got 0; ask for 1 PS or more"
    )
    job_dir = tmp_path / "jobs" / "j"
    job_dir.mkdir(parents=True)
    (job_dir / "job.json").write_text('{"job_name": "j"}')
    (job_dir / "status.json").write_text('{"job_name": "j", "phase": "Succeeded"}')
    assert main(["scale-ps", "j", "--num_ps=2", "--platform=local"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "elasticdl: error: job j is Succeeded: its PS count can change only while it runs; "
        "see 'elasticdl status j'"
    )
