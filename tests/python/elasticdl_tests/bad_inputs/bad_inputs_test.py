"""Bad inputs, one row each: what a user (or a corrupt file) can get wrong, and what happens.

Every row asserts the same contract:

* a non-zero exit status (2 for usage errors: flags, files named by flags, job names, config),
* exactly one line on stderr, ``elasticdl: error: ...``, naming the field and the fix,
* no traceback,
* nothing half-written: no job directory, no new file in the working directory.

CLI rows run the real ``elasticdl`` main function in-process (no subprocess: the whole table
runs in seconds). Data rows run the readers the master and the workers use on a file, and
expect their one-line error type (``DataReaderError``/``RecordIOError``), which the master
prints as its one error line (exit 2) and a worker reports as the task's error.

Run it with ``-v`` for one line of output per row.
"""

from __future__ import annotations

import dataclasses
import gzip
import logging
import struct
import sys
import zlib
from pathlib import Path
from typing import Callable

import pytest
from elasticdl.client.main import main

# --------------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Row:
    id: str
    argv: tuple[str, ...]  # "{tmp}", "{zoo}", "{data}", "{home}" are filled in
    expect: str  # a substring of the one error line (names the field)
    code: int = 2
    files: tuple[tuple[str, bytes | str], ...] = ()  # created under {tmp} first
    env: tuple[tuple[str, str], ...] = ()
    setup: Callable[[Path], None] | None = None  # more preparation (e.g. an earlier job)


def train(*flags: str) -> tuple[str, ...]:
    """A valid local training job, plus (or overridden by) ``flags``."""
    base = {
        "--job_name": "good-job",
        "--model_zoo": "{zoo}",
        "--model_def": "mnist.model.custom_model",
        "--training_data": "{data}",
    }
    extra = []
    for flag in flags:
        name, eq, value = flag.partition("=")
        if eq and name in base:
            base[name] = value
        else:
            extra.append(flag)
    return ("train", *(f"{k}={v}" for k, v in base.items() if v is not None), *extra)


def without(flag: str) -> tuple[str, ...]:
    return tuple(a for a in train() if not a.startswith(flag + "="))


def k8s(*flags: str) -> tuple[str, ...]:
    """A Kubernetes job that only writes its manifest (--yaml): nothing reaches a cluster."""
    return train(
        "--image_name=registry.example.com/me/mnist:1",
        "--model_zoo=/model_zoo",
        "--training_data=/data/train",
        "--yaml={tmp}/work/master.yaml",
        *flags,
    )


def _four_billion_records(tmp: Path) -> None:
    payload = struct.pack("<I", 1) + b"x"
    header = struct.pack("<5I", 0x01020304, zlib.crc32(payload), 0, len(payload), 0xFFFFFFFF)
    (tmp / "huge.rio").write_bytes(header + payload)


def _gzip_bomb(tmp: Path) -> None:
    # 300 gzip members of 1 MiB of zeros each: ~300 KiB on disk, 300 MiB if read in full.
    payload = gzip.compress(bytes(1 << 20), 9) * 300
    header = struct.pack("<5I", 0x01020304, zlib.crc32(payload), 2, len(payload), 1000)
    (tmp / "bomb.rio").write_bytes(header + payload)


def _finished_job(tmp: Path) -> None:
    """A local job that ran and ended, as the client and master leave it."""
    job = tmp / "home" / "jobs" / "done-job"
    (job / "logs").mkdir(parents=True)
    (job / ".elasticdl-job").write_text('{"job_name": "done-job", "created_dir": true}')
    (job / "job.json").write_text('{"job_name": "done-job", "pid": null}')
    (job / "exit_code").write_text("0\n")
    (job / "logs" / "master.log").write_text("done\n")


CONFIG = (("ELASTICDL_CONFIG", "{tmp}/config.yaml"),)

PEM = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
TLS_PEMS = (
    ("job.pem", PEM),
    ("job.key", PEM.replace("CERTIFICATE", "PRIVATE KEY")),
    ("ca.pem", PEM),
)
TLS_FILES = (
    "--tls_cert_file={tmp}/job.pem",
    "--tls_key_file={tmp}/job.key",
    "--tls_ca_file={tmp}/ca.pem",
)


def config_row(id: str, text: str | bytes, expect: str) -> Row:
    return Row(id, ("list",), expect, files=(("config.yaml", text),), env=CONFIG)


