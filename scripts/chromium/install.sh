#!/usr/bin/env bash
# Install Debian's chromium and chromium-driver (the dashboard's browser test drives them) when
# missing. Needs root; quiet and ~0 s when both are installed.
set -euo pipefail
die() { echo "chromium/install: error: $*" >&2; exit 1; }
need=()
command -v chromium >/dev/null || need+=(chromium)
command -v chromedriver >/dev/null || need+=(chromium-driver)
((${#need[@]})) || exit 0
[[ $(id -u) == 0 ]] || die "installing ${need[*]} needs root"
log=${TMPDIR:-/tmp}/elasticdl-chromium-apt.log
export DEBIAN_FRONTEND=noninteractive
# Other set-up scripts may hold the dpkg lock: wait for it instead of failing.
apt_install() { apt-get install -y -q -o DPkg::Lock::Timeout=300 --no-install-recommends "${need[@]}"; }
# `apt-get update` only when the package lists are too old to install from.
apt_install >"$log" 2>&1 ||
  { apt-get update -q -o DPkg::Lock::Timeout=300 >>"$log" 2>&1 && apt_install >>"$log" 2>&1; } ||
  die "apt-get install ${need[*]} failed, see $log"
echo "chromium/install: installed ${need[*]}" >&2
