#!/usr/bin/env bash
# GPU check of the device-buffer path, for a machine with an NVIDIA GPU (about 2-5 minutes):
#   1. builds in build-gpu/ with -Dcuda=enabled (the toolkit at /usr/local/cuda), warnings as
#      errors;
#   2. runs the cuda test suite (device-buffer AllReduce through a local aggregator, bitwise
#      against host buffers and stream-ordered);
#   3. times a device-buffer AllReduce (cudaMalloc'ed float32, 16 Mi elements) through a local
#      ina-aggregator, 2 ranks on loopback, staged through pinned buffers, beside the same
#      AllReduce on host buffers.
# Since wire version 2 no quantizer runs on the device: the workers send their values as they are
# (a 16-bit gradient is staged at 2 bytes per element) and the aggregator quantizes.
# Without a usable GPU it builds, says so, and exits 77 (skip). Output is also written to
# testbed/results/gpu-check-<host>-<date>.txt (with a GPU). Each step runs under `timeout` so the
# whole check stays within 10 minutes.
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
if ! grep -q '#define INA_HAVE_CUDA 1' "$build/ina_config.h"; then
  echo "CUDA was not found (is the toolkit at /usr/local/cuda?)"
  exit 1
fi
test_bin="$build/tests/integration/cuda_device_allreduce_test"

gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1 || true)
if [ -z "$gpu" ]; then
  echo "no usable NVIDIA GPU here (nvidia-smi: none); built only, skipping the GPU checks"
  exit 77
fi
mkdir -p testbed/results
log="testbed/results/gpu-check-$(hostname -s)-$(date +%Y%m%d-%H%M%S).txt"
exec > >(tee "$log") 2>&1
echo "== GPU: $gpu"

echo "== cuda test suite"
timeout 300 meson test -C "$build" --suite cuda --print-errorlogs --no-rebuild

echo "== device-buffer AllReduce through a local aggregator (2 ranks, 16 Mi float32)"
INA_AGGREGATOR_BIN="$build/aggregator/ina-aggregator" timeout 180 \
  "$test_bin" \
  --gtest_filter='CudaDeviceAllreduceThroughput.*' | grep -E 'device-buffer|OK|FAILED|Skipped'
echo "== done: $log"
