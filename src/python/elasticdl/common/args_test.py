"""Tests of the shared job flags: defaults, bool semantics, round trip, validation."""

import argparse
import os

import pytest
from elasticdl.common import args as A


def _train_parser():
    parser = A.StrictArgumentParser(prog="elasticdl train")
    A.add_train_params(parser)
    return parser


MINIMAL = [
    "--job_name=test-mnist",
    "--model_def=mnist.mnist_functional_api.custom_model",
    "--training_data=/data/x",
]


def test_original_defaults():
    args = _train_parser().parse_args(["--job_name=j"])
    assert args.minibatch_size == 64
    assert args.num_workers == 2
    assert args.num_ps_pods == 0
    assert args.num_minibatches_per_task == 8
    assert args.master_resource_request == "cpu=0.1,memory=1024Mi"
    assert args.worker_resource_request == "cpu=1,memory=4096Mi"
    assert args.ps_resource_request == "cpu=1,memory=4096Mi"
    assert args.image_pull_policy == "Always"
    assert args.restart_policy == "Never"
    assert args.namespace == "default"
    assert args.distribution_strategy == "ParameterServerStrategy"
    assert args.feed == "feed" and args.loss == "loss" and args.optimizer == "optimizer"
    assert args.eval_metrics_fn == "eval_metrics_fn" and args.callbacks == "callbacks"
    assert args.num_epochs == 1 and args.grads_to_wait == 1 and args.log_loss_steps == 100
    assert args.use_async is False and args.need_task_manager is True
    assert args.relaunch_on_worker_failure == 1
    assert args.platform is None and args.job_dir == ""


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
        (["--use_async=nonsense"], False),
    ],
)
def test_bool_flag_semantics(argv, expected):
    assert _train_parser().parse_args(["--job_name=j", *argv]).use_async is expected


def test_bool_flag_alone_flips_a_true_default():
    assert (
        _train_parser().parse_args(["--job_name=j", "--need_task_manager"]).need_task_manager
        is False
    )


def test_unknown_flag_is_rejected_with_a_hint():
    with pytest.raises(A.ArgumentError, match=r"--num_worker -> did you mean --num_workers\?"):
        _train_parser().parse_args(["--job_name=j", "--num_worker=3"])


def test_abbreviated_flag_is_rejected():
    with pytest.raises(A.ArgumentError, match="unrecognized arguments: --num_work=3"):
        _train_parser().parse_args(["--job_name=j", "--num_work=3"])


def test_bad_choice_is_an_argument_error():
    with pytest.raises(A.ArgumentError, match="image_pull_policy"):
        _train_parser().parse_args(["--job_name=j", "--image_pull_policy=Sometimes"])


def test_round_trip_through_master_args():
    args = A.parse_master_args(
        MINIMAL + ["--use_async", "--envs=A=1,B=x,y", "--output=-weird", "--model_zoo="]
    )
    argv = A.build_arguments_from_parsed_result(args)
    assert "--use_async=true" in argv
    assert all(item.startswith("--") and "=" in item for item in argv)
    again = A.parse_master_args(argv)
    assert vars(again) == vars(args)


def test_build_arguments_filters_and_skips_none():
    ns = argparse.Namespace(a=1, b=None, c=True, d="x y", func=print, detach=True)
    assert A.build_arguments_from_parsed_result(ns, filter_args=["a"]) == ["--c=true", "--d=x y"]


def test_wrap_python_args_with_string():
    wrapped = A.wrap_python_args_with_string(["--a=1", "--b", "c d", "--e=it's"])
    assert wrapped == ["--a='1'", "--b", "'c d'", "--e='it'\"'\"'s'"]


def test_master_args_have_port_job_type_and_defaults():
    args = A.parse_master_args(MINIMAL)
    assert args.port == 50001
    assert args.job_type == A.JobType.TRAINING_ONLY
    assert args.platform == "local"
    assert args.job_dir.endswith(os.path.join("jobs", "test-mnist"))
    args = A.parse_master_args(MINIMAL + ["--validation_data=/v"])
    assert args.job_type == A.JobType.TRAINING_WITH_EVALUATION


def test_ps_strategy_without_ps_gets_one_ps_and_says_so():
    args = _train_parser().parse_args(MINIMAL)
    notices = A.normalize_job_args(args)
    assert args.num_ps_pods == 1
    assert any("num_ps_pods: 1" in n for n in notices)
    assert any("platform: local" in n for n in notices)
    explicit = _train_parser().parse_args(MINIMAL + ["--num_ps_pods=3"])
    A.normalize_job_args(explicit)
    assert explicit.num_ps_pods == 3


def test_platform_defaults_to_kubernetes_with_an_image():
    args = _train_parser().parse_args(MINIMAL + ["--image_name=reg/x:1"])
    A.normalize_job_args(args)
    assert args.platform == "kubernetes"
    assert args.job_dir == ""