CLI_ROWS = [
    # ---- flags ----------------------------------------------------------------------------
    Row("no-command-flag", ("--bogus",), "unrecognized arguments: --bogus"),
    Row("unknown-command", ("trian",), "invalid choice: 'trian'"),
    Row("unknown-flag-typo", train("--num_worker=2"), "did you mean --num_workers?"),
    Row("abbreviated-flag", train("--num_work=2"), "unrecognized arguments: --num_work=2"),
    Row("missing-job-name", without("--job_name"), "--job_name is required"),
    Row("missing-model-def", without("--model_def"), "--model_def is required"),
    Row("missing-training-data", without("--training_data"), "--training_data is required"),
    Row("num-workers-zero", train("--num_workers=0"), "--num_workers must be > 0"),
    Row("num-workers-negative", train("--num_workers=-3"), "--num_workers must be > 0"),
    Row("num-workers-text", train("--num_workers=two"), "--num_workers"),
    Row("num-workers-float", train("--num_workers=1.5"), "--num_workers"),
    Row("num-workers-nan", train("--num_workers=nan"), "--num_workers"),
    Row("num-workers-empty", train("--num_workers="), "--num_workers"),
    Row("num-workers-word", train("--num_workers=many"), "a number of workers or auto"),
    Row("min-workers-without-auto", train("--min_workers=2"), "--min_workers only size a job"),
    Row(
        "min-workers-over-max",
        train("--num_workers=auto", "--min_workers=4", "--max_workers=2"),
        "--min_workers=4 is more than --max_workers=2",
    ),
    Row("max-workers-zero", train("--num_workers=auto", "--max_workers=0"), "--max_workers"),
    Row(
        "autoscale-gain-one",
        train("--num_workers=auto", "--autoscale_min_gain=1"),
        "--autoscale_min_gain must be in [0, 1)",
    ),
    Row(
        "autoscale-gain-nan",
        train("--num_workers=auto", "--autoscale_min_gain=nan"),
        "--autoscale_min_gain",
    ),
    Row(
        "num-workers-auto-allreduce",
        train("--num_workers=auto", "--distribution_strategy=AllreduceStrategy"),
        "--num_workers=auto sizes ParameterServerStrategy jobs",
    ),
    Row("straggler-factor-half", train("--straggler_factor=0.5"), "--straggler_factor"),
    Row("minibatch-size-zero", train("--minibatch_size=0"), "--minibatch_size must be > 0"),
    Row(
        "minibatches-per-task-zero",
        train("--num_minibatches_per_task=0"),
        "--num_minibatches_per_task must be > 0",
    ),
    Row("num-ps-negative", train("--num_ps_pods=-1"), "--num_ps_pods must be >= 0"),
    Row("use-async-typo", train("--use_async=ture"), "--use_async"),
    Row("strategy-unknown", train("--distribution_strategy=Magic"), "--distribution_strategy"),
    Row("log-level-unknown", train("--log_level=LOUD"), "--log_level 'LOUD' is invalid"),
    Row("platform-unknown", train("--platform=mars"), "--platform"),
    Row("model-def-not-dotted", train("--model_def=custom_model"), "--model_def 'custom_model'"),
    Row("model-def-no-file", train("--model_def=mnist.nope.custom_model"), "no file mnist/nope.py"),
    Row("model-zoo-missing", train("--model_zoo={tmp}/nozoo"), "--model_zoo"),
    Row("training-data-missing", train("--training_data={tmp}/nodata"), "--training_data"),
    Row(
        "training-data-name-missing",
        train("--training_data=nodata"),
        "--training_data 'nodata' does not exist",
    ),
    Row(
        "training-data-holds-no-recordio",
        train("--training_data={tmp}/text"),
        "--training_data '{tmp}/text' holds no RecordIO file",
        files=(("text/README", "not records"),),
    ),
    Row(
        "validation-data-not-recordio",
        train("--validation_data={tmp}/test.txt"),
        "--validation_data '{tmp}/test.txt' is not a RecordIO file",
        files=(("test.txt", "not records"),),
    ),
    Row(
        "image-prefix-no-base",
        train("--docker_image_prefix=registry.example.com/me/"),
        "--docker_image_prefix needs --image_base",
    ),
    Row(
        "image-base-and-name",
        k8s("--image_base=elasticdl:cpu"),
        "--image_base and --image_name are exclusive",
    ),
    Row(
        "evaluation-steps-no-data",
        train("--evaluation_steps=10"),
        "--evaluation_steps needs --validation_data",
    ),
    Row(
        "allreduce-with-ps",
        train("--distribution_strategy=AllreduceStrategy", "--num_ps_pods=1"),
        "--num_ps_pods=1 with AllreduceStrategy",
    ),
    Row(
        "predict-no-data",
        ("predict", "--job_name=p", "--model_zoo={zoo}", "--model_def=mnist.model.custom_model"),
        "--prediction_data",
    ),
    Row(
        "evaluate-no-data",
        ("evaluate", "--job_name=e", "--model_zoo={zoo}", "--model_def=mnist.model.custom_model"),
        "--validation_data",
    ),
    Row(
        "retired-flag", train("--need_elasticdl_job_service=false"), "--need_elasticdl_job_service"
    ),
    Row("aux-params-unknown", train("--aux_params=turbo"), "--aux_params: unknown turbo"),
    Row("model-params-not-kv", train("--model_params=lr"), "--model_params"),
    Row("data-reader-params-bad", train("--data_reader_params=columns"), "--data_reader_params"),
    Row("populate-env-bad-regex", train("--populate_env_names=FOO("), "--populate_env_names"),
    Row("yaml-on-local", train("--yaml={tmp}/work/x.yaml"), "--yaml"),
    Row("flag-with-newline", train("--job_name=good\njob"), "--job_name"),
    Row("output-is-a-file", train("--output={zoo}/mnist/model.py"), "--output"),
    Row("log-file-dir-missing", train("--log_file_path={tmp}/nodir/m.log"), "--log_file_path"),
    Row("status-output-unknown", ("status", "x", "-o", "xml"), "-o/--output: invalid choice"),
    Row("logs-no-job", ("logs",), "the following arguments are required: job"),
    # ---- job names ------------------------------------------------------------------------
    Row("job-name-uppercase", train("--job_name=Bad_Name"), "--job_name"),
    Row("job-name-path", train("--job_name=../escape"), "--job_name"),
    Row("job-name-slash", train("--job_name=a/b"), "--job_name"),
    Row("job-name-too-long", train("--job_name=" + "a" * 80), "--job_name"),
    Row("job-name-leading-dash", train("--job_name=-job"), "--job_name"),
    Row("job-name-empty", train("--job_name="), "--job_name"),
    Row("status-job-name-path", ("status", "../../etc"), "'../../etc' is not a valid job name"),
    Row("cancel-job-name-path", ("cancel", "../x"), "'../x' is not a valid job name"),
    Row("logs-job-name-path", ("logs", "a/../../b"), "is not a valid job name"),
    Row(
        "logs-replica-path",
        ("logs", "done-job", "--replica=../job.json"),
        "--replica '../job.json' is not a replica name",
        setup=_finished_job,
    ),
    Row("status-unknown-job", ("status", "nosuchjob"), "no local job named 'nosuchjob'"),
    Row("logs-unknown-job", ("logs", "nosuchjob"), "no local job named 'nosuchjob'"),
    Row("cancel-unknown-job", ("cancel", "nosuchjob"), "no local job named 'nosuchjob'"),
    # ---- resources and volumes (checked for every platform) -------------------------------
    Row("resource-not-kv", k8s("--worker_resource_request=cpu"), "--worker_resource_request"),
    Row(
        "resource-bad-quantity",
        k8s("--worker_resource_request=cpu=abc"),
        "--worker_resource_request",
    ),
    Row("resource-negative", k8s("--worker_resource_request=cpu=-1"), "--worker_resource_request"),
    Row(
        "resource-bad-unit",
        k8s("--master_resource_request=memory=1Xi"),
        "--master_resource_request",
    ),
    Row("resource-unknown-name", k8s("--ps_resource_request=tpu=1"), "unknown resource 'tpu'"),
    Row(
        "resource-gpu-fraction",
        k8s("--worker_resource_request=gpu=0.5"),
        "--worker_resource_request",
    ),
    Row("resource-nan", k8s("--worker_resource_request=cpu=nan"), "--worker_resource_request"),
    Row(
        "resource-limit-below-request",
        k8s("--worker_resource_request=cpu=2", "--worker_resource_limit=cpu=1"),
        "--worker_resource_limit",
    ),
    Row("volume-no-mount-path", k8s("--volume=host_path=/data"), "--volume"),
    Row("volume-relative-mount", k8s("--volume=host_path=/data,mount_path=data"), "--volume"),
    Row("volume-unknown-key", k8s("--volume=bogus=1,mount_path=/x"), "--volume"),
    Row("volume-two-sources", k8s("--volume=claim_name=c,host_path=/d,mount_path=/x"), "--volume"),
    Row(
        "volume-duplicate-mount",
        k8s("--volume=host_path=/a,mount_path=/x;host_path=/b,mount_path=/x"),
        "--volume",
    ),
    Row("image-name-space", k8s("--image_name=Bad Image"), "--image_name 'Bad Image'"),
    Row("image-name-newline", k8s("--worker_image=reg.io/x:1\nRUN"), "--worker_image"),
    Row("namespace-invalid", k8s("--namespace=Bad_NS"), "--namespace 'Bad_NS'"),
    Row(
        "namespace-from-config",
        k8s(),
        "--namespace 'Bad_NS'",
        files=(("config.yaml", "namespace: Bad_NS\n"),),
        env=CONFIG,
    ),
    # ---- --envs ---------------------------------------------------------------------------
    Row("envs-no-equals", train("--envs=NOVALUE"), "--envs"),
    Row("envs-bad-name", train("--envs=1BAD=x"), "--envs"),
    Row("envs-empty-name", train("--envs==x"), "--envs"),
    Row("envs-name-with-space", train("--envs=A B=x"), "--envs"),
    Row("envs-newline-value", train("--envs=A=x\ny"), "--envs"),
    # ---- config file ($ELASTICDL_CONFIG) --------------------------------------------------
    config_row("config-invalid-yaml", "namespace: [unclosed\n", "invalid YAML"),
    config_row("config-not-a-mapping", "- a\n- b\n", "expected a mapping"),
    config_row("config-unknown-key", "namespce: x\n", "unknown key 'namespce'"),
    config_row("config-non-string", "namespace: 3\n", "namespace must be a non-empty string"),
    config_row("config-bad-platform", "platform: mars\n", "platform 'mars' is invalid"),
    config_row("config-binary", b"\xff\xfe\x00\x01namespace", "config.yaml"),
    Row(
        "config-missing", ("list",), "does not exist", env=(("ELASTICDL_CONFIG", "{tmp}/no.yaml"),)
    ),
    Row(
        "config-is-a-directory", ("list",), "ELASTICDL_CONFIG", env=(("ELASTICDL_CONFIG", "{tmp}"),)
    ),
    # ---- --cluster_spec files -------------------------------------------------------------
    Row("cluster-spec-missing", k8s("--cluster_spec={tmp}/nospec.py"), "--cluster_spec"),
    Row(
        "cluster-spec-syntax-error",
        k8s("--cluster_spec={tmp}/spec.py"),
        "--cluster_spec",
        files=(("spec.py", "def (:\n"),),
    ),
    Row(
        "cluster-spec-no-cluster",
        k8s("--cluster_spec={tmp}/spec.py"),
        "defines no 'cluster'",
        files=(("spec.py", "x = 1\n"),),
    ),
    Row(
        "cluster-spec-cluster-no-methods",
        k8s("--cluster_spec={tmp}/spec.py"),
        "has no method with_pod",
        files=(("spec.py", "cluster = object()\n"),),
    ),
    Row("cluster-spec-json-invalid", k8s("--cluster_spec_json={oops"), "--cluster_spec_json"),
    Row("cluster-spec-json-unknown-key", k8s('--cluster_spec_json={"pod_spek": {}}'), "pod_spek"),
    Row("cluster-spec-on-local-missing", train("--cluster_spec={tmp}/nospec.py"), "--cluster_spec"),
    # ---- wait -----------------------------------------------------------------------------
    Row("wait-timeout-nan", ("wait", "nosuchjob", "--timeout=nan"), "--timeout"),
    Row("wait-timeout-inf", ("wait", "nosuchjob", "--timeout=inf"), "--timeout"),
    Row("wait-timeout-negative", ("wait", "nosuchjob", "--timeout=-1"), "--timeout"),
    Row("wait-timeout-zero", ("wait", "nosuchjob", "--timeout=0"), "--timeout"),
    Row("wait-timeout-text", ("wait", "nosuchjob", "--timeout=soon"), "--timeout"),
    Row("wait-unknown-job", ("wait", "nosuchjob", "--timeout=5"), "no local job named"),
    # ---- job directories ------------------------------------------------------------------
    Row(
        "job-dir-not-a-job",
        train("--job_dir={tmp}/precious"),
        "--job_dir",
        files=(("precious/thesis.tex", "keep me"),),
    ),
    Row(
        "job-dir-holds-foreign-job-json",
        train("--job_dir={tmp}/precious"),
        "--job_dir",
        files=(("precious/job.json", '{"job_name": "good-job"}'), ("precious/x", "keep")),
    ),
    Row("job-dir-is-a-file", train("--job_dir={tmp}/afile"), "--job_dir", files=(("afile", "x"),)),
    # ---- mutual TLS: all three PEM files or none ------------------------------------------
    Row(
        "tls-cert-without-key-and-ca",
        train("--tls_cert_file={tmp}/job.pem"),
        "--tls_cert_file needs --tls_key_file, --tls_ca_file",
        files=(("job.pem", PEM),),
    ),
    Row(
        "tls-key-file-missing",
        train(*TLS_FILES[:1], "--tls_key_file={tmp}/none.key", *TLS_FILES[2:]),
        "--tls_key_file",
        files=TLS_PEMS,
    ),
    Row(
        "tls-ca-not-pem",
        train(*TLS_FILES[:2], "--tls_ca_file={tmp}/ca.der"),
        "--tls_ca_file",
        files=TLS_PEMS + (("ca.der", b"0\x82\x01"),),
    ),
    Row("tls-server-name-alone", train("--tls_server_name=job.example"), "--tls_server_name"),
    Row("tls-partial-on-k8s", k8s("--tls_key_file=/etc/tls/job.key"), "--tls_key_file needs"),
    Row(
        "volume-secret-bad-name",
        k8s("--volume=secret_name=Job_TLS,mount_path=/etc/tls"),
        "is not a Secret name",
    ),
    # ---- model files: the client compiles the module (runs none of it) --------------------
    Row(
        "zoo-module-syntax-error",
        train("--model_def=bad.syn.custom_model"),
        "bad/syn.py line 1: SyntaxError",
        files=(("{zoo}/bad/syn.py", "def custom_model(:\n    pass\n"),),
    ),
    Row(
        "zoo-module-indentation-error",
        train("--model_def=bad.ind.custom_model"),
        "bad/ind.py line 2: SyntaxError",
        files=(("{zoo}/bad/ind.py", "def custom_model():\nreturn 1\n"),),
    ),
    Row(
        "zoo-package-init-syntax-error",
        train("--model_def=badpkg.custom_model"),
        "badpkg/__init__.py line 3: SyntaxError",
        files=(("{zoo}/badpkg/__init__.py", "import os\n\nx = = 1\n"),),
    ),
    Row(
        "zoo-module-nul-bytes",
        train("--model_def=bad.nul.custom_model"),
        "bad/nul.py",
        files=(("{zoo}/bad/nul.py", b"x = 1\0\n"),),
    ),
    # ---- zoo init and dataset -------------------------------------------------------------
    Row(
        "zoo-index-newline",
        ("zoo", "init", "--model_zoo=zoo", "--extra_pypi_index=https://h/simple\nRUN id"),
        "--extra_pypi_index",
    ),
    Row(
        "zoo-index-not-url",
        ("zoo", "init", "--model_zoo=zoo", "--extra_pypi_index=h/simple"),
        "--extra_pypi_index",
    ),
    Row(
        "zoo-base-image-space",
        ("zoo", "init", "--model_zoo=zoo", "--base_image=a b"),
        "--base_image",
    ),
    Row("zoo-model-zoo-missing", ("zoo", "init", "--model_zoo=nozoo"), "--model_zoo"),
    Row("zoo-model-zoo-outside", ("zoo", "init", "--model_zoo=.."), "--model_zoo"),
    Row(
        "zoo-cluster-spec-missing",
        ("zoo", "init", "--model_zoo=zoo", "--cluster_spec=nospec.py"),
        "--cluster_spec",
    ),
    Row("zoo-build-no-dockerfile", ("zoo", "build", "--image=t/m:v1", "."), "--dockerfile"),
    Row(
        "zoo-build-bad-image",
        ("zoo", "build", "--image=Bad Image", "zoo"),
        "--image",
        files=(("work/zoo/Dockerfile", "FROM local/base\n"),),
    ),
    Row("zoo-push-bad-image", ("zoo", "push", "Bad Image"), "IMAGE: 'Bad Image'"),
    Row(
        "dataset-unknown",
        ("dataset", "prepare", "nosuch", "--output={tmp}/work/out"),
        "unknown dataset 'nosuch'",
    ),
    Row(
        "dataset-limit-zero",
        ("dataset", "prepare", "fashion_mnist", "--output={tmp}/work/out", "--limit=0"),
        "--limit must be positive",
    ),
]


