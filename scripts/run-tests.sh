#!/usr/bin/env bash
# The test command: installs what a fresh machine lacks, runs the tests with Pants, and ends
# with a per-tier table (scripts/ci/tier_summary.py: tier, files, tests, skips, seconds).
#   scripts/run-tests.sh            # set-up + ./pants test ::
#   scripts/run-tests.sh path::     # set-up + ./pants test path::
#
# CI mode -- ELASTICDL_CI=1 (.ci/run sets it) or CI=true (hosted CI services set it) -- means
# a green run proves every tier ran:
#   * a tier whose set-up is impossible here (the real node without cgroup v1, say) fails the
#     run at once, unless ELASTICDL_CI_SKIP_TIERS names it (comma-separated tier names; see
#     `python3 scripts/ci/tiers.py list`); the opted-out tiers are left out of `./pants test`
#     and the variable is printed at the start and at the end;
#   * every ELASTICDL_REQUIRE_* flag is exported, so a test that finds its capability missing
#     (an engine, a tmpfs, the native kernels, the wheels ...) fails instead of skipping;
#   * a skipped test that scripts/ci/skip_allow_list.py does not accept fails the run.
# Outside CI mode the set-up does what the machine allows, exports the flags of what it set
# up, and lists the skips that CI would refuse without failing.
#
# Slow, machine-wide set-up (the Kubernetes build, the container engine's images, the image
# wheels) is cached outside the repo (~/.cache/elasticdl, /tmp/elasticdl-engine) and reused.
# The Kubernetes build (Go, private apt state) runs in the background while the Debian
# packages are installed -- one apt at a time: Debian's apt takes a lock -- and Pants packages
# the wheels; if it still runs then (a fresh machine), the tiers that do not need it are tested
# meanwhile and the Kubernetes tiers after it. Logs of this run: dist/ci/ (the set-up steps'
# times, the Kubernetes build, the ./pants test output).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
log() { echo "[run-tests] $*" >&2; }
die() { echo "[run-tests] error: $*" >&2; exit 1; }
started=$(date +%s.%N)

ci=0
if [[ ${ELASTICDL_CI:-} == 1 || ${CI:-} == true ]]; then ci=1; fi
skip_tiers=${ELASTICDL_CI_SKIP_TIERS:-}
# Validates the names too (one line naming the tiers there are).
exclude_specs=$(python3 scripts/ci/tiers.py exclude-specs "$skip_tiers") || exit 2
opted_out() { [[ " ${skip_tiers//,/ } " == *" $1 "* ]]; }
if ((ci)); then
  log "CI mode (ELASTICDL_CI=${ELASTICDL_CI:-} CI=${CI:-}): every tier must run;" \
    "ELASTICDL_CI_SKIP_TIERS=${skip_tiers:-(none)}"
fi

logs="$root/dist/ci"
rm -rf "$logs" && mkdir -p "$logs"
setup_times="$logs/setup-times.tsv"
: >"$setup_times"
# record STEP START [NOTE]: the step's seconds since START, for the summary.
record() {
  awk -v s="$1" -v t0="$2" -v t="$(date +%s.%N)" -v n="${3:-}" \
    'BEGIN { printf "%s\t%.1f\t%s\n", s, t - t0, n }' >>"$setup_times"
}

is_root=0
[[ $(id -u) == 0 ]] && is_root=1
if ((ci)) && { ((!is_root)) || ! command -v apt-get >/dev/null; }; then
  die "CI mode needs root and apt-get (it installs Debian packages, mounts tmpfs, runs dockerd)"
fi

t=$(date +%s.%N)
if ((is_root)) && command -v apt-get >/dev/null; then
  # Debian package lists are needed by the Pants bootstrap (protoc) and the dataset/engine/k8s
  # set-up scripts; refresh them once a day at most.
  stamp=/var/lib/apt/lists/.elasticdl-updated
  if [ -z "$(find "$stamp" -mmin -1440 2>/dev/null)" ]; then
    log "apt-get update"
    apt-get -qq -o DPkg::Lock::Timeout=300 update && touch "$stamp"
  fi
fi
record "apt-get update" "$t"

