"""The job spec: flags generated from its fields, values checked once, lossless JSON."""

import argparse
import dataclasses
import os

import pytest
from elasticdl.common import job_spec
from elasticdl.common.cli_parser import StrictArgumentParser
from elasticdl.common.job_spec import JobSpec, SpecError, spec_from_text, spec_from_values
from elasticdl.common.types import JobType, PlatformName, Strategy


def _parser(command="train"):
    parser = StrictArgumentParser(prog=f"elasticdl {command}")
    job_spec.add_job_flags(parser, command)
    return parser


def _spec(argv, command="train", check_local_paths=False):
    """What `elasticdl <command> <argv>` submits (without the config file)."""
    given = job_spec.given_values(_parser(command).parse_args(argv))
    spec, _ = spec_from_text(command, given).resolve(check_local_paths=check_local_paths)
    return spec


MINIMAL = [
    "--job_name=test-mnist",
    "--model_def=mnist.mnist_functional_api.custom_model",
    "--training_data=/data/x",
]


def test_original_defaults():
    spec = JobSpec(job_name="j")
    assert spec.minibatch_size == 64
    assert spec.num_workers == 2
    assert spec.num_ps_pods == 0
    assert spec.num_minibatches_per_task == 8
    assert spec.master_resource_request == "cpu=0.1,memory=1024Mi"
    assert spec.worker_resource_request == "cpu=1,memory=4096Mi"
    assert spec.ps_resource_request == "cpu=1,memory=4096Mi"
    assert spec.image_pull_policy == "Always"
    assert spec.restart_policy == "Never"
    assert spec.namespace == "default"
    assert spec.distribution_strategy == "ParameterServerStrategy"
    assert spec.feed == "feed" and spec.loss == "loss" and spec.optimizer == "optimizer"
    assert spec.eval_metrics_fn == "eval_metrics_fn" and spec.callbacks == "callbacks"
    assert spec.num_epochs == 1 and spec.grads_to_wait == 1 and spec.log_loss_steps == 100
    assert spec.use_async is False
    assert spec.relaunch_on_worker_failure == 1
    assert spec.platform is None and spec.job_dir == "" and spec.port == 50001


def test_every_flag_is_a_field_and_every_field_of_a_command_is_a_flag():
    for command in job_spec.JOB_COMMANDS:
        parser = _parser(command)
        flags = {
            a.dest for a in parser._actions if a.help != argparse.SUPPRESS and a.dest != "help"
        }
        assert flags == set(job_spec.spec_fields(command)), command
    assert "num_epochs" not in job_spec.spec_fields("evaluate")
    assert "prediction_data" in job_spec.spec_fields("predict")
    # Set by the client and the master, never typed.
    assert "job_type" not in job_spec.spec_fields("train")


def test_flags_not_given_keep_the_spec_defaults():
    namespace = _parser().parse_args(["--job_name=j", "--minibatch_size=32"])
    assert job_spec.given_values(namespace) == {"job_name": "j", "minibatch_size": "32"}


@pytest.mark.parametrize(
    "argv, expected",
    [
        ([], False),
        (["--use_async"], True),
        (["--use_async=true"], True),
        (["--use_async=YES"], True),
        (["--use_async=t"], True),
        (["--use_async=y"], True),
        (["--use_async=1"], True),
        (["--use_async=false"], False),
        (["--use_async=No"], False),
        (["--use_async=0"], False),
    ],
)
def test_bool_flag_semantics(argv, expected):
    assert _spec(MINIMAL + argv).use_async is expected


def test_retired_flags_accept_what_every_job_does():
    # Tutorials of the original pass these; they describe what every job here does.
    spec = _spec(
        MINIMAL
        + [
            "--need_elasticdl_job_service=true",
            "--need_task_manager",
            "--need_pod_manager=yes",
            "--task_fault_tolerance=true",
            "--need_tf_config=false",
        ]
    )
    assert spec == _spec(MINIMAL)


