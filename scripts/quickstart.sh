#!/usr/bin/env bash
# The README's main job on a fresh machine: build the PEX files, prepare Fashion-MNIST, and train
# the MNIST CNN with 1 PS + 2 workers as local processes (no cluster needed).
# Extra arguments are passed to `elasticdl train` (e.g. --num_workers=4).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null && [ -z "$(ls /var/lib/apt/lists/*Packages* 2>/dev/null)" ]; then
  apt-get -qq update   # a fresh machine has no package lists: protoc and the dataset come from Debian
fi
./pants package src/python/client:elasticdl src/python/elasticdl/master:master
elasticdl=dist/src.python.client/elasticdl.pex
"$elasticdl" dataset prepare fashion_mnist --output data/fashion_mnist
exec "$elasticdl" train --platform=local --model_zoo=model_zoo \
  --model_def=mnist.mnist_functional_api.custom_model \
  --training_data=data/fashion_mnist/train --validation_data=data/fashion_mnist/test \
  --num_epochs=1 --minibatch_size=64 --num_minibatches_per_task=2 \
  --num_workers=2 --num_ps_pods=1 --evaluation_steps=200 --job_name=test-mnist "$@"
