#!/bin/bash
# MPI_Allreduce busbw with and without libina-mpi.so, side by side: starts an ina-aggregator on
# loopback (ephemeral port, job of NP ranks), runs ina-mpi-bench under mpirun twice (plain MPI,
# then LD_PRELOAD with INA_MPI_STATS=1) and stops the aggregator.
#
#   integrations/mpi/bench_preload.sh [BUILD_DIR] [ina-mpi-bench flags...]
#   integrations/mpi/bench_preload.sh build -b 8 -e 16M -f 4 -n 10 -w 3
#   NP=8 integrations/mpi/bench_preload.sh build -d int32
set -euo pipefail
build=${1:-build}
shift || true
np=${NP:-4}
bench="$build/testbed/ina-mpi-bench"
lib="$(realpath "$build/integrations/mpi/libina-mpi.so")"
agg="$build/aggregator/ina-aggregator"
for f in "$bench" "$lib" "$agg"; do
  [[ -x $f || -f $f ]] || { echo "missing $f: build it first (ninja -C $build)" >&2; exit 2; }
done
command -v mpirun >/dev/null || { echo "mpirun not found (Debian: openmpi-bin)" >&2; exit 2; }

tmp=$(mktemp -d /tmp/ina-mpi-bench.XXXXXX)
agg_pid=
cleanup() {
  [[ -n $agg_pid ]] && kill "$agg_pid" 2>/dev/null && wait "$agg_pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
"$agg" --world-size "$np" --bind 127.0.0.1 --port 0 --port-file "$tmp/port" \
  --stats-interval-ms 0 >"$tmp/aggregator.log" 2>&1 &
agg_pid=$!
for _ in $(seq 100); do [[ -s $tmp/port ]] && break; sleep 0.1; done
[[ -s $tmp/port ]] || { echo "ina-aggregator did not start:" >&2; cat "$tmp/aggregator.log" >&2; exit 1; }
port=$(cat "$tmp/port")

mpi=(mpirun --allow-run-as-root --oversubscribe --mca btl tcp,self --mca btl_tcp_if_include lo
     --mca oob_tcp_if_include lo -np "$np")
echo "## MPI_Allreduce, Open MPI alone ($np ranks)"
"${mpi[@]}" "$bench" "$@"
echo "## MPI_Allreduce through INA: LD_PRELOAD=libina-mpi.so, aggregator 127.0.0.1:$port"
"${mpi[@]}" -x LD_PRELOAD="$lib" -x INA_AGGREGATOR="127.0.0.1:$port" -x INA_MPI_STATS=1 \
  "$bench" "$@"