def test_unknown_flag_is_rejected_with_a_hint():
    with pytest.raises(SpecError, match=r"--num_worker -> did you mean --num_workers\?"):
        _parser().parse_args(["--job_name=j", "--num_worker=3"])


def test_abbreviated_flag_is_rejected():
    with pytest.raises(SpecError, match="unrecognized arguments: --num_work=3"):
        _parser().parse_args(["--job_name=j", "--num_work=3"])


def test_json_round_trip_is_lossless():
    spec = _spec(
        MINIMAL + ["--use_async", "--envs=A=1,B=x,y", "--output=-weird", "--minibatch_size=16"]
    )
    for only_changed in (True, False):
        assert JobSpec.from_json(spec.to_json(only_changed=only_changed)) == spec
    assert spec.to_dict()["distribution_strategy"] == "ParameterServerStrategy"
    with pytest.raises(SpecError, match="unknown field"):
        JobSpec.from_dict({"job_name": "j", "minibach_size": 1})
    with pytest.raises(SpecError, match="minibatch_size must be an integer"):
        JobSpec.from_dict({"job_name": "j", "minibatch_size": "16"})


def test_resolving_twice_changes_nothing():
    spec = _spec(MINIMAL + ["--validation_data=/v"])
    again, notices = spec.resolve(check_local_paths=False)
    assert again == spec and notices == []


def test_cli_and_typed_values_build_the_same_spec():
    typed = spec_from_values(
        "train",
        {
            "job_name": "test-mnist",
            "model_def": "mnist.mnist_functional_api.custom_model",
            "training_data": "/data/x",
            "minibatch_size": 32,
            "use_async": True,
            "distribution_strategy": "AllreduceStrategy",
        },
    ).resolve(check_local_paths=False)[0]
    flags = _spec(
        MINIMAL
        + ["--minibatch_size=32", "--use_async", "--distribution_strategy=AllreduceStrategy"]
    )
    assert typed == flags and typed.distribution_strategy is Strategy.ALLREDUCE


def test_derived_defaults():
    spec = _spec(MINIMAL)
    assert spec.job_type == JobType.TRAINING_ONLY
    assert spec.platform == PlatformName.LOCAL
    assert spec.job_dir.endswith(os.path.join("jobs", "test-mnist"))
    assert _spec(MINIMAL + ["--validation_data=/v"]).job_type == JobType.TRAINING_WITH_EVALUATION


def test_ps_strategy_without_ps_gets_one_ps_and_says_so():
    spec, notices = spec_from_text(
        "train", job_spec.given_values(_parser().parse_args(MINIMAL))
    ).resolve(check_local_paths=False)
    assert spec.num_ps_pods == 1
    assert any("num_ps_pods: 1" in n for n in notices)
    assert any("platform: local" in n for n in notices)
    assert _spec(MINIMAL + ["--num_ps_pods=3"]).num_ps_pods == 3
    allreduce = _spec(MINIMAL + ["--distribution_strategy=AllreduceStrategy"])
    assert allreduce.num_ps_pods == 0


def test_platform_defaults_to_kubernetes_with_an_image():
    spec = _spec(MINIMAL + ["--image_name=reg/x:1"])
    assert spec.platform == PlatformName.KUBERNETES
    assert spec.job_dir == ""
    assert spec.training_data == "/data/x"  # not made absolute: a path in the pods


def test_local_paths_are_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    spec = _spec(["--job_name=j", "--model_def=a.b.c", "--training_data=data", "--model_zoo=zoo"])
    assert spec.training_data == str(tmp_path / "data")
    assert spec.model_zoo == str(tmp_path / "zoo")


def test_elasticdl_home_env(monkeypatch, tmp_path):
    monkeypatch.setenv("ELASTICDL_HOME", str(tmp_path))
    assert job_spec.default_job_dir("j") == str(tmp_path / "jobs" / "j")


