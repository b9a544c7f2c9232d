#!/usr/bin/env bash
# Sets everything up and runs every test suite: installs the Debian packages, builds in
# build-test/ with warnings as errors, runs `meson test` (suites unit, integration, conformance and
# torch; the suites that need hardware report SKIP with their reason), then a short run of every
# libFuzzer harness (scripts/fuzz.sh 5: a clang build of the harnesses in build-fuzz/).
set -euo pipefail
cd "$(dirname "$0")/.."
# Meson finds the CUDA toolkit (for libina-cuda.so) through nvcc on PATH or CUDA_PATH.
if [ -d /usr/local/cuda/bin ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
scripts/setup-debian.sh
if [ -f build-test/build.ninja ]; then
  meson setup --reconfigure build-test -Dwerror=true
else
  meson setup build-test -Dwerror=true
fi
meson compile -C build-test
meson test -C build-test --print-errorlogs --num-processes "$(nproc)" "$@"
scripts/fuzz.sh 5
