#!/usr/bin/env bash
# Development environment without Pants: a venv with the locked requirements and the protobuf
# modules generated into src/python (git-ignored). `source scripts/dev-env.sh` afterwards, or
# run tests with: .venv/bin/python -m pytest src/python
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${ELASTICDL_DEV_VENV:-$root/.venv}"
[ -x "$venv/bin/python" ] || python3.11 -m venv "$venv"
# torch==2.13.0+cpu: from the build machines' wheel directory, else PyTorch's CPU index.
torch_src=(--extra-index-url https://download.pytorch.org/whl/cpu)
ls /opt/wheels/torch-2.13.0+cpu-* >/dev/null 2>&1 && torch_src=(--find-links /opt/wheels)
"$venv/bin/pip" install -q -r "$root/3rdparty/python/requirements.txt" grpcio-tools==1.62.2 \
    setuptools wheel "${torch_src[@]}"
# The native kernels (C++/OpenMP; CUDA too where nvcc is found unless ELASTICDL_BUILD_CUDA=0).
"$venv/bin/pip" install -q --no-build-isolation "$root/src/cc"
"$root/scripts/gen-protos.sh" "$venv/bin/python"
