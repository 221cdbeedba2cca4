#!/usr/bin/env bash
# Build Kubernetes v1.20.2 components for ElasticDL's Kubernetes tests and local node, into a
# cache outside the repository.
#
#   scripts/k8s/build-k8s.sh [COMPONENT...]   # default: kube-apiserver kube-controller-manager etcd
#
# Components:
#   kube-apiserver kube-controller-manager kube-scheduler kubelet
#            compiled from Debian bookworm's `kubernetes` source package (the upstream v1.20.2
#            tree with vendor/, plus Debian's patches) with Debian's Go 1.19, CGO_ENABLED=0
#            (static binaries), fully offline apart from the Debian archive itself;
#   etcd     from Debian's etcd-server package;
#   kubectl  from Debian's kubernetes-client package (the same 1.20.2 source);
#   busybox  from Debian's busybox-static package (the node's local pause and busybox images).
#
# Output: $ELASTICDL_K8S_CACHE/bin/<component> (default $HOME/.cache/elasticdl/k8s-1.20.2).
# Idempotent: only missing components are made; exits at once when all exist. Components asked
# for together share one source tree and Go build cache (the second binary is much cheaper).
# The system is not changed: apt runs with a private config/state/cache under the cache dir,
# packages are unpacked with dpkg-deb -x, and the Makefile's `rsync` is provided by a shim.
# The ~2 GB build tree is deleted at the end (set ELASTICDL_K8S_KEEP_BUILD=1 to keep it; a kept
# tree is reused by the next run).
set -euo pipefail

