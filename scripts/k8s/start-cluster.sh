#!/usr/bin/env bash
# Start a local test Kubernetes control plane (etcd + kube-apiserver + kube-controller-manager
# on 127.0.0.1, free ports) and print the admin kubeconfig path.
#
#   scripts/k8s/start-cluster.sh [STATE_DIR]      # default: /tmp/elasticdl-k8s
#   export KUBECONFIG=$(scripts/k8s/start-cluster.sh)
#   ...
#   scripts/k8s/stop-cluster.sh [STATE_DIR]
#
# Binaries come from scripts/k8s/build-apiserver.sh (built first if missing). There is no
# kubelet: pods stay Pending unless something runs them (the tests use a process kubelet).
# STATE_DIR also holds kubeconfig-user (token of an unprivileged user), logs/ and state.json.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
STATE_DIR="${1:-${TMPDIR:-/tmp}/elasticdl-k8s}"
PYTHON="${PYTHON:-$(command -v python3)}"
"$ROOT/scripts/k8s/build-apiserver.sh" >&2
if [[ -f "$STATE_DIR/state.json" ]]; then
  echo "start-cluster: a cluster is already running from $STATE_DIR (stop it with scripts/k8s/stop-cluster.sh $STATE_DIR)" >&2
  exit 1
fi
mkdir -p "$STATE_DIR"
PYTHONPATH="$ROOT/tests/python${PYTHONPATH:+:$PYTHONPATH}" exec "$PYTHON" -m elasticdl_tests.k8s.cluster start --state-dir "$STATE_DIR"
