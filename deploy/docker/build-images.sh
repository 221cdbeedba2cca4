#!/usr/bin/env bash
# Build the ElasticDL base image (CPU or GPU) from the project's wheels.
#
#   deploy/docker/build-images.sh [cpu|gpu] [options]
#     --dist DIR             wheels to install (default: dist/, what `./pants package ::` writes)
#     --from-source          no Pants build needed: a development wheel of src/python/elasticdl
#                            (deploy/docker/dev_wheel.py) + the kernels: DIST's
#                            elasticdl_native-*.whl if there, else `pip wheel src/cc`
#     --build-native         with --from-source: always compile src/cc
#     --tag NAME             image name (default: elasticdl:cpu / elasticdl:gpu)
#     --base-image IMAGE     BASE_IMAGE build arg (e.g. local/base on machines without a registry)
#     --extra-pypi-index URL EXTRA_PYPI_INDEX build arg
#     --tensorflow SPEC      TENSORFLOW build arg; "" = no TensorFlow (light image)
#     --pip-options OPTS     PIP_OPTIONS build arg, e.g. "--no-index --no-deps"
#     --wheel REQ            download REQ's wheel on this host into the context (repeatable), for
#                            builds whose containers cannot reach a package index
#     --no-cache             rebuild every layer
# Engine: $DOCKER_HOST (scripts/container-engine/setup-dockerd.sh starts one). Builds with
# `elasticdl zoo build` when $PYTHON (default python3) has the `docker` package, else with
# the docker CLI. Prints the image id on stdout.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE="$ROOT/deploy/docker"
PYTHON=${PYTHON:-python3}
KIND=cpu
[[ ${1:-} == cpu || ${1:-} == gpu ]] && { KIND=$1; shift; }
DIST="$ROOT/dist"; FROM_SOURCE=0; BUILD_NATIVE=0; TAG=""; NOCACHE=0
BUILD_ARGS=(); WHEELS=()
die() { echo "build-images: error: $*" >&2; exit 2; }
while (($#)); do
  case $1 in
    --dist) DIST=$2; shift 2 ;;
    --from-source) FROM_SOURCE=1; shift ;;
    --build-native) BUILD_NATIVE=1; shift ;;
    --tag) TAG=$2; shift 2 ;;
    --base-image) BUILD_ARGS+=("BASE_IMAGE=$2"); shift 2 ;;
    --extra-pypi-index) BUILD_ARGS+=("EXTRA_PYPI_INDEX=$2"); shift 2 ;;
    --tensorflow) BUILD_ARGS+=("TENSORFLOW=$2"); shift 2 ;;
    --pip-options) BUILD_ARGS+=("PIP_OPTIONS=$2"); shift 2 ;;
    --wheel) WHEELS+=("$2"); shift 2 ;;
    --no-cache) NOCACHE=1; shift ;;
    *) die "unknown option $1 (see the header of $0)" ;;
  esac
done
TAG=${TAG:-elasticdl:$KIND}
CTX=$(mktemp -d "${TMPDIR:-/tmp}/elasticdl-image.XXXXXX")
trap 'rm -rf "$CTX" "$CTX.src"' EXIT
cp "$HERE/Dockerfile.$KIND" "$CTX/Dockerfile"

if ((FROM_SOURCE == 0)) && ! ls "$DIST"/elasticdl-[0-9]*.whl >/dev/null 2>&1; then
  echo "build-images: no elasticdl-*.whl in $DIST; building wheels from source" >&2
  FROM_SOURCE=1
fi
if ((FROM_SOURCE)); then
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
fi
# pip for base images without it (Debian's bundled wheel; installed only where pip is missing).
pipwhl=$(ls /usr/share/python-wheels/pip-*.whl 2>/dev/null | head -n 1 || true)
[[ -n $pipwhl ]] && cp "$pipwhl" "$CTX/"
if ((${#WHEELS[@]})); then
  "$PYTHON" -m pip download -q --only-binary=:all: --no-deps -d "$CTX" "${WHEELS[@]}" >&2 ||
    die "downloading ${WHEELS[*]} failed"
fi
echo "build-images: context $(ls "$CTX" | tr '\n' ' ')" >&2

if "$PYTHON" -c "import docker" 2>/dev/null; then
  args=(); for a in "${BUILD_ARGS[@]}"; do args+=(--build_arg "$a"); done
  ((NOCACHE)) && args+=(--no_cache)
  PYTHONPATH="$ROOT/src/python${PYTHONPATH:+:$PYTHONPATH}" \
    "$PYTHON" -m elasticdl.client.zoo build --image "$TAG" "${args[@]}" "$CTX"
else
  args=(); for a in "${BUILD_ARGS[@]}"; do args+=(--build-arg "$a"); done
  ((NOCACHE)) && args+=(--no-cache)
  docker build -q -t "$TAG" "${args[@]}" "$CTX"
fi