# Kubernetes 1.20.2 built from Debian's source package, cached in ~/.cache/elasticdl (~10-15 min
# once): kube-apiserver + etcd + controller-manager for the Kubernetes tests with the stand-in
# kubelet, and where the machine can run a real node (root, cgroup v1) also kube-scheduler,
# kubelet, kubectl and busybox for the real-node tests (tests/python/elasticdl_tests/k8s_node).
# Its apt state is private (download-only, no lock): it runs beside the installs below.
node_unavailable() {
  ((is_root)) || { echo "it needs root"; return; }
  [[ -d /sys/fs/cgroup/memory ]] || { echo "it needs cgroup v1 (no /sys/fs/cgroup/memory)"; return; }
  [[ -x scripts/k8s/build-node.sh ]] || { echo "scripts/k8s/build-node.sh is missing"; return; }
}
k8s_build="" k8s_pid=""
if ! opted_out k8s-node && [[ -z $(node_unavailable) ]]; then
  k8s_build=scripts/k8s/build-node.sh
  export ELASTICDL_REQUIRE_K8S=1 ELASTICDL_REQUIRE_K8S_NODE=1
elif ! opted_out k8s-node && ((ci)); then
  die "the k8s-node tier cannot run here: $(node_unavailable); set ELASTICDL_CI_SKIP_TIERS=k8s-node to run without it"
elif ! opted_out k8s && [[ -x scripts/k8s/build-apiserver.sh ]]; then
  k8s_build=scripts/k8s/build-apiserver.sh
  export ELASTICDL_REQUIRE_K8S=1
  opted_out k8s-node || log "no real node here ($(node_unavailable)): its tests skip"
elif ! opted_out k8s && ((ci)); then
  die "the k8s tier cannot run here: scripts/k8s/build-apiserver.sh is missing"
fi
# Job control: each background step runs in its own process group, so that a failed set-up
# can stop a whole build (make, go) with it.
set -m
k8s_job() {
  local t0 rc=0 how=built
  t0=$(date +%s.%N)
  "$k8s_build" >"$logs/k8s-build.log" 2>&1 </dev/null || rc=$?
  grep -q "nothing to do" "$logs/k8s-build.log" && how=cached
  ((rc == 0)) || how="failed (exit $rc)"
  record "Kubernetes build" "$t0" "background; $how"
  return "$rc"
}
if [[ -n $k8s_build ]]; then
  log "Kubernetes (cached build) in the background: $k8s_build, log dist/ci/k8s-build.log"
  k8s_job &
  k8s_pid=$!
fi
stop_background() {
  if [[ -n $k8s_pid ]] && kill -0 "$k8s_pid" 2>/dev/null; then
    log "stopping the Kubernetes build (pid $k8s_pid)"
    kill -- -"$k8s_pid" 2>/dev/null || true
  fi
}
trap stop_background EXIT

# setup STEP FLAG COMMAND...: a set-up step the tests need; FLAG is exported when it worked.
# Under CI a failure ends the run; elsewhere the tests it serves skip (and say why).
setup() {
  local step=$1 flag=$2 t0 rc=0
  shift 2
  t0=$(date +%s.%N)
  log "$step"
  "$@" || rc=$?
  record "$step" "$t0" "$( ((rc == 0)) || echo "failed (exit $rc)")"
  if ((rc == 0)); then
    [[ -z $flag ]] || export "$flag=1"
  elif ((ci)); then
    die "$step failed (exit $rc)"
  else
    log "$step failed (exit $rc): the tests that need it skip"
  fi
}
apt_install() {
  apt-get -qq install -y -o DPkg::Lock::Timeout=300 --no-install-recommends "$@" >/dev/null
}

# Debian's openssl: the mutual-TLS tests make their certificates with it (master/tls_test.py).
if ! command -v openssl >/dev/null && ((is_root)) && command -v apt-get >/dev/null; then
  setup "openssl package" "" apt_install openssl
fi
# A real container engine + local registry for the image tests (and docker-registry for
# src/python/elasticdl/images/oci_build_test.py).
# (The engine itself needs root: elsewhere its tests skip, saying so.)
if [[ -x scripts/container-engine/install.sh ]]; then
  setup "container engine packages" "$( ((is_root)) && echo ELASTICDL_REQUIRE_ENGINE)" \
    scripts/container-engine/install.sh
fi
# Debian's chromium + chromedriver for the dashboards' browser tests.
if [[ -x scripts/chromium/install.sh ]] && ! { opted_out dashboard && opted_out k8s; }; then
  setup "chromium packages" ELASTICDL_REQUIRE_CHROMIUM scripts/chromium/install.sh
fi
# The checkpoint tests fill a small tmpfs (mounting one needs root); the ops tests must run on
# the native kernels that Pants builds (src/cc:native), not on the NumPy reference.
if ((ci || is_root)); then export ELASTICDL_REQUIRE_TMPFS=1; fi
export ELASTICDL_REQUIRE_NATIVE_OPS=1
# The autoscaling and straggler tests throttle a replica through its cgroup's CPU quota (cgroup
# v1, root): under CI a machine without it fails them instead of skipping.
if ((ci || is_root)); then export ELASTICDL_REQUIRE_CGROUP_CPU=1; fi