K8S_DEB_VERSION="1.20.5+really1.20.2-1.1+deb12u1"
CACHE="${ELASTICDL_K8S_CACHE:-$HOME/.cache/elasticdl/k8s-1.20.2}"
BIN="$CACHE/bin"
WORK="$CACHE/build"
COMPILED=(kube-apiserver kube-controller-manager kube-scheduler kubelet)
WANT=("$@")
((${#WANT[@]})) || WANT=(kube-apiserver kube-controller-manager etcd)
MIRROR="${ELASTICDL_DEBIAN_MIRROR:-}"
SEC_MIRROR="${ELASTICDL_DEBIAN_SECURITY_MIRROR:-}"

log() { echo "[build-k8s] $(date +%H:%M:%S) $*" >&2; }
die() { echo "build-k8s: error: $1" >&2; exit "${2:-1}"; }

for c in "${WANT[@]}"; do
  case $c in
    kube-apiserver|kube-controller-manager|kube-scheduler|kubelet|etcd|kubectl|busybox) ;;
    *) die "unknown component '$c' (kube-apiserver kube-controller-manager kube-scheduler kubelet etcd kubectl busybox)" 2 ;;
  esac
done
missing() { # the wanted components whose binary is not in $BIN yet
  local c; MISSING=()
  for c in "${WANT[@]}"; do [[ -x "$BIN/$c" ]] || MISSING+=("$c"); done
}
missing
if ((${#MISSING[@]} == 0)); then
  log "${WANT[*]} already present in $BIN; nothing to do"
  exit 0
fi

for tool in apt-get dpkg-source dpkg-deb make; do
  command -v "$tool" >/dev/null || die "'$tool' not found; this script needs a Debian/Ubuntu host with dpkg-dev and make" 2
done

# Mirrors: reuse the URIs the host already trusts (deb822 or one-line sources).
if [[ -z "$MIRROR" ]]; then
  MIRROR=$(grep -hoE 'https?://[^ ]*/debian/?$' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null | head -n1 || true)
  MIRROR=${MIRROR:-http://deb.debian.org/debian}
fi
if [[ -z "$SEC_MIRROR" ]]; then
  SEC_MIRROR=$(grep -hoE 'https?://[^ ]*/debian-security/?$' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null | head -n1 || true)
  SEC_MIRROR=${SEC_MIRROR:-http://deb.debian.org/debian-security}
fi
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
[[ -f "$KEYRING" ]] || die "$KEYRING missing (install debian-archive-keyring)" 2

mkdir -p "$BIN" "$WORK"
LOCK="$CACHE/.build.lock"
exec 9>"$LOCK"
if ! flock -n 9; then
  log "another build holds $LOCK; waiting for it"
  flock 9
  missing
  if ((${#MISSING[@]} == 0)); then log "the other build finished; nothing to do"; exit 0; fi
fi
log "making ${MISSING[*]}"

cleanup() {
  if [[ "${ELASTICDL_K8S_KEEP_BUILD:-0}" != 1 ]]; then rm -rf "$WORK"; fi
}
trap cleanup EXIT

# ---- private apt -----------------------------------------------------------------------
APTDIR="$WORK/apt"
mkdir -p "$APTDIR"/{lists/partial,cache/archives/partial,etc/sources.list.d,etc/preferences.d}
cat >"$APTDIR/etc/sources.list" <<SRC
deb [signed-by=$KEYRING] $MIRROR bookworm main
deb-src [signed-by=$KEYRING] $MIRROR bookworm main
deb [signed-by=$KEYRING] $MIRROR bookworm-updates main
deb-src [signed-by=$KEYRING] $MIRROR bookworm-updates main
deb [signed-by=$KEYRING] $SEC_MIRROR bookworm-security main
deb-src [signed-by=$KEYRING] $SEC_MIRROR bookworm-security main
SRC
APT_OPTS=(
  -o "Dir::Etc::sourcelist=$APTDIR/etc/sources.list"
  -o "Dir::Etc::sourceparts=$APTDIR/etc/sources.list.d"
  -o "Dir::Etc::preferencesparts=$APTDIR/etc/preferences.d"
  -o "Dir::State::Lists=$APTDIR/lists"
  -o "Dir::Cache=$APTDIR/cache"
  -o "Dir::Cache::archives=$APTDIR/cache/archives"
  -o "APT::Sandbox::User=root"
  -o "Debug::NoLocking=1"
  -o "APT::Get::Download-Only=true"
)
if [[ $(id -u) -ne 0 ]]; then APT_OPTS+=(-o "APT::Sandbox::User=$(id -un)"); fi
log "apt update (private state in $APTDIR; mirrors $MIRROR, $SEC_MIRROR)"
apt-get "${APT_OPTS[@]}" -qq update

# ---- Debian binary packages (etcd, kubectl, busybox) ---------------------------------------
cd "$WORK"
mkdir -p debs prefix
deb_component() { # component package path-in-package
  [[ -x "$BIN/$1" ]] && return
  [[ " ${MISSING[*]} " == *" $1 "* ]] || return 0
  log "downloading $2"
  (cd debs && apt-get "${APT_OPTS[@]}" -qq download "$2")
  dpkg-deb -x "$(ls debs/"$2"_*.deb | head -n1)" prefix
  [[ -x "prefix/$3" ]] || die "$3 not found in the $2 package"
  install -m 0755 "prefix/$3" "$BIN/$1.tmp" && mv -f "$BIN/$1.tmp" "$BIN/$1"
}
deb_component etcd etcd-server usr/bin/etcd
# kubectl: unpacked, not apt-installed (a host may have another package owning /usr/bin/kubectl).
deb_component kubectl kubernetes-client usr/bin/kubectl
deb_component busybox busybox-static bin/busybox

# ---- sources and toolchain ----------------------------------------------------------------
TO_COMPILE=()
for c in "${COMPILED[@]}"; do [[ " ${MISSING[*]} " == *" $c "* ]] && TO_COMPILE+=("$c"); done
if ((${#TO_COMPILE[@]} == 0)); then log "done: ${WANT[*]} in $BIN"; exit 0; fi

if [[ ! -f "$WORK/k8s/.extracted" ]]; then
  rm -rf "$WORK/k8s"
  log "downloading kubernetes=$K8S_DEB_VERSION source package"
  apt-get "${APT_OPTS[@]}" -qq source --download-only "kubernetes=$K8S_DEB_VERSION"
  log "extracting (dpkg-source applies Debian's patches)"
  dpkg-source -x --no-check kubernetes_*.dsc k8s >/dev/null
  touch "$WORK/k8s/.extracted"
fi
if [[ ! -x "$WORK/prefix/usr/lib/go-1.19/bin/go" ]]; then
  log "downloading golang-1.19"
  (cd debs && apt-get "${APT_OPTS[@]}" -qq download golang-1.19-go golang-1.19-src)
  for deb in debs/golang-1.19-*.deb; do dpkg-deb -x "$deb" prefix; done
fi
GOROOT="$WORK/prefix/usr/lib/go-1.19"
[[ -x "$GOROOT/bin/go" ]] || die "Go toolchain not found at $GOROOT"

# rsync shim: the Makefile only copies local trees with it; keep the host untouched.
SHIM="$WORK/shim"
mkdir -p "$SHIM"
if ! command -v rsync >/dev/null; then
  cat >"$SHIM/rsync" <<'SH'
#!/usr/bin/env bash
# Minimal local `rsync` for Kubernetes' build scripts: copies SRC... into DST (cp -pR semantics,
# a trailing slash on SRC copies its contents). Options are ignored.
args=(); for a in "$@"; do [[ "$a" == -* ]] || args+=("$a"); done
(( ${#args[@]} >= 2 )) || exit 0
dst="${args[-1]}"; unset 'args[-1]'
mkdir -p "$dst" 2>/dev/null || true
for s in "${args[@]}"; do
  if [[ "$s" == */ ]]; then cp -pR "$s". "$dst"; else cp -pR "$s" "$dst"; fi
done
SH
  chmod +x "$SHIM/rsync"
fi

# ---- build -------------------------------------------------------------------------------
export GOROOT PATH="$GOROOT/bin:$SHIM:$PATH" GOPROXY=off GOFLAGS=-mod=vendor CGO_ENABLED=0 \
  GOPATH="$WORK/gopath" GOCACHE="$WORK/gocache" HOME="$WORK/home" GO111MODULE=on \
  KUBE_GIT_VERSION=v1.20.2 KUBE_GIT_TREE_STATE=clean
mkdir -p "$HOME"
cd "$WORK/k8s"
for what in "${TO_COMPILE[@]}"; do
  t0=$SECONDS
  log "make WHAT=cmd/$what (minutes)"
  make WHAT="cmd/$what" >"$WORK/make-$what.log" 2>&1 || { tail -n 40 "$WORK/make-$what.log" >&2; exit 1; }
  install -m 0755 "_output/bin/$what" "$BIN/$what.tmp" && mv -f "$BIN/$what.tmp" "$BIN/$what"
  log "built $what in $((SECONDS - t0)) s"
done
log "done: $("$BIN/kube-apiserver" --version 2>&1 | head -n1 || true); ${WANT[*]} in $BIN"
