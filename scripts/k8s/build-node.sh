#!/usr/bin/env bash
# Everything start-node.sh needs for the real cluster:
#  - in ${ELASTICDL_K8S_CACHE:-~/.cache/elasticdl/k8s-1.20.2}/bin (build-k8s.sh, cached and
#    content-keyed): the control plane (kube-apiserver, kube-controller-manager,
#    kube-scheduler, etcd), kubelet, kube-proxy, kubectl and a static busybox; on a fresh
#    machine the five Go binaries are compiled in one `make`;
#  - Debian packages, installed when missing (root only; ~0 s when present):
#      containernetworking-plugins  the pod network's CNI plugins (bridge, host-local,
#                                   loopback, portmap) in /usr/lib/cni
#      dnsmasq-base                 the cluster DNS server
#      iptables                     kube-proxy's Service rules and the pod network's FORWARD rules
#      conntrack                    kube-proxy deletes stale UDP flows of removed endpoints with it
#      socat                        the kubelets' dockershim serves `kubectl port-forward` with it
#    (the container engine, Debian's docker.io, comes from scripts/container-engine/install.sh).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
die() { echo "build-node: error: $*" >&2; exit 1; }

need=()
for plugin in bridge host-local loopback portmap; do
  [[ -x /usr/lib/cni/$plugin ]] || { need+=(containernetworking-plugins); break; }
done
command -v dnsmasq >/dev/null || need+=(dnsmasq-base)
command -v iptables >/dev/null || need+=(iptables)
command -v conntrack >/dev/null || need+=(conntrack)
command -v socat >/dev/null || need+=(socat)
if ((${#need[@]})); then
  [[ $(id -u) == 0 ]] || die "installing ${need[*]} needs root"
  log=${TMPDIR:-/tmp}/elasticdl-k8s-apt.log
  export DEBIAN_FRONTEND=noninteractive
  # `apt-get update` only when the package lists are too old to install from.
  apt-get install -y -q -o DPkg::Lock::Timeout=300 --no-install-recommends "${need[@]}" >"$log" 2>&1 ||
    { apt-get update -q -o DPkg::Lock::Timeout=300 >>"$log" 2>&1 && apt-get install -y -q -o DPkg::Lock::Timeout=300 --no-install-recommends "${need[@]}" >>"$log" 2>&1; } ||
    die "apt-get install ${need[*]} failed, see $log"
  echo "build-node: installed ${need[*]}" >&2
fi

exec "$HERE/build-k8s.sh" kube-apiserver kube-controller-manager kube-scheduler kubelet \
  kube-proxy etcd kubectl busybox