def test_elasticdl_home_env(monkeypatch, tmp_path):
    monkeypatch.setenv("ELASTICDL_HOME", str(tmp_path))
    assert A.default_job_dir("j") == str(tmp_path / "jobs" / "j")


def _validate(extra, base=MINIMAL, check_local_paths=False, parser=None):
    args = (parser or _train_parser()).parse_args(base + extra)
    A.normalize_job_args(args)
    A.validate_job_args(args, check_local_paths=check_local_paths)
    return args


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--job_name=Bad_Name"], "--job_name 'Bad_Name' is invalid"),
        (["--job_name=" + "a" * 41], "use at most 40"),
        (["--job_name=-a"], "--job_name '-a' is invalid"),
        (["--model_def=custom_model"], "--model_def 'custom_model' is not a dotted path"),
        (["--model_def=a.1b.c"], "is not a dotted path"),
        (["--minibatch_size=0"], "--minibatch_size must be > 0"),
        (["--num_workers=0"], "--num_workers must be >= 1"),
        (
            ["--worker_resource_request=cpu=1,gpu=0.5"],
            "--worker_resource_request: nvidia.com/gpu=0.5",
        ),
        (["--ps_resource_limit=cpu=1,foo=2"], "--ps_resource_limit: unknown resource 'foo'"),
        (["--volume=claim_name=c,mount_path=/p,bad=1"], "--volume: unknown key 'bad'"),
        (["--worker_pod_priority=medium"], "--worker_pod_priority 'medium' is invalid"),
        (["--checkpoint_steps=10"], "--checkpoint_steps needs --checkpoint_dir"),
        (["--evaluation_steps=10"], "--evaluation_steps needs --validation_data"),
        (["--envs=novalue"], "--envs: 'novalue' has no '='"),
        (["--platform=kubernetes"], "--image_name is required on Kubernetes"),
        (
            ["--worker_resource_request=cpu=2,memory=1Gi", "--worker_resource_limit=cpu=1"],
            "--worker_resource_limit: cpu limit 1 is below the request 2",
        ),
        (["--yaml=pod.yaml"], "--yaml writes a Kubernetes manifest"),
    ],
)
def test_validation_messages(extra, message):
    with pytest.raises(A.ArgumentError) as info:
        _validate(extra)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_training_data_required():
    with pytest.raises(A.ArgumentError, match="--training_data is required"):
        _validate([], base=["--job_name=j", "--model_def=a.b.c"])


def test_evaluate_needs_validation_data_and_checkpoint():
    parser = A.StrictArgumentParser(prog="elasticdl evaluate")
    A.add_evaluate_params(parser)
    base = ["--job_name=j", "--model_def=a.b.c"]
    with pytest.raises(A.ArgumentError, match="--validation_data is required to evaluate"):
        _validate([], base=base, parser=parser)
    with pytest.raises(A.ArgumentError, match="--checkpoint_dir_for_init is required to evaluate"):
        _validate(["--validation_data=/v"], base=base, parser=parser)
    args = _validate(
        ["--validation_data=/v", "--checkpoint_dir_for_init=/c"], base=base, parser=parser
    )
    assert args.job_type == A.JobType.EVALUATION_ONLY


def test_predict_needs_prediction_data_and_checkpoint():
    parser = A.StrictArgumentParser(prog="elasticdl predict")
    A.add_predict_params(parser)
    base = ["--job_name=j", "--model_def=a.b.c"]
    with pytest.raises(A.ArgumentError, match="--prediction_data is required"):
        _validate([], base=base, parser=parser)
    with pytest.raises(A.ArgumentError, match="--checkpoint_dir_for_init is required to predict"):
        _validate(["--prediction_data=/p"], base=base, parser=parser)
    args = _validate(
        ["--prediction_data=/p", "--checkpoint_dir_for_init=/c"], base=base, parser=parser
    )
    assert args.job_type == A.JobType.PREDICTION_ONLY
    assert args.prediction_outputs_processor == "PredictionOutputsProcessor"


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
    _validate([], base=base, check_local_paths=True)
    with pytest.raises(A.ArgumentError, match="no file mnist/other.py under --model_zoo"):
        _validate(["--model_def=mnist.other.custom_model"], base=base, check_local_paths=True)
    with pytest.raises(A.ArgumentError, match="is not a directory"):
        _validate([f"--model_zoo={tmp_path / 'nope'}"], base=base, check_local_paths=True)
    with pytest.raises(A.ArgumentError, match="--training_data .* does not exist"):
        _validate([f"--training_data={tmp_path / 'missing'}"], base=base, check_local_paths=True)
    # Table names and URLs are not local paths and are not checked.
    _validate(["--training_data=project.table"], base=base, check_local_paths=True)


def test_parse_envs_keeps_commas_in_values():
    assert A.parse_envs("A=1,B=x,y,C=") == {"A": "1", "B": "x,y", "C": ""}
    assert A.parse_envs("") == {}
