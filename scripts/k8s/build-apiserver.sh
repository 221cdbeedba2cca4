#!/usr/bin/env bash
# The control plane of the apiserver-only test clusters: kube-apiserver, kube-controller-manager
# and etcd in ${ELASTICDL_K8S_CACHE:-~/.cache/elasticdl/k8s-1.20.2}/bin (see build-k8s.sh).
exec "$(dirname "${BASH_SOURCE[0]}")/build-k8s.sh" kube-apiserver kube-controller-manager etcd
