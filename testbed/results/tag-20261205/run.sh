#!/usr/bin/env bash
# Wire v4's tag (POLYVAL, then SipHash) against v3's (SipHash over the datagram) on the shaped
# star, two builds alternated: run.sh <build-a> <build-b> <rounds>
#   e.g. run.sh /tmp/base-wt/build-base build-test 3
# Per round and build: 4 workers at 1 Gbit/s, 16 to 64 MiB, with 5 and with 15 timed iterations
# (the difference is the CPU of 10 x (16 + 32 + 64) MiB = 1.174 GB reduced, without setup, input
# generation and checks: topo.py's "# cpu:" line); 8 workers at 500 Mbit/s, 16 MiB. Per round
# also the host ring at 1 Gbit/s (the same two -n values) for CPU per GB beside INA's.
# float32 SUM, every element checked. Logs go to OUT (default: this directory).
set -euo pipefail
a=$1 b=$2 rounds=$3
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-$here}
mkdir -p "$out"
cd "$here/../../.."
line() {  # log -> "times | cpu"
  echo "$(grep -E '^ +[0-9]+ +[0-9]+ +float32' "$1" | awk '{printf "%s us ", $5}')| $(grep '^# cpu' "$1" | sed 's/^# //')"
}
for i in $(seq 1 "$rounds"); do
  for build in "$a" "$b" ring; do
    if [ "$build" = ring ]; then
      tag=ring; bd=$b; extra=(--host-path); bench=(--algo ring)
    else
      tag=$(basename "$(dirname "$build")")-$(basename "$build"); bd=$build; extra=(); bench=()
    fi
    for n in 5 15; do
      log="$out/n4-1gbit-n$n-$i-$tag.txt"
      /usr/bin/python3 testbed/topo.py run-ina -N 4 --link-rate 1gbit "${extra[@]}" \
        --build-dir "$bd" -- -b 16M -e 64M -f 2 -n "$n" -w 1 -v "${bench[@]}" >"$log" 2>&1
      echo "round $i $tag N=4 1gbit n=$n: $(line "$log")"
    done
    [ "$build" = ring ] && continue
    log="$out/n8-500mbit-$i-$tag.txt"
    /usr/bin/python3 testbed/topo.py run-ina -N 8 --link-rate 500mbit \
      --build-dir "$bd" -- -b 16M -e 16M -f 2 -n 5 -w 1 -v >"$log" 2>&1
    echo "round $i $tag N=8 500mbit: $(line "$log")"
  done
done