@dataclasses.dataclass(frozen=True)
class DataRow:
    id: str
    make: Callable[[Path], None]  # writes the file(s) under tmp
    origin: str  # relative to tmp
    expect: str
    params: tuple[tuple[str, str], ...] = ()


def _write(name: str, content: bytes | str) -> Callable[[Path], None]:
    def make(tmp: Path) -> None:
        path = tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)

    return make


def _parquet(name: str, columns: dict) -> Callable[[Path], None]:
    def make(tmp: Path) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table(columns), tmp / name)

    return make


def _both(*makers: Callable[[Path], None]) -> Callable[[Path], None]:
    def make(tmp: Path) -> None:
        for m in makers:
            m(tmp)

    return make


def _truncated_recordio(tmp: Path) -> None:
    from elasticdl.data import recordio

    with recordio.Writer(tmp / "t.rio") as w:
        for i in range(100):
            w.write(b"record %d" % i)
    data = (tmp / "t.rio").read_bytes()
    (tmp / "t.rio").write_bytes(data[: len(data) - 7])


def _flipped_recordio(tmp: Path) -> None:
    from elasticdl.data import recordio

    with recordio.Writer(tmp / "f.rio", compressor="gzip") as w:
        for i in range(100):
            w.write(b"record %d" % i)
    data = bytearray((tmp / "f.rio").read_bytes())
    data[-10] ^= 0xFF
    (tmp / "f.rio").write_bytes(bytes(data))


