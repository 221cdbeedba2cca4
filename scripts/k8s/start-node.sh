#!/usr/bin/env bash
# A real single-node Kubernetes v1.20.2 on loopback, for ElasticDL jobs in real containers:
# etcd + kube-apiserver + kube-controller-manager + kube-scheduler + a real kubelet (its
# built-in dockershim) driving a private Docker engine, plus a local registry.
#
#   scripts/k8s/start-node.sh start        # ~20-30 s; prints KUBECONFIG=... and DOCKER_HOST=...
#   scripts/k8s/start-node.sh status
#   scripts/k8s/start-node.sh base-image   # imports local/base:latest (Debian + python3) into
#                                          # the node's engine, for deploy/docker/build-images.sh
#   scripts/k8s/start-node.sh stop [--purge]  # stops all it started (by pid); leaves no
#                                          # process, mount, bridge, cgroup or pod log dir
#                                          # behind; --purge also deletes images and certificates
#
# Binaries: scripts/k8s/build-node.sh (run first when one is missing). Engine: Debian's
# docker.io + docker-registry (scripts/container-engine/install.sh). Needs root and cgroup v1.
# See scripts/k8s/README.md for why each flag is there.
#
# Env (defaults):
#   ELASTICDL_NODE_DIR (/tmp/elasticdl-node)   state: certificates, logs, pids, etcd, docker
#   ELASTICDL_NODE_PORT_BASE (24300)           apiserver +0, etcd +1/+2, kubelet +10,
#                                              registry +20; all on 127.0.0.1
#   ELASTICDL_NODE_BRIDGE (edlnode0), ELASTICDL_NODE_BRIDGE_CIDR (172.31.251.1/24)
#   ELASTICDL_NODE_CGROUP (/elasticdl-node)    the kubelet's --cgroup-root
#   ELASTICDL_NODE_KUBELET_AUTH (secure)       secure: x509 client certificates + webhook
#                                              authorization; open: anyone on loopback (debug)
# The node is named "127.0.0.1" (--hostname-override) so that its InternalIP, every
# hostNetwork pod's IP and the apiserver->kubelet connection stay on loopback.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
K=${ELASTICDL_NODE_DIR:-/tmp/elasticdl-node}
BIN=${ELASTICDL_K8S_BIN:-${ELASTICDL_K8S_CACHE:-$HOME/.cache/elasticdl/k8s-1.20.2}/bin}
AUTH=${ELASTICDL_NODE_KUBELET_AUTH:-secure}
CGROOT=${ELASTICDL_NODE_CGROUP:-/elasticdl-node}
BRIDGE=${ELASTICDL_NODE_BRIDGE:-edlnode0}
BRIDGE_CIDR=${ELASTICDL_NODE_BRIDGE_CIDR:-172.31.251.1/24}
PB=${ELASTICDL_NODE_PORT_BASE:-24300}
if ! [[ $PB =~ ^[0-9]+$ ]] || ((PB < 1024 || PB > 65500)); then
  echo "start-node: error: ELASTICDL_NODE_PORT_BASE=$PB is not a port number in 1024..65500" >&2
  exit 2
fi
API_PORT=$PB ETCD_PORT=$((PB + 1)) ETCD_PEER=$((PB + 2))
KUBELET_PORT=$((PB + 10)) REGISTRY_PORT=$((PB + 20))
REGISTRY=127.0.0.1:$REGISTRY_PORT
DOCKER_SOCK=$K/docker.sock
export DOCKER_HOST=unix://$DOCKER_SOCK
DOCKER=/usr/bin/docker; [[ -x $DOCKER ]] || DOCKER=docker
NODE_NAME=127.0.0.1
L=$K/logs P=$K/pki R=$K/run
# One node per machine: the kubelet writes to fixed host paths (/var/lib/kubelet/device-plugins,
# /var/log/pods); this file names the state dir of the node that runs.
OWNER=/run/elasticdl-node.owner

