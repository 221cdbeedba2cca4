#!/usr/bin/env bash
# Install the container engine packages (Debian's docker.io and docker-registry; debootstrap
# too with ELASTICDL_BASE_ROOTFS=debootstrap) when missing. Starts nothing: setup-dockerd.sh
# does (and calls this first). Needs root; quiet and ~0 s when all is installed.
set -euo pipefail
die() { echo "container-engine/install: error: $*" >&2; exit 1; }
need=()
command -v dockerd >/dev/null || need+=(docker.io)
command -v docker-registry >/dev/null || need+=(docker-registry)
command -v curl >/dev/null || need+=(curl)
command -v flock >/dev/null || need+=(util-linux)
[[ ${ELASTICDL_BASE_ROOTFS:-hostcopy} == debootstrap ]] && ! command -v debootstrap >/dev/null && need+=(debootstrap)
((${#need[@]})) || exit 0
[[ $(id -u) == 0 ]] || die "installing ${need[*]} needs root"
log=${TMPDIR:-/tmp}/elasticdl-engine-apt.log
export DEBIAN_FRONTEND=noninteractive
# `apt-get update` only when the package lists are too old to install from.
apt-get install -y -q -o DPkg::Lock::Timeout=300 --no-install-recommends "${need[@]}" >"$log" 2>&1 ||
  { apt-get update -q -o DPkg::Lock::Timeout=300 >>"$log" 2>&1 && apt-get install -y -q -o DPkg::Lock::Timeout=300 --no-install-recommends "${need[@]}" >>"$log" 2>&1; } ||
  die "apt-get install ${need[*]} failed, see $log"
echo "container-engine/install: installed ${need[*]}" >&2
