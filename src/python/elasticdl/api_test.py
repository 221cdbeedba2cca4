"""elasticdl.api with the FAKE master of jobs/testdata (see jobs/local_backend_test.py for
why)."""

from pathlib import Path

import pytest
from elasticdl import api
from elasticdl.common.job_spec import JobSpec

FAKE_MASTER = Path(__file__).parent / "jobs" / "testdata" / "fake_master.py"


@pytest.fixture
def zoo(tmp_path, monkeypatch):
    monkeypatch.setenv("ELASTICDL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("ELASTICDL_MASTER_PEX", str(FAKE_MASTER))
    monkeypatch.setenv("FAKE_MASTER_STEPS", "2")
    monkeypatch.delenv("ELASTICDL_CONFIG", raising=False)
    (tmp_path / "zoo" / "m").mkdir(parents=True)
    (tmp_path / "zoo" / "m" / "model.py").write_text("")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "shard-0.rio").write_bytes(b"")  # a RecordIO shard without records
    return tmp_path


def test_train_wait_status_list(zoo):
    handle = api.train(
        job_name="api-job",
        model_zoo=str(zoo / "zoo"),
        model_def="m.model.custom_model",
        training_data=str(zoo / "data"),
        num_workers=1,
        use_async=True,
    )
    assert handle.platform == "local" and handle.pid
    final = api.wait("api-job", timeout=30, poll_interval=0.1)
    assert final.phase == api.JobPhase.SUCCEEDED and final.model_version == 20
    assert api.status("api-job").phase == "Succeeded"
    assert [j.job_name for j in api.list_jobs()] == ["api-job"]
    assert "job succeeded" in "".join(api.logs("api-job"))
    sent = JobSpec.from_json((zoo / "home" / "jobs" / "api-job" / "job_spec.json").read_text())
    assert sent.use_async is True and sent.num_workers == 1
    assert api.cancel("api-job").phase == "Succeeded"  # already finished: unchanged


def test_bad_kwargs_raise_value_errors(zoo):
    with pytest.raises(
        api.ArgumentError, match="num_worker is not a job parameter; did you mean num_workers"
    ):
        api.train(job_name="x", num_worker=1)
    with pytest.raises(api.ArgumentError, match="num_workers must be an integer, got str '1'"):
        api.train(job_name="x", num_workers="1")
    with pytest.raises(api.ArgumentError, match="num_epochs is not a parameter of 'evaluate' jobs"):
        api.evaluate(job_name="x", num_epochs=2)
    with pytest.raises(ValueError, match="--checkpoint_dir_for_init is required to evaluate"):
        api.evaluate(
            job_name="x",
            model_zoo=str(zoo / "zoo"),
            model_def="m.model.f",
            validation_data=str(zoo / "data"),
        )
    with pytest.raises(api.JobNotFoundError):
        api.status("nope")
    assert not (zoo / "home" / "jobs").exists()


def test_a_spec_built_beforehand(zoo):
    spec = api.JobSpec(
        job_name="spec-job",
        model_zoo=str(zoo / "zoo"),
        model_def="m.model.custom_model",
        training_data=str(zoo / "data"),
        minibatch_size=16,
    )
    handle = api.train(spec)
    assert api.wait(handle.job_name, timeout=30, poll_interval=0.1).phase == "Succeeded"
    sent = JobSpec.from_json((zoo / "home" / "jobs" / "spec-job" / "job_spec.json").read_text())
    assert sent.minibatch_size == 16 and sent.job_type == api.JobType.TRAINING_ONLY
    with pytest.raises(api.ArgumentError, match="either a JobSpec or keyword arguments"):
        api.train(spec, num_workers=3)
