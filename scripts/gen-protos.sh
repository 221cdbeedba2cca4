#!/usr/bin/env bash
# Generate the Python protobuf/gRPC modules into src/python/elasticdl/proto (git-ignored) for
# running code outside Pants. Pants generates its own copies from protos/ at build time.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="${1:-python3}"
"$py" -m grpc_tools.protoc -I "$root/protos" --python_out="$root/src/python" \
    --grpc_python_out="$root/src/python" "$root"/protos/elasticdl/proto/*.proto
