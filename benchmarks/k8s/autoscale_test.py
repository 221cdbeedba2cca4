"""autoscale.py's parts that need no cluster: where a pod's containers' CPU is read (a cgroup
tree laid out as the kubelet's cgroupfs driver lays it out, in a temporary directory), the CPU
sums over containers that come and go, whether a job fits the nodes, its flags, and the table
and summary of a run. The benchmark itself runs on the real cluster (benchmarks/autoscale/
README.md)."""

from __future__ import annotations

from pathlib import Path

import autoscale  # pants: no-infer-dep (beside this file: the BUILD names it)
import pytest
from autoscale_figures import Mark, span_figures  # pants: no-infer-dep (the BUILD names it)

UID = "3f1c2a9e-0b7d-4c55-9d1e-2a6b8c0d4e5f"


def _container(pod: Path, name: str, ns: int) -> Path:
    path = pod / name
    path.mkdir(parents=True)
    (path / "cpuacct.usage").write_text(f"{ns}\n")
    return path


def test_the_pod_cgroup_follows_the_qos_class(tmp_path):
    kubepods = tmp_path / "n1" / "kubepods"
    assert autoscale.pod_cgroup(kubepods, "Guaranteed", UID) == kubepods / f"pod{UID}"
    assert autoscale.pod_cgroup(kubepods, "Burstable", UID) == kubepods / "burstable" / f"pod{UID}"
    assert (
        autoscale.pod_cgroup(kubepods, "BestEffort", UID) == kubepods / "besteffort" / f"pod{UID}"
    )
    with pytest.raises(ValueError, match="unknown QoS class 'Gold'"):
        autoscale.pod_cgroup(kubepods, "Gold", UID)


def test_every_container_of_the_pod_is_read_and_a_missing_pod_reads_nothing(tmp_path):
    pod = autoscale.pod_cgroup(tmp_path / "n2" / "kubepods", "Guaranteed", UID)
    sandbox = _container(pod, "a" * 64, 40_000_000)
    worker = _container(pod, "b" * 64, 2_500_000_000)
    (pod / "cpuacct.usage").write_text("2540000000\n")  # the pod's own total: not a container
    assert autoscale.container_usage_ns(pod) == {
        str(sandbox): 40_000_000,
        str(worker): 2_500_000_000,
    }
    assert autoscale.container_usage_ns(tmp_path / "n1" / "kubepods" / f"pod{UID}") == {}


def test_the_cpu_of_a_container_that_ends_inside_the_span_counts_up_to_its_last_sample(tmp_path):
    pod = tmp_path / f"pod{UID}"
    master = _container(pod, "master", 1_000_000_000)
    meter = autoscale.CpuMeter()
    meter.sample(autoscale.container_usage_ns(pod))
    start = meter.seconds()
    worker = _container(pod, "worker", 500_000_000)  # started inside the span: from 0
    (master / "cpuacct.usage").write_text("1600000000\n")
    meter.sample(autoscale.container_usage_ns(pod))
    (worker / "cpuacct.usage").unlink()
    worker.rmdir()  # the worker ended: its cgroup is gone
    (master / "cpuacct.usage").write_text("2000000000\n")
    meter.sample(autoscale.container_usage_ns(pod))
    assert start == pytest.approx(1.0)
    assert meter.seconds() - start == pytest.approx(1.0 + 0.5)


def test_the_breakdown_gives_each_pods_cpu_in_the_span_and_the_decisions_on_its_clock(tmp_path):
    master = _container(tmp_path / "master-pod", "c", 3_000_000_000)
    meter = autoscale.CpuMeter()
    meter.sample(autoscale.container_usage_ns(tmp_path / "master-pod"), "job-master")
    start, start_cpu = Mark(100.0, 64, meter.seconds()), meter.by_pod()
    worker = _container(tmp_path / "worker-pod", "c", 700_000_000)  # added inside the span
    meter.sample(autoscale.container_usage_ns(tmp_path / "worker-pod"), "job-worker-1")
    (master / "cpuacct.usage").write_text("4500000000\n")
    (worker / "cpuacct.usage").write_text("2700000000\n")
    meter.sample(autoscale.container_usage_ns(tmp_path / "master-pod"), "job-master")
    meter.sample(autoscale.container_usage_ns(tmp_path / "worker-pod"), "job-worker-1")
    end = Mark(160.0, 6400, meter.seconds())
    seen = {"job-master": [99.5, 161.0], "job-worker-1": [112.0, 150.5]}
    decisions = [{"time": 1_000_020.0, "action": "add", "worker": 1, "workers": 2}]
    out = autoscale.pod_breakdown(
        start, start_cpu, end, meter.by_pod(), seen, decisions, 1_000_000.0
    )
    assert out == {
        "span_s": 60.0,
        "pods": {
            "job-master": {"cpu_s": 1.5, "seen_s": [-0.5, 61.0]},
            "job-worker-1": {"cpu_s": 2.7, "seen_s": [12.0, 50.5]},
        },
        "decisions": [
            {
                "t_s": 20.0,
                "action": "add",
                "worker": 1,
                "records_per_s": None,
                "gain": None,
                "required_gain": None,
                "ps": {},
            }
        ],
    }
    assert sum(p["cpu_s"] for p in out["pods"].values()) == pytest.approx(end.cpu_s - start.cpu_s)


