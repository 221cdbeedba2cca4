#!/usr/bin/env bash
# Make sure one Docker Engine holds local/base:latest (Debian 12 with python3 + pip) made from
# what it should be made of, and import it when it is missing or stale. Used by setup-dockerd.sh
# (the image-build engine) and scripts/k8s/start-node.sh base-image (node 1's engine).
#
#   scripts/container-engine/base-image.sh ENGINE_SOCKET WORK_DIR [hostcopy|debootstrap]
#
# The image carries what it is made of as the label org.elasticdl.base-rootfs: the key of the
# host's packages (make_base_rootfs.py --key) for `hostcopy` (the default), or
# `debootstrap-bookworm`; a host whose packages changed gets a new image. WORK_DIR holds the
# rootfs tarball while it is imported and the logs (rootfs.log, debootstrap.log, import.log).
# Only stdout line: local/base:latest; progress and errors go to stderr.
set -euo pipefail

usage() { echo "usage: $0 ENGINE_SOCKET WORK_DIR [hostcopy|debootstrap]" >&2; exit 2; }
(($# == 2 || $# == 3)) || usage
SOCK=$1 W=$2 ROOTFS=${3:-hostcopy}
[[ $ROOTFS == hostcopy || $ROOTFS == debootstrap ]] || usage
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
IMAGE=local/base:latest
LABEL=org.elasticdl.base-rootfs
die() { echo "base-image: error: $*" >&2; exit 1; }

[[ -S $SOCK ]] || die "no engine socket at $SOCK (start the engine first)"
mkdir -p "$W"

if [[ $ROOTFS == debootstrap ]]; then
  key=debootstrap-bookworm
else
  key=$(python3 "$HERE/make_base_rootfs.py" --key 2>>"$W/rootfs.log") ||
    die "make_base_rootfs.py --key failed, see $W/rootfs.log"
fi
have=$(curl -sf --unix-socket "$SOCK" "http://engine/images/$IMAGE/json" |
  python3 -c "import json, sys; print((json.load(sys.stdin)['Config'].get('Labels') or {}).get('$LABEL', ''))" \
    2>/dev/null || true)
if [[ $have == "$key" ]]; then
  echo "$IMAGE"
  exit 0
fi

tarball=$W/base.tar
if [[ $ROOTFS == debootstrap ]]; then
  mirror=$(awk '/^URIs:/ && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
  rm -rf "$W/rootfs"
  debootstrap --variant=minbase --include=python3,python3-pip,ca-certificates bookworm \
    "$W/rootfs" ${mirror:+"$mirror"} >"$W/debootstrap.log" 2>&1 || die "debootstrap failed, see $W/debootstrap.log"
  rm -rf "$W"/rootfs/var/cache/apt/archives/*.deb "$W"/rootfs/var/lib/apt/lists/*
  cp /etc/ssl/certs/ca-certificates.crt "$W/rootfs/etc/ssl/certs/ca-certificates.crt"
  tar -C "$W/rootfs" -cf "$tarball" . && rm -rf "$W/rootfs"
else
  python3 "$HERE/make_base_rootfs.py" "$tarball" 2>>"$W/rootfs.log" ||
    die "make_base_rootfs.py failed, see $W/rootfs.log"
fi
# PIP_BREAK_SYSTEM_PACKAGES: Debian's pip refuses system-wide installs otherwise (PEP 668); an
# image is its own environment. Debian's CLI first: a newer /usr/local/bin/docker may shadow it.
cli=/usr/bin/docker
[[ -x $cli ]] || cli=docker
DOCKER_HOST="unix://$SOCK" "$cli" import --change 'CMD ["/bin/bash"]' \
  --change 'ENV PIP_BREAK_SYSTEM_PACKAGES=1' --change 'ENV PIP_ROOT_USER_ACTION=ignore' \
  --change "LABEL $LABEL=$key" "$tarball" "$IMAGE" >"$W/import.log" 2>&1 ||
  { rm -f "$tarball"; die "importing $IMAGE failed, see $W/import.log"; }
rm -f "$tarball"
echo "base-image: imported $IMAGE ($ROOTFS)" >&2
echo "$IMAGE"
