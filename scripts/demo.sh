#!/usr/bin/env bash
# Sets everything up and runs the main job on its embedded default: ina-bench starts a local
# aggregator and 4 worker processes on loopback and sweeps AllReduce from 8 B to 64 MiB, printing
# an nccl-tests style table. Extra arguments go to ina-bench (try --help).
set -euo pipefail
cd "$(dirname "$0")/.."
# Meson compiles the CUDA kernels with nvcc, which it looks for on PATH.
if [ -d /usr/local/cuda/bin ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
scripts/setup-debian.sh
if [ ! -f build/build.ninja ]; then
  meson setup build
fi
meson compile -C build
exec build/testbed/ina-bench "$@"