def test_a_job_fits_when_its_pods_pack_onto_the_nodes():
    # master + PS 0.2 each and four workers on two 1-CPU nodes, the first node filled first:
    # 0.3 fits, 0.4 strands the fourth worker (0.2 left on each node)
    assert autoscale.fits([1.0, 1.0], [0.2, 0.2] + [0.3] * 4)
    assert not autoscale.fits([1.0, 1.0], [0.2, 0.2] + [0.4] * 4)
    assert autoscale.fits([1.0, 1.0], [0.2, 0.2] + [0.4] * 3)
    assert not autoscale.fits([1.0, 0.1], [0.2, 0.2] + [0.3] * 4)  # another user's pods


def test_the_job_gets_the_worker_cpu_and_auto_its_bounds():
    args = autoscale.parse_args(["--worker_cpu=0.25", "--max_workers=3", "--epochs=2"])
    node_argv = ["--namespace=x", "--worker_resource_request=cpu=0.4,memory=1024Mi"]
    auto = autoscale.job_argv(args, node_argv, "auto")
    assert "--worker_resource_request=cpu=0.25,memory=1024Mi" in auto
    assert not any("cpu=0.4" in a for a in auto)
    assert {"--num_workers=auto", "--min_workers=1", "--max_workers=3", "--num_epochs=2"} <= set(
        auto
    )
    fixed = autoscale.job_argv(args, node_argv, "2")
    assert "--num_workers=2" in fixed and not any(a.startswith("--max_workers") for a in fixed)


def test_the_sparse_job_trains_deepfm_on_its_own_data_volume():
    args = autoscale.parse_args(["--jobs=sparse"])
    assert args.jobs == ["sparse"]
    argv = autoscale.job_argv(args, ["--namespace=x"], "2", "sparse")
    assert "--model_def=deepfm.deepfm_ctr.custom_model" in argv
    assert "--model_params=features=26; vocab=38462" in argv
    assert {"--training_data=/data/sparse/train", "--minibatch_size=256"} <= set(argv)
    readme = autoscale.job_argv(args, ["--namespace=x"], "2")
    assert "--training_data=/data/readme/train" in readme
    with pytest.raises(ValueError, match="unknown job 'dense'"):
        autoscale.job_argv(args, [], "2", "dense")


def test_rounds_interleave_every_count_of_every_job_per_repeat():
    assert autoscale.rounds(2, ["readme", "sparse"], ["1", "auto"]) == [
        (0, "readme", "1"),
        (0, "readme", "auto"),
        (0, "sparse", "1"),
        (0, "sparse", "auto"),
        (1, "readme", "1"),
        (1, "readme", "auto"),
        (1, "sparse", "1"),
        (1, "sparse", "auto"),
    ]


@pytest.mark.parametrize(
    "flag, error",
    [
        ("--fixed=1,x", "--fixed must be comma-separated worker counts like 1,2,4, got '1,x'"),
        ("--worker_cpu=0", "--worker_cpu must be a CPU share like 0.3, got 0"),
        (
            "--repeats=0",
            "--max_workers, --records, --sparse_rows, --epochs and --repeats must be >= 1",
        ),
        ("--jobs=readme,dense", "--jobs must name readme and/or sparse, got 'readme,dense'"),
    ],
)
def test_bad_flags_are_one_line(flag, error, capsys):
    with pytest.raises(SystemExit) as exit_:
        autoscale.parse_args([flag])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"k8s_autoscale: error: {error}"]


def test_the_summary_compares_auto_with_the_best_fixed_counts(capsys):
    def run(records_per_s, cpus, decisions=()):
        figures = span_figures(
            "j",
            Mark(10.0, 64, 5.0),
            Mark(20.0, 64 + 10 * records_per_s, 5.0 + 10 * cpus),
            {"target": 2, "decisions": [{"action": a, "workers": w} for a, w in decisions]},
            "auto" if decisions else "n",
        )
        assert figures["records_per_s"] == pytest.approx(records_per_s)
        assert figures["cpus_used"] == pytest.approx(cpus)
        return figures

    runs = {
        "1": [run(300, 0.6)],  # 500 records per CPU s: the most efficient
        "2": [run(500, 1.25)],  # 400: the fastest
        "auto": [run(480, 1.0, [("add", 2)])],  # 480: 96% of the best efficiency
    }
    summary = autoscale.summarise("README job", runs, [1, 2])
    assert summary["best_fixed_by_throughput"] == 2 and summary["best_fixed_by_efficiency"] == 1
    assert summary["auto_over_best_records_per_cpu_s"] == pytest.approx(0.96)
    assert summary["auto_over_best_records_per_s"] == pytest.approx(0.96)
    assert summary["goal_met"] is True
    table = capsys.readouterr().out.splitlines()
    assert table[0] == "README job"
    assert table[-1].split() == ["auto", "480", "1.000", "480", "add->2"]


def test_a_span_without_records_is_refused():
    with pytest.raises(RuntimeError, match="job j trained too few records to be timed"):
        span_figures("j", Mark(1.0, 64, 0.0), Mark(1.0, 64, 0.0), {}, "1")