# The image tests' engine: started now (dockerd, the registry, local/base) so that the first
# image test does not wait for it. The tests stop it when the last of them ends, as when they
# start it themselves (tests/python/elasticdl_tests/images/engine.py).
engine_pid=""
engine_dir=${ELASTICDL_ENGINE_DIR:-/tmp/elasticdl-engine}
if [[ ${ELASTICDL_REQUIRE_ENGINE:-} == 1 ]] && ! { opted_out images && opted_out gpu-image; }; then
  (
    t0=$(date +%s.%N)
    if scripts/container-engine/setup-dockerd.sh >"$logs/engine.out" 2>"$logs/engine.log"; then
      grep -q "dockerd started" "$logs/engine.log" && touch "$engine_dir/started-by-tests"
      record "container engine start" "$t0" "background"
    else
      record "container engine start" "$t0" "failed: see dist/ci/engine.log (the tests retry)"
    fi
  ) &
  engine_pid=$!
fi

# The CPU base-image test installs the project's own wheels into an image, and the real-node
# server test the server wheel into its image: build them first.
t=$(date +%s.%N)
log "./pants package (wheels for the image tests)"
./pants package //:elasticdl-wheel src/python:elasticdl-client-wheel src/cc:native //:elasticdl-server-wheel
record "./pants package" "$t"
export ELASTICDL_WHEEL_DIR="$root/dist" ELASTICDL_SOURCE_ROOT="$root"
# The image and real-node tests name this in their environment: new wheels, new cache key.
ELASTICDL_WHEELS_DIGEST=$(python3 scripts/ci/wheels_digest.py "$ELASTICDL_WHEEL_DIR")
export ELASTICDL_WHEELS_DIGEST

[[ -z $engine_pid ]] || wait "$engine_pid" || true
record "set-up before the tests" "$started"

