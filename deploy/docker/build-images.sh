#!/usr/bin/env bash
# Build the ElasticDL base image (CPU or GPU), or the job server's image, from the project's
# wheels.
#
#   deploy/docker/build-images.sh [cpu|gpu|server] [options]
# cpu, gpu: two builds, so that a change to the project rebuilds one small layer, not the
# third-party stack (TensorFlow, torch, the CUDA wheels: ~2.5 GB / ~9 GB installed):
#   1. the dependencies image, the first half of Dockerfile.KIND (up to `FROM ${DEPS_IMAGE}`)
#      from a context of the third-party side only (deps/: requirements.txt, the wheels of
#      --download-deps and --wheel, pip), tagged <repository>-deps:KIND-<hash of that half,
#      deps/'s files and the build args> (<repository>: --tag's, or --deps-repository). It is
#      built only when no image of that tag sits on the same base image layers, and kept: it is
#      the cache. Once the image is built, the other KIND-* tags of that repository are removed
#      (an image still in use keeps its layers);
#   2. the image, the second half, FROM that image, from a context of the project's wheels only
#      (project/): they go in with --no-deps as a layer of a few MB.
# server: Dockerfile.server, DIST's elasticdl_server-*.whl (./pants package
# //:elasticdl-server-wheel) on --base-image (default elasticdl:cpu); --download-deps fetches
# only its requirements the base image lacks (FastAPI, uvicorn and theirs). The cpu and gpu
# images never take that wheel (the jobs' images do not run the server).
#     --dist DIR             wheels to install (default: dist/, what `./pants package ::` writes)
#     --from-source          no Pants build needed: a development wheel of src/python/elasticdl
#                            (deploy/docker/dev_wheel.py) + the kernels: DIST's
#                            elasticdl_native-*.whl if there, else `pip wheel src/cc`
#     --build-native         with --from-source: always compile src/cc
#     --tag NAME             image name (default: elasticdl:cpu / elasticdl:gpu /
#                            elasticdl-server:latest)
#     --deps-repository REPO cpu, gpu: the dependencies image's repository (default: --tag's
#                            repository + "-deps", e.g. elasticdl-deps)
#     --base-image IMAGE     BASE_IMAGE build arg (e.g. local/base on machines without a registry)
#     --extra-pypi-index URL EXTRA_PYPI_INDEX build arg (also used by --download-deps)
#     --tensorflow SPEC      TENSORFLOW build arg; "" = no TensorFlow (light image)
#     --torch SPEC           gpu: TORCH build arg (installed with --no-deps over TENSORFLOW's
#                            CUDA wheels); "" = no torch
#     --build-arg NAME=VALUE any other build arg (e.g. PYTHON_PPA for NVIDIA's base image)
#     --pip-options OPTS     PIP_OPTIONS build arg, e.g. "--no-index --no-deps" (cpu: with
#                            --no-deps only the context's wheels go in, not the project
#                            wheels' requirements)
#     --wheel REQ            download REQ's wheel on this host into the context (repeatable), for
#                            builds whose containers cannot reach a package index
#     --download-deps        offline build of the real image: download on this host, once per
#                            machine, the full closure of the context wheels' requirements
#                            (Requires-Dist) + TENSORFLOW as cp311 manylinux wheels into
#                            ${ELASTICDL_CACHE_DIR:-${XDG_CACHE_HOME:-~/.cache}/elasticdl}/image-wheels/<hash>
#                            (<hash>: of the requirement set), hardlink them into the context,
#                            and install with PIP_OPTIONS=--no-index (unless --pip-options is
#                            given): pip resolves the dependencies from the context alone, so
#                            the build fails if the wheels' declared requirements are incomplete.
#                            The download uses pants.toml's [python-repos] (its find_links hold
#                            torch's +cpu wheel) besides the host pip's configuration
#     --wheel-cache DIR      --download-deps with the cache in DIR/<hash>
#     --download-options OPTS more `pip download` options, e.g. "--extra-index-url URL"
#     --keep-install-stage   keep the install stages' images (wheels + installed tree) as layer
#                            cache; by default they are deleted after the build
#     --no-cache             rebuild every layer, the dependencies image too
# gpu: the kernels wheel is always compiled here with CUDA (ELASTICDL_BUILD_CUDA=1, nvcc from
# PATH, $CUDA_HOME or /usr/local/cuda; without one, NVIDIA's nvcc wheels are installed into the
# cache first), cached in $ELASTICDL_CACHE_DIR/gpu-native/<hash of src/cc and nvcc>; the
# context gets requirements.txt, the project wheels' requirements less the CPU builds of
# TensorFlow and torch that TENSORFLOW and TORCH replace.
# Engine: $DOCKER_HOST (scripts/container-engine/setup-dockerd.sh starts one). Builds with
# `elasticdl zoo build` when $PYTHON (default python3) has the `docker` package, else with
# the docker CLI. Prints the image id on stdout.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE="$ROOT/deploy/docker"
PYTHON=${PYTHON:-python3}
KIND=cpu
[[ ${1:-} == cpu || ${1:-} == gpu || ${1:-} == server ]] && { KIND=$1; shift; }
DIST="$ROOT/dist"; FROM_SOURCE=0; BUILD_NATIVE=0; TAG=""; NOCACHE=0
BUILD_ARGS=(); WHEELS=(); WHEEL_CACHE=""; DOWNLOAD_OPTIONS=""; KEEP_STAGE=0; DEPS_REPO=""
PIP_OPTIONS=""
TENSORFLOW_SET=0; TENSORFLOW=""; PIP_OPTIONS_SET=0; EXTRA_INDEX=""; TORCH_SET=0; TORCH=""
die() { echo "build-images: error: $*" >&2; exit 2; }
while (($#)); do
  case $1 in
    --dist) DIST=$2; shift 2 ;;
    --from-source) FROM_SOURCE=1; shift ;;
    --build-native) BUILD_NATIVE=1; shift ;;
    --tag) TAG=$2; shift 2 ;;
    --deps-repository) DEPS_REPO=$2; shift 2 ;;
    --base-image) BUILD_ARGS+=("BASE_IMAGE=$2"); shift 2 ;;
    --extra-pypi-index) BUILD_ARGS+=("EXTRA_PYPI_INDEX=$2"); EXTRA_INDEX=$2; shift 2 ;;
    --tensorflow) BUILD_ARGS+=("TENSORFLOW=$2"); TENSORFLOW=$2; TENSORFLOW_SET=1; shift 2 ;;
    --torch) BUILD_ARGS+=("TORCH=$2"); TORCH=$2; TORCH_SET=1; shift 2 ;;
    --build-arg) BUILD_ARGS+=("$2"); shift 2 ;;
    --pip-options) BUILD_ARGS+=("PIP_OPTIONS=$2"); PIP_OPTIONS=$2; PIP_OPTIONS_SET=1; shift 2 ;;
    --wheel) WHEELS+=("$2"); shift 2 ;;
    --download-deps)
      WHEEL_CACHE=${ELASTICDL_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/elasticdl}/image-wheels; shift ;;
    --wheel-cache) WHEEL_CACHE=$2; shift 2 ;;
    --download-options) DOWNLOAD_OPTIONS=$2; shift 2 ;;
    --keep-install-stage) KEEP_STAGE=1; shift ;;
    --no-cache) NOCACHE=1; shift ;;
    *) die "unknown option $1 (see the header of $0)" ;;
  esac
