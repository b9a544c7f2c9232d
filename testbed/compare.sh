#!/usr/bin/env bash
# Runs INA (ina-bench), Gloo (ina-gloo-bench) and MPI_Allreduce (ina-mpi-bench under mpirun, TCP
# over loopback) at the same rank count and sizes, and writes the tables and one CSV to
#   testbed/results/allreduce-<N>ranks-<date>.{txt,csv}
# then prints busbw (and time) per size per tool side by side. A tool that is not built (or
# mpirun that is not installed) is skipped with the reason.
#
# usage: testbed/compare.sh [-N ranks] [-b minbytes] [-e maxbytes] [-f stepfactor] [-n iters]
#                           [-w warmup] [-B max-bytes-per-size] [-t per-tool-timeout-s]
#                           [--build-dir DIR] [--only ina,gloo,mpi]
# defaults: -N 4 -b 8 -e 64M -f 2 -n 20 -w 5 -B 512M -t 900 --build-dir build
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")

ranks=4
minb=8
maxb=64M
factor=2
iters=20
warmup=5
cap=512M
tool_timeout=900
build="$root/build"
only="ina,gloo,mpi"

usage() { sed -n '2,12p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
  case "$1" in
    -N|--ranks) ranks=$2; shift 2 ;;
    -b|--minbytes) minb=$2; shift 2 ;;
    -e|--maxbytes) maxb=$2; shift 2 ;;
    -f|--stepfactor) factor=$2; shift 2 ;;
    -n|--iters) iters=$2; shift 2 ;;
    -w|--warmup_iters) warmup=$2; shift 2 ;;
    -B|--max-bytes-per-size) cap=$2; shift 2 ;;
    -t|--timeout) tool_timeout=$2; shift 2 ;;
    --build-dir) build=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "compare.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
case "$build" in /*) ;; *) build="$PWD/$build" ;; esac

# ---- build what is missing ----
if [ ! -f "$build/build.ninja" ]; then
  echo "== meson setup $build"
  meson setup "$build" "$root"
fi
targets=()
for t in ina-bench ina-gloo-bench ina-mpi-bench; do
  if ninja -C "$build" -t query "testbed/$t" >/dev/null 2>&1; then targets+=("testbed/$t"); fi
done
if [ ${#targets[@]} -gt 0 ]; then
  echo "== ninja -C $build ${targets[*]}"
  ninja -C "$build" "${targets[@]}"
fi

# ---- output files ----
mkdir -p "$here/results"
stamp=$(date -u +%Y%m%d-%H%M%S)
base="$here/results/allreduce-${ranks}ranks-$stamp"
txt="$base.txt"
csv="$base.csv"
: >"$csv"
cpu=$(grep -m1 '^model name' /proc/cpuinfo 2>/dev/null | sed 's/^model name[[:space:]]*:[[:space:]]*//' || true)
commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
dirty=$(git -C "$root" status --porcelain 2>/dev/null | head -1 || true)
{
  echo "# AllReduce comparison: INA vs Gloo vs MPI, $ranks ranks on one machine (loopback)"
  echo "# machine: $(uname -srm), $(nproc) CPUs, ${cpu:-unknown CPU}"
  echo "# date: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), commit $commit${dirty:+ (with local changes)}"
  echo "# sizes $minb .. $maxb (x$factor), iters $iters, warmup $warmup, iterations capped at $cap bytes per size"
  echo "# load average at start: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown)"
  echo "# busbw = algbw * 2(N-1)/N (nccl-tests AllReduce convention)"
  echo "#"
} >"$txt"
cat "$txt"

common=(-b "$minb" -e "$maxb" -f "$factor" -n "$iters" -w "$warmup" -c 1
        --max-bytes-per-size "$cap" --csv "$csv")
status=0

# Runs one tool under `timeout` (which ends only the process it started), appending its output
# to the text file. A failing tool is reported, and the others still run.
run_tool() {
  local name=$1; shift
  local shown="$*"
  shown=${shown//"$root/"/}
  echo "== $name: $shown" | tee -a "$txt"
  local rc=0
  timeout --kill-after=10 "$tool_timeout" "$@" 2>&1 | tee -a "$txt" || rc=$?
  if [ "$rc" -ne 0 ]; then
    local why=""
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then why=" (timed out after ${tool_timeout}s)"; fi
    echo "# $name exited with status $rc$why" | tee -a "$txt"
    status=1
  fi
  echo | tee -a "$txt"
}

skip() { echo "== $1: skipped: $2" | tee -a "$txt"; echo | tee -a "$txt"; }

wants() { case ",$only," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }

if wants ina; then
  if [ -x "$build/testbed/ina-bench" ]; then
    run_tool ina "$build/testbed/ina-bench" --workers "$ranks" "${common[@]}"
  else
    skip ina "$build/testbed/ina-bench is not built (worker or aggregator missing?)"
  fi
fi

if wants gloo; then
  if [ -x "$build/testbed/ina-gloo-bench" ]; then
    run_tool gloo "$build/testbed/ina-gloo-bench" --ranks "$ranks" "${common[@]}"
  else
    skip gloo "$build/testbed/ina-gloo-bench is not built (apt-get install libgloo-dev, then reconfigure)"
  fi
fi

if wants mpi; then
  if [ ! -x "$build/testbed/ina-mpi-bench" ]; then
    skip mpi "$build/testbed/ina-mpi-bench is not built (apt-get install libopenmpi-dev, -Dmpi=enabled)"
  elif ! command -v mpirun >/dev/null 2>&1; then
    skip mpi "mpirun is not installed (apt-get install openmpi-bin)"
  else
    mpi_flags=(-np "$ranks" --oversubscribe --mca btl tcp,self --mca btl_tcp_if_include lo)
    if [ "$(id -u)" -eq 0 ]; then mpi_flags=(--allow-run-as-root "${mpi_flags[@]}"); fi
    run_tool mpi mpirun "${mpi_flags[@]}" "$build/testbed/ina-mpi-bench" "${common[@]}"
  fi
fi

# ---- side-by-side summary ----
summary() {
  local tools
  tools=$(tail -n +2 "$csv" | cut -d, -f1 | awk '!seen[$0]++' | tr '\n' ' ')
  if [ -z "$tools" ]; then echo "# no results"; return; fi
  echo "# Summary, $ranks ranks: busbw (GB/s) and time (us) per size"
  printf '%12s' "size(B)"
  for t in $tools; do printf '  %10s' "$t busbw"; done
  for t in $tools; do printf '  %12s' "$t time"; done
  echo
  for s in $(tail -n +2 "$csv" | cut -d, -f3 | sort -n -u); do
    printf '%12s' "$s"
    for t in $tools; do
      printf '  %10s' "$(awk -F, -v t="$t" -v s="$s" '$1==t && $3==s {v=$9} END {print (v=="" ? "-" : v)}' "$csv")"
    done
    for t in $tools; do
      printf '  %12s' "$(awk -F, -v t="$t" -v s="$s" '$1==t && $3==s {v=$7} END {print (v=="" ? "-" : v)}' "$csv")"
    done
    echo
  done
  for t in $tools; do
    awk -F, -v t="$t" '$1==t {n++; b+=$9; if ($10!="NA") w+=$10} END {if (n) printf "# %-5s avg busbw %.4f GB/s over %d sizes, #wrong %d\n", t, b/n, n, w}' "$csv"
  done
}
summary | tee -a "$txt"
echo "# results: $txt"
echo "#          $csv"
exit "$status"
