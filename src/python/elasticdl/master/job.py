"""One ElasticDL job as run by its master: wires the task manager, the evaluation service, the
gRPC server, the platform and the replica manager together, runs until the job ends and
reports the outcome (``status.json``, the final log summary, the exit code).

Where the platform's replicas outlive their master (a local job under the client's
supervisor), the master journals its state in ``<job dir>/journal/`` and a master started
again after one died resumes the job from it (``master.resume``): same port and secret, state
replayed, running replicas adopted, only dead ones relaunched."""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

from elasticdl.common import auth, message_caps, tls
from elasticdl.common.job_dir import LOG_DIR, RECOVERY_DIR, SECRET_FILE, STATUS_FILE
from elasticdl.common.job_spec import DEFAULT_MASTER_PORT, JobSpec
from elasticdl.common.job_status import JobStatus, ReplicaStatus
from elasticdl.common.types import JobPhase, JobType, PlatformName
from elasticdl.master import status_writer
from elasticdl.master.autoscaler import Autoscaler, AutoscalerConfig, PSLoads
from elasticdl.master.evaluation_service import FINAL_VERSION, EvaluationService
from elasticdl.master.job_cpu import CPUReports, JobCPU, MeasuredCPU, ReportedCPU, RequestedCPU
from elasticdl.master.journal import JournalError
from elasticdl.master.launch_specs import Checkpointing, LaunchSpecs, ReplicaContext, replica_env
from elasticdl.master.ps_calls import PSCalls
from elasticdl.master.ps_count_requests import PSCountRequests
from elasticdl.master.ps_rescale import PSOps, PSRescaler
from elasticdl.master.replica_manager import ReplicaManager, ReplicaManagerConfig
from elasticdl.master.resume import JobJournal, PreviousLife
from elasticdl.master.server import MasterServerError, create_master_server
from elasticdl.master.servicer import MasterServicer
from elasticdl.master.task_manager import TaskManager, TaskManagerConfig
from elasticdl.master.throughput import Throughput
from elasticdl.platform.base import Platform, ReplicaType

logger = logging.getLogger(__name__)

# Local training jobs without --checkpoint_steps: PS checkpoints kept for recovery only.
RECOVERY_CHECKPOINT_STEPS = 100
RECOVERY_CHECKPOINTS_KEPT = 2


class JobConfigError(ValueError):
    """The job cannot start as configured; the message names the flag and the fix."""


def create_platform(spec: JobSpec) -> Platform:
    if spec.platform == PlatformName.LOCAL:
        from elasticdl.platform.local import LocalProcessPlatform

        return LocalProcessPlatform.from_spec(spec)
    if spec.platform == PlatformName.KUBERNETES:
        from elasticdl.platform.kubernetes import KubernetesPlatform  # kubernetes client: lazy

        return KubernetesPlatform.from_spec(spec)
    raise JobConfigError(f"--platform {spec.platform!r} is not supported; use local or kubernetes")


