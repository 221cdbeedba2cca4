#!/usr/bin/env bash
# Build Kubernetes v1.20.2 components for ElasticDL's Kubernetes tests and local node, into a
# cache outside the repository.
#
#   scripts/k8s/build-k8s.sh [COMPONENT...]   # default: kube-apiserver kube-controller-manager etcd
#
# Components:
#   kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy
#            compiled from Debian bookworm's `kubernetes` source package (the upstream v1.20.2
#            tree with vendor/, plus Debian's patches, plus this directory's patches/) with
#            Debian's Go 1.19, CGO_ENABLED=0 (static binaries), fully offline apart from the
#            Debian archive itself, all in ONE `make` (they share the compiled dependencies);
#   etcd     from Debian bookworm's etcd-server package;
#   kubectl  from Debian bookworm's kubernetes-client package (the same 1.20.2 source);
#   busybox  from Debian trixie's busybox-static package (the cluster's local pause and busybox
#            images): bookworm's busybox is built without wget's -T support yet accepts -T and
#            crashes on it (SIGSEGV); trixie's is static and runs on bookworm.
#
# patches/<component>--<what>.patch are applied to the source tree; each says why in its header.
#
# Output: $ELASTICDL_K8S_CACHE/bin/<component> (default $HOME/.cache/elasticdl/k8s-1.20.2), and
# bin/.key.<component>: what the binary was made from (package versions, patches' contents).
# A component counts as present only when its key matches, so changing a patch rebuilds the
# components it applies to and nothing else. Idempotent: exits at once when all are present.
# The system is not changed: apt runs with a private config/state/cache under the cache dir,
# packages are unpacked with dpkg-deb -x, and the Makefile's `rsync` is provided by a shim.
# The ~2 GB build tree is deleted at the end (set ELASTICDL_K8S_KEEP_BUILD=1 to keep it; a kept
# tree is reused by the next run).
set -euo pipefail

