#!/usr/bin/env bash
# What a two-level aggregation tree costs against one flat aggregator, on loopback: the same
# ina-bench size sweep with 8 external-mode ranks, first through one ina-aggregator (world 8), then
# through a root (world 2) and two leaf aggregators (--parent ..., 4 ranks each). Prints rank 0's
# table of each run. Indicative only: every process shares this machine's cores.
#
#   testbed/tree_bench.sh [build dir] [ina-bench size options...]
#   e.g. testbed/tree_bench.sh build -b 4K -e 4M -f 4 -n 5 -w 2 -d float32
set -euo pipefail

BUILD=${1:-build}
shift || true
BENCH_ARGS=("$@")
if [ ${#BENCH_ARGS[@]} -eq 0 ]; then BENCH_ARGS=(-b 4K -e 4M -f 4 -n 5 -w 2); fi
AGG="$BUILD/aggregator/ina-aggregator"
BENCH="$BUILD/testbed/ina-bench"
for bin in "$AGG" "$BENCH"; do
  [ -x "$bin" ] || { echo "tree_bench: $bin not built (ninja -C $BUILD)" >&2; exit 1; }
done

WORLD=8
flat='' root='' leaf0='' leaf1=''
TMP=$(mktemp -d /tmp/ina-tree-bench-XXXXXX)
AGG_PIDS=()
cleanup() {
  for p in "${AGG_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${AGG_PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$TMP"
}
trap cleanup EXIT

# start_agg NAME ARGS...: an aggregator on 127.0.0.1, any free port, which it sets in the
# variable NAME (not a command substitution: the PID must be recorded in this shell).
start_agg() {
  local name=$1
  shift
  "$AGG" --bind 127.0.0.1 --port 0 --port-file "$TMP/$name.port" --stats-interval-ms 0 "$@" \
    >"$TMP/$name.out" 2>&1 &
  AGG_PIDS+=($!)
  for _ in $(seq 100); do
    if [ -s "$TMP/$name.port" ]; then
      printf -v "$name" '%s' "$(cat "$TMP/$name.port")"
      return
    fi
    sleep 0.05
  done
  echo "tree_bench: aggregator $name did not start:" >&2
  cat "$TMP/$name.out" >&2
  exit 1
}

# run_ranks LABEL PORT_OF_RANK...: 8 ina-bench ranks, rank r to the port given for it.
run_ranks() {
  local label=$1
  shift
  local ports=("$@") pids=()
  for r in $(seq 0 $((WORLD - 1))); do
    timeout 120 "$BENCH" --aggregator "127.0.0.1:${ports[$r]}" --rank "$r" --workers "$WORLD" \
      "${BENCH_ARGS[@]}" >"$TMP/rank$r.out" 2>&1 &
    pids+=($!)
  done
  local rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  echo "## $label"
  cat "$TMP/rank0.out"
  if [ $rc -ne 0 ]; then
    echo "tree_bench: a rank failed ($label)" >&2
    for r in $(seq 1 $((WORLD - 1))); do tail -3 "$TMP/rank$r.out" >&2; done
    exit 1
  fi
}

stop_aggs() {
  for p in "${AGG_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${AGG_PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  AGG_PIDS=()
}

start_agg flat --world-size "$WORLD"
run_ranks "flat: one aggregator, 8 ranks" "$flat" "$flat" "$flat" "$flat" "$flat" "$flat" "$flat" "$flat"
stop_aggs

start_agg root --world-size 2
start_agg leaf0 --world-size "$WORLD" --parent "127.0.0.1:$root" --child-index 0 \
  --rank-base 0 --local-ranks 4 --parent-world 2
start_agg leaf1 --world-size "$WORLD" --parent "127.0.0.1:$root" --child-index 1 \
  --rank-base 4 --local-ranks 4 --parent-world 2
run_ranks "tree: root + 2 leaves x 4 ranks" "$leaf0" "$leaf0" "$leaf0" "$leaf0" \
  "$leaf1" "$leaf1" "$leaf1" "$leaf1"
stop_aggs
for n in leaf0 leaf1; do
  echo "## $n counters"
  grep -E '^ +(completed|forwarded|reforwarded|parent_results|parent_stale|parent_errors) ' \
    "$TMP/$n.out" || { echo "(no counter report)"; tail -5 "$TMP/$n.out"; }
done
