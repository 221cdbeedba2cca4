#!/usr/bin/env bash
# Build a real kube-apiserver + kube-controller-manager (Kubernetes v1.20.2) and fetch
# etcd-server, for ElasticDL's Kubernetes tests.
#
# No registry ships kube-apiserver binaries, so they are compiled from Debian bookworm's
# `kubernetes` source package (the upstream v1.20.2 tree with vendor/, plus Debian's patches)
# with Debian's Go 1.19, fully offline apart from the Debian archive itself. etcd comes from
# Debian's etcd-server package.
#
# Output: $ELASTICDL_K8S_CACHE/bin/{kube-apiserver,kube-controller-manager,etcd}
#   (default $HOME/.cache/elasticdl/k8s-1.20.2). Idempotent: exits at once when all exist.
# The system is not changed: apt runs with a private config/state/cache under the cache dir,
# packages are unpacked with dpkg-deb -x, and the Makefile's `rsync` is provided by a shim.
# The ~1.9 GB build tree is deleted at the end (set ELASTICDL_K8S_KEEP_BUILD=1 to keep it).
set -euo pipefail

K8S_DEB_VERSION="1.20.5+really1.20.2-1.1+deb12u1"
CACHE="${ELASTICDL_K8S_CACHE:-$HOME/.cache/elasticdl/k8s-1.20.2}"
BIN="$CACHE/bin"
WORK="$CACHE/build"
MIRROR="${ELASTICDL_DEBIAN_MIRROR:-}"
SEC_MIRROR="${ELASTICDL_DEBIAN_SECURITY_MIRROR:-}"

log() { echo "[build-apiserver] $(date +%H:%M:%S) $*" >&2; }

if [[ -x "$BIN/kube-apiserver" && -x "$BIN/kube-controller-manager" && -x "$BIN/etcd" ]]; then
  log "binaries already present in $BIN; nothing to do"
  exit 0
fi

for tool in apt-get dpkg-source dpkg-deb make; do
  command -v "$tool" >/dev/null || { echo "build-apiserver: '$tool' not found; this script needs a Debian/Ubuntu host with dpkg-dev and make" >&2; exit 2; }
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
[[ -f "$KEYRING" ]] || { echo "build-apiserver: $KEYRING missing (install debian-archive-keyring)" >&2; exit 2; }

mkdir -p "$BIN" "$WORK"
LOCK="$CACHE/.build.lock"
exec 9>"$LOCK"
if ! flock -n 9; then
  log "another build holds $LOCK; waiting for it"
  flock 9
  if [[ -x "$BIN/kube-apiserver" && -x "$BIN/kube-controller-manager" && -x "$BIN/etcd" ]]; then
    log "the other build finished; nothing to do"; exit 0
  fi
fi

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

# ---- sources and toolchain ----------------------------------------------------------------
cd "$WORK"
log "downloading kubernetes=$K8S_DEB_VERSION source package"
apt-get "${APT_OPTS[@]}" -qq source --download-only "kubernetes=$K8S_DEB_VERSION"
log "extracting (dpkg-source applies Debian's patches)"
dpkg-source -x --no-check kubernetes_*.dsc k8s >/dev/null

log "downloading golang-1.19 and etcd debs"
mkdir -p debs prefix
(cd debs && apt-get "${APT_OPTS[@]}" -qq download golang-1.19-go golang-1.19-src etcd-server)
for deb in debs/*.deb; do dpkg-deb -x "$deb" prefix; done
GOROOT="$WORK/prefix/usr/lib/go-1.19"
[[ -x "$GOROOT/bin/go" ]] || { echo "build-apiserver: Go toolchain not found at $GOROOT" >&2; exit 1; }
ETCD_BIN=$(find prefix/usr/bin -name etcd -type f | head -n1)
[[ -n "$ETCD_BIN" ]] || { echo "build-apiserver: etcd binary not found in etcd-server deb" >&2; exit 1; }

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
for what in kube-apiserver kube-controller-manager; do
  log "make WHAT=cmd/$what (several minutes)"
  make WHAT="cmd/$what" >"$WORK/make-$what.log" 2>&1 || { tail -n 40 "$WORK/make-$what.log" >&2; exit 1; }
done

install -m 0755 "_output/bin/kube-apiserver" "$BIN/kube-apiserver.tmp"
install -m 0755 "_output/bin/kube-controller-manager" "$BIN/kube-controller-manager.tmp"
install -m 0755 "$WORK/$ETCD_BIN" "$BIN/etcd.tmp"
for b in kube-apiserver kube-controller-manager etcd; do mv -f "$BIN/$b.tmp" "$BIN/$b"; done
log "done: $("$BIN/kube-apiserver" --version 2>&1 | head -n1); binaries in $BIN"
