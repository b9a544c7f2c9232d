#!/usr/bin/env bash
# The end-to-end comparison of issue 3: ina-bench AllReduce at N ranks (default 4) over every
# data path this machine has, next to Gloo and Open MPI, in one run, in network namespaces unique
# to the run (always deleted):
#   ina-udp-lo      kernel-UDP ranks, kernel-UDP aggregator, on loopback (ina-bench --workers N)
#   ina-udp-veth    kernel-UDP ranks -> veth -> bridge -> kernel-UDP aggregator
#   ina-xdp-veth    AF_XDP ranks (one veth each, copy mode) -> kernel-UDP aggregator
#   ina-udp-dpdk    kernel-UDP ranks -> DPDK aggregator (net_af_packet on its own veth, 1 lcore)
#   ina-xdp-dpdk    AF_XDP ranks -> DPDK aggregator
#   ina-memif-dpdk  DPDK ranks (net_memif client; ina-bench --local-ranks N: threads of one
#                   process, which shares one port) -> DPDK aggregator (net_memif server, 1 lcore)
#   gloo            ina-gloo-bench, ring AllReduce over TCP on a namespace's loopback
#   mpi             ina-mpi-bench under mpirun (Open MPI, TCP) on a namespace's loopback
# Same sizes, iterations and data type (float32 SUM) for every row; each row has a 60 s limit.
# Results go to testbed/results/bypass-compare-<UTC stamp>/: machine.txt (machine, command, git
# revision), <row>.csv and <row>.txt per row, runs.csv (status and seconds per row) and README.md
# (the table). Needs root (namespaces, AF_XDP, DPDK on af_packet); the whole run takes about
# 1-2 minutes with the defaults. On a shared machine the figures are indicative only.
#   testbed/bypass_compare.sh [BUILD_DIR] [RANKS] [ina-bench size args...]
# e.g. testbed/bypass_compare.sh build 4 -b 64K -e 4M -f 4 -n 10 -w 2
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
build=${1:-$root/build}
n=${2:-4}
shift $(( $# >= 2 ? 2 : $# ))
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(-b 64K -e 4M -f 4 -n 10 -w 2)
[ "$(id -u)" -eq 0 ] || { echo "bypass_compare: needs root (namespaces, AF_XDP, DPDK)"; exit 77; }
agg_bin=$build/aggregator/ina-aggregator
bench=$build/testbed/ina-bench
gloo=$build/testbed/ina-gloo-bench
mpi=$build/testbed/ina-mpi-bench
for b in "$agg_bin" "$bench"; do [ -x "$b" ] || { echo "bypass_compare: $b not built"; exit 1; }; done
stamp=$(date -u +%Y%m%d-%H%M%S)
out=$root/testbed/results/bypass-compare-$stamp
mkdir -p "$out"
A=ina_bc_$$_a
W=ina_bc_$$_w
agg_pid=
memif_sock=/tmp/ina_bc_$$.sock
cleanup() {
  if [ -n "$agg_pid" ] && kill -0 "$agg_pid" 2>/dev/null; then
    kill -INT "$agg_pid"; sleep 1; kill -KILL "$agg_pid" 2>/dev/null
  fi
  ip netns del "$A" 2>/dev/null || true
  ip netns del "$W" 2>/dev/null || true
  rm -rf "/var/run/dpdk/ina_bc_$$" "/var/run/dpdk/ina_bc_w_$$"
  rm -f "$memif_sock"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

{
  echo "command: $0 $build $n ${sizes[*]}"
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "git: $(git -C "$root" rev-parse --short HEAD 2>/dev/null) ($(git -C "$root" rev-parse --abbrev-ref HEAD 2>/dev/null))"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores available"
  echo "kernel: $(uname -r)"
  echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "ranks: $n; sizes: ${sizes[*]}; dtype float32, op sum"
} > "$out/machine.txt"
echo "row,status,seconds" > "$out/runs.csv"

# Topology: W holds the ranks' veths w0..w(n-1); A holds the bridge (10.79.0.1, the kernel
# aggregator), the ranks' peers a0.. and the DPDK aggregator's veth d0 (10.79.0.2, no kernel
# address) with its peer d0b on the bridge. lo up in both (Gloo, Open MPI, loopback rows).
ip netns add "$A" && ip netns add "$W" || { echo "bypass_compare: cannot create namespaces"; exit 77; }
# shellcheck source=bypass_netns.sh
. "$here/bypass_netns.sh"
bridge_topology "$A" "$W" "$n"
ip -n "$A" link add name d0 type veth peer name d0b
ip -n "$A" link set d0b master br0
ip -n "$A" link set d0b up
ip -n "$A" link set d0 up
# Full transmit checksums where a raw receiver (AF_XDP socket, DPDK af_packet) sees the frames.
devs=(br0 d0b)
for k in $(seq 0 $((n - 1))); do devs+=("a$k"); done
csum_off "$A" "${devs[@]}"

# One row: $1 name, then the command (a program, limited to 60 s, or the function `ranks`, whose
# processes are); its stdout+stderr in <row>.txt.
row() {
  local name=$1; shift
  local t0=$SECONDS rc
  if declare -F "$1" >/dev/null; then
    "$@" > "$out/$name.txt" 2>&1; rc=$?
  else
    timeout 60 "$@" > "$out/$name.txt" 2>&1; rc=$?
  fi
  echo "$name,$([ $rc -eq 0 ] && echo ok || echo "failed ($rc)"),$((SECONDS - t0))" >> "$out/runs.csv"
  echo "== $name: rc $rc in $((SECONDS - t0)) s"
  return 0
}

# The N ranks of ina-bench in W against $1 (host:port), transport $2 (udp | xdp); rank 0 writes
# the CSV and the table.
ranks() {
  local target=$1 kind=$2 csv=$3 pids=() rc=0
  for k in $(seq 0 $((n - 1))); do
    local env_t=(INA_TRANSPORT=udp)
    [ "$kind" = xdp ] && env_t=(INA_TRANSPORT=xdp INA_XDP_IFACE="w$k" INA_LOCAL_IP="10.79.0.$((10 + k))")
    local extra=()
    [ "$k" -eq 0 ] && extra=(--csv "$csv")
    timeout 60 ip netns exec "$W" env "${env_t[@]}" INA_RANK="$k" INA_WORLD_SIZE="$n" INA_TIMEOUT_MS=20000 \
      "$bench" --aggregator "$target" "${sizes[@]}" -c 1 "${extra[@]}" \
      > "$out/.rank$k" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  cat "$out/.rank0"
  for k in $(seq 1 $((n - 1))); do grep -i "error\|fail" "$out/.rank$k" | sed "s/^/rank $k: /"; done
  rm -f "$out"/.rank*
  return $rc
}

kernel_agg() {  # the kernel-UDP aggregator in A on 10.79.0.1
  ip netns exec "$A" "$agg_bin" --bind 10.79.0.1 --port 47474 --world-size "$n" \
    --stats-interval-ms 0 > "$out/.agg" 2>&1 &
  agg_pid=$!
  sleep 0.5
}
dpdk_agg() {  # the DPDK aggregator in A: on d0 (net_af_packet), 10.79.0.2; or $1 = memif
  local port=net_af_packet0 vdev=net_af_packet0,iface=d0,framecnt=4096
  if [ "${1:-}" = memif ]; then
    port=net_memif0
    vdev=net_memif0,role=server,socket=$memif_sock
  fi
  ip netns exec "$A" "$agg_bin" --backend dpdk --world-size "$n" --ip 10.79.0.2 --port 47474 \
    --dpdk-port "$port" --stats-interval-ms 0 -- --no-huge -m 512 --no-shconf --no-pci \
    --no-telemetry --file-prefix "ina_bc_$$" -l 0-1 --vdev "$vdev" \
    --log-level=3 > "$out/.agg" 2>&1 &
  agg_pid=$!
  for _ in $(seq 1 100); do
    grep -q "ina-aggregator (dpdk) on port" "$out/.agg" && return 0
    kill -0 "$agg_pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "bypass_compare: the DPDK aggregator did not start: $(tail -3 "$out/.agg")"
  return 1
}
stop_agg() {  # $1: where its counters go
  [ -n "$agg_pid" ] || return 0
  kill -INT "$agg_pid" 2>/dev/null
  wait "$agg_pid" 2>/dev/null
  agg_pid=
  mv "$out/.agg" "$1"
}

echo "results: $out"
row ina-udp-lo ip netns exec "$A" env -u INA_TRANSPORT "$bench" --workers "$n" "${sizes[@]}" -c 1 \
  --csv "$out/ina-udp-lo.csv"

ip -n "$W" addr add 10.79.0.10/24 dev w0  # every kernel-UDP rank through w0
kernel_agg
row ina-udp-veth ranks 10.79.0.1:47474 udp "$out/ina-udp-veth.csv"
stop_agg "$out/ina-udp-veth.aggregator.txt"
ip -n "$W" addr flush dev w0

kernel_agg
row ina-xdp-veth ranks 10.79.0.1:47474 xdp "$out/ina-xdp-veth.csv"
stop_agg "$out/ina-xdp-veth.aggregator.txt"

if dpdk_agg; then
  ip -n "$W" addr add 10.79.0.10/24 dev w0
  csum_off "$W" w0
  row ina-udp-dpdk ranks 10.79.0.2:47474 udp "$out/ina-udp-dpdk.csv"
  ip -n "$W" addr flush dev w0
  stop_agg "$out/ina-udp-dpdk.aggregator.txt"
else
  echo "ina-udp-dpdk,failed (aggregator),0" >> "$out/runs.csv"
fi
if dpdk_agg; then
  row ina-xdp-dpdk ranks 10.79.0.2:47474 xdp "$out/ina-xdp-dpdk.csv"
  stop_agg "$out/ina-xdp-dpdk.aggregator.txt"
else
  echo "ina-xdp-dpdk,failed (aggregator),0" >> "$out/runs.csv"
fi

# The N ranks as threads of one ina-bench process on one DPDK port (memif client), in A with the
# aggregator (DPDK 22.11's memif socket is abstract by default: one per network namespace), on
# every CPU but the aggregator's worker lcore (CPU 1): a busy-polling rank on that CPU would take
# turns with the lcore.
memif_ranks() {
  local cpus rank_cpus=0
  cpus=$(nproc)
  [ "$cpus" -gt 2 ] && rank_cpus="0,2-$((cpus - 1))"
  [ "$cpus" -lt 2 ] && rank_cpus=0
  INA_TRANSPORT=dpdk INA_LOCAL_IP=10.79.0.20 INA_TIMEOUT_MS=20000 \
    INA_DPDK_ARGS="--no-huge -m 512 --no-shconf --no-pci --no-telemetry --log-level=3 --file-prefix ina_bc_w_$$ --vdev=net_memif0,role=client,socket=$memif_sock --lcores 0@0" \
    timeout 60 ip netns exec "$A" taskset -c "$rank_cpus" "$bench" --aggregator 10.79.0.2:47474 --rank 0 \
    --workers "$n" --local-ranks "$n" "${sizes[@]}" -c 1 --csv "$out/ina-memif-dpdk.csv"
}
if dpdk_agg memif; then
  row ina-memif-dpdk memif_ranks
  # The ranks' process has exited (its port stopped, no traffic left): DPDK 22.11's memif server
  # crashes only on a disconnect under traffic.
  stop_agg "$out/ina-memif-dpdk.aggregator.txt"
else
  echo "ina-memif-dpdk,failed (aggregator),0" >> "$out/runs.csv"
fi

if [ -x "$gloo" ]; then
  row gloo ip netns exec "$A" "$gloo" --ranks "$n" "${sizes[@]}" -c 1 --csv "$out/gloo.csv"
else
  echo "gloo,not built,0" >> "$out/runs.csv"
fi
if [ -x "$mpi" ] && command -v mpirun >/dev/null; then
  row mpi ip netns exec "$A" mpirun --allow-run-as-root -np "$n" --oversubscribe --mca btl tcp,self \
    --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo "$mpi" "${sizes[@]}" -c 1 \
    --csv "$out/mpi.csv"
else
  echo "mpi,not built or no mpirun,0" >> "$out/runs.csv"
fi

/usr/bin/python3 "$here/bypass_compare_table.py" "$out" > "$out/README.md"
cat "$out/README.md"
