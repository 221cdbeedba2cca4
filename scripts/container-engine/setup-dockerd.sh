#!/usr/bin/env bash
# Start a private Docker Engine (Debian's dockerd) + a local registry for ElasticDL image
# builds, tests and CI. Idempotent: what already runs is kept; a second call takes ~0.1 s.
#
#   scripts/container-engine/setup-dockerd.sh      # prints DOCKER_HOST=unix://.../docker.sock
#   eval "export $(scripts/container-engine/setup-dockerd.sh)"
#
# What it provides (all under $ELASTICDL_ENGINE_DIR, default /tmp/elasticdl-engine):
#   - dockerd with its data, exec root, socket and pidfile in that directory (it does not touch
#     /var/lib/docker or /var/run/docker.sock), 127.0.0.1:5000 marked insecure;
#   - a registry (Debian's docker-registry) on 127.0.0.1:5000;
#   - local/base:latest, a Debian 12 base image with python3 + pip made from the host's own
#     packages (no registry needed; make_base_rootfs.py), or with debootstrap when
#     ELASTICDL_BASE_ROOTFS=debootstrap.
# Env: ELASTICDL_ENGINE_DIR, ELASTICDL_REGISTRY_ADDR (127.0.0.1:5000),
#      ELASTICDL_STORAGE_DRIVER (empty = dockerd's choice, overlay2 here; "vfs" where overlay
#      mounts are not allowed), ELASTICDL_BASE_ROOTFS (hostcopy|debootstrap).
# Only stdout line: DOCKER_HOST=...; progress goes to stderr. Stop with teardown-dockerd.sh.
set -euo pipefail

W=${ELASTICDL_ENGINE_DIR:-/tmp/elasticdl-engine}
REGISTRY=${ELASTICDL_REGISTRY_ADDR:-127.0.0.1:5000}
STORAGE=${ELASTICDL_STORAGE_DRIVER:-}
ROOTFS=${ELASTICDL_BASE_ROOTFS:-hostcopy}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SOCK="$W/docker.sock"
t0=$(date +%s.%N)
say() { awk -v m="$1" -v t0="$t0" -v t="$(date +%s.%N)" 'BEGIN { printf "setup-dockerd: %-26s %5.1fs\n", m, t - t0 }' >&2; }
die() { echo "setup-dockerd: error: $*" >&2; exit 1; }

[[ $(id -u) == 0 ]] || die "needs root (dockerd and apt-get); run it with sudo"
mkdir -p "$W"
# Concurrent callers (parallel test processes) wait for the first one to finish.
exec 9>"$W/setup.lock"
flock 9

engine_up() { curl -sf --max-time 2 --unix-socket "$SOCK" http://engine/_ping >/dev/null 2>&1; }
registry_up() { curl -sf --max-time 2 "http://$REGISTRY/v2/" >/dev/null 2>&1; }
alive() { [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

# 1. Packages (only when missing).
"$HERE/install.sh"

# 2. dockerd.
if ! engine_up; then
  alive "$W/dockerd.pid" && die "dockerd (pid $(cat "$W/dockerd.pid")) runs but does not answer on $SOCK; run teardown-dockerd.sh"
  storage_line=""
  [[ -n $STORAGE ]] && storage_line="\"storage-driver\": \"$STORAGE\","
  cat >"$W/daemon.json" <<JSON
{ "data-root": "$W/data", "exec-root": "$W/exec", "pidfile": "$W/dockerd.pidfile",
  $storage_line
  "hosts": ["unix://$SOCK"], "insecure-registries": ["$REGISTRY"] }
JSON
  # setsid + redirected output: the engine outlives this script and holds none of the
  # caller's pipes (a test harness waiting on our stdout would otherwise hang) nor our lock.
  setsid dockerd --config-file "$W/daemon.json" </dev/null 9>&- >"$W/dockerd.log" 2>&1 &
  echo $! >"$W/dockerd.pid"
  for _ in $(seq 150); do engine_up && break; sleep 0.2; done
  engine_up || die "dockerd did not come up within 30 s, see $W/dockerd.log"
  say "dockerd started"
fi

# 3. Registry.
if ! registry_up; then
  cat >"$W/registry.yml" <<YML
version: 0.1
log: { level: warn }
storage: { filesystem: { rootdirectory: $W/registry-data }, delete: { enabled: true } }
http: { addr: $REGISTRY }
YML
  setsid docker-registry serve "$W/registry.yml" </dev/null 9>&- >"$W/registry.log" 2>&1 &
  echo $! >"$W/registry.pid"
  for _ in $(seq 50); do registry_up && break; sleep 0.2; done
  registry_up || die "registry did not come up on $REGISTRY, see $W/registry.log"
  say "registry started"
fi

# 4. Base image (kept in the engine's data root across restarts; base-image.sh imports it again
# when what it is made of changes).
"$HERE/base-image.sh" "$SOCK" "$W" "$ROOTFS" >/dev/null
say "base image ready"

say "ready"
echo "DOCKER_HOST=unix://$SOCK"
