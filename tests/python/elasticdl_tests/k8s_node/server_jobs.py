"""The small training job the real-node test files submit through the job server."""
from __future__ import annotations


def server_job_spec(job: str) -> dict:
    """The job spec (as the job server takes it) of a one-epoch README model job sized for the
    test cluster (the default pod network mode)."""
    return {
        "job_name": job,
        "model_def": "mnist.mnist_functional_api.custom_model",
        "training_data": "fashion/train",
        "num_epochs": 1,
        "minibatch_size": 32,
        "num_minibatches_per_task": 2,
        "num_ps_pods": 1,
        "num_workers": 1,
        "distribution_strategy": "ParameterServerStrategy",
        "image_pull_policy": "IfNotPresent",
        "master_resource_request": "cpu=0.2,memory=1024Mi",
        "worker_resource_request": "cpu=0.4,memory=1024Mi",
        "ps_resource_request": "cpu=0.2,memory=1024Mi",
    }
