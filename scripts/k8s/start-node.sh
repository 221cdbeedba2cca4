#!/usr/bin/env bash
# A real multi-node Kubernetes v1.20.2 cluster on one machine, for ElasticDL's tests and users:
# one control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler), N nodes
# (each a kubelet with its own private Docker engine), a pod network (Debian's CNI plugins),
# kube-proxy for Services, cluster DNS (Debian's dnsmasq fed from the API) and a local registry.
#
#   scripts/k8s/start-node.sh start [--nodes N]  # N nodes (default 2, 1..9); ~20-30 s; prints
#                                                # KUBECONFIG=..., DOCKER_HOST=..., one line per node
#   scripts/k8s/start-node.sh status             # every process, then `kubectl get nodes`
#   scripts/k8s/start-node.sh stop [--purge]     # stops all it started and removes every
#                                                # process, mount, bridge, route, iptables rule,
#                                                # cgroup and pod network namespace it made
#                                                # (found by name and tag, also after a crash);
#                                                # --purge also deletes images and certificates
#                                                # (else the registry's images and the engines'
#                                                # copies stay for the next start: no re-push)
#   scripts/k8s/start-node.sh stop-node I        # node I dies: its kubelet, engine and every
#                                                # container on it are killed at once (SIGKILL)
#   scripts/k8s/start-node.sh start-node I       # node I boots again (engine, kubelet) and rejoins
#   scripts/k8s/start-node.sh base-image         # imports local/base:latest (Debian + python3)
#                                                # into node 1's engine, for build-images.sh
#
# Binaries and Debian packages: scripts/k8s/build-node.sh (run first when one is missing).
# Engine: Debian's docker.io + docker-registry (scripts/container-engine/install.sh). Needs root
# and cgroup v1. scripts/k8s/README.md says why each flag and address is what it is.
#
# Env (defaults):
#   ELASTICDL_NODE_DIR (/tmp/elasticdl-node)  state: certificates, logs, pids, etcd, engines
#   ELASTICDL_NODE_PORT_BASE (24300)          apiserver +0 (on the cluster address); etcd +1/+2,
#                                             kube-proxy's metrics +3 and registry +20
#                                             (127.0.0.1); node i's kubelet +10+(i-1) (127.0.0.i)
#   ELASTICDL_NODE_NET (10.244)               the cluster's /16: A.B.0.1 the apiserver, A.B.0.10
#                                             the DNS server, A.B.i.0/24 node i's pods,
#                                             A.B.255.0/24 Service ClusterIPs
#   ELASTICDL_NODE_CGROUP (/elasticdl-node)   cgroup of the nodes: <it>/n<i> is node i's
#                                             --cgroup-root (its pods), <it>/n<i>/daemons (freezer
#                                             hierarchy) holds its engine and kubelet
#   ELASTICDL_NODE_GRACE (40s), ELASTICDL_NODE_MONITOR_PERIOD (5s)
#                                             controller-manager --node-monitor-grace-period and
#                                             --node-monitor-period (Kubernetes' defaults)
#   ELASTICDL_NODE_KUBELET_AUTH (secure)      secure: x509 client certificates + webhook
#                                             authorization; open: anyone on loopback (debug)
#   ELASTICDL_NODE_REGISTRY_KEEP_MB (8192)    a start empties a kept registry larger than this
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
K=${ELASTICDL_NODE_DIR:-/tmp/elasticdl-node}
BIN=${ELASTICDL_K8S_BIN:-${ELASTICDL_K8S_CACHE:-$HOME/.cache/elasticdl/k8s-1.20.2}/bin}
AUTH=${ELASTICDL_NODE_KUBELET_AUTH:-secure}
CGROOT=${ELASTICDL_NODE_CGROUP:-/elasticdl-node}
GRACE=${ELASTICDL_NODE_GRACE:-40s}
MONITOR=${ELASTICDL_NODE_MONITOR_PERIOD:-5s}
# How long a node's engine may take to answer (seconds), and how often one that exits while
# starting is started again (as systemd's docker.service restarts it).
DOCKERD_READY_S=180
DOCKERD_RESTARTS=2
NETP=${ELASTICDL_NODE_NET:-10.244}
PB=${ELASTICDL_NODE_PORT_BASE:-24300}
REGISTRY_KEEP_MB=${ELASTICDL_NODE_REGISTRY_KEEP_MB:-8192}
usage() { echo "usage: $0 start [--nodes N] | status | stop [--purge] | stop-node I | start-node I | base-image" >&2; exit 2; }
if ! [[ $REGISTRY_KEEP_MB =~ ^[0-9]+$ ]]; then
  echo "start-node: error: ELASTICDL_NODE_REGISTRY_KEEP_MB=$REGISTRY_KEEP_MB: give whole megabytes (0 keeps nothing)" >&2
  exit 2
fi
if ! [[ $PB =~ ^[0-9]+$ ]] || ((PB < 1024 || PB > 65500)); then
  echo "start-node: error: ELASTICDL_NODE_PORT_BASE=$PB is not a port number in 1024..65500" >&2
  exit 2
fi
if ! [[ $NETP =~ ^(10|172|192)\.[0-9]{1,3}$ ]]; then
  echo "start-node: error: ELASTICDL_NODE_NET=$NETP is not the first two numbers of a private /16 (e.g. 10.244)" >&2
  exit 2
fi
API_PORT=$PB ETCD_PORT=$((PB + 1)) ETCD_PEER=$((PB + 2)) PROXY_METRICS_PORT=$((PB + 3))
REGISTRY_PORT=$((PB + 20))
REGISTRY=127.0.0.1:$REGISTRY_PORT
NET=$NETP.0.0/16              # everything of the cluster: host route "unreachable" (never leaves)
CLUSTER_IP=$NETP.0.1          # apiserver (bind + advertise): reachable from the host and pods
DNS_IP=$NETP.0.10             # dnsmasq
SVC_CIDR=$NETP.255.0/24       # ClusterIPs; the `kubernetes` Service is $NETP.255.1
SVC_FIRST=$NETP.255.1
HOST_DEV=edlcluster0          # a bridge without ports: holds the cluster and DNS addresses
DOMAIN=cluster.local
TAG=elasticdl-cluster         # the comment on every iptables rule of ours
DOCKER=/usr/bin/docker; [[ -x $DOCKER ]] || DOCKER=docker
L=$K/logs P=$K/pki R=$K/run
# One cluster per machine: kube-proxy's iptables chains (KUBE-*) are machine-wide. This file
# names the state dir of the cluster that runs.
OWNER=/run/elasticdl-node.owner

node_name() { echo "127.0.0.$1"; }
node_dir() { echo "$K/n$1"; }
node_sock() { echo "unix://$K/n$1/docker.sock"; }
pod_bridge() { echo "edlpod$1"; }
engine_bridge() { echo "edldocker$1"; }                       # node i's engine's default bridge
engine_cidr() { echo "$NETP.$((100 + $1)).1/24"; }
# Every link of ours is named so (the sweep removes them by name, whatever is recorded)
OUR_LINKS='^(edlcluster0|edlpod[0-9]+|edldocker[0-9]+)$'
pod_cidr() { echo "$NETP.$1.0/24"; }
pod_gateway() { echo "$NETP.$1.1"; }
kubelet_port() { echo $((PB + 9 + $1)); }
cg_node() { echo "$CGROOT/n$1"; }                               # the kubelet's --cgroup-root
freezer() { echo "/sys/fs/cgroup/freezer$(cg_node "$1")"; }     # every process of node $1

