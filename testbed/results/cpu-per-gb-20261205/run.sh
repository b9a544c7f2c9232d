#!/usr/bin/env bash
# CPU seconds per GB reduced, INA against the host ring, on the shaped star (topo.py run-ina's
# "# cpu:" line: every rank's and the aggregator's user + system time from wait4).
#   run.sh <build-dir> <rounds> [link rate, default 1gbit]
# Each variant runs twice, with 5 and with 15 timed iterations of 16 and 64 MiB (float32 SUM,
# 4 workers, 1 warm-up, every element checked): the difference is the CPU of 10 x (16 + 64) MiB
# = 0.839 GB reduced, without the runs' setup, input generation and checks.
set -euo pipefail
build=$1 rounds=$2 rate=${3:-1gbit}
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-$here}
cd "$here/../../.."
for i in $(seq 1 "$rounds"); do
  for variant in ina ring; do
    for n in 5 15; do
      extra=(); bench=()
      if [ "$variant" = ring ]; then extra=(--host-path); bench=(--algo ring); fi
      log="$out/$variant-n$n-$i.txt"
      /usr/bin/python3 testbed/topo.py run-ina -N 4 --link-rate "$rate" "${extra[@]}" \
        --build-dir "$build" -- -b 16M -e 64M -f 4 -n "$n" -w 1 "${bench[@]}" >"$log" 2>&1
      echo "round $i $variant n=$n: $(grep -E '^ +[0-9]+ +[0-9]+ +float32' "$log" | awk '{printf "%s us ", $5}')| $(grep '^# cpu' "$log")"
    done
  done
done