DATA_ROWS = [
    DataRow(
        "recordio-four-billion-records",
        _four_billion_records,
        "huge.rio",
        "claims 4294967295 records",
    ),
    DataRow("recordio-gzip-bomb", _gzip_bomb, "bomb.rio", "not read: it decompresses to more"),
    DataRow("recordio-truncated", _truncated_recordio, "t.rio", "the file was cut short"),
    DataRow("recordio-corrupt-payload", _flipped_recordio, "f.rio", "checksum mismatch"),
    DataRow(
        "recordio-not-recordio",
        _write("x.rio", b"hello world, not recordio\n" * 10),
        "x.rio",
        "bad magic",
    ),
    DataRow("recordio-empty-dir", _write("empty/.keep", ""), "empty", "contains no RecordIO"),
    DataRow("data-origin-missing", lambda tmp: None, "nothing/here", "does not exist"),
    DataRow("csv-binary", _write("bin.csv", bytes(range(256)) * 64), "bin.csv", "not a text file"),
    DataRow(
        "csv-gzipped",
        _write("z.csv", gzip.compress(b"a,b\n1,2\n" * 100)),
        "z.csv",
        "not a text file",
    ),
    DataRow(
        "csv-nul-in-the-middle",
        _write("n.csv", b"a,b\n1,2\n" * 1000 + b"3,\x00\n"),
        "n.csv",
        "NUL byte at offset 8002",
    ),
    DataRow(
        "csv-bad-sep", _write("ok.csv", "a,b\n1,2\n"), "ok.csv", "sep", params=(("sep", "::"),)
    ),
    DataRow(
        "parquet-not-parquet",
        _write("p.parquet", b"PAR1 but not really"),
        "p.parquet",
        "not a readable Parquet file",
    ),
    DataRow(
        "parquet-missing-column",
        _parquet("p.parquet", {"x": [1, 2]}),
        "p.parquet",
        "columns: ['label'] not in",
        params=(("columns", "x,label"),),
    ),
    DataRow(
        "parquet-schemas-differ",
        _both(_parquet("pq/a.parquet", {"x": [1, 2]}), _parquet("pq/b.parquet", {"y": ["a", "b"]})),
        "pq",
        "schema",
    ),
    DataRow(
        "parquet-column-type-differs",
        _both(_parquet("pq/a.parquet", {"x": [1, 2]}), _parquet("pq/b.parquet", {"x": ["a", "b"]})),
        "pq",
        "schema",
    ),
    DataRow(
        "reader-type-unknown",
        _write("ok.csv", "a\n1\n"),
        "ok.csv",
        "reader_type",
        params=(("reader_type", "excel"),),
    ),
]


