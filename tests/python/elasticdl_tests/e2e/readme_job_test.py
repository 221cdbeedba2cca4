"""The README's main job, exactly as documented (data paths aside): Fashion-MNIST CNN, 1 PS +
2 workers as local processes, one epoch, evaluation every 200 versions. It must succeed with
test accuracy >= 0.80, having trained every record once."""
import re

from .conftest import MODEL_DEF, MODEL_ZOO


def test_readme_job_reaches_80_percent_accuracy_in_one_epoch(cli, fashion_mnist):
    proc = cli.run(
        "train",
        "--platform=local",
        f"--model_zoo={MODEL_ZOO}",
        f"--model_def={MODEL_DEF}",
        f"--training_data={fashion_mnist / 'train'}",
        f"--validation_data={fashion_mnist / 'test'}",
        "--num_epochs=1",
        "--minibatch_size=64",
        "--num_minibatches_per_task=2",
        "--num_workers=2",
        "--num_ps_pods=1",
        "--evaluation_steps=200",
        "--job_name=test-mnist",
        timeout=1000,
    )
    out = proc.stdout + proc.stderr
    # The followed master log: periodic evaluations, then the accounting summary.
    assert re.search(r"Evaluation metrics\[v=200\]: \{'accuracy': ", out), out[-3000:]
    summary = re.search(
        r"Job test-mnist succeeded: trained (\d+)/(\d+) records in (\d+) tasks " r"\((\d+) retried",
        out,
    )
    assert summary, out[-3000:]
    assert summary.group(1) == summary.group(2) == "60000"

    status = cli.status("test-mnist")
    assert status["phase"] == "Succeeded"
    assert status["records_trained"] == status["records_expected"] == 60000
    assert status["records_trained_per_epoch"] == {"1": 60000}
    assert status["model_version"] >= 900  # ~938 minibatches, one PS version each
    accuracy = status["evaluation_metrics"]["accuracy"]
    assert accuracy >= 0.80, f"test accuracy {accuracy} after one epoch"
    assert [h["model_version"] for h in status["evaluation_history"]][:4] == [200, 400, 600, 800]