done
if [[ $KIND == server ]]; then
  TAG=${TAG:-elasticdl-server:latest}
  ((FROM_SOURCE == 0)) || die "server: no --from-source; build the wheel with ./pants package //:elasticdl-server-wheel"
  ls "$DIST"/elasticdl_server-*.whl >/dev/null 2>&1 ||
    die "server: no elasticdl_server-*.whl in $DIST; run ./pants package //:elasticdl-server-wheel (or give --dist)"
fi
TAG=${TAG:-elasticdl:$KIND}
CTX=$(mktemp -d "${TMPDIR:-/tmp}/elasticdl-image.XXXXXX")
trap 'rm -rf "$CTX" "$CTX.src"' EXIT
cp "$HERE/Dockerfile.$KIND" "$CTX/Dockerfile"

if [[ $KIND != server ]] && ((FROM_SOURCE == 0)) && ! ls "$DIST"/elasticdl-[0-9]*.whl >/dev/null 2>&1; then
  echo "build-images: no elasticdl-*.whl in $DIST; building wheels from source" >&2
  FROM_SOURCE=1
fi
if [[ $KIND == server ]]; then
  cp "$(ls -t "$DIST"/elasticdl_server-*.whl | head -n 1)" "$CTX/"
elif ((FROM_SOURCE)); then
  "$PYTHON" "$HERE/dev_wheel.py" "$CTX" >/dev/null
  native=$(ls -t "$DIST"/elasticdl_native-*.whl 2>/dev/null | head -n 1 || true)
  if [[ -n $native && $BUILD_NATIVE == 0 ]]; then
    # A kernels wheel from `./pants package src/cc:native` saves the C++ compile; the image
    # build fails loudly if it is stale (ABI check in the Dockerfile).
    cp "$native" "$CTX/"
  else
    # Built from a copy: pip builds in-tree and would leave build/ and *.egg-info in src/cc.
    # The build requirements pinned in src/cc/pyproject.toml come from the package index.
    mkdir -p "$CTX.src" && cp -r "$ROOT/src/cc" "$CTX.src/cc" && rm -rf "$CTX.src/cc/build" "$CTX.src/cc"/*.egg-info
    "$PYTHON" -m pip wheel -q --no-deps -w "$CTX" "$CTX.src/cc" >&2 ||
      die "building the native kernels wheel (src/cc) failed"
  fi
else
  cp "$DIST"/*.whl "$CTX/"
  rm -f "$CTX"/elasticdl_server-*.whl  # the server's own image takes it (KIND server)
fi
CACHE_ROOT=${ELASTICDL_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/elasticdl}
if [[ $KIND == gpu ]]; then
  # The kernels compiled with CUDA, whatever the context's kernels wheel was built with.
  find_nvcc() {
    local c
    for c in "$(command -v nvcc || true)" "${CUDA_HOME:+$CUDA_HOME/bin/nvcc}" /usr/local/cuda/bin/nvcc; do
      [[ -n $c && -x $c ]] && { echo "$c"; return 0; }
    done
    return 1
  }
  if ! nvcc=$(find_nvcc); then
    # NVIDIA's compiler wheels (no CUDA 12 wheel ships the nvcc driver, only ptxas): a CUDA
    # root under the cache, once per machine.
    cuda="$CACHE_ROOT/cuda-nvcc-13.0.88"
    if [[ ! -x $cuda/nvidia/cu13/bin/nvcc ]]; then
      echo "build-images: installing nvcc 13.0 (NVIDIA's wheels) into $cuda" >&2
      rm -rf "$cuda.part"
      "$PYTHON" -m pip install -q --no-deps --target "$cuda.part" nvidia-cuda-nvcc==13.0.88 \
        nvidia-cuda-runtime==13.0.96 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88 \
        nvidia-cuda-cccl==13.0.85 >&2 || die "installing NVIDIA's nvcc wheels into $cuda.part failed"
      rm -rf "$cuda" && mv "$cuda.part" "$cuda"
    fi
    export CUDA_HOME="$cuda/nvidia/cu13" PATH="$cuda/nvidia/cu13/bin:$PATH"
    nvcc=$(find_nvcc) || die "no nvcc in $cuda"
  fi
  [[ -f $ROOT/src/cc/setup.py ]] || die "gpu: the CUDA kernels are built from $ROOT/src/cc, which is missing"
  key=$({ cat "$ROOT"/src/cc/{setup.py,pyproject.toml} "$ROOT"/src/cc/*.{cc,h,cu}; "$nvcc" --version;
    echo "${ELASTICDL_CUDA_ARCHS:-80;90}"; } | sha256sum | cut -c1-16)
  native_cache="$CACHE_ROOT/gpu-native/$key"
  if ! ls "$native_cache"/elasticdl_native-*.whl >/dev/null 2>&1; then
    echo "build-images: compiling the CUDA kernels with $nvcc (a few minutes)" >&2
    rm -rf "$CTX.src" "$native_cache.part" && mkdir -p "$CTX.src" "$native_cache.part"
    cp -r "$ROOT/src/cc" "$CTX.src/cc" && rm -rf "$CTX.src/cc/build" "$CTX.src/cc"/*.egg-info
    ELASTICDL_BUILD_CUDA=1 "$PYTHON" -m pip wheel -q --no-deps -w "$native_cache.part" "$CTX.src/cc" >&2 ||
      die "building the CUDA kernels wheel (src/cc, ELASTICDL_BUILD_CUDA=1) failed"
    rm -rf "$native_cache" && mv "$native_cache.part" "$native_cache"
  fi
  rm -f "$CTX"/elasticdl_native-*.whl
  cp "$native_cache"/elasticdl_native-*.whl "$CTX/"
fi
# pip for base images without it (Debian's bundled wheel; installed only where pip is missing).
pipwhl=$(ls /usr/share/python-wheels/pip-*.whl 2>/dev/null | head -n 1 || true)
[[ -n $pipwhl ]] && cp "$pipwhl" "$CTX/"
# The install: TENSORFLOW (and for gpu TORCH, TORCH_REQUIREMENTS) as the Dockerfile would
# install them: the flags, else the ARGs' defaults.
arg_default() {
  sed -n -e "s/^ARG $1=\"\\(.*\\)\"\$/\\1/p" -e t -e "s/^ARG $1=\\(.*\\)\$/\\1/p" "$CTX/Dockerfile" | head -n 1
}
((TENSORFLOW_SET)) || TENSORFLOW=$(arg_default TENSORFLOW)
TORCH_REQUIREMENTS=""
if [[ $KIND == gpu ]]; then
  ((TORCH_SET)) || TORCH=$(arg_default TORCH)
  [[ -n $TORCH ]] && TORCH_REQUIREMENTS=$(arg_default TORCH_REQUIREMENTS)
  # TENSORFLOW and TORCH replace the framework's CPU builds of both.
  REPLACED="tensorflow tensorflow-cpu torch"
elif [[ $KIND == server ]]; then
  # In the base image already, with their requirements.
  REPLACED="elasticdl elasticdl-client elasticdl-native"
else
  REPLACED=""
fi
if [[ $KIND != server || -n $WHEEL_CACHE ]]; then
  # The requirement set: every Requires-Dist (without extras) of the context's wheels, less
  # the project's own packages (they are in the context) and REPLACED; and the target
  # interpreter: the cpXY tag of a context wheel (the kernels), default 3.11.
  reqs=$("$PYTHON" - "$CTX" "$REPLACED" <<'PY'
import glob, os, re, sys, zipfile

def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()

names, reqs, tags = set(sys.argv[2].split()), set(), set()
for whl in glob.glob(os.path.join(sys.argv[1], "*.whl")):
    if os.path.basename(whl).startswith("pip-"):
        continue
    tags.update(re.findall(r"-cp(3\d+)-", os.path.basename(whl)))
    with zipfile.ZipFile(whl) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        for line in z.read(meta).decode().splitlines():
            key, _, value = line.partition(":")
            if key == "Name":
                names.add(norm(value.strip()))
            elif key == "Requires-Dist" and "extra ==" not in value:
                reqs.add(value.strip())
reqs = {r for r in reqs if norm(re.match(r"[A-Za-z0-9._-]+", r).group(0)) not in names}
print("python", "3." + (sorted(tags)[0][1:] if tags else "11"))
print("\n".join(sorted(reqs)))
PY
  ) || die "reading the requirements of the wheels in the context failed"
  pyver=$(head -n 1 <<<"$reqs" | cut -d' ' -f2); reqs=$(tail -n +2 <<<"$reqs")
  # The dependencies image installs these with dependency resolution (the project wheels go
  # on it with --no-deps; for gpu their requirement of the CPU torch cannot be met beside
  # TORCH). cpu with --pip-options --no-deps: only the context's wheels, as asked.
  if [[ $KIND == cpu && " $PIP_OPTIONS " == *" --no-deps "* ]]; then
    : >"$CTX/requirements.txt"
  elif [[ $KIND != server ]]; then
    printf '%s\n' "$reqs" | sed '/^$/d' >"$CTX/requirements.txt"
  fi
fi
if [[ -n $WHEEL_CACHE ]]; then
  read -ra tf_reqs <<<"$TENSORFLOW $TORCH_REQUIREMENTS"
  reqs=$(printf '%s\n' "$reqs" ${tf_reqs[@]+"${tf_reqs[@]}"} | sed '/^$/d' | LC_ALL=C sort -u)
  # TORCH: downloaded without its dependencies (its CUDA pins conflict with TENSORFLOW's).
  nodeps=""
  [[ $KIND == gpu ]] && nodeps=$TORCH
  # cpXY manylinux wheels whatever this host runs: glibc 2.17 (manylinux2014) to 2.35
  # (Ubuntu 22.04 of the GPU image; Debian 12 has 2.36).
  arch=$(uname -m)
  target=(--only-binary=:all: --implementation cp --python-version "$pyver"
    --abi "cp${pyver/./}" --platform "manylinux2014_$arch")
  for m in $(seq 35 -1 17); do target+=(--platform "manylinux_2_${m}_$arch"); done
  # The package sources of the project's own resolve (pants.toml [python-repos]): torch's +cpu
  # build comes from a find_links there, not from PyPI.
  repos=()
  if [[ -f $ROOT/pants.toml ]]; then
    mapfile -t repos < <("$PYTHON" - "$ROOT" <<'PY'
import os, sys, tomllib

root = sys.argv[1]
with open(os.path.join(root, "pants.toml"), "rb") as f:
    conf = tomllib.load(f).get("python-repos", {})
for url in conf.get("find_links", []):
    print("--find-links"); print(url.replace("%(buildroot)s", root))
for url in conf.get("indexes", [])[1:]:
    print("--extra-index-url"); print(url)
PY
    ) || die "reading [python-repos] of $ROOT/pants.toml failed"
  fi
  key=$(printf '%s\n' "$reqs" "${target[*]}" "${repos[*]}" "$EXTRA_INDEX" "$DOWNLOAD_OPTIONS" \
    ${nodeps:+"--no-deps $nodeps"} | sha256sum | cut -c1-16)
  cache="$WHEEL_CACHE/$key"
  mkdir -p "$WHEEL_CACHE"
  (
    # One download per machine, also with concurrent builds.
    command -v flock >/dev/null && { exec 8>"$cache.lock"; flock 8; }
    [[ -f $cache/.complete ]] && exit 0
    rm -rf "$cache" "$cache.part"
    echo "build-images: downloading the dependency closure into $cache" >&2
    printf '%s\n' "$reqs" >"$WHEEL_CACHE/$key.requirements.txt"
    # shellcheck disable=SC2086  # DOWNLOAD_OPTIONS: several options
    "$PYTHON" -m pip download -q "${target[@]}" ${repos[@]+"${repos[@]}"} \
      ${EXTRA_INDEX:+--extra-index-url "$EXTRA_INDEX"} \
      $DOWNLOAD_OPTIONS -d "$cache.part" -r "$WHEEL_CACHE/$key.requirements.txt" >&2 ||
      die "downloading the requirements into $cache.part failed (see $WHEEL_CACHE/$key.requirements.txt)"
    if [[ -n $nodeps ]]; then
      read -ra nodeps_reqs <<<"$nodeps"
      # shellcheck disable=SC2086
      "$PYTHON" -m pip download -q --no-deps "${target[@]}" ${repos[@]+"${repos[@]}"} \
        ${EXTRA_INDEX:+--extra-index-url "$EXTRA_INDEX"} $DOWNLOAD_OPTIONS -d "$cache.part" \
        "${nodeps_reqs[@]}" >&2 || die "downloading $nodeps (--no-deps) into $cache.part failed"
    fi
    mv "$WHEEL_CACHE/$key.requirements.txt" "$cache.part/requirements.txt"
    mv "$cache.part" "$cache" && touch "$cache/.complete"
  ) || exit $?
  # Hardlinks (no copy) when the cache and the context share a file system.
  for f in "$cache"/*.whl; do
    ln "$f" "$CTX/" 2>/dev/null || cp "$f" "$CTX/"
  done
  ((PIP_OPTIONS_SET)) || BUILD_ARGS+=("PIP_OPTIONS=--no-index")
  echo "build-images: $(ls "$cache"/*.whl | wc -l) dependency wheels ($(du -sh "$cache" | cut -f1)) from $cache" >&2
fi
if ((${#WHEELS[@]})); then
  "$PYTHON" -m pip download -q --only-binary=:all: --no-deps -d "$CTX" "${WHEELS[@]}" >&2 ||
    die "downloading ${WHEELS[*]} failed"
fi
STAGE_ID=""
if grep -q '^ARG INSTALL_STAGE_ID' "$CTX/Dockerfile"; then
  # $ELASTICDL_INSTALL_STAGE_ID lets a caller (the image tests) tell its build's stage images
  # from those of a build running beside it on the same engine.
  if ((KEEP_STAGE)); then
    STAGE_ID=kept
  elif [[ -n ${ELASTICDL_INSTALL_STAGE_ID:-} ]]; then
    [[ $ELASTICDL_INSTALL_STAGE_ID =~ ^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$ && $ELASTICDL_INSTALL_STAGE_ID != kept ]] ||
      die "ELASTICDL_INSTALL_STAGE_ID=$ELASTICDL_INSTALL_STAGE_ID: use letters, digits, '.', '_' or '-' (at most 63), not 'kept'"
    STAGE_ID=$ELASTICDL_INSTALL_STAGE_ID
  else
    STAGE_ID="$(date +%s)-$$-$RANDOM"
  fi
fi
DOCKER_PY=0
"$PYTHON" -c "import docker" 2>/dev/null && DOCKER_PY=1

# What the build asks of the engine, through the `docker` package or the CLI:
#   engine layers IMAGE     its layers (RootFS diff ids), one a line; nothing when absent
#   engine tags REPOSITORY  its tags, as REPOSITORY:TAG, one a line
#   engine untag IMAGE      remove the tag (the image goes too unless another image uses it)
#   engine prune LABEL      delete the dangling images with LABEL, and their untagged parents
engine() {
  if ((DOCKER_PY)); then
    "$PYTHON" - "$@" <<'PY'
import sys
import time

import docker
import requests

what, arg = sys.argv[1:3]
client = docker.from_env()
try:
    if what == "layers":
        print("\n".join(client.api.inspect_image(arg)["RootFS"]["Layers"]))
    elif what == "tags":
        for image in client.api.images(name=arg):
            print("\n".join(t for t in image.get("RepoTags") or [] if t.startswith(arg + ":")))
    elif what == "untag":
        client.api.remove_image(arg)
    elif what == "prune":
        # The engine runs one prune at a time and refuses others meanwhile (409): a build
        # beside this one may be pruning its own stages. Deleting a GPU stage's gigabytes while
        # another build writes can outlast a call's timeout; the engine goes on pruning, so
        # the next call waits behind it (409) and then finds what is left.
        client = docker.from_env(timeout=300)
        deadline = time.monotonic() + 1200
        while True:
            try:
                client.images.prune(filters={"dangling": True, "label": arg})
                break
            except requests.exceptions.ReadTimeout:
                if time.monotonic() > deadline:
                    sys.exit(f"build-images: prune {arg}: the engine did not answer in time")
            except docker.errors.APIError as e:
                if e.status_code != 409 or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
except docker.errors.NotFound:
    pass
except docker.errors.APIError as e:
    sys.exit(f"build-images: {what} {arg}: {e.explanation or e}")
PY
  else
    case $1 in
      layers) docker image inspect --format '{{range .RootFS.Layers}}{{println .}}{{end}}' "$2" 2>/dev/null | sed '/^$/d' || true ;;
      tags) docker images --format '{{.Repository}}:{{.Tag}}' "$2" ;;
      untag) docker rmi "$2" >/dev/null ;;
      prune) engine_cli_prune "$2" ;;
    esac
  fi
}
# docker image prune, retried while the engine runs another prune (it refuses a second).
engine_cli_prune() {
  local out try
  for try in $(seq 120); do
    out=$(docker image prune -f --filter "label=$1" 2>&1) && return 0
    [[ $out == *"already running"* ]] || { echo "build-images: prune $1: $out" >&2; return 1; }
    sleep 0.5
  done
  echo "build-images: prune $1: $out" >&2
  return 1
}
# The install stages' images hold the wheels and a second copy of the installed tree; the
# images keep only the latter. Deleted by their label, also when the build fails.
prune_install_stage() {
  [[ -n $STAGE_ID && $STAGE_ID != kept ]] || return 0
  engine prune "org.elasticdl.install-stage=$STAGE_ID"
}
trap 'prune_install_stage || echo "build-images: warning: the install-stage images labelled $STAGE_ID are left" >&2; rm -rf "$CTX" "$CTX.src"' EXIT

# engine_build TAG DIR BUILD_ARG...: DIR's Dockerfile, DIR as the context; the image id on
# stdout.
engine_build() {
  local tag=$1 dir=$2 a args=()
  shift 2
  if ((DOCKER_PY)); then
    for a in "$@"; do args+=(--build_arg "$a"); done
    if ((NOCACHE)); then args+=(--no_cache); fi
    PYTHONPATH="$ROOT/src/python${PYTHONPATH:+:$PYTHONPATH}" \
      "$PYTHON" -m elasticdl.client.zoo build --image "$tag" "${args[@]}" "$dir"
  else
    for a in "$@"; do args+=(--build-arg "$a"); done
    if ((NOCACHE)); then args+=(--no-cache); fi
    docker build -q -t "$tag" "${args[@]}" "$dir"
  fi
}
[[ -n $STAGE_ID ]] && BUILD_ARGS+=("INSTALL_STAGE_ID=$STAGE_ID")

if [[ $KIND == server ]]; then
  echo "build-images: context $(ls "$CTX" | wc -l) files, $(du -sh "$CTX" | cut -f1)" >&2
  engine_build "$TAG" "$CTX" "${BUILD_ARGS[@]}"
  exit 0
fi

# cpu, gpu: the two halves of the Dockerfile, each with its own context directory.
DEPS_CTX="$CTX/deps-build" PROJECT_CTX="$CTX/project-build"
mkdir -p "$DEPS_CTX/deps" "$PROJECT_CTX/project"
# shellcheck disable=SC2016  # a literal ${DEPS_IMAGE}
split=$(grep -n '^FROM \${DEPS_IMAGE}' "$CTX/Dockerfile" | head -n 1 | cut -d: -f1)
first=$(grep -n '^FROM ' "$CTX/Dockerfile" | head -n 1 | cut -d: -f1)
[[ -n $split && $split -gt $first ]] ||
  die "$HERE/Dockerfile.$KIND has no 'FROM \${DEPS_IMAGE}' line after its first FROM (where its project half begins)"
# The lines before the first FROM (the global ARGs) go to both halves.
{ head -n $((first - 1)) "$CTX/Dockerfile"; sed -n "${first},$((split - 1))p" "$CTX/Dockerfile"; } >"$DEPS_CTX/Dockerfile"
{ head -n $((first - 1)) "$CTX/Dockerfile"; tail -n +"$split" "$CTX/Dockerfile"; } >"$PROJECT_CTX/Dockerfile"
for f in "$CTX"/*.whl; do
  [[ -e $f ]] || continue
  case ${f##*/} in
    elasticdl-[0-9]*.whl | elasticdl_*.whl) mv "$f" "$PROJECT_CTX/project/" ;;
    pip-[0-9]*.whl) cp "$f" "$PROJECT_CTX/project/"; mv "$f" "$DEPS_CTX/deps/" ;;
    *) mv "$f" "$DEPS_CTX/deps/" ;;
  esac
