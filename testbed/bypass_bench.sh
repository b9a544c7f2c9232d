#!/usr/bin/env bash
# ina-bench at N ranks (default 4) through the kernel-UDP ina-aggregator over veth pairs in two
# network namespaces unique to this run (deleted on exit): once with the workers on kernel UDP
# (addresses on their veths) and once over the AF_XDP transport (INA_TRANSPORT=xdp, copy mode on
# veth), same topology, same run. Needs root. Figures on a shared machine are indicative only.
#   testbed/bypass_bench.sh BUILD_DIR [RANKS] [ina-bench args...]
# e.g. testbed/bypass_bench.sh build 4 -b 64K -e 4M -f 4 -n 20 -w 3
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:?usage: bypass_bench.sh BUILD_DIR [RANKS] [ina-bench args]}
n=${2:-4}
shift $(( $# >= 2 ? 2 : 1 ))
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(-b 64K -e 4M -f 4 -n 20 -w 3)
[ "$(id -u)" -eq 0 ] || { echo "bypass_bench: needs root (namespaces, AF_XDP)"; exit 77; }
agg_bin=$build/aggregator/ina-aggregator
bench=$build/testbed/ina-bench
A=ina_bb_$$_a
W=ina_bb_$$_w
agg_pid=
cleanup() {
  [ -n "$agg_pid" ] && kill "$agg_pid" 2>/dev/null && wait "$agg_pid" 2>/dev/null || true
  ip netns del "$A" 2>/dev/null || true
  ip netns del "$W" 2>/dev/null || true
}
trap cleanup EXIT INT TERM
ip netns add "$A"
ip netns add "$W"
# shellcheck source=bypass_netns.sh
. "$here/bypass_netns.sh"
bridge_topology "$A" "$W" "$n"
# Full checksums towards the AF_XDP sockets (see README: kernel-bypass transports).
devs=(br0)
for k in $(seq 0 $((n - 1))); do devs+=("a$k"); done
csum_off "$A" "${devs[@]}"

run() {  # $1 = udp | xdp
  ip netns exec "$A" "$agg_bin" --bind 10.79.0.1 --port 47474 --world-size "$n" --no-gso --no-gro \
    --stats-interval-ms 0 >/dev/null 2>&1 &
  agg_pid=$!
  sleep 0.5
  local pids=()
  for k in $(seq 0 $((n - 1))); do
    if [ "$1" = udp ]; then
      env_t=(INA_TRANSPORT=udp)
    else
      env_t=(INA_TRANSPORT=xdp INA_XDP_IFACE="w$k" INA_LOCAL_IP="10.79.0.$((10 + k))")
    fi
    if [ "$k" -eq 0 ]; then out=/dev/stdout; else out=/dev/null; fi
    ip netns exec "$W" env "${env_t[@]}" INA_RANK="$k" INA_WORLD_SIZE="$n" \
      "$bench" --aggregator 10.79.0.1:47474 "${args[@]}" >"$out" 2>&1 &
    pids+=($!)
  done
  local rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  kill "$agg_pid" 2>/dev/null; wait "$agg_pid" 2>/dev/null || true
  agg_pid=
  return $rc
}

echo "== $n ranks, kernel UDP workers (all through w0, 10.79.0.10)"
ip -n "$W" addr add 10.79.0.10/24 dev w0
run udp || echo "udp run failed"
ip -n "$W" addr flush dev w0
echo "== $n ranks, AF_XDP workers (INA_TRANSPORT=xdp, one veth each, copy mode)"
run xdp
