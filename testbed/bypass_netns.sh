# Sourced by bypass_bench.sh and bypass_compare.sh (bash): the network namespaces of a run.
#
# bridge_topology A W N: in namespace A a bridge br0 with 10.79.0.1/24 (the kernel aggregator's
# address) and the peers a0 .. a(N-1) of the ranks' veths w0 .. w(N-1), which are in namespace W;
# lo up in both. Both namespaces must exist.
bridge_topology() {
  local a=$1 w=$2 n=$3 k
  ip -n "$a" link set lo up
  ip -n "$w" link set lo up
  ip -n "$a" link add name br0 type bridge
  ip -n "$a" addr add 10.79.0.1/24 dev br0
  ip -n "$a" link set br0 up
  for k in $(seq 0 $((n - 1))); do
    ip -n "$w" link add name "w$k" type veth peer name "a$k" netns "$a"
    ip -n "$a" link set "a$k" master br0
    ip -n "$a" link set "a$k" up
    ip -n "$w" link set "w$k" up
  done
}

# csum_off NS DEV...: full transmit checksums on those devices of namespace NS, where a raw
# receiver (AF_XDP socket, DPDK af_packet) sees the frames: veth otherwise leaves them to an
# offload that never happens (scripts/tx_checksum_off.py).
csum_off() {
  local ns=$1
  shift
  ip netns exec "$ns" /usr/bin/python3 "$(dirname "${BASH_SOURCE[0]}")/../scripts/tx_checksum_off.py" "$@"
}
