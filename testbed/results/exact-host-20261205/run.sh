#!/usr/bin/env bash
# The host path in exact mode (INA_FALLBACK=exact, what an in-network AllReduce falls back to):
# two builds alternated, 4 local ranks over the TCP mesh on loopback, float32 SUM.
#   run.sh <build-a> <build-b> <rounds>
# Per build and round: a first call in a fresh process (-w 0 -n 1, 4 MiB: the scratch is cold),
# then 4-64 MiB warm (-w 1 -n 5); float mode's warm figures once per round for reference.
set -euo pipefail
a=$1 b=$2 rounds=$3
for i in $(seq 1 "$rounds"); do
  for build in "$a" "$b"; do
    cold=$(INA_FALLBACK=exact "$build/testbed/ina-bench" --transport host -b 4M -e 4M -n 1 -w 0 2>/dev/null |
           awk '$3 == "float32" {print $5}')
    warm=$(INA_FALLBACK=exact "$build/testbed/ina-bench" --transport host -b 4M -e 64M -f 4 -n 5 -w 1 2>/dev/null |
           awk '$3 == "float32" {printf "%s ", $5}')
    echo "round $i $build exact: first call 4 MiB $cold us; warm 4/16/64 MiB $warm us"
  done
  float=$(INA_FALLBACK=float "$b/testbed/ina-bench" --transport host -b 4M -e 64M -f 4 -n 5 -w 1 2>/dev/null |
          awk '$3 == "float32" {printf "%s ", $5}')
  echo "round $i $b float: warm 4/16/64 MiB $float us"
done