K8S_DEB_VERSION="1.20.5+really1.20.2-1.1+deb12u1"
GO_PACKAGE=golang-1.19
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PATCHES="$HERE/patches"
CACHE="${ELASTICDL_K8S_CACHE:-$HOME/.cache/elasticdl/k8s-1.20.2}"
BIN="$CACHE/bin"
WORK="$CACHE/build"
COMPILED=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy)
ALL=("${COMPILED[@]}" etcd kubectl busybox)
WANT=("$@")
((${#WANT[@]})) || WANT=(kube-apiserver kube-controller-manager etcd)
MIRROR="${ELASTICDL_DEBIAN_MIRROR:-}"
SEC_MIRROR="${ELASTICDL_DEBIAN_SECURITY_MIRROR:-}"

log() { echo "[build-k8s] $(date +%H:%M:%S) $*" >&2; }
die() { echo "build-k8s: error: $1" >&2; exit "${2:-1}"; }

for c in "${WANT[@]}"; do
  [[ " ${ALL[*]} " == *" $c "* ]] || die "unknown component '$c' (${ALL[*]})" 2
done

patches_of() { # component: its patch files, sorted
  local f
  for f in "$PATCHES/$1--"*.patch; do [[ -f $f ]] && echo "$f"; done
}
key_of() { # component: a digest of everything its binary is made from
  local c=$1 f
  {
    case $c in
      etcd) echo "bookworm etcd-server" ;;
      kubectl) echo "bookworm kubernetes-client" ;;
      busybox) echo "trixie busybox-static" ;;
      *)
        echo "bookworm kubernetes=$K8S_DEB_VERSION $GO_PACKAGE CGO_ENABLED=0 cmd/$c"
        for f in $(patches_of "$c"); do echo "${f##*/}"; cat "$f"; done
        ;;
    esac
  } | sha256sum | cut -c1-16
}
unpatched() { # component: made from exactly the bookworm packages, no patch applied
  [[ $1 != busybox && -z $(patches_of "$1") ]]
}
present() { # component: its binary exists and was made from what key_of names
  local c=$1
  [[ -x "$BIN/$c" ]] || return 1
  if [[ ! -f "$BIN/.key.$c" ]] && unpatched "$c"; then
    # A binary without a key record was made from the unpatched bookworm packages: it is
    # what this recipe makes for a component without patches, so it is kept.
    key_of "$c" >"$BIN/.key.$c"
  fi
  [[ -f "$BIN/.key.$c" && $(cat "$BIN/.key.$c") == "$(key_of "$c")" ]]
}
installed() { # component file: put a made binary in place with its key
  install -m 0755 "$2" "$BIN/$1.tmp" && mv -f "$BIN/$1.tmp" "$BIN/$1"
  key_of "$1" >"$BIN/.key.$1"
}
missing() { # the wanted components not present with their current key
  local c; MISSING=()
  for c in "${WANT[@]}"; do present "$c" || MISSING+=("$c"); done
}
missing
if ((${#MISSING[@]} == 0)); then
  log "${WANT[*]} already present in $BIN; nothing to do"
  exit 0
fi

for tool in apt-get dpkg-source dpkg-deb make patch sha256sum; do
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

mkdir -p "$BIN"
LOCK="$CACHE/.build.lock"
exec 9>"$LOCK"
if ! flock -n 9; then
  log "another build holds $LOCK; waiting for it"
  flock 9
  missing
  if ((${#MISSING[@]} == 0)); then log "the other build finished; nothing to do"; exit 0; fi
fi
mkdir -p "$WORK"
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
deb_component() { # component package path-in-package [apt options...]
  local c=$1 pkg=$2 path=$3 deb; shift 3
  [[ " ${MISSING[*]} " == *" $c "* ]] || return 0
  log "downloading $pkg"
  rm -f debs/"$pkg"_*.deb
  (cd debs && apt-get "${APT_OPTS[@]}" "$@" -qq download "$pkg")
  deb=$(ls debs/"$pkg"_*.deb | head -n1)
  rm -rf "prefix-$c" && mkdir "prefix-$c" && dpkg-deb -x "$deb" "prefix-$c"
  [[ -x "prefix-$c/$path" ]] || die "$path not found in the $pkg package"
  installed "$c" "prefix-$c/$path"
  log "$c from ${deb##*/}"
}
deb_component etcd etcd-server usr/bin/etcd
# kubectl: unpacked, not apt-installed (a host may have another package owning /usr/bin/kubectl).
deb_component kubectl kubernetes-client usr/bin/kubectl
if [[ " ${MISSING[*]} " == *" busybox "* ]]; then
  # trixie's lists in a state of their own, so that nothing else is ever taken from trixie
  TRIXIE="$WORK/apt-trixie"
  mkdir -p "$TRIXIE"/{lists/partial,etc/sources.list.d}
  echo "deb [signed-by=$KEYRING] $MIRROR trixie main" >"$TRIXIE/etc/sources.list"
  mkdir -p "$TRIXIE"/cache/archives/partial
  TRIXIE_OPTS=(-o "Dir::Etc::sourcelist=$TRIXIE/etc/sources.list"
    -o "Dir::Etc::sourceparts=$TRIXIE/etc/sources.list.d" -o "Dir::State::Lists=$TRIXIE/lists"
    -o "Dir::Cache=$TRIXIE/cache" -o "Dir::Cache::archives=$TRIXIE/cache/archives")
  log "apt update (trixie, for busybox-static)"
  apt-get "${APT_OPTS[@]}" "${TRIXIE_OPTS[@]}" -qq update
  deb_component busybox busybox-static usr/bin/busybox "${TRIXIE_OPTS[@]}"
fi

# ---- sources and toolchain ----------------------------------------------------------------
TO_COMPILE=()
for c in "${COMPILED[@]}"; do [[ " ${MISSING[*]} " == *" $c "* ]] && TO_COMPILE+=("$c"); done
if ((${#TO_COMPILE[@]} == 0)); then log "done: ${WANT[*]} in $BIN"; exit 0; fi

# The tree carries every patch of patches/ (each changes code of one component only); a kept
# tree made with other patches is extracted again.
TREE_KEY=$(cat "$PATCHES"/*.patch 2>/dev/null | sha256sum | cut -c1-16)
if [[ $(cat "$WORK/k8s/.extracted" 2>/dev/null) != "$TREE_KEY" ]]; then
  rm -rf "$WORK/k8s"
  log "downloading kubernetes=$K8S_DEB_VERSION source package"
  apt-get "${APT_OPTS[@]}" -qq source --download-only "kubernetes=$K8S_DEB_VERSION"
  log "extracting (dpkg-source applies Debian's patches)"
  dpkg-source -x --no-check kubernetes_*.dsc k8s >/dev/null
  for patch in "$PATCHES"/*.patch; do
    [[ -f $patch ]] || continue
    log "applying ${patch##*/}"
    patch -d "$WORK/k8s" -p1 --forward --quiet <"$patch" ||
      die "${patch##*/} does not apply to kubernetes=$K8S_DEB_VERSION"
  done
  echo "$TREE_KEY" >"$WORK/k8s/.extracted"
fi
if [[ ! -x "$WORK/prefix/usr/lib/go-1.19/bin/go" ]]; then
  log "downloading golang-1.19"
  (cd debs && apt-get "${APT_OPTS[@]}" -qq download "$GO_PACKAGE-go" "$GO_PACKAGE-src")
  for deb in debs/"$GO_PACKAGE"-*.deb; do dpkg-deb -x "$deb" prefix; done
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
t0=$SECONDS
what=(); for c in "${TO_COMPILE[@]}"; do what+=("cmd/$c"); done
log "make WHAT=\"${what[*]}\" (minutes)"
make WHAT="${what[*]}" >"$WORK/make.log" 2>&1 || { tail -n 40 "$WORK/make.log" >&2; exit 1; }
for c in "${TO_COMPILE[@]}"; do installed "$c" "_output/bin/$c"; done
log "built ${TO_COMPILE[*]} in $((SECONDS - t0)) s"
log "done: $("$BIN/kube-apiserver" --version 2>&1 | head -n1 || true); ${WANT[*]} in $BIN"
