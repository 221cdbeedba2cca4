#!/usr/bin/env bash
# The GPU half of the ops work in one command, for a machine with an NVIDIA GPU, nvcc, numpy,
# pybind11 and torch or CuPy (CI has none of these GPUs; the device machines have all):
#   1. builds elasticdl_native with its CUDA kernels for the local GPU's architecture,
#   2. runs the ops tests -- cuda_test.py against the NumPy oracle, and the CPU ones,
#   3. runs the AllReduce group test, whose NCCL case (a worker with a GPU of its own) runs only
#      here, beside the Gloo cases (two workers sharing the GPU get Gloo: NCCL refuses that),
#   4. runs the CUDA benchmark (lookup vs device copy and torch.index_select, aggregation vs
#      torch.unique + index_add_, sparse/dense Adam), 3 runs, medians.
# Logs and the benchmark's JSON line go to $OUT (default /tmp/edl-gpu).
#
#   bash benchmarks/ops/gpu_checks.sh            # PYTHON=... to pick the interpreter
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/edl-gpu}
py=${PYTHON:-python3}
mkdir -p "$out"
site=$(mktemp -d)
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '. ')
echo "building elasticdl_native for sm_${arch}"
ELASTICDL_BUILD_CUDA=1 ELASTICDL_CUDA_ARCHS="${arch}" \
  "$py" -m pip install -q --no-build-isolation --no-deps --no-cache-dir --target "$site" ./src/cc \
  >"$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
export PYTHONPATH="$site:$PWD/src/python${PYTHONPATH:+:$PYTHONPATH}"
"$py" -c "import elasticdl_native as N, sys; print('CUDA devices:', N.cuda_device_count()); \
sys.exit(0 if N.has_cuda() and N.cuda_device_count() > 0 else 'elasticdl_native sees no CUDA device')"
status=0
"$py" -m pytest -q -p no:cacheprovider -rs src/python/elasticdl/ops 2>&1 | tee "$out/tests.log" || status=1
"$py" -m pytest -q -p no:cacheprovider -rs src/python/elasticdl/worker/allreduce_group_test.py 2>&1 |
  tee "$out/allreduce.log" || status=1
PYTHONUNBUFFERED=1 "$py" benchmarks/ops/bench_ops.py --device cuda --runs 3 2>&1 | tee "$out/bench_cuda.log" ||
  status=1
tail -1 "$out/bench_cuda.log" >"$out/bench_cuda.json"
exit $status
