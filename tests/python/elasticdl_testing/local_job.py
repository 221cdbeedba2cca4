"""Run a whole small job in one process: real master servicer, real PS, one real worker.

For tests of model-zoo entries and of the worker loop: every part talks real gRPC on
127.0.0.1 with free ports; only the process boundaries are gone. Not a production launcher.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Iterable, List, Optional

from elasticdl.common.auth import new_job_secret
from elasticdl.common.model_utils import get_optimizer_info, load_model_spec
from elasticdl.data import recordio
from elasticdl.data.reader import create_data_reader
from elasticdl.master.evaluation_service import EvaluationService
from elasticdl.master.server import create_master_server
from elasticdl.master.servicer import MasterServicer
from elasticdl.master.task_manager import TaskManager, TaskManagerConfig
from elasticdl.ps.server import PSConfig, PSServer
from elasticdl.worker.master_client import MasterClient
from elasticdl.worker.ps_client import PSClient
from elasticdl.worker.ps_trainer import PSTrainer, TrainerConfig
from elasticdl.worker.task_data_service import TaskDataService
from elasticdl.worker.worker import JobType, Worker, WorkerConfig

logger = logging.getLogger(__name__)


def write_recordio(path: str, records: Iterable[bytes]) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with recordio.Writer(path) as w:
        for r in records:
            w.write(r)
    return path


@dataclass
class LocalJobResult:
    exit_code: int
    task_summary: object
    evaluation: Optional[object]
    worker: Worker
    ps_versions: List[int] = field(default_factory=list)


def run_local_job(
    model_zoo: str,
    model_def: str,
    training_data: str = "",
    validation_data: str = "",
    saved_model_path: str = "",
    minibatch_size: int = 16,
    num_minibatches_per_task: int = 2,
    num_epochs: int = 1,
    num_ps: int = 2,
    use_async: bool = True,
    log_loss_steps: int = 100,
) -> LocalJobResult:
    spec = load_model_spec(model_zoo, model_def)
    records_per_task = minibatch_size * num_minibatches_per_task
    train_shards = create_data_reader(training_data).create_shards() if training_data else []
    eval_shards = create_data_reader(validation_data).create_shards() if validation_data else []
    tm = TaskManager(
        TaskManagerConfig(
            records_per_task=records_per_task,
            num_epochs=num_epochs,
            minibatch_size=minibatch_size,
            saved_model_path=saved_model_path,
        ),
        training_shards=train_shards,
        evaluation_shards=eval_shards,
    )
    es = EvaluationService(tm, spec.eval_metrics_fn) if eval_shards else None
    # Authenticated like a real job: servers and clients share a job secret.
    secret = new_job_secret()
    server, port = create_master_server(
        MasterServicer(tm, es), 0, bind_host="127.0.0.1", secret=secret
    )
    opt_type, opt_args = get_optimizer_info(spec.optimizer())
    servers = []
    master = ps = None
    try:
        for i in range(num_ps):
            s = PSServer(
                PSConfig(
                    ps_id=i,
                    num_ps_pods=num_ps,
                    port=0,
                    bind_host="127.0.0.1",
                    use_async=use_async,
                    opt_type=opt_type,
                    opt_args=opt_args,
                    log_every_versions=0,
                    grpc_threads=8,
                ),
                secret=secret,
            )
            s.start()
            servers.append(s)
        master = MasterClient(f"127.0.0.1:{port}", worker_id=0, retry_timeout=10, secret=secret)
        ps = PSClient([f"127.0.0.1:{s.port}" for s in servers], retry_timeout=10, secret=secret)
        job_type = (
            JobType.TRAINING_WITH_EVALUATION
            if train_shards and eval_shards
            else JobType.TRAINING_ONLY
            if train_shards
            else JobType.EVALUATION_ONLY
        )
        # As elasticdl.worker.main builds it: an async PS gets pushes overlapped with steps.
        trainer = PSTrainer(
            spec,
            ps,
            TrainerConfig(init_model_on_ps=job_type.trains, overlap_pushes=use_async),
        )
        worker = Worker(
            WorkerConfig(
                worker_id=0,
                job_type=job_type,
                minibatch_size=minibatch_size,
                log_loss_steps=log_loss_steps,
                wait_sleep_s=0.1,
            ),
            spec,
            master,
            trainer,
            TaskDataService(spec, minibatch_size),
        )
        code = worker.run()
        return LocalJobResult(
            exit_code=code,
            task_summary=tm.summary(),
            evaluation=es.latest if es is not None else None,
            worker=worker,
            ps_versions=[s.params.version for s in servers],
        )
    finally:
        for c in (master, ps):
            if c is not None:
                c.close()
        for s in servers:
            s.stop(grace_s=0)
        server.stop(0)