t0=$(date +%s.%N)
say() { awk -v m="$*" -v t0="$t0" -v t="$(date +%s.%N)" 'BEGIN { printf "start-node: %5.1fs %s\n", t - t0, m }' >&2; }
die() { echo "start-node: error: $*" >&2; exit 1; }
running() { # pid: a live process (a zombie, dead and not yet reaped by its parent, is not)
  local state; state=$(sed -n 's/^State:[[:space:]]*\(.\).*/\1/p' "/proc/$1/status" 2>/dev/null)
  [[ -n $state && $state != Z ]]
}
alive() { [[ -f $R/$1.pid ]] && running "$(cat "$R/$1.pid")"; }
kc() { "$BIN/kubectl" --kubeconfig="$K/admin.kubeconfig" "$@"; }
dk() { local i=$1; shift; DOCKER_HOST=$(node_sock "$i") $DOCKER "$@"; }   # node i's engine

spawn() { # name argv...: own session, output to $L/name.log, pid in $R/name.pid
  local name=$1; shift
  alive "$name" && return 0
  setsid "$@" </dev/null 9>&- >"$L/$name.log" 2>&1 &
  echo $! >"$R/$name.pid"
}

spawn_on_node() { # node name argv...: spawn in the node's cgroup (freezer) and mount namespace
  local i=$1 name=$2; shift 2
  local ns=()
  if [[ $name != mntns-* ]]; then
    alive "mntns-$i" || die "node $i has no mount namespace (its holder died)"
    ns=(nsenter --mount="/proc/$(cat "$R/mntns-$i.pid")/ns/mnt" --)
  fi
  spawn "$name" sh -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$(freezer "$i")/daemons" "${ns[@]}" "$@"
}

