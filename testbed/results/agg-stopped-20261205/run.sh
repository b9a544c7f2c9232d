#!/usr/bin/env bash
# The aggregator SIGSTOPped mid-stream (alive to the kernel: no ICMP refusals, but it answers
# nothing): how long until the ranks take the host path. run.sh <build-dir>
# A standalone ina-aggregator on 127.0.0.1, 4 ina-bench ranks with the fallback armed
# (INA_STORE, INA_FALLBACK=float), 1 MiB float32 AllReduces in a loop; SIGSTOP 2 s in, SIGCONT
# once the ranks are done. Prints rank 0's fallback line (its "for N ms" is the detection time).
set -u
build=$1
port=47474
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$build/aggregator/ina-aggregator" --bind 127.0.0.1 --port $port --world-size 4 \
  --stats-interval-ms 0 >"$out/agg.txt" 2>&1 &
agg=$!
sleep 0.3
pids=()
for r in 0 1 2 3; do
  INA_LOG_LEVEL=info INA_AGGREGATOR=127.0.0.1:$port INA_RANK=$r INA_WORLD_SIZE=4 \
    INA_STORE=127.0.0.1:29777 INA_FALLBACK=float \
    "$build/testbed/ina-bench" --workers 4 -b 1M -e 1M -n 3000 -w 1 -d float32 >"$out/r$r.txt" 2>&1 &
  pids+=($!)
done
sleep 2
t0=$(date +%s.%N)
echo "# $(date -u +%FT%TZ) build $build: SIGSTOP"
kill -STOP $agg
for p in "${pids[@]}"; do wait "$p"; done
echo "# ranks done $(echo "$(date +%s.%N) - $t0" | bc) s after the SIGSTOP"
kill -CONT $agg
kill $agg
wait $agg 2>/dev/null
grep -h "failed" "$out/r0.txt" | cut -c1-400 | head -3
awk '$3 == "float32" {print "# time per collective", $5, "us (3000 collectives)"}' "$out/r0.txt"