# Model files the master imports (the client only compiles them): what they raise at import
# becomes the master's one error line, naming the file and line, exit 2. Each row's package
# has its own name, so no row finds another's module already imported.
@dataclasses.dataclass(frozen=True)
class ModelRow:
    id: str
    files: tuple[tuple[str, str], ...]  # under the zoo; the model is <package>.model
    expect: tuple[str, ...]  # substrings of the one error line


MODEL_ROWS = [
    ModelRow(
        "model-imports-a-missing-module",
        (("model.py", "import os\nimport not_a_module_xyz\n\ndef custom_model():\n    pass\n"),),
        ("model.py line 2", "No module named 'not_a_module_xyz'"),
    ),
    ModelRow(
        "model-raises-importerror",
        (("model.py", "raise ImportError('this model needs the GPU build')\n"),),
        ("model.py line 1", "needs the GPU build"),
    ),
    ModelRow(
        "model-sibling-import-fails",
        (
            ("model.py", "from . import helper\n"),
            ("helper.py", "import os\n\nimport nope_xyz\n"),
            ("__init__.py", ""),
        ),
        ("helper.py line 3", "nope_xyz"),
    ),
    ModelRow(
        "model-syntax-error",
        (("model.py", "def custom_model(:\n    pass\n"),),
        ("model.py line 1: SyntaxError",),
    ),
    ModelRow(
        "model-sibling-syntax-error",
        (
            ("model.py", "from . import helper\n"),
            ("helper.py", "x = 1\ny = (\n"),
            ("__init__.py", ""),
        ),
        ("helper.py line 2: SyntaxError",),
    ),
    ModelRow(
        "model-raises-at-import",
        (("model.py", "x = 1\nraise RuntimeError('boom\\nat import')\n"),),
        ("raised RuntimeError at", "model.py line 2", "boom at import"),
    ),
    ModelRow(
        "model-divides-by-zero-at-import",
        (("model.py", "\n\nrate = 1 / 0\n"),),
        ("raised ZeroDivisionError at", "model.py line 3"),
    ),
    # Exits would end the master with the model's status and no error line (0 read as success).
    ModelRow(
        "model-calls-sys-exit-with-a-message",
        (("model.py", "import sys\n\nsys.exit('needs a GPU')\n"),),
        ("model.py line 3 called sys.exit('needs a GPU') at import", "instead of exiting"),
    ),
    ModelRow(
        "model-calls-sys-exit-0",
        (("model.py", "import sys\nsys.exit(0)\n"),),
        ("model.py line 2 called sys.exit(0)",),
    ),
    ModelRow(
        "model-raises-systemexit",
        (("model.py", "raise SystemExit\n"),),
        ("model.py line 1 called sys.exit(None)",),
    ),
    ModelRow(
        "model-sibling-calls-sys-exit",
        (
            ("model.py", "from . import helper\n"),
            ("helper.py", "import sys\n\nif True:\n    sys.exit(3)\n"),
            ("__init__.py", ""),
        ),
        ("helper.py line 4 called sys.exit(3)",),
    ),
    ModelRow(
        "model-calls-os-exit",
        (("model.py", "import os\n\nos._exit(0)\n"),),
        ("model.py line 3 called os._exit(0)",),
    ),
]