wait_for() { # what timeout-seconds command...
  local what=$1 t=$2; shift 2
  for _ in $(seq $((t * 5))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  die "$what not ready after ${t}s (logs in $L)"
}

wait_for_engine() { # node: its engine answers; else the start fails with what it was doing
  local i=$1 restarts=0 end=$((SECONDS + DOCKERD_READY_S)) kept
  while ((SECONDS < end)); do
    curl -sf --unix-socket "$(node_dir "$i")/docker.sock" http://d/_ping >/dev/null 2>&1 && return 0
    if ! alive "dockerd-$i"; then
      ((restarts < DOCKERD_RESTARTS)) || break
      restarts=$((restarts + 1))
      # Its log is overwritten by the next spawn: kept under another name.
      kept="$L/dockerd-$i.exited-$restarts.log"
      cp "$L/dockerd-$i.log" "$kept" 2>/dev/null || true
      say "dockerd of node $i exited while starting, its log kept in $kept ($(tail -n 1 "$kept" | cut -c1-200)); starting it again"
      start_dockerd "$i"
      end=$((SECONDS + DOCKERD_READY_S))
    fi
    sleep 0.2
  done
  local state="exited while starting ($restarts restarts)"
  alive "dockerd-$i" && state="not answering after ${DOCKERD_READY_S}s"
  kept="$L/dockerd-$i.not-ready.log"
  cp "$L/dockerd-$i.log" "$kept" 2>/dev/null || true
  die "dockerd of node $i $state; its log, kept in $kept, ends: $(tail -n 1 "$kept" 2>/dev/null | cut -c1-240)"
}

node_count() { # the running cluster's node count, else the one asked for
  if [[ -f $R/nodes ]]; then cat "$R/nodes"; else echo "${ASKED:-2}"; fi
}

kubeconfig() { # path user token [server address]
  cat >"$1" <<YAML
apiVersion: v1
kind: Config
clusters:
- name: elasticdl-cluster
  cluster: {server: "https://${4:-$CLUSTER_IP}:$API_PORT", certificate-authority: "$P/ca.crt"}
users:
- name: $2
  user: {token: "$3"}
contexts:
- name: elasticdl-cluster
  context: {cluster: elasticdl-cluster, user: $2, namespace: default}
current-context: elasticdl-cluster
YAML
  chmod 600 "$1"
}

certs() { # a throw-away CA, serving/client certificates, the service-account key, tokens
  local n=$1 i
  # Made again when what they name changes (the addresses, the node count).
  local want="$NETP $n $API_PORT"
  [[ -f $P/tokens.csv && $(cat "$P/made-for" 2>/dev/null) == "$want" ]] && return
  rm -rf "$P"
  mkdir -p "$P"
  (
    cd "$P"
    umask 077
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 \
      -subj /CN=elasticdl-cluster-ca -addext basicConstraints=critical,CA:TRUE \
      -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
    sign() { # name subject extensions
      printf '%s\n' "$3" >"$1.ext"
      openssl req -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "$2" 2>/dev/null
      openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$1.crt" \
        -days 3650 -extfile "$1.ext" 2>/dev/null
    }
    local server="basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth" client="basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
    # the apiserver: its own address, the `kubernetes` Service's ClusterIP and DNS names
    sign server /CN=kube-apiserver "$server
subjectAltName=IP:$CLUSTER_IP,IP:$SVC_FIRST,IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.$DOMAIN"
    # the apiserver's client certificate toward the kubelets (logs, exec, port-forward)
    sign kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "$client"
    for i in $(seq "$n"); do # each kubelet's serving certificate, verified by the apiserver
      sign "kubelet-$i" "/CN=$(node_name "$i")" "$server
subjectAltName=IP:$(node_name "$i")"
    done
    # etcd: mutual TLS for clients (the apiserver) and peers
    sign etcd-server /CN=etcd "$server,clientAuth
subjectAltName=IP:127.0.0.1,DNS:localhost"
    sign etcd-client /CN=kube-apiserver-etcd-client "$client"
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
    chmod 644 ca.crt
    # random tokens: the admin (system:masters), each kubelet (Node authorizer), kube-proxy
    # (bound to system:node-proxier by Kubernetes' default policy), the DNS feeder (RBAC below)
    {
      echo "$(openssl rand -hex 16),elasticdl-node-admin,elasticdl-node-admin,\"system:masters\""
      for i in $(seq "$n"); do
        echo "$(openssl rand -hex 16),system:node:$(node_name "$i"),elasticdl-node-kubelet-$i,\"system:nodes\""
      done
      echo "$(openssl rand -hex 16),system:kube-proxy,elasticdl-node-kube-proxy"
      echo "$(openssl rand -hex 16),elasticdl:cluster-dns,elasticdl-node-cluster-dns"
    } >tokens.csv.tmp
    mv tokens.csv.tmp tokens.csv
    echo "$want" >made-for
  )
}

token_of() { awk -F, -v u="$1" '$2 == u {print $1}' "$P/tokens.csv"; }

net_record() { echo "$*" >>"$R/net"; } # what stop undoes, in reverse order

ipt_add() { # table chain rule...: insert a rule of ours (tagged) once, and record it
  local table=$1 chain=$2; shift 2
  local rule=("$@" -m comment --comment "$TAG")
  iptables -w -t "$table" -C "$chain" "${rule[@]}" 2>/dev/null && return 0
  iptables -w -t "$table" -I "$chain" 1 "${rule[@]}"
  net_record iptables "$table" "$chain" "${rule[@]}"
}

net_up() { # the host side of the pod network; everything added is recorded in $R/net
  local n=$1 i br
  if [[ ! -d /proc/sys/net/bridge ]]; then modprobe br_netfilter 2>/dev/null || true; fi
  [[ -d /proc/sys/net/bridge ]] || die "the kernel has no br_netfilter (net.bridge.* sysctls): kube-proxy cannot see traffic between pods of one bridge"
  # Replies between pods of one bridge must pass iptables, else Service traffic is not
  # translated back (kube-proxy's DNAT): restored at stop if it was off.
  if [[ $(cat /proc/sys/net/bridge/bridge-nf-call-iptables) != 1 ]]; then
    sysctl -qw net.bridge.bridge-nf-call-iptables=1
    net_record sysctl net.bridge.bridge-nf-call-iptables=0
  fi
  if ! ip link show "$HOST_DEV" >/dev/null 2>&1; then
    # (a bridge without ports: the kernel may lack the `dummy` driver; a local address works
    # on either)
    ip link add "$HOST_DEV" type bridge && net_record link "$HOST_DEV"
    sysctl -qw "net.ipv6.conf.$HOST_DEV.disable_ipv6=1" 2>/dev/null || true
    ip addr add "$CLUSTER_IP/32" dev "$HOST_DEV"
    ip addr add "$DNS_IP/32" dev "$HOST_DEV"
    ip link set "$HOST_DEV" up
  fi
  for i in $(seq "$n"); do
    br=$(pod_bridge "$i")
    if ! ip link show "$br" >/dev/null 2>&1; then
      ip link add "$br" type bridge && net_record link "$br"
      sysctl -qw "net.ipv6.conf.$br.disable_ipv6=1" 2>/dev/null || true   # IPv4 only
      ip addr add "$(pod_gateway "$i")/24" dev "$br"
      ip link set "$br" up
    fi
    # Forwarding for packets that ENTER on a pod bridge only; net.ipv4.ip_forward (every
    # interface) is left as it is.
    sysctl -qw "net.ipv4.conf.$br.forwarding=1"
    # The node's engine gets a default bridge of its own: an engine without one ("bridge":
    # "none") deletes the machine's docker0 at its start, under any other engine using it.
    # Containers outside Kubernetes (`docker build` steps) get an address of it and reach this
    # machine only: nothing is forwarded from it (its range is inside the cluster's, so the
    # mangle rules below drop it too).
    br=$(engine_bridge "$i")
    if ! ip link show "$br" >/dev/null 2>&1; then
      ip link add "$br" type bridge && net_record link "$br"
      sysctl -qw "net.ipv6.conf.$br.disable_ipv6=1" 2>/dev/null || true
      ip addr add "$(engine_cidr "$i")" dev "$br"
      ip link set "$br" up
    fi
    sysctl -qw "net.ipv4.conf.$br.forwarding=0"
  done
  # Nothing of the cluster's range leaves the machine: the bridges' own /24 routes are more
  # specific, the rest of the range is unreachable.
  if ! ip route show table main exact "$NET" | grep -q unreachable; then
    ip route add unreachable "$NET" && net_record route unreachable "$NET"
  fi
  # ClusterIPs from the host (and host-network pods): a route so that connect() gets as far as
  # kube-proxy's OUTPUT rules, with the cluster address as source (inside --cluster-cidr: no
  # masquerading); a packet kube-proxy does not translate dies on the port-less bridge.
  if ! ip route show table main exact "$SVC_CIDR" | grep -q "$HOST_DEV"; then
    ip route add "$SVC_CIDR" dev "$HOST_DEV" src "$CLUSTER_IP" && net_record route "$SVC_CIDR" dev "$HOST_DEV"
  fi
  # Pod to pod (any bridge): accepted whatever the FORWARD policy (a Docker engine on the
  # machine sets it to DROP; with br_netfilter even traffic within one bridge passes FORWARD).
  ipt_add filter FORWARD -s "$NET" -d "$NET" -j ACCEPT
  # The pod network is closed both ways: nothing forwarded from it to outside the range, nothing
  # from outside into it (mangle runs before filter, so no ACCEPT of kube-proxy's comes first).
  ipt_add mangle FORWARD -s "$NET" ! -d "$NET" -j DROP
  ipt_add mangle FORWARD ! -s "$NET" -d "$NET" -j DROP
  # A connection addressed into the range (a ClusterIP, a NodePort on the cluster address) is
  # never translated to an address outside it (an Endpoints object may name any address).
  ipt_add mangle POSTROUTING -m conntrack --ctstate DNAT --ctorigdst "$NET" ! -d "$NET" -j DROP
  # The apiserver's loopback door: 127.0.0.1:<api port>, from this machine only, leads to the
  # cluster address (a local address: no route_localnet needed, nothing leaves loopback).
  ipt_add nat OUTPUT -o lo -d 127.0.0.1/32 -p tcp --dport "$API_PORT" -j DNAT --to-destination "$CLUSTER_IP:$API_PORT"
  # (portmap makes its chains, CNI-*, when a pod first asks for a hostPort; start refuses to
  # run where any existed, so those at stop are ours.)
}

cni_conf() { # node: bridge plugin on its pod bridge, host-local IPAM, portmap on the bridge address
  local i=$1 d; d=$(node_dir "$i")
  mkdir -p "$d/cni/net.d" "$d/cni/cache" "$d/cni/ipam"
  # isGateway false: the bridge has its gateway address already (net_up), and the plugin then
  # does not turn on net.ipv4.ip_forward for every interface. routes: the cluster's range
  # only, no default route. ipMasq false: no NAT. portmap: a pod's hostPort is served on its
  # node's bridge address only (not on every address of the machine), without SNAT.
  cat >"$d/cni/net.d/10-elasticdl.conflist" <<JSON
{
  "cniVersion": "0.4.0",
  "name": "elasticdl-n$i",
  "plugins": [
    {
      "type": "bridge", "bridge": "$(pod_bridge "$i")", "isGateway": false,
      "isDefaultGateway": false, "ipMasq": false, "hairpinMode": true,
      "ipam": {
        "type": "host-local", "dataDir": "$d/cni/ipam",
        "ranges": [[{"subnet": "$(pod_cidr "$i")", "gateway": "$(pod_gateway "$i")"}]],
        "routes": [{"dst": "$NET"}]
      }
    },
    {
      "type": "portmap", "capabilities": {"portMappings": true}, "snat": false,
      "conditionsV4": ["-d", "$(pod_gateway "$i")/32"]
    }
  ]
}
JSON
}

runc_wrapper() {
  # Where root lacks CAP_SYS_RESOURCE (CapBnd bit 24 off, as on Firecracker VMs) no process may
  # lower its oom_score_adj, and the kubelet gives every sandbox -998 and Guaranteed containers
  # -997: runc init dies ("can't get final child's PID from pipe: EOF") and no pod starts.
  # Clamp negative values to 0 in the bundle's config.json (create/run) and exec's
  # process.json; positive values (Burstable, BestEffort) are kept.
  cat >"$K/runc-clamp-oom.new" <<'SH'
#!/bin/sh
prev=""
for a in "$@"; do
  case $prev in --bundle|-b) f=$a/config.json ;; --process|-p) f=$a ;; esac
  case $a in --bundle=*) f=${a#--bundle=}/config.json ;; --process=*) f=${a#--process=} ;; esac
  prev=$a
done
if [ -n "${f:-}" ] && [ -f "$f" ]; then
  sed -i -E 's/"oomScoreAdj":[[:space:]]*-[0-9]+/"oomScoreAdj":0/' "$f"
fi
exec runc "$@"
SH
  chmod +x "$K/runc-clamp-oom.new"
  mv -f "$K/runc-clamp-oom.new" "$K/runc-clamp-oom"   # (running engines may be executing it)
}

