"""A job that sizes itself (--num_workers=auto) on a throughput that stops growing: the master
starts one worker and adds a second (the first step from the minimum is always tried); the
PS is then held to 1% of a CPU by a cgroup quota (it needs several times that), so the job is
limited by its one PS and the second worker cannot pay for its CPU (the default rule): the
master must release it (or hold, seeing the PS saturated), log the numbers behind each decision
(records/s, the CPU its processes used, records per CPU second, the gain required), and still
count every record once.

The quota needs root and a cgroup hierarchy with the cpu controller: elsewhere the test skips
with the reason, except where ELASTICDL_REQUIRE_CGROUP_CPU is set, where that is a failure.
"""
import os

import pytest
from elasticdl_testing.cpu_throttle import ThrottleUnavailable, cpu_throttled

from .conftest import replica

JOB = "autoscale"
# Enough records for the baseline at its slowest: up to MAX_BASELINE_WINDOWS windows of 10 s
# (elasticdl.master.autoscaler) while the machine's load makes their rates disagree.
EPOCHS = 8
REQUIRE_ENV = "ELASTICDL_REQUIRE_CGROUP_CPU"


def decisions(status: dict) -> list[dict]:
    return status.get("autoscaling", {}).get("decisions", [])


def test_an_auto_sized_job_stops_adding_when_the_ps_limits_it(cli, fashion_mnist):
    cli.submit(
        "train",
        JOB,
        f"--training_data={fashion_mnist / 'train'}",
        f"--num_epochs={EPOCHS}",
        "--minibatch_size=64",
        "--num_minibatches_per_task=2",
        "--num_workers=auto",
        "--min_workers=1",
        "--max_workers=3",
        "--num_ps_pods=1",
    )
    first = cli.wait_for(JOB, lambda s: decisions(s), timeout=300, what="made a first decision")
    added = decisions(first)[0]
    assert added["action"] == "add" and added["workers"] == 2, added
    assert added["measured_workers"] == 1 and added["records_per_s"] > 0, added
    assert "records/s with 1 workers on" in added["reason"], added
    # The local platform measures its processes' CPU: the master, the PS and the worker.
    assert added["rule"] == "cpu_efficiency" and added["cpu_source"] == "measured", added
    assert added["cpu"] > 0 and added["records_per_cpu_s"] > 0, added
    try:
        with cpu_throttled(replica(first, "ps-0")["pid"], 0.01):
            second = cli.wait_for(
                JOB, lambda s: len(decisions(s)) >= 2, timeout=600, what="made a second decision"
            )
    except ThrottleUnavailable as e:
        cli.run("cancel", JOB, timeout=120, check=False)
        if os.environ.get(REQUIRE_ENV):
            pytest.fail(f"{e} ({REQUIRE_ENV} is set)", pytrace=False)
        pytest.skip(str(e))
    stopped = decisions(second)[1]
    assert stopped["action"] in ("release", "hold"), stopped
    assert stopped["measured_workers"] == 2 and stopped["ps"], stopped
    assert stopped["previous_cpu"] == added["cpu"] and stopped["cpu"] > 0, stopped
    assert stopped["required_gain"] >= 0.1, stopped  # at least the floor, whatever the CPU
    if stopped["action"] == "release":
        assert stopped["workers"] == 1 and stopped["worker"] == added["worker"], stopped
        assert stopped["gain"] < stopped["required_gain"], stopped
    else:
        assert "saturated" in stopped["reason"], stopped

    final = cli.wait_end(JOB, timeout=900)
    assert final["phase"] == "Succeeded", cli.master_log(JOB)[-4000:]
    assert final["records_trained"] == final["records_expected"] == EPOCHS * 60000
    assert final["records_trained_per_epoch"] == {str(e): 60000 for e in range(1, EPOCHS + 1)}
    assert final["autoscaling"]["settled"]
    assert len(decisions(final)) == 2  # settled: nothing more was decided
    if stopped["action"] == "release":
        # Let go gracefully: it reported what it held and exited, and was not relaunched.
        released = replica(final, f"worker-{stopped['worker']}")
        assert released["phase"] == "Succeeded" and released["replaced_by"] is None
    assert "Autoscaling: add ->" in cli.master_log(JOB)
    shown = cli.run("status", JOB).stdout
    assert "Autoscaling: 1..3 workers" in shown and "add -> 2:" in shown, shown
