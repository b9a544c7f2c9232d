#!/usr/bin/env bash
# GPU check of the CUDA kernels, for a machine with an NVIDIA GPU (about 2-5 minutes):
#   1. builds in build-gpu/ with -Dcuda=enabled (nvcc from /usr/local/cuda/bin), warnings as errors;
#   2. runs the cuda test suite (device kernels vs the CPU reference, bit for bit);
#   3. runs ina-kernel-bench cuda: GB/s of quantize (scan + encode) and dequantize per dtype,
#      beside a device-to-device cudaMemcpy measured in the same run;
#   4. runs ina-kernel-bench cpu: reference vs AVX2 CPU kernels;
#   5. a device-buffer AllReduce (cudaMalloc'ed float32, 16 Mi elements) through a local
#      ina-aggregator, 2 ranks on loopback, staged through pinned buffers: time and GB/s beside
#      the same AllReduce on host buffers (the bitwise checks ran in step 2's cuda suite).
# Without a usable GPU it builds, says so, and exits 77 (skip). Output is also written to
# testbed/results/gpu-check-<host>-<date>.txt (with a GPU). Each step runs under `timeout` so the whole
# check stays within 10 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -d /usr/local/cuda/bin ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
build=${BUILD_DIR:-build-gpu}
echo "== build ($build, -Dcuda=enabled)"
start=$(date +%s)
if [ -f "$build/build.ninja" ]; then
  timeout 300 meson setup --reconfigure "$build" -Dcuda=enabled -Dwerror=true >/dev/null
else
  timeout 300 meson setup "$build" -Dcuda=enabled -Dwerror=true >/dev/null
fi
timeout 400 meson compile -C "$build"
echo "built in $(( $(date +%s) - start )) s"
if ! grep -q '#define INA_HAVE_CUDA_KERNELS 1' "$build/ina_config.h"; then
  echo "the CUDA kernels were not built (is nvcc on PATH?)"
  exit 1
fi

gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1 || true)
if [ -z "$gpu" ] || ! "$build/testbed/ina-kernel-bench" cuda --elems 1024 --iters 1 >/dev/null 2>&1; then
  echo "no usable NVIDIA GPU here (nvidia-smi: ${gpu:-none}); built only, skipping the GPU checks"
  "$build/testbed/ina-kernel-bench" cuda --elems 1024 --iters 1 || true
  exit 77
fi
mkdir -p testbed/results
log="testbed/results/gpu-check-$(hostname -s)-$(date +%Y%m%d-%H%M%S).txt"
exec > >(tee "$log") 2>&1
echo "== GPU: $gpu"

echo "== cuda test suite"
timeout 300 meson test -C "$build" --suite cuda --print-errorlogs --no-rebuild

echo "== ina-kernel-bench cuda (64 Mi elements)"
timeout 120 "$build/testbed/ina-kernel-bench" cuda --elems $((64 << 20)) --iters 20

echo "== ina-kernel-bench cpu"
timeout 120 "$build/testbed/ina-kernel-bench" cpu --seconds 0.3
echo "== device-buffer AllReduce through a local aggregator (2 ranks, 16 Mi float32)"
INA_AGGREGATOR_BIN="$build/aggregator/ina-aggregator" timeout 180 \
  "$build/tests/integration/cuda_device_allreduce_test" \
  --gtest_filter='CudaDeviceAllreduceThroughput.*' | grep -E 'device-buffer|OK|FAILED|Skipped'
echo "== done: $log"