def test_a_spec_is_frozen_and_typed():
    spec = JobSpec(job_name="j")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.minibatch_size = 3  # type: ignore[misc]
    with pytest.raises(SpecError, match="minibatch_size must be an integer, got bool"):
        JobSpec(job_name="j", minibatch_size=True)
    assert JobSpec(job_name="j", log_level="debug").log_level == "DEBUG"


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--job_name=Bad_Name"], "--job_name 'Bad_Name' is invalid"),
        (["--job_name=" + "a" * 41], "use at most 40"),
        (["--job_name=-a"], "--job_name '-a' is invalid"),
        (["--model_def=custom_model"], "--model_def 'custom_model' is not a dotted path"),
        (["--model_def=a.1b.c"], "is not a dotted path"),
        (["--minibatch_size=0"], "--minibatch_size must be > 0"),
        (["--num_workers=0"], "--num_workers must be > 0"),
        (["--task_timeout=0"], "--task_timeout must be > 0"),
        (
            ["--worker_resource_request=cpu=1,gpu=0.5"],
            "--worker_resource_request: nvidia.com/gpu=0.5",
        ),
        (["--ps_resource_limit=cpu=1,foo=2"], "--ps_resource_limit: unknown resource 'foo'"),
        (["--volume=claim_name=c,mount_path=/p,bad=1"], "--volume: unknown key 'bad'"),
        (["--worker_pod_priority=medium"], "--worker_pod_priority 'medium' is invalid"),
        (["--docker_image_prefix=reg.io/t/"], "--docker_image_prefix needs --image_base"),
        (["--evaluation_steps=10"], "--evaluation_steps needs --validation_data"),
        (["--envs=novalue"], "--envs: 'novalue' has no '='"),
        (["--platform=kubernetes"], "--image_name is required on Kubernetes"),
        (
            ["--worker_resource_request=cpu=2,memory=1Gi", "--worker_resource_limit=cpu=1"],
            "--worker_resource_limit: cpu limit 1 is below the request 2",
        ),
        (["--use_async=ture"], "--use_async: expected true or false, got 'ture'"),
        (["--minibatch_size=ten"], "--minibatch_size: expected an integer, got 'ten'"),
        (["--image_pull_policy=Sometimes"], "--image_pull_policy 'Sometimes' is invalid"),
        (
            ["--distribution_strategy=Local"],
            "expected one of ParameterServerStrategy, AllreduceStrategy",
        ),
        (["--aux_params=disable_relaunch,fast"], "--aux_params: unknown fast"),
        (["--populate_env_names=A[,B"], "--populate_env_names: 'A[' is not a valid regex"),
        (
            ["--distribution_strategy=AllreduceStrategy", "--num_ps_pods=2"],
            "--num_ps_pods=2 with AllreduceStrategy",
        ),
        (["--need_tf_config"], "--need_tf_config=true was removed: TF_CONFIG"),
        (["--task_fault_tolerance=false"], "--task_fault_tolerance=false was removed"),
        (["--need_elasticdl_job_service=no"], "--need_elasticdl_job_service=false was removed"),
        (["--job_command=python x.py"], "--job_command=python x.py was removed"),
        (["--model_params=units"], "--model_params: 'units' is not key=value"),
        (["--data_reader_params=columns"], "--data_reader_params: 'columns' is not key=value"),
        (["--image_name=Bad Image"], "--image_name 'Bad Image' is not an image name"),
        (["--worker_image=reg.io/x:1\nRUN"], "--worker_image 'reg.io/x:1\\nRUN' is not an image"),
        (["--namespace=Bad_NS"], "--namespace 'Bad_NS' is not a Kubernetes namespace name"),
        (["--envs=A=x\ny"], "--envs: the value of A contains control characters"),
        (["--num_workers=many"], "--num_workers: expected a number of workers or auto, got 'many'"),
        (["--min_workers=2"], "--min_workers only size a job with --num_workers=auto"),
        (
            ["--num_workers=auto", "--min_workers=4", "--max_workers=2"],
            "--min_workers=4 is more than --max_workers=2",
        ),
        (["--num_workers=auto", "--max_workers=0"], "--max_workers must be > 0"),
        (
            ["--num_workers=auto", "--autoscale_min_gain=1"],
            "--autoscale_min_gain must be in [0, 1)",
        ),
        (
            ["--num_workers=auto", "--autoscale_min_gain=-0.1"],
            "--autoscale_min_gain must be in [0, 1), e.g. 0.1 for 10%, got -0.1",
        ),
        (
            ["--num_workers=auto", "--autoscale_min_gain=half"],
            "--autoscale_min_gain: expected a number, got 'half'",
        ),
        (
            ["--autoscale_min_gain=0.2"],
            "--autoscale_min_gain only size a job with --num_workers=auto",
        ),
        (
            ["--num_workers=auto", "--autoscale_pending_timeout=0"],
            "--autoscale_pending_timeout must be > 0, got 0",
        ),
        (
            ["--autoscale_pending_timeout=30"],
            "--autoscale_pending_timeout only size a job with --num_workers=auto",
        ),
        (
            ["--num_workers=auto", "--autoscale_pending_timeout=soon"],
            "--autoscale_pending_timeout",
        ),
        (
            ["--num_workers=auto", "--distribution_strategy=AllreduceStrategy"],
            "--num_workers=auto sizes ParameterServerStrategy jobs",
        ),
        (["--straggler_factor=0.5"], "--straggler_factor must be 0 (off) or at least 1"),
    ],
)
def test_validation_messages(extra, message):
    with pytest.raises(SpecError) as info:
        _spec(MINIMAL + extra)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_training_data_required():
    with pytest.raises(SpecError, match="--training_data is required"):
        _spec(["--job_name=j", "--model_def=a.b.c"])