done
mv "$CTX/requirements.txt" "$DEPS_CTX/deps/"
echo "build-images: dependencies context $(find "$DEPS_CTX/deps" -type f | wc -l) files," \
  "$(du -sh "$DEPS_CTX/deps" | cut -f1); project context $(find "$PROJECT_CTX/project" -type f | wc -l)" \
  "files, $(du -sh "$PROJECT_CTX/project" | cut -f1)" >&2

# The dependencies image's tag: a hash of all it is built from but the base image's content,
# which the layer check below covers (a re-imported base of the same name).
if [[ -z $DEPS_REPO ]]; then
  DEPS_REPO=$TAG
  [[ ${TAG##*/} == *:* ]] && DEPS_REPO=${TAG%:*}
  DEPS_REPO=$DEPS_REPO-deps
fi
deps_args=()
for a in "${BUILD_ARGS[@]}"; do [[ $a == INSTALL_STAGE_ID=* ]] || deps_args+=("$a"); done
base=$(arg_default BASE_IMAGE)
for a in "${BUILD_ARGS[@]}"; do [[ $a == BASE_IMAGE=* ]] && base=${a#BASE_IMAGE=}; done
deps_key=$({
  echo "$KIND"
  sed -e '/^[[:space:]]*#/d' -e '/^[[:space:]]*$/d' "$DEPS_CTX/Dockerfile"  # not its comments
  printf '%s\n' ${deps_args[@]+"${deps_args[@]}"}
  (cd "$DEPS_CTX/deps" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum)
} | sha256sum | cut -c1-16)
DEPS_TAG="$DEPS_REPO:$KIND-$deps_key"
deps_reusable() {
  local deps_layers base_layers
  ((NOCACHE == 0)) || return 1
  deps_layers=$(engine layers "$DEPS_TAG")
  base_layers=$(engine layers "$base")
  [[ -n $deps_layers && -n $base_layers && $deps_layers$'\n' == "$base_layers"$'\n'* ]]
}
t0=$SECONDS
if deps_reusable; then
  echo "build-images: dependencies image $DEPS_TAG reused" >&2
else
  echo "build-images: building the dependencies image $DEPS_TAG" >&2
  engine_build "$DEPS_TAG" "$DEPS_CTX" "${BUILD_ARGS[@]}" >&2
  echo "build-images: dependencies image $DEPS_TAG built in $((SECONDS - t0)) s" >&2
  # Its ~12 GB (gpu) of wheels and installed tree, before the next build; what a failed
  # prune leaves, the exit trap prunes again.
  prune_install_stage || echo "build-images: warning: could not prune the install stage yet" >&2
fi
t0=$SECONDS
args=("DEPS_IMAGE=$DEPS_TAG")
[[ -n $STAGE_ID ]] && args+=("INSTALL_STAGE_ID=$STAGE_ID")
engine_build "$TAG" "$PROJECT_CTX" "${args[@]}"
echo "build-images: $TAG built on it in $((SECONDS - t0)) s" >&2
# The dependencies images of earlier inputs: untagged (an image built on one keeps its layers).
while read -r old; do
  [[ $old == "$DEPS_REPO:$KIND-"* && $old != "$DEPS_TAG" ]] || continue
  engine untag "$old" || echo "build-images: warning: could not remove $old" >&2
done < <(engine tags "$DEPS_REPO")
