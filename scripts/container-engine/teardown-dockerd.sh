#!/usr/bin/env bash
# Stop the engine and registry started by setup-dockerd.sh (by their pids, nothing else).
#   teardown-dockerd.sh           stop; keep images, build cache and registry data
#   teardown-dockerd.sh --purge   stop and delete $ELASTICDL_ENGINE_DIR
# The docker0 bridge and iptables rules dockerd added stay (harmless; reused next start).
set -uo pipefail
W=${ELASTICDL_ENGINE_DIR:-/tmp/elasticdl-engine}
[[ -d $W ]] || exit 0
exec 9>"$W/setup.lock"
flock 9
for p in registry dockerd; do
  [[ -f $W/$p.pid ]] && kill "$(cat "$W/$p.pid")" 2>/dev/null
done
for p in registry dockerd; do
  if [[ -f $W/$p.pid ]]; then
    pid=$(cat "$W/$p.pid")
    for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -0 "$pid" 2>/dev/null && { echo "teardown-dockerd: $p (pid $pid) still running" >&2; exit 1; }
    rm -f "$W/$p.pid"
  fi
done
umount "$W/exec/netns/default" 2>/dev/null || true
if [[ ${1:-} == --purge ]]; then
  # Leftover mounts under data/ (should be none once dockerd exited) would make rm fail loudly.
  grep -o " $W/[^ ]*" /proc/mounts | sort -r | xargs -r -n1 umount 2>/dev/null || true
  rm -rf "$W"
fi
echo "teardown-dockerd: stopped" >&2