cgroups() { # node: its --cgroup-root in every v1 hierarchy, and its daemons' freezer cgroup
  local i=$1 c path
  for c in /sys/fs/cgroup/*/; do
    c=${c%/}
    [[ $(basename "$c") == unified ]] && continue
    mountpoint -q "$c" || continue
    # the kubelet refuses a --cgroup-root that does not exist in every hierarchy; a cpuset
    # cgroup needs its CPUs and memory nodes before anything runs in it
    for path in "$CGROOT" "$(cg_node "$i")"; do
      mkdir -p "$c$path"
      if [[ -f $c/cpuset.cpus ]]; then
        [[ -n $(cat "$c$path/cpuset.cpus") ]] || cat "$c/cpuset.cpus" >"$c$path/cpuset.cpus"
        [[ -n $(cat "$c$path/cpuset.mems") ]] || cat "$c/cpuset.mems" >"$c$path/cpuset.mems"
      fi
    done
  done
  [[ -d /sys/fs/cgroup/freezer ]] || die "needs the cgroup v1 freezer hierarchy (a node's processes are tracked and killed through it)"
  mkdir -p "$(freezer "$i")/daemons"
  echo THAWED >"$(freezer "$i")/freezer.state"
}

node_ns() { # node: its mount namespace, held by a sleep in the node's cgroup
  # The kubelet 1.20 hard-codes /var/log/pods, /var/log/containers and
  # /var/lib/kubelet/{device-plugins,pod-resources}. Each kubelet's container GC deletes every
  # /var/log/pods/<ns>_<pod>_<uid> it does not know -- the other nodes' pod logs -- within a
  # minute, and each device manager deletes the others' kubelet.sock. In its own mount namespace
  # each node has its own directories there; its engine's and kubelet's mounts (overlays,
  # secrets, netns) never show in the host's table and go with the namespace.
  local i=$1 d h; d=$(node_dir "$i")
  mkdir -p "$d/host/var-log-pods" "$d/host/var-log-containers" "$d/host/var-lib-kubelet"
  spawn_on_node "$i" "mntns-$i" unshare --mount --propagation private -- sh -c '
    mount --bind "$1/host/var-log-pods" /var/log/pods &&
    mount --bind "$1/host/var-log-containers" /var/log/containers &&
    mount --bind "$1/host/var-lib-kubelet" /var/lib/kubelet && exec sleep infinity' sh "$d"
  h=$(cat "$R/mntns-$i.pid")
  wait_for "mount namespace of node $i" 10 grep -q ' /var/lib/kubelet ' "/proc/$h/mountinfo"
}

start_dockerd() { # node: a private engine; pods get their network from CNI
  local i=$1 d; d=$(node_dir "$i")
  alive "dockerd-$i" && return 0
  mkdir -p "$d/docker"
  # exec-root is runtime state (tmpfs /run on a real machine): a node that boots again starts
  # without the dead engine's sockets and shim state
  rm -rf "$d/docker/exec"
  # Own data/exec root, socket, pidfile and default bridge (net_up); no iptables, no
  # masquerading, no forwarding, so other engines on the machine (docker0, iptables) are not
  # disturbed. (Never "bridge": "none": such an engine deletes docker0.)
  cat >"$d/docker/daemon.json" <<JSON
{ "data-root": "$d/docker/data", "exec-root": "$d/docker/exec", "pidfile": "$d/docker/dockerd.pidfile",
  "hosts": ["$(node_sock "$i")"], "bridge": "$(engine_bridge "$i")", "iptables": false, "ip-masq": false,
  "ip-forward": false, "insecure-registries": ["$REGISTRY"],
  "exec-opts": ["native.cgroupdriver=cgroupfs"],
  "runtimes": {"runc-clamp-oom": {"path": "$K/runc-clamp-oom"}}, "default-runtime": "runc-clamp-oom" }
JSON
  spawn_on_node "$i" "dockerd-$i" dockerd --config-file "$d/docker/daemon.json"
}

# The registry's data outlives a stop, as the engines' images do: a start after a stop serves
# what was pushed before, so a build whose layers are there pushes only what changed and the
# other nodes pull only that. Kept within REGISTRY_KEEP_MB: a start empties a larger one (and
# each engine's copies of its images, which could name images it no longer holds).
registry_fresh() { # 0 when the registry starts empty (its copies in the engines must go)
  [[ -d $K/registry-data ]] || return 0
  local mb; mb=$(du -sm "$K/registry-data" | cut -f1)
  ((mb > REGISTRY_KEEP_MB)) || return 1
  say "the kept registry holds ${mb} MB (> ELASTICDL_NODE_REGISTRY_KEEP_MB=$REGISTRY_KEEP_MB): emptied"
  rm -rf "$K/registry-data"
}

start_registry() {
  cat >"$K/registry.yml" <<YML
version: 0.1
log: { level: warn }
storage: { filesystem: { rootdirectory: $K/registry-data }, delete: { enabled: true } }
http: { addr: $REGISTRY }
YML
  spawn registry docker-registry serve "$K/registry.yml"
}

images() { # node: local/busybox:node (test pods) and local/pause:node (the pods' sandbox)
  local i=$1 bb rootfs
  bb=$(sha256sum "$BIN/busybox" | cut -c1-16)
  # both there and made from this busybox? (its digest is a label of both images; a node under
  # disk pressure deletes unused images, so one may be gone while the other stays)
  local labels
  labels=$(dk "$i" image inspect -f '{{index .Config.Labels "org.elasticdl.busybox"}}' local/busybox:node local/pause:node 2>/dev/null || true)
  [[ $labels == "$bb"$'\n'"$bb" ]] && return
  if [[ ! -f $K/img/busybox-$bb.tar ]]; then
    rm -rf "$K/img" && mkdir -p "$K/img"
    rootfs=$K/img/rootfs
    mkdir -p "$rootfs"/{bin,tmp,etc,proc,sys,dev}
    cp "$BIN/busybox" "$rootfs/bin/busybox"
    for a in $("$BIN/busybox" --list); do [[ $a == busybox ]] || ln -sf busybox "$rootfs/bin/$a"; done
    echo 'root:x:0:0:root:/root:/bin/sh' >"$rootfs/etc/passwd"; echo 'root:x:0:' >"$rootfs/etc/group"
    chmod 1777 "$rootfs/tmp"
    tar -C "$rootfs" -cf "$K/img/busybox-$bb.tar.tmp" . && rm -rf "$rootfs"
    mv "$K/img/busybox-$bb.tar.tmp" "$K/img/busybox-$bb.tar"
  fi
  dk "$i" import --change 'CMD ["/bin/sh"]' --change 'ENV PATH=/bin' \
    --change "LABEL org.elasticdl.busybox=$bb" "$K/img/busybox-$bb.tar" local/busybox:node >/dev/null
  # The sandbox's PID 1 must exit on SIGTERM (PID 1 ignores signals it has no handler for),
  # else every pod deletion waits for the stop timeout.
  dk "$i" import --change 'ENTRYPOINT ["/bin/sh","-c","trap \"exit 0\" TERM INT; sleep 2147483647 & wait"]' \
    --change 'ENV PATH=/bin' --change "LABEL org.elasticdl.busybox=$bb" \
    "$K/img/busybox-$bb.tar" local/pause:node >/dev/null
  dk "$i" image prune -f >/dev/null 2>&1 || true   # the images of an older busybox
  say "node $i: imported local/busybox:node, local/pause:node"
}

start_kubelet() { # node
  local i=$1 n=$2 d name; d=$(node_dir "$i"); name=$(node_name "$i")
  mkdir -p "$d/kubelet" "$d/dockershim"
  kubeconfig "$d/kubelet.kubeconfig" "kubelet-$i" "$(token_of "system:node:$name")"
  local auth=(--anonymous-auth=true --authorization-mode=AlwaysAllow)
  if [[ $AUTH == secure ]]; then
    auth=(--anonymous-auth=false --client-ca-file="$P/ca.crt" --authorization-mode=Webhook)
  fi
  # The nodes share the machine's CPUs: each offers its share (cores / nodes) to pods, so the
  # cluster never promises more CPU than the machine has; the rest is reserved. Memory is not
  # split (each node offers the machine's): see README.
  local total reserved
  total=$(($(getconf _NPROCESSORS_ONLN) * 1000))
  reserved=$((total - total / n))
  spawn_on_node "$i" "kubelet-$i" "$BIN/kubelet" --kubeconfig="$d/kubelet.kubeconfig" \
    --container-runtime=docker --docker-endpoint="$(node_sock "$i")" --docker="$(node_sock "$i")" \
    --experimental-dockershim-root-directory="$d/dockershim" \
    --container-runtime-endpoint="unix://$d/dockershim.sock" --image-service-endpoint="unix://$d/dockershim.sock" \
    --pod-infra-container-image=local/pause:node \
    --root-dir="$d/kubelet" --cert-dir="$d/kubelet/pki" --volume-plugin-dir="$d/kubelet/volume-plugins" \
    --hostname-override="$name" --address="$name" --port="$(kubelet_port "$i")" --read-only-port=0 \
    --healthz-port=0 "${auth[@]}" --tls-cert-file="$P/kubelet-$i.crt" --tls-private-key-file="$P/kubelet-$i.key" \
    --network-plugin=cni --cni-bin-dir=/usr/lib/cni --cni-conf-dir="$d/cni/net.d" \
    --cni-cache-dir="$d/cni/cache" \
    --cluster-dns="$DNS_IP" --cluster-domain="$DOMAIN" --resolv-conf=/etc/resolv.conf \
    --cgroup-driver=cgroupfs --cgroup-root="$(cg_node "$i")" \
    --kube-reserved="cpu=${reserved}m" \
    --fail-swap-on=false --make-iptables-util-chains=false \
    --eviction-hard='memory.available<100Mi,nodefs.available<1%,imagefs.available<1%' \
    --image-gc-high-threshold=100 --image-gc-low-threshold=99 --v=1
  # (no healthz port: it would answer without authentication; the node's Ready status tells)
}

node_ready() { # node: its Ready condition is True
  [[ $(kc get node "$(node_name "$1")" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]]
}
node_ready_message() { # node: its Ready condition's reason and message
  kc get node "$(node_name "$1")" \
    -o jsonpath='{.status.conditions[?(@.type=="Ready")].reason}: {.status.conditions[?(@.type=="Ready")].message}' 2>&1
}

drop_registry_copies() { # node: images named after the registry are copies of what it held;
  # once its data is gone (--purge, or emptied at a start for its size), a later registry may
  # hold other images under those names.
  local i=$1 imgs
  imgs=$(dk "$i" images --format '{{.Repository}}:{{.Tag}}' 2>/dev/null | grep "^$REGISTRY/" || true)
  # shellcheck disable=SC2086
  [[ -z $imgs ]] || dk "$i" rmi $imgs >/dev/null 2>&1 || true
}

boot_node() { # node node-count: namespace, engine, images, kubelet (idempotent)
  local i=$1 n=$2
  cni_conf "$i"
  cgroups "$i"
  node_ns "$i"
  start_dockerd "$i"
  # After a hard kill the engine first cleans up the containers it left: minutes under load.
  wait_for_engine "$i"
  images "$i"
  start_kubelet "$i" "$n"
}

preflight() {
  [[ $(id -u) == 0 ]] || die "needs root (dockerd, kubelets, cgroups, bridges, iptables)"
  [[ -d /sys/fs/cgroup/memory ]] || die "needs cgroup v1 (no /sys/fs/cgroup/memory): the kubelet 1.20 dockershim runs on cgroup v1"
  command -v openssl >/dev/null || die "openssl not found"
  command -v ip >/dev/null || die "ip (iproute2) not found"
  command -v nsenter >/dev/null && command -v unshare >/dev/null || die "nsenter/unshare (util-linux) not found"
  "$ROOT/scripts/container-engine/install.sh"
  local b missing=()
  for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl busybox; do
    [[ -x $BIN/$b ]] || missing+=("$b")
  done
  for b in bridge host-local loopback portmap; do [[ -x /usr/lib/cni/$b ]] || missing+=("cni-$b"); done
  for b in dnsmasq iptables conntrack socat; do command -v "$b" >/dev/null || missing+=("$b"); done
  if ((${#missing[@]})); then
    say "making ${missing[*]} (scripts/k8s/build-node.sh)"
    "$HERE/build-node.sh" >&2
  fi
  local other; other=$(other_cluster)
  [[ -z $other ]] || die "another cluster runs from $other (one per machine; stop it with ELASTICDL_NODE_DIR=$other $0 stop)"
  if [[ ! -s $R/net ]]; then # not running: what an earlier cluster left goes first
    sweep_leftovers
    # the range and the chains must be free
    ip route show table main | grep -q "^$NETP\." &&
      die "routes in $NET exist already (another pod network?); choose another ELASTICDL_NODE_NET"
    local t
    local rules
    for t in raw mangle nat filter; do
      rules=$(iptables -w -t "$t" -S 2>/dev/null || true)
      grep -q '^-N \(KUBE\|CNI\)-' <<<"$rules" &&
        die "iptables chains KUBE-*/CNI-* exist in table $t (another Kubernetes or CNI network on this machine?): kube-proxy's and portmap's would mix with them"
    done
  fi
  return 0
}

