"""A FAKE ElasticDL master for the client tests (the real one needs TensorFlow and minutes).

It takes the master's arguments (--job_spec_file), reads the job name and directory, and acts
out a job the way the real master reports it: status.json (atomically replaced) and logs/<replica>.log files.
Behaviour is chosen with $FAKE_MASTER_MODE:
  succeed (default)  Running -> Succeeded, exit 0
  fail               Running -> Failed (message "worker-0 failed"), exit 1
  fail_with_error_line  the same, printing the master's error line with that message first
  crash              Running, then exit 3 without a final phase (master died)
  hang               Running until SIGTERM; on SIGTERM it writes "terminating" to its log
                     and exits 143 without a final phase (like a master being cancelled),
                     after $FAKE_MASTER_TERM_SECONDS (default 0) of "shutting down"
  ignore_term        Running and ignores SIGTERM (the client must SIGKILL it)
$FAKE_MASTER_STEPS sets how many progress steps succeed/fail take (0.1 s each, default 5).
It also writes the argv it got to argv.json so tests can check what the client sent.
"""

import json
import os
import signal
import sys
import time
from pathlib import Path

# Read the spec with the real master's reader, so a spec the client writes that the master
# would reject fails these tests too (exit 2 and a one-line error, like the real master).
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from elasticdl.common.job_dir import write_atomically  # noqa: E402
from elasticdl.common.job_spec import spec_from_master_argv  # noqa: E402

try:
    spec = spec_from_master_argv(sys.argv[1:])
except ValueError as e:
    print(f"elasticdl master: error: {e}", file=sys.stderr)
    sys.exit(2)

job_name = spec.job_name
job_dir = spec.job_dir
mode = os.environ.get("FAKE_MASTER_MODE", "succeed")
steps = int(os.environ.get("FAKE_MASTER_STEPS", "5"))
os.makedirs(os.path.join(job_dir, "logs"), exist_ok=True)
with open(os.path.join(job_dir, "argv.json"), "w") as f:
    json.dump(sys.argv[1:], f)


def write_status(phase, step, message=""):
    data = {
        "job_name": job_name,
        "phase": phase,
        "model_version": step * 10,
        "tasks_todo": max(0, steps - step),
        "tasks_doing": 0 if phase != "Running" else 1,
        "tasks_done": step,
        "tasks_retried": 0,
        "records_trained": step * 100,
        "records_expected": steps * 100,
        "epoch": 1,
        "evaluation_metrics": {"accuracy": 0.5 + step / 100.0} if step else {},
        "replicas": [
            {"name": "ps-0", "type": "ps", "id": 0, "phase": "Running"},
            {"name": "worker-0", "type": "worker", "id": 0, "phase": "Running", "restarts": 0},
        ],
        "message": message,
        "updated_at": time.time(),
        "future_field": "ignored by older clients",
    }
    path = os.path.join(job_dir, "status.json")
    write_atomically(path, json.dumps(data))


def on_term(signum, frame):
    print("terminating", flush=True)
    # Like the real master stopping its PS and workers: shutting down takes a while.
    time.sleep(float(os.environ.get("FAKE_MASTER_TERM_SECONDS", "0")))
    print("stopped cleanly", flush=True)
    sys.exit(143)


if mode == "ignore_term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, on_term)

print(f"fake master of {job_name} starting", flush=True)
with open(os.path.join(job_dir, "logs", "worker-0.log"), "a") as log:
    log.write("worker-0 started\n")
write_status("Running", 0)

if mode in ("hang", "ignore_term"):
    while True:
        time.sleep(0.1)

for step in range(1, steps + 1):
    time.sleep(0.1)
    print(f"step {step} version {step * 10}", flush=True)
    if step < steps:
        write_status("Running", step)

if mode == "crash":
    print("fatal: something broke", flush=True)
    sys.exit(3)
if mode in ("fail", "fail_with_error_line"):
    if mode == "fail_with_error_line":  # the real master prints the reason it fails with
        print("elasticdl master: error: worker-0 failed", flush=True)
    write_status("Failed", steps, "worker-0 failed")
    print("job failed", flush=True)
    sys.exit(1)
write_status("Succeeded", steps)
print("job succeeded", flush=True)
