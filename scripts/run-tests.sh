#!/usr/bin/env bash
# The test command: installs what a fresh machine lacks, then runs every test with Pants.
#   scripts/run-tests.sh            # set-up + ./pants test ::
#   scripts/run-tests.sh path::     # set-up + ./pants test path::
# Slow, machine-wide set-up (the kube-apiserver build, the container engine) is cached outside
# the repo (~/.cache/elasticdl) and reused by later runs.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
log() { echo "[run-tests] $*" >&2; }

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  # Debian package lists are needed by the Pants bootstrap (protoc) and the dataset/engine/k8s
  # set-up scripts; refresh them once a day at most.
  stamp=/var/lib/apt/lists/.elasticdl-updated
  if [ -z "$(find "$stamp" -mmin -1440 2>/dev/null)" ]; then
    log "apt-get update"
    apt-get -qq update && touch "$stamp"
  fi
fi

# Debian's openssl: the mutual-TLS tests make their certificates with it (master/tls_test.py).
if ! command -v openssl >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  log "openssl"
  apt-get -qq install -y --no-install-recommends openssl >/dev/null
fi

# Kubernetes 1.20.2 built from Debian's source package, cached in ~/.cache/elasticdl (~10-15 min
# once): kube-apiserver + etcd + controller-manager for the Kubernetes tests with the stand-in
# kubelet, and where the machine can run a real node (root, cgroup v1) also kube-scheduler,
# kubelet, kubectl and busybox for the real-node tests (tests/python/elasticdl_tests/k8s_node).
if [ "$(id -u)" = 0 ] && [ -d /sys/fs/cgroup/memory ] && [ -x scripts/k8s/build-node.sh ]; then
  log "Kubernetes control plane + kubelet (cached build)"
  scripts/k8s/build-node.sh
  export ELASTICDL_REQUIRE_K8S=1 ELASTICDL_REQUIRE_K8S_NODE=1
elif [ -x scripts/k8s/build-apiserver.sh ]; then
  log "kube-apiserver (cached build); no real node here (needs root and cgroup v1)"
  scripts/k8s/build-apiserver.sh
  export ELASTICDL_REQUIRE_K8S=1
fi
# A real container engine + local registry for the image tests.
if [ -x scripts/container-engine/install.sh ]; then
  log "container engine packages"
  scripts/container-engine/install.sh
  export ELASTICDL_REQUIRE_ENGINE=1
fi

# Debian's chromium + chromedriver for the dashboard's browser test.
if [ -x scripts/chromium/install.sh ]; then
  log "chromium packages"
  scripts/chromium/install.sh
  export ELASTICDL_REQUIRE_CHROMIUM=1
fi

# The CPU base-image test installs the project's own wheels into an image, and the real-node
# server test the server wheel into its image: build them first.
log "./pants package (wheels for the image tests)"
./pants package //:elasticdl-wheel src/python:elasticdl-client-wheel src/cc:native //:elasticdl-server-wheel
export ELASTICDL_WHEEL_DIR="$root/dist" ELASTICDL_SOURCE_ROOT="$root"

targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("::")
log "./pants test ${targets[*]}"
exec ./pants test "${targets[@]}"