start() {
  local n
  n=$(node_count)
  if [[ -f $R/nodes && -n ${ASKED:-} && $ASKED != "$n" ]]; then
    die "the cluster runs with $n nodes (asked for $ASKED): stop it first"
  fi
  preflight
  mkdir -p "$L" "$R"
  echo "$n" >"$R/nodes"
  echo "$K" >"$OWNER"
  # Paths kubelet 1.20 hard-codes outside --root-dir: mount points for each node's own dirs
  # (node_ns); the host's stay empty. Remember which ones we create.
  local d i
  # (in the state dir, not the run dir: a lost run dir must not make them the host's)
  [[ -f $K/created-dirs ]] || : >"$K/created-dirs"
  for d in /var/lib/kubelet /var/log/pods /var/log/containers; do
    [[ -e $d ]] || { mkdir -p "$d"; echo "$d" >>"$K/created-dirs"; }
  done
  certs "$n"
  # Users (and tests, and host-network pods) reach the apiserver on loopback: when the cluster
  # is down that address refuses at once, where the cluster address would be routed off the
  # machine by the default route.
  kubeconfig "$K/admin.kubeconfig" admin "$(token_of elasticdl-node-admin)" 127.0.0.1
  kubeconfig "$K/kube-proxy.kubeconfig" kube-proxy "$(token_of system:kube-proxy)"
  printf '%s' "$(token_of elasticdl:cluster-dns)" >"$P/cluster-dns.token"
  chmod 600 "$P/cluster-dns.token"
  net_up "$n"
  runc_wrapper
  local fresh_registry=0
  if ! alive registry && registry_fresh; then fresh_registry=1; fi
  start_registry

  # etcd accepts only clients and peers with a certificate of our CA.
  spawn etcd "$BIN/etcd" --data-dir="$K/etcd" --name=elasticdl-cluster \
    --listen-client-urls=https://127.0.0.1:$ETCD_PORT --advertise-client-urls=https://127.0.0.1:$ETCD_PORT \
    --listen-peer-urls=https://127.0.0.1:$ETCD_PEER --initial-advertise-peer-urls=https://127.0.0.1:$ETCD_PEER \
    --initial-cluster=elasticdl-cluster=https://127.0.0.1:$ETCD_PEER \
    --cert-file="$P/etcd-server.crt" --key-file="$P/etcd-server.key" \
    --client-cert-auth --trusted-ca-file="$P/ca.crt" \
    --peer-cert-file="$P/etcd-server.crt" --peer-key-file="$P/etcd-server.key" \
    --peer-client-cert-auth --peer-trusted-ca-file="$P/ca.crt" --log-level=warn
  # the nodes' engines come up meanwhile
  for i in $(seq "$n"); do cni_conf "$i"; cgroups "$i"; node_ns "$i"; start_dockerd "$i"; done
  wait_for etcd 30 curl -sf --cacert "$P/ca.crt" --cert "$P/etcd-client.crt" --key "$P/etcd-client.key" \
    https://127.0.0.1:$ETCD_PORT/health

  # The apiserver listens on the cluster address only: the host and host-network pods reach it
  # there directly, pods through the `kubernetes` Service ($SVC_FIRST:443, kube-proxy).
  spawn kube-apiserver "$BIN/kube-apiserver" --etcd-servers=https://127.0.0.1:$ETCD_PORT \
    --etcd-cafile="$P/ca.crt" --etcd-certfile="$P/etcd-client.crt" --etcd-keyfile="$P/etcd-client.key" \
    --bind-address="$CLUSTER_IP" --advertise-address="$CLUSTER_IP" --secure-port=$API_PORT --insecure-port=0 \
    --tls-cert-file="$P/server.crt" --tls-private-key-file="$P/server.key" --client-ca-file="$P/ca.crt" \
    --token-auth-file="$P/tokens.csv" --authorization-mode=Node,RBAC --anonymous-auth=false \
    --service-account-key-file="$P/sa.pub" --service-account-signing-key-file="$P/sa.key" \
    --service-account-issuer=https://kubernetes.default.svc --service-cluster-ip-range="$SVC_CIDR" \
    --kubelet-client-certificate="$P/kubelet-client.crt" --kubelet-client-key="$P/kubelet-client.key" \
    --kubelet-certificate-authority="$P/ca.crt" --kubelet-preferred-address-types=InternalIP,Hostname \
    --allow-privileged=true --profiling=false --v=1
  for i in $(seq "$n"); do
    wait_for_engine "$i"
    images "$i"
    ((fresh_registry == 0)) || drop_registry_copies "$i"
  done
  wait_for registry 10 curl -sf "http://$REGISTRY/v2/"
  wait_for kube-apiserver 120 curl -sf --cacert "$P/ca.crt" \
    -H "Authorization: Bearer $(token_of elasticdl-node-admin)" "https://127.0.0.1:$API_PORT/readyz"
  say "apiserver up; $n engines up"

  # kube-controller-manager runs a patched node lifecycle controller (build-k8s.sh,
  # patches/kube-controller-manager--*): v1.20.2 could stop evicting from lost nodes for good
  # after every node had been NotReady at once, as at a start.
  spawn kube-controller-manager "$BIN/kube-controller-manager" --kubeconfig="$K/admin.kubeconfig" \
    --leader-elect=false --service-account-private-key-file="$P/sa.key" --root-ca-file="$P/ca.crt" \
    --use-service-account-credentials=false --port=0 --secure-port=0 \
    --node-monitor-grace-period="$GRACE" --node-monitor-period="$MONITOR" \
    --flex-volume-plugin-dir="$K/controller-flexvolume" --v=1
  spawn kube-scheduler "$BIN/kube-scheduler" --kubeconfig="$K/admin.kubeconfig" \
    --leader-elect=false --port=0 --secure-port=0 --v=1
  # One kube-proxy for the machine: every node's pods are routed through the host's network
  # namespace, where its rules are. No health server (it answers anyone); the metrics server
  # cannot be turned off in 1.20: loopback only. NodePorts on the cluster address only;
  # conntrack and OOM settings left as they are; --cluster-cidr is the whole range, so only
  # hairpin and NodePort traffic is masqueraded (to a pod bridge's address).
  spawn kube-proxy "$BIN/kube-proxy" --kubeconfig="$K/kube-proxy.kubeconfig" --proxy-mode=iptables \
    --hostname-override="$(node_name 1)" --cluster-cidr="$NET" --nodeport-addresses="$CLUSTER_IP/32" \
    --healthz-port=0 --metrics-bind-address="127.0.0.1:$PROXY_METRICS_PORT" \
    --oom-score-adj=0 --conntrack-max-per-core=0 \
    --conntrack-tcp-timeout-established=0 --conntrack-tcp-timeout-close-wait=0 --v=1
  grep -q '^kube-proxy$' "$R/net" 2>/dev/null || net_record kube-proxy

  # Cluster DNS (a stand-in for CoreDNS, which Debian does not package): cluster-dns.py mirrors
  # Services and Endpoints into a hosts file dnsmasq serves; only cluster.local, no upstream (a
  # name outside it is REFUSED: nothing is forwarded off the machine).
  kc apply -f - >/dev/null <<YAML
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "elasticdl:cluster-dns"}
rules: [{apiGroups: [""], resources: [services, endpoints], verbs: [get, list, watch]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "elasticdl:cluster-dns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "elasticdl:cluster-dns"}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: "elasticdl:cluster-dns"}]
YAML
  mkdir -p "$K/dns/hosts"
  chmod 755 "$K" "$K/dns" "$K/dns/hosts"   # dnsmasq reads it as an unprivileged user
  spawn cluster-dns python3 "$HERE/cluster-dns.py" --api "https://$CLUSTER_IP:$API_PORT" \
    --token-file "$P/cluster-dns.token" --ca-file "$P/ca.crt" --hosts-dir "$K/dns/hosts" --domain "$DOMAIN"
  spawn dnsmasq dnsmasq --keep-in-foreground --conf-file=/dev/null --no-resolv --no-hosts \
    --hostsdir="$K/dns/hosts" --local="/$DOMAIN/" --domain-needed \
    --listen-address="$DNS_IP" --bind-interfaces --port=53 --pid-file="$R/dnsmasq.pidfile" --log-facility=-

  for i in $(seq "$n"); do start_kubelet "$i" "$n"; done
  # Pods are refused until the token controller made the default service account's token.
  wait_for "default service account token" 90 bash -c "'$BIN/kubectl' --kubeconfig='$K/admin.kubeconfig' \
    get sa default -o jsonpath='{.secrets[0].name}' | grep -q ."
  for i in $(seq "$n"); do wait_for "node $(node_name "$i") Ready" 120 node_ready "$i"; done
  wait_for "cluster DNS" 30 "$BIN/busybox" nslookup "kubernetes.default.svc.$DOMAIN" "$DNS_IP"
  wait_for "kube-proxy's rules" 30 bash -c "iptables -w -t nat -S KUBE-SERVICES | grep -q -- '-d $SVC_FIRST/32'"
  # A node's kubelet can report NotReady again shortly after its first Ready (its engine still
  # cleaning up after a hard kill, say): start returns only with every node Ready now.
  for i in $(seq "$n"); do
    node_ready "$i" && continue
    say "node $(node_name "$i") went NotReady after its first Ready: $(node_ready_message "$i")"
    wait_for "node $(node_name "$i") Ready again" 120 node_ready "$i"
  done
  say "$n nodes Ready, DNS and Services up"
  {
    echo "KUBECONFIG=$K/admin.kubeconfig"
    echo "DOCKER_HOST=$(node_sock 1)"
    echo "ELASTICDL_NODE_REGISTRY=$REGISTRY"
    echo "ELASTICDL_NODE_API=127.0.0.1:$API_PORT"
    for i in $(seq "$n"); do echo "ELASTICDL_NODE_$i=$(node_name "$i"),$(node_sock "$i")"; done
  } >"$K/env"
  cat "$K/env"
}

base_image() {
  alive dockerd-1 || die "the cluster is not running (start it first)"
  "$ROOT/scripts/container-engine/base-image.sh" "$(node_dir 1)/docker.sock" "$K/base-image" ||
    die "the base image could not be made (logs in $K/base-image)"
}

stop_pids() { # seconds-before-SIGKILL name...: TERM them together, wait, KILL what is left
  local t=$1 n pid pids=() names=(); shift
  for n in "$@"; do
    [[ -f $R/$n.pid ]] || continue
    pid=$(cat "$R/$n.pid")
    if running "$pid"; then kill -TERM "$pid"; pids+=("$pid"); names+=("$n"); fi
    rm -f "$R/$n.pid"
  done
  ((${#pids[@]})) || return 0
  local left
  for _ in $(seq $((t * 10))); do
    left=0; for pid in "${pids[@]}"; do running "$pid" && left=1; done
    ((left)) || break
    sleep 0.1
  done
  for pid in "${pids[@]}"; do running "$pid" && kill -KILL "$pid" 2>/dev/null; done
  for _ in $(seq 50); do # SIGKILL is not instant either
    left=0; for pid in "${pids[@]}"; do running "$pid" && left=1; done
    ((left)) || break
    sleep 0.1
  done
  say "stopped ${names[*]}"
}

cgroup_pids() { # cgroup dir: every pid in it and below
  find "$1" -name cgroup.procs -exec cat {} + 2>/dev/null
}

kill_node() { # node: every process of the node dies at once, as when its machine loses power
  local i=$1 f; f=$(freezer "$i")
  [[ -d $f ]] || return 0
  # Frozen first, so that nothing forks or restarts a container while the kill goes round.
  echo FROZEN >"$f/freezer.state" 2>/dev/null || true
  for _ in $(seq 50); do [[ $(cat "$f/freezer.state" 2>/dev/null) == FROZEN ]] && break; sleep 0.1; done
  local pids; pids=$(cgroup_pids "$f")
  [[ -z $pids ]] || kill -KILL $pids 2>/dev/null || true
  echo THAWED >"$f/freezer.state" 2>/dev/null || true
  for _ in $(seq 100); do [[ -z $(cgroup_pids "$f") ]] && break; sleep 0.1; done
  rm -f "$R/kubelet-$i.pid" "$R/dockerd-$i.pid" "$R/mntns-$i.pid"
  if [[ -n $(cgroup_pids "$f") ]]; then
    echo "start-node: error: processes of node $i left in $f: $(cgroup_pids "$f" | tr '\n' ' ')" >&2
    return 1
  fi
}

stop_node() { # I: a node loss
  local i=${1:-} n; n=$(node_count)
  [[ $i =~ ^[0-9]+$ ]] && ((i >= 1 && i <= n)) || die "stop-node: I must be a node number 1..$n (got '${i}')"
  [[ -f $R/nodes ]] || die "the cluster is not running"
  kill_node "$i" || exit 1
  say "node $(node_name "$i") is down (kubelet, engine and every container killed)"
}

start_node() { # I: the node boots again
  local i=${1:-} n; n=$(node_count)
  [[ $i =~ ^[0-9]+$ ]] && ((i >= 1 && i <= n)) || die "start-node: I must be a node number 1..$n (got '${i}')"
  alive kube-apiserver || die "the cluster is not running (start it first)"
  boot_node "$i" "$n"
  wait_for "node $(node_name "$i") Ready" 120 node_ready "$i"
  say "node $(node_name "$i") is Ready"
}

# --- Teardown. What start made is found by name and tag, not only in its records: a crash or
# an older version of this script may have lost the run dir ($R), and whatever is left of an
# earlier cluster (an iptables rule leading the apiserver's port elsewhere, a route, a bridge)
# breaks the next cluster or another Kubernetes on the machine.

cluster_pids() { # state dir: the live control-plane processes of the cluster kept there
  # (found by their command lines, which name files of the state dir; each node's processes
  # are in its cgroup, see kill_node)
  local dir=$1 f pid argv0 args
  for f in $(grep -laF -- "$dir/" /proc/[0-9]*/cmdline 2>/dev/null); do
    pid=${f#/proc/}; pid=${pid%/cmdline}
    args=$(tr '\0' '\n' <"$f" 2>/dev/null) || continue
    argv0=$(basename "$(head -n1 <<<"$args")")
    case $argv0 in
      etcd | kube-apiserver | kube-controller-manager | kube-scheduler | kube-proxy | dnsmasq | docker-registry) ;;
      python3*) [[ $(sed -n 2p <<<"$args") == */cluster-dns.py ]] || continue ;;
      *) continue ;;
    esac
    running "$pid" && echo "$pid"
  done
  return 0
}

other_cluster() { # the state dir of another cluster that runs on this machine, if any
  [[ -f $OWNER ]] || return 0
  local other; other=$(cat "$OWNER")
  [[ -n $other && $other != "$K" ]] || return 0
  if { [[ -f $other/run/kube-apiserver.pid ]] && running "$(cat "$other/run/kube-apiserver.pid")"; } ||
    [[ -n $(cluster_pids "$other") ]]; then
    echo "$other"
  fi
}

kill_pids() { # seconds-before-SIGKILL pid...: TERM them, wait, KILL what is left
  local t=$1 pid left; shift
  (($#)) || return 0
  kill -TERM "$@" 2>/dev/null || true
  for _ in $(seq $((t * 10))); do
    left=0; for pid in "$@"; do running "$pid" && left=1; done
    ((left)) || return 0
    sleep 0.1
  done
  kill -KILL "$@" 2>/dev/null || true
  for _ in $(seq 50); do
    left=0; for pid in "$@"; do running "$pid" && left=1; done
    ((left)) || return 0
    sleep 0.1
  done
}

tagged_rule() { # table: "<chain> <number>" of one iptables rule carrying our tag, if any
  iptables -w -t "$1" -S 2>/dev/null | awk -v tag="$TAG" '
    $1 == "-A" {
      n[$2]++
      for (i = 3; i < NF; i++)
        if ($i == "--comment" && ($(i + 1) == tag || $(i + 1) == "\"" tag "\"")) { print $2, n[$2]; exit }
    }'
}

has_tag() { # table chain number: that rule carries our tag
  iptables -w -t "$1" -S "$2" "$3" 2>/dev/null | grep -qE -- "--comment \"?$TAG\"?( |$)"
}

sweep_tagged_rules() { # prints how many rules of ours it removed
  local t c num removed=0 tries
  for t in raw mangle nat filter; do
    for tries in $(seq 100); do
      c="" num=""
      read -r c num < <(tagged_rule "$t") || true
      [[ -n $c ]] || break
      # by rule number, read afresh each time and checked right before (another program, such
      # as a Docker engine, may insert rules meanwhile): no rule text is guessed or replayed
      if has_tag "$t" "$c" "$num" && iptables -w -t "$t" -D "$c" "$num" 2>/dev/null; then
        removed=$((removed + 1))
      fi
    done
  done
  echo "$removed"
}

chains_cleanup() { # prefix: every iptables chain named <prefix>*, and the rules jumping to it
  local prefix=$1 t c num ours
  for t in raw mangle nat filter; do
    ours=$(iptables -w -t "$t" -S 2>/dev/null | awk -v p="$prefix" '$1 == "-N" && index($2, p) == 1 {print $2}')
    [[ -n $ours ]] || continue
    for c in $(iptables -w -t "$t" -S | awk '$1 == "-P" || $1 == "-N" {print $2}'); do
      [[ $c == "$prefix"* ]] && continue
      # by rule number (last first): no rule text is parsed or replayed
      for num in $(iptables -w -t "$t" -L "$c" -n --line-numbers |
        awk -v p="$prefix" 'NR > 2 && index($2, p) == 1 {print $1}' | sort -rn); do
        iptables -w -t "$t" -D "$c" "$num" || true
      done
    done
    for c in $ours; do iptables -w -t "$t" -F "$c" || true; done
    for c in $ours; do iptables -w -t "$t" -X "$c" || true; done
  done
}

sweep_network() { # every rule, chain, link and route of ours; prints what it removed
  local gone=() evidence="" t m n
  # Kubernetes' chains (kube-proxy's KUBE-*, portmap's CNI-*) are removed only where the
  # cluster was ours: its records, its owner file, or rules with our tag. (start refuses to run
  # where any existed before it.)
  [[ -s $R/net ]] && evidence="records"
  [[ -f $OWNER && $(cat "$OWNER") == "$K" ]] && evidence="owner file"
  [[ -n $(for t in raw mangle nat filter; do tagged_rule "$t"; done) ]] && evidence="tagged rules"
  if [[ -f $R/net ]]; then # sysctls are not named: only the record knows what to restore
    while read -r t m; do [[ $t != sysctl ]] || sysctl -qw "$m" || true; done <"$R/net"
  fi
  n=$(sweep_tagged_rules)
  ((n == 0)) || gone+=("$n iptables rules tagged $TAG")
  if [[ -n $evidence ]]; then
    local saved
    for t in KUBE- CNI-; do
      saved=$(iptables-save 2>/dev/null || true)
      if grep -q "^:$t" <<<"$saved"; then chains_cleanup "$t"; gone+=("the ${t}* chains"); fi
    done
  fi
  for n in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep -E "$OUR_LINKS"); do
    # veths still on our bridges first (none expected: they go with the pods' namespaces)
    for m in $(ip -o link show master "$n" 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1); do
      ip link del "$m" 2>/dev/null && gone+=("veth $m")
    done
    ip link del "$n" 2>/dev/null && gone+=("link $n")
  done
  if ip route show table main exact "$NET" | grep -q '^unreachable'; then
    ip route del unreachable "$NET" 2>/dev/null && gone+=("route unreachable $NET")
  fi
  rm -f "$R/net"
  ((${#gone[@]} == 0)) || joined "${gone[@]}"
  return 0
}

joined() { local out=$1; shift; for a in "$@"; do out+="; $a"; done; echo "$out"; }

node_dirs_count() { # the highest node number with a directory in the state dir
  local n=0 d
  for d in "$K"/n[0-9]*; do [[ -d $d ]] && ((${d##*/n} > n)) && n=${d##*/n}; done
  echo "$n"
}

unmount_state() { # mounts under the state dir in the host's table (none expected)
  local m
  for _ in 1 2 3; do
    { grep -F " $K/" /proc/self/mounts || true; } | awk '{print $2}' | sort -r | while read -r m; do
      umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    done
    grep -qF " $K/" /proc/self/mounts || break
    sleep 0.5
  done
}

sweep_leftovers() { # at start, where no cluster of this state dir runs: whatever one left
  local found=() pids i n what
  pids=$(cluster_pids "$K")
  if [[ -n $pids ]]; then
    # shellcheck disable=SC2086
    kill_pids 10 $pids; found+=("processes $(echo $pids)")
  fi
  n=$(node_dirs_count)
  for i in $(seq "$n"); do
    if [[ -n $(cgroup_pids "$(freezer "$i")") ]]; then kill_node "$i" || exit 1; found+=("node $i's processes"); fi
  done
  rm -f "$R"/*.pid
  unmount_state
  what=$(sweep_network)
  [[ -z $what ]] || found+=("$what")
  ((${#found[@]} == 0)) || say "removed what an earlier cluster left: $(joined "${found[@]}")"
}

stop() {
  local other; other=$(other_cluster)
  [[ -z $other ]] || die "another cluster runs from $other, not from $K (one per machine): stop it with ELASTICDL_NODE_DIR=$other $0 stop"
  if [[ ! -d $K ]]; then # nothing of the state dir, but perhaps of the network
    local what; what=$(sweep_network)
    [[ -z $what ]] || say "removed $what"
    return 0
  fi
  mkdir -p "$R"
  local n i d
  n=$(node_dirs_count)
  # The kubelets first (else they restart what we remove), then the pods' containers.
  local kubelets=(); for i in $(seq "$n"); do kubelets+=("kubelet-$i"); done
  stop_pids 10 "${kubelets[@]}"
  for i in $(seq "$n"); do
    alive "dockerd-$i" || continue
    local ids; ids=$(dk "$i" ps -aq --filter label=io.kubernetes.pod.uid 2>/dev/null || true)
    [[ -z $ids ]] || dk "$i" rm -f $ids >/dev/null 2>&1 || true
    # (images a later pull or build untagged: the kept ones are tagged)
    dk "$i" image prune -f >/dev/null 2>&1 || true
  done
  stop_pids 10 dnsmasq cluster-dns kube-proxy kube-scheduler kube-controller-manager kube-apiserver registry
  stop_pids 10 etcd
  # and those whose pid files were lost
  local strays; strays=$(cluster_pids "$K")
  if [[ -n $strays ]]; then
    # shellcheck disable=SC2086
    kill_pids 10 $strays; say "stopped processes without a pid file: $(echo $strays)"
  fi
  local dockerds=(); for i in $(seq "$n"); do dockerds+=("dockerd-$i"); done
  stop_pids 30 "${dockerds[@]}"
  # What is left of each node (its namespace holder, shims of killed containers) dies with its
  # cgroup; with the last process the node's mount namespace goes, and with it every mount of
  # the engine and kubelet and the pods' network namespaces (their veths leave the bridges).
  local failed=0
  for i in $(seq "$n"); do kill_node "$i" || failed=1; done
  unmount_state
  local what; what=$(sweep_network)
  say "network removed${what:+: $what}"
  local m
  for m in /sys/fs/cgroup/*/; do # the nodes' cgroups (kubepods/..., daemons), then CGROOT if empty
    for i in $(seq "$n"); do
      [[ -d ${m%/}$(cg_node "$i") ]] && find "${m%/}$(cg_node "$i")" -depth -type d -exec rmdir {} \; 2>/dev/null || true
    done
    rmdir "${m%/}$CGROOT" 2>/dev/null || true
  done
  if [[ -f $K/created-dirs ]]; then
    while read -r d; do [[ -n $d ]] && rm -rf "$d"; done <"$K/created-dirs"
    rm -f "$K/created-dirs"
  fi
  [[ -f $OWNER && $(cat "$OWNER") == "$K" ]] && rm -f "$OWNER"
  ((failed == 0)) || die "processes of a node survived (see above)"
  if grep -qF " $K/" /proc/self/mounts; then
    die "mounts under $K are left: $(grep -F " $K/" /proc/self/mounts | awk '{print $2}' | tr '\n' ' ')"
  fi
  # The cluster's state goes (the next start is a fresh cluster); certificates, the registry's
  # images (less the layers no tag holds any more) and the engines' images stay for the next
  # start unless --purge.
  if [[ -d $K/registry-data && -f $K/registry.yml && ${1:-} != --purge ]]; then
    docker-registry garbage-collect --delete-untagged "$K/registry.yml" >/dev/null 2>&1 ||
      say "the registry's garbage collection failed: its data stays as it was"
  fi
  rm -rf "$K/etcd" "$K/controller-flexvolume" "$K/dns" "$R" "$K/env"
  for i in $(seq "$n"); do
    d=$(node_dir "$i")
    rm -rf "$d/kubelet" "$d/dockershim" "$d/cni" "$d/host" "$d/docker/exec"
  done
  [[ ${1:-} == --purge ]] && rm -rf "$K"
  say "stopped"
}

status() {
  local rc=0 name i n
  n=$(node_count)
  for name in registry etcd kube-apiserver kube-controller-manager kube-scheduler kube-proxy cluster-dns dnsmasq; do
    if alive "$name"; then echo "$name: running (pid $(cat "$R/$name.pid"))"; else echo "$name: stopped"; rc=3; fi
  done
  for i in $(seq "$n"); do
    for name in dockerd kubelet; do
      if alive "$name-$i"; then echo "node $(node_name "$i") $name: running (pid $(cat "$R/$name-$i.pid"))"
      else echo "node $(node_name "$i") $name: stopped"; rc=3; fi
    done
  done
  alive kube-apiserver && kc get nodes -o wide 2>/dev/null || true
  return $rc
}

cmd=${1:-}; shift || true
case $cmd in
  start)
    ASKED=""
    while (($#)); do
      case $1 in
        --nodes) ASKED=${2:-}; shift 2 || true ;;
        --nodes=*) ASKED=${1#--nodes=}; shift ;;
        *) die "start: unknown argument '$1' (start [--nodes N])" ;;
      esac
    done
    if [[ -n $ASKED ]] && ! { [[ $ASKED =~ ^[0-9]+$ ]] && ((ASKED >= 1 && ASKED <= 9)); }; then
      die "start: --nodes must be a number 1..9 (got '$ASKED')"
    fi
    start ;;
  stop) stop "${1:-}" ;;
  stop-node) stop_node "${1:-}" ;;
  start-node) start_node "${1:-}" ;;
  status) status ;;
  base-image) base_image ;;
  *) usage ;;
esac
