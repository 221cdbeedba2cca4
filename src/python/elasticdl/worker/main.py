"""`python -m elasticdl.worker.main`: one worker process of an ElasticDL job.

Exit codes: 0 when the master has no more tasks; 2 for bad flags or model definition; 1 when the
worker cannot go on (PS unreachable, repeated task failures).
"""
from __future__ import annotations

import argparse
import logging
import sys

from elasticdl.common.cpu_budget import apply_training_split
from elasticdl.common.malloc_tuning import tune_malloc
from elasticdl.common.model_utils import ModelSpecError, get_dict_from_params_str, load_model_spec

logger = logging.getLogger("elasticdl.worker.main")

STRATEGIES = ("ParameterServerStrategy", "AllreduceStrategy", "Local", "")
ALLREDUCE = "AllreduceStrategy"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="elasticdl.worker.main", description=__doc__.splitlines()[0])
    p.add_argument("--worker_id", type=int, required=True)
    p.add_argument("--master_addr", required=True, help="host:port of the master")
    p.add_argument(
        "--ps_addrs", default="", help="comma-separated host:port of every PS, in PS id order"
    )
    p.add_argument(
        "--job_type",
        required=True,
        choices=["training_only", "training_with_evaluation", "evaluation_only", "prediction_only"],
    )
    p.add_argument("--model_zoo", required=True)
    p.add_argument("--model_def", required=True)
    p.add_argument("--minibatch_size", type=int, default=64)
    p.add_argument("--feed", default="feed")
    p.add_argument("--loss", default="loss")
    p.add_argument("--optimizer", default="optimizer")
    p.add_argument("--eval_metrics_fn", default="eval_metrics_fn")
    p.add_argument("--callbacks", default="callbacks")
    p.add_argument("--custom_data_reader", default="custom_data_reader")
    p.add_argument("--prediction_outputs_processor", default="PredictionOutputsProcessor")
    p.add_argument("--data_reader_params", default="")
    p.add_argument(
        "--log_level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]
    )
    p.add_argument("--get_model_steps", type=int, default=1)
    p.add_argument("--distribution_strategy", default="ParameterServerStrategy")
    p.add_argument("--output", default="")
    p.add_argument("--log_loss_steps", type=int, default=100)
    p.add_argument("--num_workers", type=int, default=0)
    p.add_argument(
        "--retry_timeout",
        type=float,
        default=120.0,
        help="seconds to keep retrying an unreachable master/PS",
    )
    p.add_argument(
        "--allreduce_retries",
        type=int,
        default=5,
        help="AllreduceStrategy: re-form the group and retry a failed allreduce this often",
    )
    p.add_argument(
        "--allreduce_backend",
        default="auto",
        choices=["auto", "gloo", "nccl"],
        help="AllreduceStrategy: torch.distributed backend (auto: NCCL with a GPU, else Gloo)",
    )
    return p


class WorkerArgsError(ValueError):
    pass


def _validate(args) -> None:
    if args.minibatch_size <= 0:
        raise WorkerArgsError(f"--minibatch_size must be positive, got {args.minibatch_size}")
    if args.get_model_steps <= 0:
        raise WorkerArgsError(f"--get_model_steps must be positive, got {args.get_model_steps}")
    if args.distribution_strategy not in STRATEGIES:
        raise WorkerArgsError(
            f"--distribution_strategy {args.distribution_strategy!r} unknown; "
            f"use one of {[s for s in STRATEGIES if s]}"
        )
    if args.distribution_strategy == ALLREDUCE:
        if args.allreduce_retries < 0:
            raise WorkerArgsError(f"--allreduce_retries must be >= 0, got {args.allreduce_retries}")
        return  # no PS: workers allreduce gradients among themselves
    if not [a for a in args.ps_addrs.split(",") if a.strip()]:
        raise WorkerArgsError("--ps_addrs is empty: pass the PS addresses (host:port,...)")


def main(argv=None) -> int:
    # Before any model-sized buffer exists (see elasticdl.common.malloc_tuning).
    tune_malloc()
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level,
        format="[%(asctime)s] [%(levelname)s] [%(filename)s:%(lineno)d:%(funcName)s] %(message)s",
    )
    try:
        _validate(args)
        if args.job_type in ("training_only", "training_with_evaluation"):
            # Before TensorFlow starts its runtime (see elasticdl.common.cpu_budget).
            apply_training_split()
        spec = load_model_spec(
            args.model_zoo,
            args.model_def,
            feed=args.feed,
            loss=args.loss,
            optimizer=args.optimizer,
            eval_metrics_fn=args.eval_metrics_fn,
            callbacks=args.callbacks,
            custom_data_reader=args.custom_data_reader,
            prediction_outputs_processor=args.prediction_outputs_processor,
            require_eval_metrics_fn=False,
        )
        reader_params = get_dict_from_params_str(args.data_reader_params)
    except (ModelSpecError, WorkerArgsError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2

    # TensorFlow is imported only now: flag errors above come back fast.
    from elasticdl.worker.master_client import MasterClient
    from elasticdl.worker.ps_client import PSClient
    from elasticdl.worker.task_data_service import TaskDataService
    from elasticdl.worker.trainer import PSTrainer, TrainerConfig
    from elasticdl.worker.worker import JobType, Worker, WorkerConfig

    job_type = JobType(args.job_type)
    ps = None
    if args.distribution_strategy == ALLREDUCE:
        # torch is imported by the group only when it first builds one.
        from elasticdl.worker.allreduce_group import AllreduceMasterClient, CommGroup, GroupConfig
        from elasticdl.worker.allreduce_trainer import AllreduceTrainer, AllreduceTrainerConfig

        master = AllreduceMasterClient(
            args.master_addr, args.worker_id, retry_timeout=args.retry_timeout
        )
        group = CommGroup(master, GroupConfig(backend=args.allreduce_backend))
        trainer = AllreduceTrainer(
            spec,
            group,
            master,
            AllreduceTrainerConfig(max_allreduce_retries=args.allreduce_retries),
        )
    else:
        master = MasterClient(args.master_addr, args.worker_id, retry_timeout=args.retry_timeout)
        ps = PSClient(
            [a.strip() for a in args.ps_addrs.split(",") if a.strip()],
            worker_id=args.worker_id,
            retry_timeout=args.retry_timeout,
        )
        trainer = PSTrainer(
            spec,
            ps,
            TrainerConfig(get_model_steps=args.get_model_steps, init_model_on_ps=job_type.trains),
        )
    data = TaskDataService(spec, args.minibatch_size, reader_params)
    worker = Worker(
        WorkerConfig(
            worker_id=args.worker_id,
            job_type=job_type,
            minibatch_size=args.minibatch_size,
            log_loss_steps=args.log_loss_steps,
            output=args.output,
        ),
        spec,
        master,
        trainer,
        data,
    )
    try:
        return worker.run()
    except Exception as err:  # fatal: the master sees the exit code and relaunches/records it
        logger.error("Worker %d failed: %s: %s", args.worker_id, type(err).__name__, err)
        return 1
    finally:
        master.close()
        if ps is not None:
            ps.close()


if __name__ == "__main__":
    sys.exit(main())
