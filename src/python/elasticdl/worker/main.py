"""`python -m elasticdl.worker.main`: one worker process of an ElasticDL job.

Exit codes: 0 when the master has no more tasks; 2 for bad flags or model definition (one
line on stderr, ``common.process_entry``); 1 when the worker cannot go on (PS unreachable,
repeated task failures).
"""
from __future__ import annotations

import logging
import sys

from elasticdl.common.auth import MissingJobSecret, job_secret_from_env
from elasticdl.common.cpu_budget import apply_training_split
from elasticdl.common.model_utils import ModelSpecError, get_dict_from_params_str, load_model_of
from elasticdl.common.process_entry import WORKER, UsageError, run_process
from elasticdl.common.replica_spec import worker_spec_from_argv
from elasticdl.common.tls import TLS

logger = logging.getLogger("elasticdl.worker.main")


def main(argv=None) -> int:
    return run_process(WORKER, argv, worker_spec_from_argv, _work)


def _work(spec) -> int:
    try:
        secret = job_secret_from_env()
        if spec.job_type.trains:
            # Before TensorFlow starts its runtime (see elasticdl.common.cpu_budget).
            apply_training_split()
        model = load_model_of(spec, require_eval_metrics_fn=False)
        reader_params = get_dict_from_params_str(spec.data_reader_params)
        tls_config = TLS.of(spec)
    except (MissingJobSecret, ModelSpecError, ValueError) as err:
        raise UsageError(err) from None

    # TensorFlow is imported only now: flag errors above come back fast.
    from elasticdl.worker.master_client import MasterClient
    from elasticdl.worker.ps_client import PSClient
    from elasticdl.worker.ps_trainer import PSTrainer, TrainerConfig
    from elasticdl.worker.task_data_service import TaskDataService
    from elasticdl.worker.worker import Worker, WorkerConfig

    job_type = spec.job_type
    ps = ps_set = None
    if spec.allreduce:
        # torch is imported by the group only when it first builds one.
        from elasticdl.worker.allreduce_group import AllreduceMasterClient, CommGroup, GroupConfig
        from elasticdl.worker.allreduce_trainer import AllreduceTrainer, AllreduceTrainerConfig

        master = AllreduceMasterClient(
            spec.master_addr,
            spec.worker_id,
            retry_timeout=spec.retry_timeout,
            secret=secret,
            tls_config=tls_config,
        )
        group = CommGroup(master, GroupConfig(backend=spec.allreduce_backend, secret=secret))
        trainer = AllreduceTrainer(
            model,
            group,
            master,
            AllreduceTrainerConfig(max_allreduce_retries=spec.allreduce_retries),
        )
    else:
        master = MasterClient(
            spec.master_addr,
            spec.worker_id,
            retry_timeout=spec.retry_timeout,
            secret=secret,
            tls_config=tls_config,
        )
        from elasticdl.worker.ps_set import PSSet

        def connect(addrs):
            return PSClient(
                list(addrs),
                worker_id=spec.worker_id,
                retry_timeout=spec.retry_timeout,
                secret=secret,
                tls_config=tls_config,
            )

        ps = connect(spec.ps_addrs)
        trainer = PSTrainer(
            model,
            ps,
            TrainerConfig(
                get_model_steps=spec.get_model_steps,
                init_model_on_ps=job_type.trains,
                overlap_pushes=spec.use_async,
            ),
        )
        ps_set = PSSet(trainer, connect)
    data = TaskDataService(model, spec.minibatch_size, reader_params)
    worker = Worker(
        WorkerConfig(
            worker_id=spec.worker_id,
            job_type=job_type,
            minibatch_size=spec.minibatch_size,
            log_loss_steps=spec.log_loss_steps,
            output=spec.output,
        ),
        model,
        master,
        trainer,
        data,
        ps_set=ps_set,
    )
    try:
        return worker.run()
    except Exception as err:  # fatal: the master sees the exit code and relaunches/records it
        logger.error("Worker %d failed: %s: %s", spec.worker_id, type(err).__name__, err)
        return 1
    finally:
        master.close()
        if ps is not None:
            ps.close()  # a dropped client has nothing left to detach: closing it is harmless
        for client in ps_set.clients if ps_set is not None else ():
            client.close()


if __name__ == "__main__":
    sys.exit(main())