targets=("$@")
full=0
if [ ${#targets[@]} -eq 0 ]; then
  targets=("::")
  full=1
fi
read -ra excluded <<<"$exclude_specs"
# Reports of an earlier run would count again; the two runs below add theirs to one directory.
rm -rf dist/test/reports
: >"$logs/pants-test.log"
tests_rc=0
# Under CI the tests end by a deadline (seconds since this script started; .ci/run's limit less
# the summary's margin), so that a run that grew too long still prints its per-tier table and
# slowest files instead of being killed without them.
deadline_s=${ELASTICDL_CI_DEADLINE_S:-5220}
[[ $deadline_s =~ ^[0-9]+$ ]] || die "ELASTICDL_CI_DEADLINE_S=$deadline_s: give whole seconds"
pants_run() { # LOG PANTS_ARGS...: one ./pants run, its output added to LOG, its failure kept
  local out=$1 rc bound=()
  shift
  if ((ci)); then
    local left
    left=$(awk -v t0="$started" -v t="$(date +%s.%N)" -v d="$deadline_s" 'BEGIN { printf "%d", d - (t - t0) }')
    ((left > 0)) || left=1
    bound=(timeout --signal=INT --kill-after=60 "$left")
    log "tests end by the CI deadline: ${left}s from now (ELASTICDL_CI_DEADLINE_S=$deadline_s)"
  fi
  log "./pants $*"
  set +e
  ${bound[@]+"${bound[@]}"} ./pants "$@" 2>&1 | tee -a "$out"
  rc=${PIPESTATUS[0]}
  set -e
  ((rc != 124)) || log "error: the tests ran past the CI deadline (ELASTICDL_CI_DEADLINE_S=$deadline_s)"
  ((rc == 0)) || tests_rc=$rc
}
pants_test() { pants_run "$logs/pants-test.log" test "$@"; }
# The real-cluster tier (k8s-node) runs as a Pants run of its own, one file at a time, beside
# the other tiers: its files take the one cluster in turn, six of them alone, and inside the
# shared run a file waiting for the cluster held one of Pants' slots idle while the other tiers
# queued (both slots waited on the cluster for minutes at a time). Its output goes to its own
# log, shown after the other tiers' and added to the log the summary reads.
node_specs=()
if ((full)) && ! opted_out k8s-node; then
  read -ra node_specs <<<"$(python3 scripts/ci/tiers.py specs k8s-node)"
fi
node_log="$logs/pants-test-k8s-node.log"
node_pid=""
start_node_tier() {
  ((${#node_specs[@]})) || return 0
  : >"$node_log"
  (
    # Up for the whole tier, so that no file stops it for the next one to start again (a file
    # that finds the cluster up leaves it up); stopped after the tier if this started it.
    cluster=(bash scripts/k8s/start-node.sh)
    started_here=0
    if ! "${cluster[@]}" status >/dev/null 2>&1; then
      if "${cluster[@]}" start >"$logs/k8s-node-start.log" 2>&1; then
        started_here=1
      else
        log "start-node.sh start failed (dist/ci/k8s-node-start.log): the tier's files start it"
      fi
    fi
    tests_rc=0
    pants_run "$node_log" --concurrent --process-execution-local-parallelism=1 \
      test "${node_specs[@]}" >/dev/null
    echo "$tests_rc" >"$node_log.rc"
    if ((started_here)) && ! "${cluster[@]}" stop >>"$logs/k8s-node-start.log" 2>&1; then
      log "start-node.sh stop failed after the tier: see dist/ci/k8s-node-start.log"
      echo 1 >"$node_log.rc"
    fi
  ) &
  node_pid=$!
  log "the real-cluster tier in the background (pid $node_pid), log dist/ci/${node_log##*/}"
}
wait_node_tier() {
  [[ -n $node_pid ]] || return 0
  wait "$node_pid" || true
  node_pid=""
  local rc
  rc=$(cat "$node_log.rc" 2>/dev/null || echo 1)
  ((rc == 0)) || tests_rc=$rc
  log "the real-cluster tier's ./pants test (exit $rc):"
  cat "$node_log"
  cat "$node_log" >>"$logs/pants-test.log"
}
wait_for_kubernetes() {
  [[ -n $k8s_pid ]] || return 0
  log "waiting for the Kubernetes build"
  local rc=0
  wait "$k8s_pid" || rc=$?
  k8s_pid=""
  ((rc == 0)) && return 0
  tail -n 20 "$logs/k8s-build.log" >&2
  log "error: $k8s_build failed (exit $rc), see dist/ci/k8s-build.log"
  return 1
}

k8s_specs=()
if ((full)) && [[ -n $k8s_pid ]] && kill -0 "$k8s_pid" 2>/dev/null; then
  # Kubernetes is still being built (a fresh machine): the tiers that do not need it run
  # meanwhile, then those that do.
  names=""
  for tier in $(python3 scripts/ci/tiers.py kubernetes-tiers | tr , ' '); do
    opted_out "$tier" || names+="$tier,"
  done
  read -ra k8s_specs <<<"$(python3 scripts/ci/tiers.py specs "$names")"
fi
if ((${#k8s_specs[@]})); then
  pants_test "${targets[@]}" ${excluded[@]+"${excluded[@]}"} "${k8s_specs[@]/#/-}"
  if wait_for_kubernetes; then
    start_node_tier
    rest=()
    for spec in "${k8s_specs[@]}"; do
      [[ " ${node_specs[*]-} " == *" $spec "* ]] || rest+=("$spec")
    done
    ((${#rest[@]} == 0)) || pants_test "${rest[@]}"
  else
    tests_rc=1 # the table shows those tiers as not run
  fi
else
  wait_for_kubernetes || exit 1
  start_node_tier
  pants_test "${targets[@]}" ${excluded[@]+"${excluded[@]}"} ${node_specs[@]+"${node_specs[@]/#/-}"}
fi
wait_node_tier
# An engine started for the image tests that none of them stopped (their results all came
# from Pants' cache, say) stops now; one a developer started is left alone.
if [[ -f $engine_dir/started-by-tests && -x scripts/container-engine/teardown-dockerd.sh ]]; then
  rm -f "$engine_dir/started-by-tests"
  ELASTICDL_ENGINE_DIR=$engine_dir scripts/container-engine/teardown-dockerd.sh >/dev/null 2>&1 ||
    log "stopping the test engine failed: scripts/container-engine/teardown-dockerd.sh"
fi

summary=(--reports dist/test/reports --pants-log "$logs/pants-test.log" --setup "$setup_times")
((ci)) && summary+=(--strict)
((ci && full)) && summary+=(--expect-all-tiers)
summary_rc=0
python3 scripts/ci/tier_summary.py "${summary[@]}" --skip-tiers "$skip_tiers" \
  --wall-seconds "$(awk -v t0="$started" -v t="$(date +%s.%N)" 'BEGIN { print t - t0 }')" ||
  summary_rc=$?
mode="outside CI mode"
((ci)) && mode="CI mode"
log "$mode; ELASTICDL_CI_SKIP_TIERS=${skip_tiers:-(none)}; ./pants test exit $tests_rc," \
  "skip check exit $summary_rc"
((tests_rc == 0)) || exit "$tests_rc"
exit "$summary_rc"