# --------------------------------------------------------------------------------------------
# Running a row
# --------------------------------------------------------------------------------------------


@pytest.fixture
def place(tmp_path, monkeypatch):
    """A clean user: own ELASTICDL_HOME, no config, a fake master that would exit at once (a
    row that wrongly starts a job fails on its exit status and its job directory)."""
    tmp = tmp_path
    home = tmp / "home"
    zoo = tmp / "work" / "zoo"
    (zoo / "mnist").mkdir(parents=True)
    (zoo / "mnist" / "model.py").write_text("def custom_model():\n    pass\n")
    data = tmp / "work" / "data"
    data.mkdir()
    (data / "shard-0.rio").write_bytes(b"")  # a RecordIO shard without records
    master = tmp / "fake_master.sh"
    master.write_text("#!/bin/sh\nexit 0\n")
    master.chmod(0o755)
    monkeypatch.setenv("ELASTICDL_HOME", str(home))
    monkeypatch.setenv("ELASTICDL_MASTER_PEX", str(master))
    monkeypatch.delenv("ELASTICDL_CONFIG", raising=False)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.chdir(tmp / "work")
    return {"tmp": str(tmp), "zoo": str(zoo), "data": str(data), "home": str(home)}


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _run_main(argv: list[str], capsys) -> tuple[int, list[str]]:
    # The user's view: main's own logging set-up writes to this stderr, not pytest's handlers.
    root = logging.getLogger()
    saved = root.handlers[:]
    root.handlers = []
    try:
        code = main(argv)
    finally:
        root.handlers = saved
    return code, capsys.readouterr().err.splitlines()


