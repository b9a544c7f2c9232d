#!/usr/bin/env bash
# Runs one libFuzzer harness for a while and prints one line of figures:
#   run_fuzzer.sh <harness> <name> <seconds> <workdir>
#   fuzz <name>: <execs> execs, <exec/s> exec/s, corpus <units> units (<seeds> seeds), cov <edges>,
#   <n> crashes
# Inputs: the seeds, written by tests/fuzz/make_seeds.py into <workdir>/seeds-<name>/ at each run
# (from the wire vectors and the input layouts, so they follow the code), the crash regressions
# committed in tests/fuzz/corpus/<name>/ (regress-*), and tests/fuzz/<name>.dict and
# <name>.options when present (INA_FUZZ_SOURCE: the tests/fuzz source directory).
# The corpus grows in <workdir>/corpus/<name>; crashing inputs go to <workdir>/crashes/<name>/.
# Exit status: 0 without a crash, 1 with one (libFuzzer's report is printed), 2 on bad usage.
set -uo pipefail
if [ $# -ne 4 ]; then
  echo "usage: $0 <harness> <name> <seconds> <workdir>" >&2
  exit 2
fi
exe=$1 name=$2 seconds=$3 work=$4
src=${INA_FUZZ_SOURCE:-$(cd "$(dirname "$0")" && pwd)}
regress="$src/corpus/$name"
seeds="$work/seeds-$name/$name"
corpus="$work/corpus/$name"
crashes="$work/crashes/$name"
log="$work/$name.log"
mkdir -p "$corpus" "$crashes"
# One directory per harness: the harnesses' tests run in parallel.
if ! python3 "$src/make_seeds.py" "$work/seeds-$name" >/dev/null; then
  echo "fuzz $name: tests/fuzz/make_seeds.py failed" >&2
  exit 2
fi
rm -f "$crashes"/*
args=(-max_total_time="$seconds" -print_final_stats=1 -timeout=10 -rss_limit_mb=2048
      -error_exitcode=1 -timeout_exitcode=1 -artifact_prefix="$crashes/" -max_len=4096)
if [ -f "$src/$name.dict" ]; then args+=(-dict="$src/$name.dict"); fi
# tests/fuzz/<name>.options: more libFuzzer flags for that harness, one per line (# comments).
if [ -f "$src/$name.options" ]; then
  while read -r opt; do
    case "$opt" in ''|'#'*) ;; *) args+=("$opt") ;; esac
  done <"$src/$name.options"
fi
# INA_FUZZ_RUNS=N: stop after N executions too (whichever of time and count comes first).
if [ -n "${INA_FUZZ_RUNS:-}" ]; then args+=(-runs="$INA_FUZZ_RUNS"); fi
dirs=("$corpus" "$seeds")
if [ -d "$regress" ]; then dirs+=("$regress"); fi
# halt_on_error: UBSan findings are crashes too; leaks are checked (libFuzzer's -detect_leaks).
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
export ASAN_OPTIONS="abort_on_error=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
"$exe" "${args[@]}" "${dirs[@]}" >"$log" 2>&1
rc=$?
execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
# libFuzzer's last status line: "#N DONE cov: C ft: F corp: U/SIZE ...".
units=$(grep -o 'corp: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
nseeds=0
for d in "$seeds" "$regress"; do
  if [ -d "$d" ]; then nseeds=$((nseeds + $(find "$d" -type f | wc -l))); fi
done
ncrash=$(find "$crashes" -type f | wc -l)
if [ "$rc" -ne 0 ] && [ "$ncrash" -eq 0 ]; then ncrash=1; fi
echo "fuzz $name: ${execs:-0} execs, ${rate:-0} exec/s, corpus ${units:-0} units ($nseeds seeds), cov ${cov:-0}, $ncrash crashes"
if [ "$rc" -ne 0 ] || [ "$ncrash" -ne 0 ]; then
  echo "fuzz $name: libFuzzer exited $rc; its log ($log) ends:" >&2
  tail -60 "$log" >&2
  ls "$crashes" >&2
  exit 1
fi
exit 0