t0=$(date +%s.%N)
say() { awk -v m="$*" -v t0="$t0" -v t="$(date +%s.%N)" 'BEGIN { printf "start-node: %5.1fs %s\n", t - t0, m }' >&2; }
die() { echo "start-node: error: $*" >&2; exit 1; }
alive() { [[ -f $R/$1.pid ]] && kill -0 "$(cat "$R/$1.pid")" 2>/dev/null; }
kc() { "$BIN/kubectl" --kubeconfig="$K/admin.kubeconfig" "$@"; }

spawn() { # name argv...: own session, output to $L/name.log, pid in $R/name.pid
  local name=$1; shift
  alive "$name" && return 0
  setsid "$@" </dev/null 9>&- >"$L/$name.log" 2>&1 &
  echo $! >"$R/$name.pid"
}

wait_for() { # what timeout-seconds command...
  local what=$1 t=$2; shift 2
  for _ in $(seq $((t * 5))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  die "$what not ready after ${t}s (logs in $L)"
}

kubeconfig() { # path user token
  cat >"$1" <<YAML
apiVersion: v1
kind: Config
clusters:
- name: elasticdl-node
  cluster: {server: "https://127.0.0.1:$API_PORT", certificate-authority: "$P/ca.crt"}
users:
- name: $2
  user: {token: "$3"}
contexts:
- name: elasticdl-node
  context: {cluster: elasticdl-node, user: $2, namespace: default}
current-context: elasticdl-node
YAML
  chmod 600 "$1"
}

certs() { # a throw-away CA, serving/client certificates, the service-account key, tokens
  [[ -f $P/tokens.csv && -f $P/etcd-client.crt ]] && return
  mkdir -p "$P"
  (
    cd "$P"
    umask 077
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 \
      -subj /CN=elasticdl-node-ca -addext basicConstraints=critical,CA:TRUE \
      -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
    sign() { # name subject extensions
      printf '%s\n' "$3" >"$1.ext"
      openssl req -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "$2" 2>/dev/null
      openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$1.crt" \
        -days 3650 -extfile "$1.ext" 2>/dev/null
    }
    local server="basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth"
    sign server /CN=kube-apiserver "$server
subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default.svc"
    # the apiserver's client certificate toward the kubelet (logs, exec, port-forward)
    sign kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
    # the kubelet's serving certificate, verified by the apiserver
    sign kubelet-serving "/CN=$NODE_NAME" "$server
subjectAltName=IP:127.0.0.1,DNS:localhost"
    # etcd: mutual TLS for clients (the apiserver) and peers
    sign etcd-server /CN=etcd "$server,clientAuth
subjectAltName=IP:127.0.0.1,DNS:localhost"
    sign etcd-client /CN=kube-apiserver-etcd-client "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
    chmod 644 ca.crt
    # random tokens: the admin (system:masters) and the kubelet (Node authorizer)
    admin=$(openssl rand -hex 16) node=$(openssl rand -hex 16)
    printf '%s\n' "$admin,elasticdl-node-admin,elasticdl-node-admin,\"system:masters\"" \
      "$node,system:node:$NODE_NAME,elasticdl-node-kubelet,\"system:nodes\"" >tokens.csv.tmp
    mv tokens.csv.tmp tokens.csv
  )
}

token_of() { awk -F, -v u="$1" '$2 == u {print $1}' "$P/tokens.csv"; }

start_dockerd() {
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link add "$BRIDGE" type bridge
    ip addr add "$BRIDGE_CIDR" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    echo "$BRIDGE" >"$R/bridge"
  fi
  mkdir -p "$K/docker"
  # runc wrapper: where root lacks CAP_SYS_RESOURCE (CapBnd bit 24 off, as on Firecracker VMs)
  # no process may lower its oom_score_adj, and the kubelet gives every sandbox -998 and
  # Guaranteed containers -997: runc init dies ("can't get final child's PID from pipe: EOF")
  # and no pod starts. Clamp negative values to 0 in the bundle's config.json (create/run) and
  # exec's process.json; positive values (Burstable, BestEffort) are kept.
  cat >"$K/docker/runc-clamp-oom" <<'SH'
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
  chmod +x "$K/docker/runc-clamp-oom"
  # Own data/exec root, socket and pidfile; own bridge; no iptables or masquerading, so a
  # second dockerd on the machine (docker0, iptables) is not disturbed.
  cat >"$K/docker/daemon.json" <<JSON
{ "data-root": "$K/docker/data", "exec-root": "$K/docker/exec", "pidfile": "$K/docker/dockerd.pidfile",
  "hosts": ["$DOCKER_HOST"], "bridge": "$BRIDGE", "iptables": false, "ip-masq": false,
  "ip-forward": false, "insecure-registries": ["$REGISTRY"],
  "exec-opts": ["native.cgroupdriver=cgroupfs"],
  "runtimes": {"runc-clamp-oom": {"path": "$K/docker/runc-clamp-oom"}}, "default-runtime": "runc-clamp-oom" }
JSON
  spawn dockerd dockerd --config-file "$K/docker/daemon.json"
  wait_for dockerd 30 curl -sf --unix-socket "$DOCKER_SOCK" http://d/_ping
}

start_registry() {
  cat >"$K/registry.yml" <<YML
version: 0.1
log: { level: warn }
storage: { filesystem: { rootdirectory: $K/registry-data }, delete: { enabled: true } }
http: { addr: $REGISTRY }
YML
  spawn registry docker-registry serve "$K/registry.yml"
  wait_for registry 10 curl -sf "http://$REGISTRY/v2/"
}

busybox_rootfs() { # a tarball with a static busybox and its applets
  local rootfs=$K/img/rootfs
  rm -rf "$rootfs"; mkdir -p "$rootfs"/{bin,tmp,etc,proc,sys,dev}
  cp "$BIN/busybox" "$rootfs/bin/busybox"
  for a in $("$BIN/busybox" --list); do [[ $a == busybox ]] || ln -sf busybox "$rootfs/bin/$a"; done
  echo 'root:x:0:0:root:/root:/bin/sh' >"$rootfs/etc/passwd"; echo 'root:x:0:' >"$rootfs/etc/group"
  chmod 1777 "$rootfs/tmp"
  tar -C "$rootfs" -cf "$K/img/busybox.tar" . && rm -rf "$rootfs"
}

images() { # local/busybox:node (test pods) and local/pause:node (the pods' sandbox)
  $DOCKER image inspect local/busybox:node local/pause:node >/dev/null 2>&1 && return
  mkdir -p "$K/img"
  busybox_rootfs
  $DOCKER import --change 'CMD ["/bin/sh"]' --change 'ENV PATH=/bin' "$K/img/busybox.tar" \
    local/busybox:node >/dev/null
  # The sandbox's PID 1 must exit on SIGTERM (PID 1 ignores signals it has no handler for),
  # else every pod deletion waits for the stop timeout.
  $DOCKER import --change 'ENTRYPOINT ["/bin/sh","-c","trap \"exit 0\" TERM INT; sleep 2147483647 & wait"]' \
    --change 'ENV PATH=/bin' "$K/img/busybox.tar" local/pause:node >/dev/null
  rm -f "$K/img/busybox.tar"
  say "imported local/busybox:node, local/pause:node"
}

cgroup_root() { # the kubelet refuses a --cgroup-root that does not exist in every hierarchy
  local c
  for c in /sys/fs/cgroup/*/; do
    c=${c%/}
    [[ $(basename "$c") == unified ]] && continue
    mountpoint -q "$c" || continue
    mkdir -p "$c$CGROOT"
    if [[ -f $c/cpuset.cpus ]]; then
      [[ -n $(cat "$c$CGROOT/cpuset.cpus") ]] || cat "$c/cpuset.cpus" >"$c$CGROOT/cpuset.cpus"
      [[ -n $(cat "$c$CGROOT/cpuset.mems") ]] || cat "$c/cpuset.mems" >"$c$CGROOT/cpuset.mems"
    fi
  done
}

preflight() {
  [[ $(id -u) == 0 ]] || die "needs root (dockerd, kubelet, cgroups, a bridge)"
  [[ -d /sys/fs/cgroup/memory ]] || die "needs cgroup v1 (no /sys/fs/cgroup/memory): the kubelet 1.20 dockershim runs on cgroup v1"
  command -v openssl >/dev/null || die "openssl not found"
  command -v ip >/dev/null || die "ip (iproute2) not found"
  "$ROOT/scripts/container-engine/install.sh"
  local b missing=()
  for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl busybox; do
    [[ -x $BIN/$b ]] || missing+=("$b")
  done
  if ((${#missing[@]})); then
    say "building ${missing[*]} (scripts/k8s/build-node.sh)"
    "$HERE/build-node.sh" >&2
  fi
  if [[ -f $OWNER ]]; then
    local other; other=$(cat "$OWNER")
    if [[ $other != "$K" ]] && [[ -f $other/run/kubelet.pid ]] && kill -0 "$(cat "$other/run/kubelet.pid")" 2>/dev/null; then
      die "another node runs from $other (one per machine; stop it with ELASTICDL_NODE_DIR=$other $0 stop)"
    fi
  fi
}

start() {
  preflight
  mkdir -p "$L" "$R" "$K/kubelet" "$K/dockershim"
  echo "$K" >"$OWNER"
  certs
  kubeconfig "$K/admin.kubeconfig" admin "$(token_of elasticdl-node-admin)"
  kubeconfig "$K/kubelet.kubeconfig" kubelet "$(token_of "system:node:$NODE_NAME")"
  start_dockerd
  say "dockerd up"
  images
  start_registry

  # etcd accepts only clients and peers with a certificate of our CA.
  spawn etcd "$BIN/etcd" --data-dir="$K/etcd" --name=elasticdl-node \
    --listen-client-urls=https://127.0.0.1:$ETCD_PORT --advertise-client-urls=https://127.0.0.1:$ETCD_PORT \
    --listen-peer-urls=https://127.0.0.1:$ETCD_PEER --initial-advertise-peer-urls=https://127.0.0.1:$ETCD_PEER \
    --initial-cluster=elasticdl-node=https://127.0.0.1:$ETCD_PEER \
    --cert-file="$P/etcd-server.crt" --key-file="$P/etcd-server.key" \
    --client-cert-auth --trusted-ca-file="$P/ca.crt" \
    --peer-cert-file="$P/etcd-server.crt" --peer-key-file="$P/etcd-server.key" \
    --peer-client-cert-auth --peer-trusted-ca-file="$P/ca.crt" --log-level=warn
  wait_for etcd 20 curl -sf --cacert "$P/ca.crt" --cert "$P/etcd-client.crt" --key "$P/etcd-client.key" \
    https://127.0.0.1:$ETCD_PORT/health

  spawn kube-apiserver "$BIN/kube-apiserver" --etcd-servers=https://127.0.0.1:$ETCD_PORT \
    --etcd-cafile="$P/ca.crt" --etcd-certfile="$P/etcd-client.crt" --etcd-keyfile="$P/etcd-client.key" \
    --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port=$API_PORT --insecure-port=0 \
    --tls-cert-file="$P/server.crt" --tls-private-key-file="$P/server.key" --client-ca-file="$P/ca.crt" \
    --token-auth-file="$P/tokens.csv" --authorization-mode=Node,RBAC --anonymous-auth=false \
    --service-account-key-file="$P/sa.pub" --service-account-signing-key-file="$P/sa.key" \
    --service-account-issuer=https://kubernetes.default.svc --service-cluster-ip-range=10.0.0.0/24 \
    --kubelet-client-certificate="$P/kubelet-client.crt" --kubelet-client-key="$P/kubelet-client.key" \
    --kubelet-certificate-authority="$P/ca.crt" --kubelet-preferred-address-types=InternalIP,Hostname \
    --allow-privileged=true --profiling=false --v=1
  wait_for kube-apiserver 90 curl -sf --cacert "$P/ca.crt" \
    -H "Authorization: Bearer $(token_of elasticdl-node-admin)" https://127.0.0.1:$API_PORT/readyz
  say "apiserver up"

  spawn kube-controller-manager "$BIN/kube-controller-manager" --kubeconfig="$K/admin.kubeconfig" \
    --leader-elect=false --service-account-private-key-file="$P/sa.key" --root-ca-file="$P/ca.crt" \
    --use-service-account-credentials=false --port=0 --secure-port=0 \
    --flex-volume-plugin-dir="$K/controller-flexvolume" --v=1
  spawn kube-scheduler "$BIN/kube-scheduler" --kubeconfig="$K/admin.kubeconfig" \
    --leader-elect=false --port=0 --secure-port=0 --v=1

  local auth=(--anonymous-auth=true --authorization-mode=AlwaysAllow)
  if [[ $AUTH == secure ]]; then
    auth=(--anonymous-auth=false --client-ca-file="$P/ca.crt" --authorization-mode=Webhook)
  fi
  auth+=(--tls-cert-file="$P/kubelet-serving.crt" --tls-private-key-file="$P/kubelet-serving.key")
  cgroup_root
  # Paths kubelet 1.20 hard-codes outside --root-dir; remember which ones we make.
  for d in /var/lib/kubelet /var/log/pods /var/log/containers; do
    [[ -e $d ]] || echo "$d" >>"$R/created-dirs"
  done
  spawn kubelet "$BIN/kubelet" --kubeconfig="$K/kubelet.kubeconfig" \
    --container-runtime=docker --docker-endpoint="$DOCKER_HOST" --docker="$DOCKER_HOST" \
    --experimental-dockershim-root-directory="$K/dockershim" \
    --pod-infra-container-image=local/pause:node \
    --root-dir="$K/kubelet" --cert-dir="$K/kubelet/pki" --volume-plugin-dir="$K/kubelet/volume-plugins" \
    --hostname-override=$NODE_NAME --address=127.0.0.1 --port=$KUBELET_PORT --read-only-port=0 \
    --healthz-port=0 "${auth[@]}" \
    --network-plugin= --resolv-conf=/etc/resolv.conf \
    --cgroup-driver=cgroupfs --cgroup-root="$CGROOT" \
    --fail-swap-on=false --make-iptables-util-chains=false \
    --eviction-hard='memory.available<100Mi,nodefs.available<1%,imagefs.available<1%' \
    --image-gc-high-threshold=100 --image-gc-low-threshold=99 --v=1
  # (no healthz port: it would answer without authentication; the node's Ready status tells)
  # Pods are refused until the token controller made the default service account's token.
  wait_for "default service account token" 60 bash -c "'$BIN/kubectl' --kubeconfig='$K/admin.kubeconfig' \
    get sa default -o jsonpath='{.secrets[0].name}' | grep -q ."
  wait_for "node Ready" 60 bash -c "'$BIN/kubectl' --kubeconfig='$K/admin.kubeconfig' get node $NODE_NAME \
    -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -qx True"
  say "node $NODE_NAME Ready"
  cat >"$K/env" <<ENV
KUBECONFIG=$K/admin.kubeconfig
DOCKER_HOST=$DOCKER_HOST
ELASTICDL_NODE_REGISTRY=$REGISTRY
ELASTICDL_NODE_API=127.0.0.1:$API_PORT
ENV
  cat "$K/env"
}

base_image() {
  alive dockerd || die "the node is not running (start it first)"
  $DOCKER image inspect local/base:latest >/dev/null 2>&1 && { echo "local/base:latest"; return; }
  mkdir -p "$K/img"
  python3 "$ROOT/scripts/container-engine/make_base_rootfs.py" "$K/img/base.tar" 2>>"$L/rootfs.log" ||
    die "make_base_rootfs.py failed, see $L/rootfs.log"
  $DOCKER import --change 'CMD ["/bin/bash"]' \
    --change 'ENV PIP_BREAK_SYSTEM_PACKAGES=1' --change 'ENV PIP_ROOT_USER_ACTION=ignore' \
    "$K/img/base.tar" local/base:latest >/dev/null || die "importing local/base failed"
  rm -f "$K/img/base.tar"
  say "imported local/base:latest"
  echo "local/base:latest"
}

stop_pids() { # seconds-before-SIGKILL name...: TERM them together, wait, KILL what is left
  local t=$1 n pid pids=() names=(); shift
  for n in "$@"; do
    [[ -f $R/$n.pid ]] || continue
    pid=$(cat "$R/$n.pid")
    if kill -0 "$pid" 2>/dev/null; then kill -TERM "$pid"; pids+=("$pid"); names+=("$n"); fi
    rm -f "$R/$n.pid"
  done
  ((${#pids[@]})) || return 0
  for _ in $(seq $((t * 10))); do
    kill -0 "${pids[@]}" 2>/dev/null || break
    sleep 0.1
  done
  for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"; done
  say "stopped ${names[*]}"
}

stop() {
  [[ -d $K ]] || return 0
  mkdir -p "$R"
  # The kubelet first (else it restarts what we remove), then the pods' containers.
  stop_pids 10 kubelet
  local uids=""
  if alive dockerd; then
    uids=$($DOCKER ps -a --filter label=io.kubernetes.pod.uid --format '{{.Label "io.kubernetes.pod.uid"}}' 2>/dev/null | sort -u || true)
    ids=$($DOCKER ps -aq --filter label=io.kubernetes.pod.uid 2>/dev/null || true)
    [[ -z $ids ]] || $DOCKER rm -f $ids >/dev/null 2>&1 || true
  fi
  stop_pids 10 kube-scheduler kube-controller-manager kube-apiserver registry
  stop_pids 10 etcd
  stop_pids 30 dockerd
  # containerd-shims of killed containers exit with their container; wait for docker's mounts
  # (overlay, shm, netns) and the kubelet's (secret tmpfs, its bind-mounted root) to go.
  local m
  for _ in 1 2 3; do
    { grep -F " $K/" /proc/self/mounts || true; } | awk '{print $2}' | sort -r | while read -r m; do
      umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    done
    grep -qF " $K/" /proc/self/mounts || break
    sleep 0.5
  done
  if [[ -f $R/bridge ]] || ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link del "$BRIDGE" 2>/dev/null || true
    rm -f "$R/bridge"
  fi
  local c
  for c in /sys/fs/cgroup/*/; do
    [[ -d ${c%/}$CGROOT ]] && find "${c%/}$CGROOT" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
  # dockershim's per-pod log dirs (/var/log/pods/NS_NAME_UID, symlinks in /var/log/containers):
  # only those whose links lead into our engine's data root (or of pods we just removed).
  local d u
  for u in $uids; do rm -rf /var/log/pods/*_"$u"; done
  for d in /var/log/pods/*/; do
    [[ -d $d ]] && find "$d" -type l -lname "$K/*" | grep -q . && rm -rf "$d"
  done
  for d in /var/log/containers/*; do
    [[ -L $d && ! -e $d ]] && rm -f "$d"   # dangling: its pod log dir is gone
  done
  if [[ -f $R/created-dirs ]]; then
    while read -r d; do [[ -n $d ]] && rm -rf "$d"; done <"$R/created-dirs"
    rm -f "$R/created-dirs"
  fi
  [[ -f $OWNER && $(cat "$OWNER") == "$K" ]] && rm -f "$OWNER"
  if grep -qF " $K/" /proc/self/mounts; then
    die "mounts under $K are left: $(grep -F " $K/" /proc/self/mounts | awk '{print $2}' | tr '\n' ' ')"
  fi
  # The cluster's state and the registry's data go (the next start is a fresh cluster);
  # certificates and the engine's images stay for the next start unless --purge.
  rm -rf "$K/etcd" "$K/kubelet" "$K/dockershim" "$K/controller-flexvolume" "$R" "$K/env" \
    "$K/registry-data"
  [[ ${1:-} == --purge ]] && rm -rf "$K"
  say "stopped"
}

status() {
  local n rc=0
  for n in dockerd registry etcd kube-apiserver kube-controller-manager kube-scheduler kubelet; do
    if alive "$n"; then echo "$n: running (pid $(cat "$R/$n.pid"))"; else echo "$n: stopped"; rc=3; fi
  done
  alive kube-apiserver && kc get nodes -o wide 2>/dev/null || true
  return $rc
}

case ${1:-} in
  start) start ;;
  stop) stop "${2:-}" ;;
  status) status ;;
  base-image) base_image ;;
  *) die "usage: $0 start|stop|status|base-image" ;;
esac