@pytest.mark.parametrize("row", CLI_ROWS, ids=[r.id for r in CLI_ROWS])
def test_cli(row: Row, place, capsys, monkeypatch):
    tmp = Path(place["tmp"])
    for name, content in row.files:
        path = tmp / name.format(**place)
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
    for name, value in row.env:
        monkeypatch.setenv(name, value.format(**place))
    if row.setup:
        row.setup(tmp)
    before = _tree(tmp)
    argv = [
        a.replace("{tmp}", place["tmp"])
        .replace("{zoo}", place["zoo"])
        .replace("{data}", place["data"])
        .replace("{home}", place["home"])
        for a in row.argv
    ]
    code, err = _run_main(argv, capsys)
    assert code == row.code, f"exit {code}, stderr: {err}"
    assert len(err) == 1, f"expected one line on stderr, got {err}"
    line = err[0]
    assert line.startswith("elasticdl: error: ") or line.startswith("elasticdl zoo: error: ")
    assert row.expect.replace("{tmp}", place["tmp"]) in line, line
    assert "Traceback" not in line
    assert _tree(tmp) == before, "something was written"


def _read_everything(origin: str, params: dict) -> None:
    from elasticdl.data.reader import create_data_reader

    reader = create_data_reader(origin, None, **params)
    for shard in reader.create_shards():
        for _ in reader.read_records(shard.name, shard.start, shard.end):
            pass