def test_evaluate_needs_validation_data_and_checkpoint():
    base = ["--job_name=j", "--model_def=a.b.c"]
    with pytest.raises(SpecError, match="--validation_data is required to evaluate"):
        _spec(base, "evaluate")
    with pytest.raises(SpecError, match="--checkpoint_dir_for_init is required to evaluate"):
        _spec(base + ["--validation_data=/v"], "evaluate")
    spec = _spec(base + ["--validation_data=/v", "--checkpoint_dir_for_init=/c"], "evaluate")
    assert spec.job_type == JobType.EVALUATION_ONLY


def test_predict_needs_prediction_data_and_checkpoint():
    base = ["--job_name=j", "--model_def=a.b.c"]
    with pytest.raises(SpecError, match="--prediction_data is required"):
        _spec(base, "predict")
    with pytest.raises(SpecError, match="--checkpoint_dir_for_init is required to predict"):
        _spec(base + ["--prediction_data=/p"], "predict")
    spec = _spec(base + ["--prediction_data=/p", "--checkpoint_dir_for_init=/c"], "predict")
    assert spec.job_type == JobType.PREDICTION_ONLY
    assert spec.prediction_outputs_processor == "PredictionOutputsProcessor"


def test_local_paths_are_checked(tmp_path):
    zoo = tmp_path / "zoo"
    (zoo / "mnist").mkdir(parents=True)
    (zoo / "mnist" / "model.py").write_text("")
    data = tmp_path / "train"
    data.mkdir()
    base = [
        "--job_name=j",
        f"--model_zoo={zoo}",
        "--model_def=mnist.model.custom_model",
        f"--training_data={data}",
    ]
    _spec(base, check_local_paths=True)
    with pytest.raises(SpecError, match="no file mnist/other.py under --model_zoo"):
        _spec(base + ["--model_def=mnist.other.custom_model"], check_local_paths=True)
    with pytest.raises(SpecError, match="is not a directory"):
        _spec(base + [f"--model_zoo={tmp_path / 'nope'}"], check_local_paths=True)
    with pytest.raises(SpecError, match="--training_data .* does not exist"):
        _spec(base + [f"--training_data={tmp_path / 'missing'}"], check_local_paths=True)
    with pytest.raises(SpecError, match="--output '.*model.py' is a file; give a directory"):
        _spec(base + [f"--output={zoo / 'mnist' / 'model.py'}"], check_local_paths=True)
    _spec(base + [f"--output={tmp_path / 'new' / 'export'}"], check_local_paths=True)
    with pytest.raises(SpecError, match="--log_file_path .*: directory .* does not exist"):
        _spec(base + [f"--log_file_path={tmp_path / 'no' / 'm.log'}"], check_local_paths=True)
    _spec(base + [f"--log_file_path={tmp_path / 'm.log'}"], check_local_paths=True)
    with pytest.raises(SpecError, match="--cluster_spec '.*nospec.py' is not a file"):
        _spec(base + [f"--cluster_spec={tmp_path / 'nospec.py'}"], check_local_paths=True)
    # Table names and URLs are not local paths and are not checked.
    _spec(base + ["--training_data=project.table"], check_local_paths=True)


