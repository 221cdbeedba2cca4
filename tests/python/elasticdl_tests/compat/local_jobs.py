"""A short local job of the original-style model zoo (testdata/model_zoo), submitted as
`elasticdl <kind> --flag=value ...` would submit it (flag text, as typed), for the compat tests."""
from __future__ import annotations

import json
from pathlib import Path

from elasticdl.common.job_spec import spec_from_text
from elasticdl.master.job import Job

ZOO = str(Path(__file__).resolve().parent / "testdata" / "model_zoo")


def run_local_job(kind: str, tmp_path: Path, name: str, **flags: str) -> dict:
    """Runs the job (master in this process, PS and workers as processes) in tmp_path/name;
    its final status.json, after asserting that it succeeded."""
    values = {
        "job_name": name,
        "model_zoo": ZOO,
        "minibatch_size": "64",
        "num_workers": "1",
        "platform": "local",
        "job_dir": str(tmp_path / name),
        **flags,
    }
    spec, _ = spec_from_text(kind, values).resolve()
    code = Job(spec).run()
    status = json.loads((tmp_path / name / "status.json").read_text())
    assert code == 0, status["message"]
    return status
