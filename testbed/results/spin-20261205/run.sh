#!/usr/bin/env bash
# 8 B float32 AllReduce on loopback, two builds alternated with libina's host halving-doubling and
# Open MPI over TCP: run.sh <build-a> <build-b> <rounds> [world] [iterations]
#   e.g. run.sh /tmp/base-wt/build-base build-test 5 4 3000
# Each INA run: a standalone ina-aggregator (its defaults) on 127.0.0.1 and `world` ina-bench
# ranks in external mode, -b 8 -e 8 -n <iterations> -w 300, defaults otherwise; rank 0's time per
# collective. host-hd: the same ranks with INA_TRANSPORT=host INA_ALGO=hd (the TCP mesh); mpi:
# ina-mpi-bench under mpirun (--mca btl tcp,self over lo, oversubscribed), from build-b.
set -uo pipefail
a=$1 b=$2 rounds=$3 world=${4:-4} n=${5:-3000}
port=47474
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
ina() {  # label build [env...]
  local label=$1 build=$2
  shift 2
  "$build/aggregator/ina-aggregator" --bind 127.0.0.1 --port $port --world-size "$world" \
    --stats-interval-ms 0 >"$out/agg.txt" 2>&1 &
  local agg=$! pids=() r
  sleep 0.3
  for r in $(seq 0 $((world - 1))); do
    env "$@" INA_AGGREGATOR=127.0.0.1:$port INA_RANK="$r" INA_WORLD_SIZE="$world" \
      "$build/testbed/ina-bench" --workers "$world" -b 8 -e 8 -n "$n" -w 300 -d float32 -v \
      >"$out/rank$r.txt" 2>&1 &
    pids+=($!)
  done
  for r in "${pids[@]}"; do wait "$r"; done
  kill "$agg"
  wait "$agg" 2>/dev/null
  printf '%-8s %8s us\n' "$label" "$(awk '$1 == 8 && $3 == "float32" {print $5}' "$out/rank0.txt")"
}
echo "# $(date -u +%FT%TZ) git $(git rev-parse --short HEAD) world $world iterations $n" \
  "load $(cut -d' ' -f1-3 /proc/loadavg)"
for i in $(seq 1 "$rounds"); do
  echo "round $i"
  ina a "$a"
  ina b "$b"
  ina host-hd "$b" INA_TRANSPORT=host INA_ALGO=hd INA_STORE=127.0.0.1:$((29600 + i))
  mpirun --allow-run-as-root -np "$world" --oversubscribe --mca btl tcp,self \
    --mca btl_tcp_if_include lo "$b/testbed/ina-mpi-bench" -b 8 -e 8 -n "$n" -w 300 -d float32 \
    2>/dev/null | awk '$1 == 8 && $3 == "float32" {printf "mpi      %8s us\n", $5}'
done