class Job:
    def __init__(self, spec: JobSpec, platform: Platform | None = None) -> None:
        """``spec`` is resolved (``JobSpec.resolve``): platform, job type and PS count set."""
        if spec.platform is None or spec.job_type is None:
            raise JobConfigError("the job spec is not resolved; call JobSpec.resolve() first")
        self.job_spec = spec
        self.name = spec.job_name
        self.job_dir = Path(spec.job_dir) if spec.job_dir else None
        self.started_at = time.time()
        self.phase = JobPhase.PENDING
        self.message = ""
        self._cancel = threading.Event()
        self._requests_stop = threading.Event()  # ends the PS count request thread, if any
        self._platform = platform
        self._server = None
        self.worker_exit_grace_s = 60.0
        self.poll_interval_s = 1.0
        self.journal: JobJournal | None = None
        self.previous: PreviousLife | None = None
        self._prepare()

    # ---- setup ---------------------------------------------------------------------------
    @property
    def allreduce(self) -> bool:
        return self.job_spec.allreduce

    @property
    def job_type(self) -> JobType:
        return self.job_spec.job_type

    @property
    def trains(self) -> bool:
        return self.job_type.trains

    @property
    def evaluates(self) -> bool:
        return self.job_type.evaluates and bool(self.job_spec.validation_data)

    def _prepare(self) -> None:
        from elasticdl.common.model_utils import get_optimizer_info, load_model_of

        a = self.job_spec
        if self.job_dir is not None:
            (self.job_dir / LOG_DIR).mkdir(parents=True, exist_ok=True)
        self.tls = tls.TLS.of(a)  # read before anything starts: a bad file is a one-line error
        self.model_spec = load_model_of(
            a, require_feed=False, require_eval_metrics_fn=self.evaluates
        )
        records_per_task = a.records_per_task
        self.records_per_task = records_per_task
        training = self._shards(a.training_data) if self.trains else []
        validation = self._shards(a.validation_data) if self.evaluates else []
        prediction = self._shards(a.prediction_data) if self.job_type.predicts else []
        if self.trains and not training:
            raise JobConfigError(f"--training_data {a.training_data!r} holds no records")
        self.tm = TaskManager(
            TaskManagerConfig(
                records_per_task=records_per_task,
                num_epochs=a.num_epochs if self.trains else 1,
                minibatch_size=a.minibatch_size,
                max_step=a.max_step if self.trains else 0,
                saved_model_path=a.output if self.trains else "",
                timeout_floor_s=float(a.task_timeout),
                straggler_factor=a.straggler_factor,
            ),
            training_shards=training,
            evaluation_shards=validation,
            prediction_shards=prediction,
        )
        self.es = (
            EvaluationService(
                self.tm,
                self.model_spec.eval_metrics_fn,
                evaluation_steps=a.evaluation_steps,
                start_delay_secs=a.evaluation_start_delay_secs,
                throttle_secs=a.evaluation_throttle_secs if self.trains else 0,
            )
            if self.evaluates
            else None
        )
        opt_type, opt_args = "SGD", "learning_rate=0.1;"
        if self.trains:
            opt_type, opt_args = get_optimizer_info(self.model_spec.optimizer())
        self.opt_type, self.opt_args = opt_type, opt_args

        self.platform = self._platform or create_platform(a)
        if self.job_dir is not None and self.platform.replicas_outlive_master:
            self.journal = JobJournal(self.job_dir, a.to_json(only_changed=False))
            try:
                self.previous = self.journal.previous()
            except JournalError as e:
                raise JobConfigError(str(e)) from e
        self.secret = self._create_secret()
        if self.previous is not None:
            self._resume_tasks()
        self.rendezvous = self._start_rendezvous() if self.allreduce else None
        self.loss_history = status_writer.LossHistory()
        self.throughput = Throughput()  # the status's records/s and ETA
        self.ps_loads = PSLoads()
        # Only a job that sizes itself reads the replicas' CPU: others keep no readings.
        self.cpu_reports = CPUReports() if self.job_spec.auto_workers else None
        self.ps_rescaler: PSRescaler | None = None  # elasticdl scale-ps (_rescaler_slot)
        self.servicer = MasterServicer(
            self.tm,
            self.es,
            job_status=lambda: status_writer.to_pb(self.snapshot()),
            rendezvous=self.rendezvous,
            loss_history=self.loss_history,
            ps_loads=self.ps_loads,
            ps_rescaler=self._rescaler_slot(),
            cpu_reports=self.cpu_reports,
        )
        self._server, self.port = self._start_server()
        if self.journal is not None and self.previous is None:
            self._record_this_life(self.port)  # nobody knows the port yet: nothing was missed
        master_addr = self.platform.master_address(self.port)
        if self.rendezvous is not None:
            self.rendezvous.config.store_host = master_addr.rpartition(":")[0]
            # Workers that end leave the communication group at once (before any relaunch).
            self.platform.add_event_listener(self.rendezvous.on_replica_event)
        replicas = LaunchSpecs(
            a,
            self.platform,
            ReplicaContext(
                master_addr=master_addr,
                opt_type=opt_type,
                opt_args=opt_args,
                checkpointing=self._checkpointing,
                env=replica_env(a),
                secret=self.secret,
            ),
        )
        self.launch_specs = replicas
        self.rm = ReplicaManager(
            self.platform,
            ReplicaManagerConfig(
                num_ps=a.num_ps_pods,
                num_workers=a.num_workers,
                relaunch_on_worker_failure=a.relaunch_on_worker_failure,
                disable_relaunch="disable_relaunch" in a.aux_param_set(),
                relaunch_timeout_worker=a.relaunch_timeout_worker,
                worker_priority=a.worker_pod_priority,
                ps_priority=a.ps_pod_priority,
                max_workers=a.max_workers if a.auto_workers else 0,
            ),
            worker_spec=replicas.worker,
            ps_spec=replicas.ps,
            task_manager=self.tm,
        )
        if self.journal is not None:
            self._resume_replicas()
        self.autoscaler = self._autoscaler() if a.auto_workers else None
        self.tensorboard = self._tensorboard_writer()
        self.status_writer = status_writer.StatusWriter(
            self.job_dir / STATUS_FILE if self.job_dir is not None else None,
            self.snapshot,
            publish=self.platform.publish_status,
        )
        logger.info(
            "Job %s (%s): %d training / %d evaluation / %d prediction tasks per round of "
            "%d records; %d PS, %d workers; master at %s",
            self.name,
            self.job_type,
            self.tm.num_training_tasks_per_epoch,
            self.tm.num_evaluation_tasks,
            self.tm.num_prediction_tasks,
            records_per_task,
            a.num_ps_pods,
            a.num_workers,
            master_addr,
        )

    def _rescaler_slot(self) -> PSRescaler | None:
        """The servicer's PS rescaler (PS training jobs only), made before the server starts;
        it reaches the replica manager and the launch specs, made later, through methods."""
        self._checkpointing = self._ps_checkpointing()
        if self.allreduce or not self.trains or not self.job_spec.num_ps_pods:
            return None
        refuse = ""
        if not self._checkpointing.directory:
            refuse = (
                "changing the PS count re-shards through the PS checkpoint directory, and this "
                "job has none: submit it with --checkpoint_dir (and --checkpoint_steps)"
            )
        else:
            refuse = self.platform.shared_dir_problem(self._checkpointing.directory)
        calls = PSCalls(self.secret, self.tls)
        self.ps_rescaler = PSRescaler(
            self.tm,
            PSOps(calls.save_shard, calls.wait_ready, self._replace_ps_set),
            addrs_of=self._ps_addrs,
            set_generation=self._set_ps_generation,
            num_ps=self.job_spec.num_ps_pods,
            refuse_reason=refuse,
        )
        return self.ps_rescaler

    def _ps_addrs(self, num_ps: int) -> list[str]:
        return [self.platform.address(ReplicaType.PS, i) for i in range(num_ps)]

    def _set_ps_generation(self, generation: int, num_ps: int) -> None:
        self.launch_specs.set_ps_generation(generation, num_ps)

    def _replace_ps_set(self, num_ps: int, op) -> None:
        self.rm.replace_ps_set(num_ps, op)

    def _autoscaler(self) -> Autoscaler:
        """--num_workers=auto; a restarted master carries on from the journaled decisions."""
        a = self.job_spec

        def planned(workers: int) -> None:  # local workers size their threads by it
            self.launch_specs.worker_count = workers

        scaler = Autoscaler(
            AutoscalerConfig(
                a.min_workers,
                a.max_workers,
                a.autoscale_min_gain,
                pending_timeout_s=float(a.autoscale_pending_timeout),
            ),
            self.rm,
            self.tm,
            self.ps_loads,
            on_target=planned,
            cpu=self._job_cpu(),
        )
        if self.rm.scaling:
            scaler.resume(self.rm.scaling)
            planned(scaler.target)
        return scaler

    def _job_cpu(self) -> JobCPU:
        """What the job's CPU is for --num_workers=auto: what its replicas use, read from
        /proc on this host, reported by the pods elsewhere (their requests until they have)."""
        if self.platform.traits.shared_host:
            return MeasuredCPU(self._replica_processes)
        a = self.job_spec
        num_ps = lambda: self.rm.config.num_ps  # noqa: E731
        requested = RequestedCPU.of(
            a.master_resource_request,
            a.ps_resource_request,
            a.worker_resource_request,
            num_ps=num_ps,
        )
        return ReportedCPU(self.cpu_reports, num_ps, fallback=requested)

    def _replica_processes(self) -> dict[str, int]:
        processes = {}
        for r in self.rm.replicas():
            if r.phase.is_terminal:
                continue
            pid = self.platform.replica_pid(r.replica_type, r.replica_id)
            if pid is not None:
                processes[f"{r.replica_type.value}-{r.replica_id}"] = pid
        return processes

    def _tensorboard_writer(self):
        """--tensorboard_log_dir: loss and evaluation metrics as TensorBoard event files."""
        if not self.job_spec.tensorboard_log_dir:
            return None
        from elasticdl.master.tensorboard_writer import TensorBoardError, TensorBoardWriter

        try:
            writer = TensorBoardWriter(self.job_spec.tensorboard_log_dir)
        except TensorBoardError as e:
            raise JobConfigError(str(e)) from None
        self.loss_history.add_listener(writer.add_loss)
        if self.es is not None:
            self.es.add_result_listener(writer.add_evaluation)
        logger.info("TensorBoard event files in %s", writer.log_dir)
        return writer

    def _resume_tasks(self) -> None:
        """A restarted master, before its server answers anyone: replay the task manager and
        the evaluation service, and record from now on (the workers are calling already)."""
        previous = self.previous
        try:
            self.tm.replay(*previous.tasks)
            if self.es is not None:
                self.es.replay(*previous.evaluation)
        except (JournalError, KeyError, TypeError, ValueError) as e:
            raise JobConfigError(f"cannot resume from {self.journal.directory}: {e}") from e
        self._record_this_life(previous.port)
        inherited = self.tm.resume_after_restart()
        rounds = self.es.resume_after_restart() if self.es is not None else []
        s = self.tm.summary()
        logger.info(
            "Resuming job %s after %d master(s): %d/%d records trained, %d task(s) handed "
            "out before the restart, evaluation rounds restarted: %s",
            self.name,
            previous.lives,
            s.records_trained,
            s.records_expected,
            len(inherited),
            rounds or "none",
        )

    def _record_this_life(self, port: int) -> None:
        self.journal.open(port)
        self.tm.attach_journal(self.journal.tasks)
        if self.es is not None:
            self.es.attach_journal(self.journal.evaluation)

    def _resume_replicas(self) -> None:
        """The replica table: replayed for a restarted master (adopted in ``run``)."""
        if self.previous is not None:
            try:
                self.rm.restore(self.previous.replicas)
                if self.rm.ps_set is not None and self.ps_rescaler is not None:
                    self.ps_rescaler.restore(self.rm.ps_set.generation, self.rm.ps_set.num_ps)
            except (JournalError, KeyError, TypeError, ValueError) as e:
                raise JobConfigError(f"cannot resume from {self.journal.directory}: {e}") from e
        self.rm.attach_journal(self.journal.replicas)

    def _ps_checkpointing(self) -> Checkpointing:
        """Where and how often the PS checkpoint.

        With --checkpoint_steps=0 and no --checkpoint_dir, a local training job still writes
        recovery checkpoints under its job directory (every RECOVERY_CHECKPOINT_STEPS
        versions, the last RECOVERY_CHECKPOINTS_KEPT kept), so a PS that dies is relaunched
        from its last one with embedding tables and optimizer state. Elsewhere the job
        directory is not shared with the PS pods: checkpointing stays off, as the flags say.
        """
        a = self.job_spec
        asked = Checkpointing(a.checkpoint_dir, a.checkpoint_steps, a.keep_checkpoint_max)
        if a.checkpoint_steps or not self.trains or self.allreduce:
            return asked
        if (
            not a.checkpoint_dir
            and self.platform.traits.shared_job_dir
            and self.job_dir is not None
        ):
            recovery = str(self.job_dir / RECOVERY_DIR)
            logger.info(
                "PS recovery checkpoints every %d versions in %s (--checkpoint_steps=0; set "
                "--checkpoint_steps and --checkpoint_dir to keep checkpoints of your own)",
                RECOVERY_CHECKPOINT_STEPS,
                recovery,
            )
            return Checkpointing(recovery, RECOVERY_CHECKPOINT_STEPS, RECOVERY_CHECKPOINTS_KEPT)
        logger.info(
            "Checkpointing is off (--checkpoint_steps=0): a relaunched PS gets the dense model "
            "back from the workers, but embedding tables and optimizer state are lost; set "
            "--checkpoint_steps and --checkpoint_dir to make PS recovery exact"
        )
        return asked

    def _shards(self, data_origin: str) -> list:
        from elasticdl.data.reader import create_data_reader, parse_data_reader_params

        params = parse_data_reader_params(self.job_spec.data_reader_params)
        rpt = self.job_spec.records_per_task
        if self.model_spec.custom_data_reader is not None:
            reader = self.model_spec.custom_data_reader(data_origin, rpt, **params)
        else:
            reader = create_data_reader(data_origin, rpt, **params)
        return list(reader.create_shards())

    def _create_secret(self) -> str:
        """The job's secret (see elasticdl.common.auth). Locally also in ``<job
        dir>/job_secret`` (0600), for tools of the same user that query the master. A resumed
        master keeps its predecessor's: the running replicas hold it."""
        if self.previous is not None and self.job_dir is not None:
            try:
                return auth.read_secret_file(self.job_dir / SECRET_FILE)
            except OSError as e:
                raise JobConfigError(f"cannot resume: the job's secret is unreadable: {e}")
        secret = auth.new_job_secret()
        if self.job_dir is not None:
            auth.write_secret_file(self.job_dir / SECRET_FILE, secret)
        return secret

    def _start_rendezvous(self):
        """AllReduce: the rendezvous and the torch TCPStore the workers build groups through
        (hosted here so it outlives any worker; torch is imported only for these jobs)."""
        from elasticdl.master.rendezvous import (
            Rendezvous,
            RendezvousConfig,
            RendezvousStore,
            generation_base,
        )

        self._store = RendezvousStore(self.platform.traits.bind_host)
        # Not journaled: the workers that outlived a dead master keep their group and see this
        # master's generations as newer (life-major ids), so they regroup through its store.
        lives = self.previous.lives if self.previous is not None else 0
        return Rendezvous(
            RendezvousConfig(store_port=self._store.port, first_generation=generation_base(lives))
        )

    def _server_args(self) -> dict:
        """How the master's server admits calls: the job secret and the largest request."""
        cap = message_caps.master_cap(self.records_per_task, self.evaluates)
        return dict(secret=self.secret, max_message_bytes=cap, tls_config=self.tls)

    def _start_server(self):
        traits = self.platform.traits
        port = self.job_spec.port
        if self.previous is not None:
            # The replicas know this address: it must be the same (the stable-address
            # contract, for the master too). The dead master's socket is gone with it.
            deadline = time.monotonic() + 10
            while True:
                try:
                    return create_master_server(
                        self.servicer, self.previous.port, traits.bind_host, **self._server_args()
                    )
                except MasterServerError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
        if self.journal is not None and port == DEFAULT_MASTER_PORT:
            # The replicas find a restarted master at its predecessor's port: the default one,
            # which every other local job tries first, could be taken meanwhile. A port the
            # kernel picks is not handed out again soon.
            port = 0
        try:
            return create_master_server(
                self.servicer, port, traits.bind_host, **self._server_args()
            )
        except MasterServerError:
            if not traits.port_may_be_taken:
                raise
            logger.info("Port %d is busy; the master uses a free port instead", port)
            return create_master_server(self.servicer, 0, traits.bind_host, **self._server_args())

    # ---- running -------------------------------------------------------------------------
    def cancel(self) -> None:
        self._cancel.set()
        # Replicas may end on their own now (the job's owner is gone): not relaunched.
        if getattr(self, "rm", None) is not None:
            self.rm.begin_stop()

    def run(self) -> int:
        """Run the job to its end; returns the master's exit code (0 success, 1 otherwise)."""
        self.status_writer.write()
        self.status_writer.start()
        if self.es is not None:
            self.es.start()
        try:
            if self.previous is not None:
                if self.job_type == JobType.EVALUATION_ONLY and self.es is not None:
                    if not self.es.busy and not self.es.history:  # died before starting it
                        self.es.start_evaluation(FINAL_VERSION)
                self.rm.adopt()
            else:
                if self.job_type == JobType.EVALUATION_ONLY and self.es is not None:
                    self.es.start_evaluation(FINAL_VERSION)
                self.rm.start()
            self.phase = JobPhase.RUNNING
            self._start_ps_count_requests()
            if self.autoscaler is not None:
                self.autoscaler.start()
            # Checked often enough that a task is taken back soon after its timeout.
            self.tm.start_timeout_monitor(
                self.rm.on_worker_timeout,
                interval_s=min(30.0, max(1.0, self.job_spec.task_timeout / 4)),
            )
            self._wait_for_end()
        except Exception as e:  # never leave replicas behind
            logger.exception("Master error")
            self.phase, self.message = JobPhase.FAILED, f"master error: {type(e).__name__}: {e}"
        finally:
            self._requests_stop.set()
            if self.autoscaler is not None:
                self.autoscaler.stop()
            self.tm.stop()
            self.rm.stop(delete_all=True)
            if self._server is not None:
                self._server.stop(grace=1)
            if getattr(self, "_store", None) is not None:
                self._store.close()
            if self.es is not None:
                self.es.stop()
            if self.tensorboard is not None:
                self.tensorboard.close()
            self.status_writer.stop()
            self.status_writer.write()
            if self.journal is not None:
                self.journal.close()
            try:
                self.platform.mark_job_status(self.phase)
            except Exception as e:  # best effort: the outcome is also in the log and exit code
                logger.warning("Cannot record the final phase on the platform: %s", e)
        self._log_summary()
        return 0 if self.phase == JobPhase.SUCCEEDED else 1

    def _start_ps_count_requests(self) -> None:
        """Where the client cannot call the master (Kubernetes), ``elasticdl scale-ps`` writes
        its request on the master's pod: a thread reads it (master.ps_count_requests)."""
        if not self.platform.traits.requests_on_master:
            return
        requests = PSCountRequests(
            self.ps_rescaler, self.platform.master_annotations, self.platform.annotate_master
        )
        threading.Thread(
            target=requests.run, args=(self._requests_stop,), name="ps-count-requests", daemon=True
        ).start()

    def _wait_for_end(self) -> None:
        while True:
            if self._cancel.is_set():
                self.phase, self.message = (
                    JobPhase.CANCELLED,
                    "cancelled (the master was asked to stop)",
                )
                return
            failed = self.tm.failed_message or self.rm.failed_message
            if failed:
                self.phase, self.message = JobPhase.FAILED, failed
                return
            if self.previous is not None:
                self.tm.requeue_unclaimed()
            if self.es is not None:
                self.es.evaluate_if_time(self.servicer.model_version)
            if self.tm.finished and not (self.es is not None and self.es.busy):
                # Workers ask for a task, get "no more tasks" and exit on their own; one still
                # running a task whose backup was reported first is not waited for.
                abandoned = self.tm.abandoned_workers()
                if not self.rm.wait_workers_exited(self.worker_exit_grace_s, ignore=abandoned):
                    logger.warning(
                        "Workers %s did not exit in time; stopping them", self.rm.alive_workers()
                    )
                self.phase, self.message = self._final_verdict()
                return
            self.rm.wait_for_change(self.poll_interval_s)

    def _final_verdict(self) -> tuple[str, str]:
        s = self.tm.summary()
        if self.trains and s.records_trained != s.records_expected:
            return JobPhase.FAILED, (
                f"accounting mismatch: trained {s.records_trained} records, expected {s.records_expected}"
            )
        return JobPhase.SUCCEEDED, ""

    # ---- reporting -----------------------------------------------------------------------
    def snapshot(self) -> JobStatus:
        s = self.tm.summary()
        latest = self.es.latest if self.es is not None else None
        replicas = [
            ReplicaStatus(
                name=f"{r.replica_type}-{r.replica_id}",
                type=str(r.replica_type),
                id=r.replica_id,
                phase=str(r.phase),
                exit_code=r.exit_code,
                restarts=r.relaunch_count,
                pid=self.platform.replica_pid(r.replica_type, r.replica_id),
                message=r.reason,
                replaced_by=r.replaced_by,
                tasks_done=r.tasks_done,
                log=r.log,
                ended_by=r.ended_by,
                waiting_reason=r.waiting_reason,
                waiting_message=r.waiting_message,
            )
            for r in self.rm.replicas()
        ]
        self.throughput.observe(s.records_trained)
        records_left = (
            JobStatus(
                records_expected=s.records_expected,
                records_trained=s.records_trained,
                epoch=s.epoch,
                num_epochs=self.job_spec.num_epochs if self.trains else 0,
            ).records_total
            - s.records_trained
        )
        return JobStatus(
            job_name=self.name,
            platform=str(self.job_spec.platform),
            job_type=str(self.job_type),
            phase=self.phase,
            message=self.message or s.failed_message or self.rm.failed_message,
            model_version=self.servicer.model_version,
            tasks_todo=s.tasks_todo,
            tasks_doing=s.tasks_doing,
            tasks_done=s.tasks_done,
            tasks_retried=s.tasks_retried,
            tasks_recovered=s.tasks_recovered,
            tasks_failed=s.tasks_failed,
            stale_reports=s.stale_reports,
            records_trained=s.records_trained,
            records_expected=s.records_expected,
            records_trained_per_epoch={str(k): v for k, v in s.records_trained_per_epoch.items()},
            records_predicted=s.records_predicted,
            epoch=s.epoch,
            num_epochs=self.job_spec.num_epochs if self.trains else 0,
            evaluation_metrics=dict(latest.metrics) if latest else {},
            evaluation_history=[
                {"model_version": r.model_version, "metrics": r.metrics}
                for r in (self.es.history if self.es else [])
            ],
            loss_history=self.loss_history.samples(),
            replicas=replicas,
            rendezvous=(
                {"generation": self.rendezvous.generation, "members": self.rendezvous.members()}
                if self.rendezvous is not None
                else None
            ),
            stragglers=self.tm.straggler_status() if self.job_spec.straggler_factor else {},
            autoscaling=self.autoscaler.status() if self.autoscaler is not None else {},
            ps_scaling=self.ps_rescaler.status() if self.ps_rescaler is not None else {},
            master={
                "pid": os.getpid(),
                "port": self.port,
                "restarts": self.previous.lives if self.previous is not None else 0,
            },
            created_at=self.started_at,
            job_dir=str(self.job_dir) if self.job_dir else "",
            records_per_second=self.throughput.records_per_second() if self.trains else None,
            eta_seconds=self.throughput.eta_seconds(records_left) if self.trains else None,
        )

    def _log_summary(self) -> None:
        s = self.tm.summary()
        elapsed = time.time() - self.started_at
        verb = {JobPhase.SUCCEEDED: "succeeded", JobPhase.FAILED: "failed"}.get(
            self.phase, self.phase.lower()
        )
        parts = []
        if self.trains:
            per_epoch = ", ".join(
                f"epoch {e}: {n}" for e, n in sorted(s.records_trained_per_epoch.items())
            )
            parts.append(
                f"trained {s.records_trained}/{s.records_expected} records in {s.tasks_done} tasks "
                f"({s.tasks_retried} retried, {s.tasks_recovered} recovered from lost workers)"
                + (f" [{per_epoch}]" if per_epoch else "")
            )
            parts.append(f"model version {self.servicer.model_version}")
        elif self.job_type.predicts:
            parts.append(f"predicted {s.records_predicted} records in {s.tasks_done} tasks")
        else:
            parts.append(f"{s.tasks_done} evaluation tasks")
        if self.es is not None and self.es.latest is not None:
            parts.append(
                f"evaluation metrics[v={self.es.latest.model_version}]: {self.es.latest.metrics}"
            )
        relaunched = sum(1 for r in self.rm.replicas() if r.replaced_by is not None)
        if relaunched:
            parts.append(f"{relaunched} worker(s) relaunched")
        parts.append(f"{elapsed:.1f} s")
        line = f"Job {self.name} {verb}: " + ", ".join(parts)
        if self.message:
            line += f". {self.message}"
        (logger.info if self.phase == JobPhase.SUCCEEDED else logger.error)(line)