@pytest.mark.parametrize("row", DATA_ROWS, ids=[r.id for r in DATA_ROWS])
def test_data(row: DataRow, tmp_path):
    from elasticdl.data.reader.base import DataReaderError
    from elasticdl.data.recordio import RecordIOError

    row.make(tmp_path)
    with pytest.raises((DataReaderError, RecordIOError)) as e:
        _read_everything(str(tmp_path / row.origin), dict(row.params))
    message = str(e.value)
    assert "\n" not in message and row.expect in message, message


@pytest.mark.parametrize("row", MODEL_ROWS, ids=[r.id for r in MODEL_ROWS])
def test_model(row: ModelRow, tmp_path, capsys, monkeypatch):
    from elasticdl.common.job_spec import JobSpec
    from elasticdl.master.main import main as master_main

    package = "z_" + row.id.replace("-", "_")
    zoo = tmp_path / "zoo"
    for name, text in row.files:
        (zoo / package).mkdir(parents=True, exist_ok=True)
        (zoo / package / name).write_text(text)
    (tmp_path / "data").mkdir()
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.chdir(tmp_path)
    spec = JobSpec(
        job_name="bad-model",
        model_zoo=str(zoo),
        model_def=f"{package}.model.custom_model",
        training_data=str(tmp_path / "data"),
        platform="local",
    )
    before = _tree(tmp_path)
    root = logging.getLogger()
    saved, level = root.handlers[:], root.level
    try:
        code = master_main([f"--job_spec={spec.to_json()}"])
    finally:
        root.handlers[:] = saved
        root.setLevel(level)
    err = capsys.readouterr().err.splitlines()
    assert code == 2, f"exit {code}, stderr: {err}"
    assert len(err) == 1, f"expected one line on stderr, got {err}"
    line = err[0]
    assert line.startswith("elasticdl master: error: --model_def"), line
    for part in row.expect:
        assert part in line, line
    assert "Traceback" not in line
    assert _tree(tmp_path) == before, "something was written"


def test_the_table_has_at_least_60_rows():
    assert len(CLI_ROWS) + len(DATA_ROWS) + len(MODEL_ROWS) >= 60
    ids = [r.id for r in CLI_ROWS] + [r.id for r in DATA_ROWS] + [r.id for r in MODEL_ROWS]
    assert len(ids) == len(set(ids))
