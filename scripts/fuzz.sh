#!/usr/bin/env bash
# Builds the libFuzzer harnesses (tests/fuzz) with clang, ASan and UBSan in build-fuzz/ and runs
# each for the given time, printing per harness: executions, executions per second, corpus size,
# coverage and crashes. Exits non-zero on any crash (its input is in
# build-fuzz/tests/fuzz/work/crashes/<harness>/), or when clang or libFuzzer is missing.
#   scripts/fuzz.sh [seconds per harness, default 60] [harness ...]    (harnesses: all by default)
# Harnesses: wire frame engine agg_jobs controller config. Only the harnesses and the code they
# cover are built (the rest of the project is configured but not compiled).
# INA_FUZZ_RUNS=N also stops each harness after N executions: a campaign of 10^7 executions per
# harness is `INA_FUZZ_RUNS=10000000 scripts/fuzz.sh 100000`.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
harnesses=("$@")
if [ ${#harnesses[@]} -eq 0 ]; then harnesses=(wire frame engine agg_jobs controller config); fi
if ! command -v clang++ >/dev/null; then
  echo "fuzz: clang++ not found (scripts/setup-debian.sh installs clang and libclang-rt-14-dev)" >&2
  exit 1
fi
opts=(-Dfuzz=enabled -Db_sanitize=address,undefined -Dbuildtype=debugoptimized -Dtests=false
      -Dcontroller=enabled -Ddpdk=disabled -Drdma=disabled -Dcuda=disabled -Dxdp=disabled
      -Dmpi=disabled -Dnccl_plugin=disabled -Dtorch=disabled -Dsodium=disabled)
if [ -f build-fuzz/build.ninja ]; then
  meson setup --reconfigure build-fuzz "${opts[@]}" >/dev/null
else
  CC=clang CXX=clang++ meson setup build-fuzz "${opts[@]}" >/dev/null
fi
targets=()
for h in "${harnesses[@]}"; do targets+=("fuzz_$h"); done
meson compile -C build-fuzz -j "${INA_FUZZ_JOBS:-2}" "${targets[@]}"
work=build-fuzz/tests/fuzz/work
failed=()
for h in "${harnesses[@]}"; do
  INA_FUZZ_SOURCE="$PWD/tests/fuzz" tests/fuzz/run_fuzzer.sh "build-fuzz/tests/fuzz/fuzz_$h" "$h" \
    "$seconds" "$work" || failed+=("$h")
done
if [ ${#failed[@]} -ne 0 ]; then
  echo "fuzz: crashes in ${failed[*]} (inputs under $work/crashes/)" >&2
  exit 1
fi
echo "fuzz: ${#harnesses[@]} harnesses, ${seconds}s each, no crash"
