"""A straggler in a real job: one worker's CPU limited by a cgroup quota (5% of a CPU) once it
trains, as a throttled node would be. The master must see it as slow, back up or withhold its
tasks near the end, and still count every record exactly once.

The quota needs root and a cgroup hierarchy with the cpu controller: elsewhere the test skips
with the reason, except where ELASTICDL_REQUIRE_CGROUP_CPU is set, where that is a failure.
"""
import os
import re

import pytest
from elasticdl_testing.cpu_throttle import ThrottleUnavailable, cpu_throttled

from .conftest import TERMINAL, replica

JOB = "stragglers"
RECORDS = 16384
EPOCHS = 3
MINIBATCHES_PER_TASK = 16
TASKS = EPOCHS * RECORDS // (64 * MINIBATCHES_PER_TASK)
REQUIRE_ENV = "ELASTICDL_REQUIRE_CGROUP_CPU"


def test_a_throttled_worker_is_backed_up_and_every_record_counts_once(cli, small_data):
    cli.submit(
        "train",
        JOB,
        f"--training_data={small_data['train']}",
        # Three epochs: the throttle starts once 2,048 records are trained, and the fast peer
        # alone trains one epoch in a few seconds; with one epoch it could finish the data
        # before the throttle (set after a status poll) took hold, leaving nothing near the end
        # to back up or withhold. The end of the last epoch is where both happen.
        f"--num_epochs={EPOCHS}",
        "--minibatch_size=64",
        # Tasks of 1,024 records: throttled, one takes the slow worker seconds, past the
        # age at which an idle peer may back it up (BACKUP_MIN_AGE_SECONDS); tasks of 128
        # records took it 0.6 s, and whether it was still asking for work near the end (to be
        # withheld) was a race with the fast peer.
        f"--num_minibatches_per_task={MINIBATCHES_PER_TASK}",
        "--num_workers=2",
        "--num_ps_pods=1",
        # The throttled worker must stay this much slower than its peer to the end: on a
        # machine loaded from elsewhere the peer's own share of the CPU falls too, and the
        # default factor of 3 was not always exceeded there.
        "--straggler_factor=2",
    )
    # Both workers warmed up (their first task is not measured) and training.
    status = cli.wait_for(
        JOB,
        lambda s: s["records_trained"] >= 2048 and replica(s, "worker-1")["pid"],
        timeout=300,
        what="trained 2048 records",
    )
    pid = replica(status, "worker-1")["pid"]
    try:
        with cpu_throttled(pid, 0.05):
            seen_slow = cli.wait_for(
                JOB,
                lambda s: 1 in s["stragglers"].get("ever_slow", []),
                timeout=300,
                what="seen worker 1 as slow",
            )
            final = cli.wait_end(JOB, timeout=600)
    except ThrottleUnavailable as e:
        cli.run("cancel", JOB, timeout=120, check=False)
        if os.environ.get(REQUIRE_ENV):
            pytest.fail(f"{e} ({REQUIRE_ENV} is set)", pytrace=False)
        pytest.skip(str(e))

    assert seen_slow["phase"] not in TERMINAL or seen_slow["phase"] == "Succeeded"
    assert final["phase"] == "Succeeded", cli.master_log(JOB)[-4000:]
    assert final["records_trained"] == final["records_expected"] == EPOCHS * RECORDS
    assert final["records_trained_per_epoch"] == {str(e): RECORDS for e in range(1, EPOCHS + 1)}
    stragglers = final["stragglers"]
    assert 1 in stragglers["ever_slow"], stragglers
    # Near the end it got no more than its share, or its tasks were backed up (or both).
    log = cli.master_log(JOB)
    assert stragglers["backups_issued"] + stragglers["tasks_withheld"] >= 1, (
        f"{stragglers}\n"
        + "\n".join(line for line in log.splitlines() if "slower" in line or "backed up" in line)
        + "\n--- master log tail\n"
        + log[-3000:]
    )
    assert "slower than its peers" in log
    shown = cli.run("status", JOB).stdout
    # Worker 1 among the ever slow (on a busy machine worker 0 may have been slow for a while).
    assert "Stragglers:" in shown and re.search(r"ever slow: [^;]*\bworker-1\b", shown), shown
    # A dropped copy or a withheld task never cost a record: every task counted once.
    assert final["tasks_done"] == TASKS, final
