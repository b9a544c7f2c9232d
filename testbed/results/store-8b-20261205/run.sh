#!/usr/bin/env bash
# 8 B float32 AllReduce at 4 ranks on loopback through a standalone ina-aggregator, with and
# without INA_STORE (the host fallback armed, as under torchrun), and libina's host
# halving-doubling over the TCP mesh (the issue's peer), alternated.
#   testbed/results/store-8b-20261205/run.sh [build-dir] [pairs]
set -euo pipefail
build=${1:-build-test}
pairs=${2:-3}
world=4
port=47474
"$build/aggregator/ina-aggregator" --bind 127.0.0.1 --port $port --world-size $world \
  --stats-interval-ms 0 >/dev/null 2>&1 &
agg=$!
trap 'kill $agg 2>/dev/null; wait $agg 2>/dev/null || true' EXIT
sleep 0.3
run() {  # $1: none|store|host-hd, $2: store port
  local pids=() r
  for r in $(seq 0 $((world - 1))); do
    local env=(INA_AGGREGATOR=127.0.0.1:$port INA_RANK=$r INA_WORLD_SIZE=$world)
    if [ "$1" != none ]; then env+=(INA_STORE=127.0.0.1:$2 INA_FALLBACK=float); fi
    if [ "$1" = host-hd ]; then env+=(INA_TRANSPORT=host INA_ALGO=hd); fi
    if [ "$r" = 0 ]; then
      env "${env[@]}" "$build/testbed/ina-bench" --workers $world -b 8 -e 8 -n 3000 -w 300 \
        -d float32 -v >/tmp/store8b-rank0.txt 2>&1 &
    else
      env "${env[@]}" "$build/testbed/ina-bench" --workers $world -b 8 -e 8 -n 3000 -w 300 \
        -d float32 >/dev/null 2>&1 &
    fi
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  printf '%-6s %s us  (%s)\n' "$1" "$(awk '$1 == 8 && $3 == "float32" {print $5}' /tmp/store8b-rank0.txt)" \
    "$(grep -o "collectives [0-9]*, packets sent [0-9]*" /tmp/store8b-rank0.txt | head -1)"
}
echo "# $(date -u +%FT%TZ) git $(git rev-parse --short HEAD) load $(cut -d' ' -f1-3 /proc/loadavg)"
for i in $(seq 1 "$pairs"); do
  run none 0
  run store $((29600 + i))
  run host-hd $((29650 + i))
done
