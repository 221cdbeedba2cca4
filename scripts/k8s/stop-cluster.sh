#!/usr/bin/env bash
# Stop the control plane started by scripts/k8s/start-cluster.sh (apiserver before etcd) and
# remove its state directory.
#   scripts/k8s/stop-cluster.sh [STATE_DIR]      # default: /tmp/elasticdl-k8s
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
STATE_DIR="${1:-${TMPDIR:-/tmp}/elasticdl-k8s}"
PYTHON="${PYTHON:-$(command -v python3)}"
PYTHONPATH="$ROOT/tests/python${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m elasticdl_tests.k8s.cluster stop --state-dir "$STATE_DIR"
rm -rf "$STATE_DIR"
