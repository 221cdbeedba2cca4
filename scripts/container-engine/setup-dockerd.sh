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

# 4. Base image (kept in the engine's data root across restarts), labelled with what it is made
# of: imported again when the host's packages (or how the rootfs is made) change.
if [[ $ROOTFS == debootstrap ]]; then
  base_key=debootstrap-bookworm
else
  base_key=$(python3 "$HERE/make_base_rootfs.py" --key 2>>"$W/rootfs.log") ||
    die "make_base_rootfs.py --key failed, see $W/rootfs.log"
fi
have_key=$(curl -sf --unix-socket "$SOCK" http://engine/images/local/base:latest/json |
  python3 -c 'import json, sys; print((json.load(sys.stdin)["Config"].get("Labels") or {}).get("org.elasticdl.base-rootfs", ""))' 2>/dev/null || true)
if [[ $have_key != "$base_key" ]]; then
  if [[ $ROOTFS == debootstrap ]]; then
    mirror=$(awk '/^URIs:/ && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
    rm -rf "$W/rootfs"
    debootstrap --variant=minbase --include=python3,python3-pip,ca-certificates bookworm \
      "$W/rootfs" ${mirror:+"$mirror"} >"$W/debootstrap.log" 2>&1 || die "debootstrap failed, see $W/debootstrap.log"
    rm -rf "$W"/rootfs/var/cache/apt/archives/*.deb "$W"/rootfs/var/lib/apt/lists/*
    cp /etc/ssl/certs/ca-certificates.crt "$W/rootfs/etc/ssl/certs/ca-certificates.crt"
    tar -C "$W/rootfs" -cf "$W/base.tar" . && rm -rf "$W/rootfs"
  else
    python3 "$HERE/make_base_rootfs.py" "$W/base.tar" 2>>"$W/rootfs.log" || die "make_base_rootfs.py failed, see $W/rootfs.log"
  fi
  # PIP_BREAK_SYSTEM_PACKAGES: Debian's pip refuses system-wide installs otherwise (PEP 668);
  # an image is its own environment.
  # Debian's CLI first: a newer /usr/local/bin/docker may shadow it (both work).
  cli=/usr/bin/docker; [[ -x $cli ]] || cli=docker
  DOCKER_HOST="unix://$SOCK" "$cli" import --change 'CMD ["/bin/bash"]' \
    --change 'ENV PIP_BREAK_SYSTEM_PACKAGES=1' --change 'ENV PIP_ROOT_USER_ACTION=ignore' \
    --change "LABEL org.elasticdl.base-rootfs=$base_key" \
    "$W/base.tar" local/base:latest >"$W/import.log" 2>&1 ||
    die "importing local/base failed, see $W/import.log"
  rm -f "$W/base.tar"
  say "imported local/base:latest ($ROOTFS)"
fi

say "ready"
echo "DOCKER_HOST=unix://$SOCK"