@pytest.mark.parametrize(
    "image",
    ["img", "reg.io/team/model:v1", "localhost:5000/a/b_c.d-e:1.0", "a/b@sha256:" + "0" * 64],
)
def test_image_names_that_docker_accepts(image):
    _spec(MINIMAL + [f"--image_name={image}"])


def test_parse_envs_keeps_commas_in_values():
    assert job_spec.parse_envs("A=1,B=x,y,C=") == {"A": "1", "B": "x,y", "C": ""}
    assert job_spec.parse_envs("") == {}


def test_original_model_flags_reach_the_worker_by_name():
    # v0.2's --dataset_fn and --model_params: JobSpec fields, copied into the worker spec.
    from elasticdl.common import replica_spec

    spec = _spec(MINIMAL + ["--dataset_fn=input_fn", "--model_params=units=16; name='w'"])
    assert (spec.dataset_fn, spec.model_params) == ("input_fn", "units=16; name='w'")
    worker = replica_spec.derive(
        replica_spec.WorkerSpec, spec, worker_id=0, master_addr="m:1", ps_addrs=("p:2",)
    )
    back = replica_spec.worker_spec_from_argv(replica_spec.to_argv(worker))
    assert (back.dataset_fn, back.model_params) == ("input_fn", "units=16; name='w'")


def test_v02_evaluation_timing_and_tensorboard_flags(tmp_path):
    spec = _spec(MINIMAL)
    assert (spec.evaluation_start_delay_secs, spec.evaluation_throttle_secs) == (100, 0)
    assert spec.tensorboard_log_dir == ""
    spec = _spec(
        MINIMAL
        + [
            "--validation_data=/data/v",
            "--evaluation_start_delay_secs=5",
            "--evaluation_throttle_secs=30",
            f"--tensorboard_log_dir={tmp_path}/tb/run1",  # created by the master
        ],
        check_local_paths=False,
    )
    assert (spec.evaluation_start_delay_secs, spec.evaluation_throttle_secs) == (5, 30)
    assert spec.tensorboard_log_dir == f"{tmp_path}/tb/run1"

    def error(argv, check_local_paths=True):
        with pytest.raises(SpecError) as info:
            _spec(MINIMAL + argv, check_local_paths=check_local_paths)
        assert "\n" not in str(info.value)
        return str(info.value)

    assert "--evaluation_throttle_secs needs --validation_data" in error(
        ["--evaluation_throttle_secs=10"], check_local_paths=False
    )
    assert "--evaluation_start_delay_secs must be >= 0" in error(
        ["--evaluation_start_delay_secs=-1"], check_local_paths=False
    )
    # Local paths: not a file, and somewhere this user can create the directory.
    zoo = tmp_path / "zoo" / "mnist"
    zoo.mkdir(parents=True)
    (zoo / "mnist_functional_api.py").write_text("")
    (tmp_path / "data").mkdir()
    local = [f"--model_zoo={tmp_path / 'zoo'}", f"--training_data={tmp_path / 'data'}"]
    (tmp_path / "afile").write_text("x")
    assert "--tensorboard_log_dir" in error(local + [f"--tensorboard_log_dir={tmp_path}/afile"])
    assert "is a file" in error(local + [f"--tensorboard_log_dir={tmp_path}/afile"])
    assert "not a writable directory" in error(
        local + [f"--tensorboard_log_dir={tmp_path}/afile/tb"]
    )
    _spec(MINIMAL + local + [f"--tensorboard_log_dir={tmp_path}/new/tb"], check_local_paths=True)
    assert not (tmp_path / "new").exists()  # the client creates nothing
    # Kubernetes: only a directory under one of the master pod's volume mounts survives it.
    k8s = ["--image_name=reg/x:1", "--volume=claim_name=c,mount_path=/data"]
    _spec(MINIMAL + k8s + ["--tensorboard_log_dir=/data/tb"])
    message = error(k8s + ["--tensorboard_log_dir=/tmp/tb"], check_local_paths=False)
    assert "--tensorboard_log_dir '/tmp/tb' is not under a --volume mount_path (/data)" in message
    assert "not under a --volume" in error(
        ["--image_name=reg/x:1", "--tensorboard_log_dir=/data-other/tb"], check_local_paths=False
    )


