#!/usr/bin/env bash
# Everything start-node.sh needs for a real single-node cluster, in
# ${ELASTICDL_K8S_CACHE:-~/.cache/elasticdl/k8s-1.20.2}/bin: the control plane (kube-apiserver,
# kube-controller-manager, kube-scheduler, etcd), the kubelet, kubectl and a static busybox
# (see build-k8s.sh). Idempotent; on a fresh machine all four Go binaries share one build.
exec "$(dirname "${BASH_SOURCE[0]}")/build-k8s.sh" kube-apiserver kube-controller-manager \
  kube-scheduler kubelet etcd kubectl busybox