def test_num_workers_auto_starts_with_the_minimum_and_round_trips():
    spec = _spec(MINIMAL + ["--num_workers=auto", "--min_workers=2", "--max_workers=6"])
    assert spec.auto_workers and spec.num_workers == 2 and spec.max_workers == 6
    assert JobSpec.from_json(spec.to_json()) == spec
    typed = spec_from_values(
        "train",
        dict(job_name="j", model_def="a.b", training_data="/d", num_workers="auto"),
    )
    assert typed.auto_workers and typed.num_workers == typed.min_workers == 1
    assert JobSpec.from_dict({"job_name": "j", "num_workers": "auto"}).auto_workers
    fixed = _spec(MINIMAL)
    assert not fixed.auto_workers and fixed.num_workers == 2
    assert spec.autoscale_pending_timeout == fixed.autoscale_pending_timeout == 120
    patient = _spec(MINIMAL + ["--num_workers=auto", "--autoscale_pending_timeout=25"])
    assert patient.autoscale_pending_timeout == 25
    assert JobSpec.from_json(patient.to_json(only_changed=True)) == patient
    assert fixed.straggler_factor == 3.0


def test_autoscale_min_gain_defaults_to_the_cpu_rule_and_overrides_it_everywhere():
    from elasticdl.common.job_spec.master_argv import master_argv, spec_from_master_argv

    auto = MINIMAL + ["--num_workers=auto"]
    default = _spec(auto)
    assert default.autoscale_min_gain is None  # the CPU-aware rule (master.autoscaler)
    assert "autoscale_min_gain" not in default.to_json(only_changed=True)
    assert spec_from_master_argv(master_argv(default)).autoscale_min_gain is None
    flag = _spec(auto + ["--autoscale_min_gain=0.05"])
    assert flag.autoscale_min_gain == 0.05
    assert spec_from_master_argv(master_argv(flag)) == flag
    assert JobSpec.from_json(flag.to_json()) == flag
    sdk = spec_from_values(
        "train",
        dict(
            job_name="j",
            model_def="a.b",
            training_data="/d",
            num_workers="auto",
            autoscale_min_gain=0.05,
        ),
    )
    assert sdk.autoscale_min_gain == 0.05
    with pytest.raises(SpecError, match="autoscale_min_gain"):
        spec_from_values("train", dict(job_name="j", autoscale_min_gain="0.05"))
    help_text = _parser().format_help()
    assert "--autoscale_min_gain" in help_text and "records per CPU second" in help_text
