#!/usr/bin/env bash
# Suite dpdk: the DPDK aggregator under ina-controller, end to end, in a network namespace this
# script creates (unique to the run, always deleted): a veth pair inside it, the DPDK aggregator's
# net_af_packet port on one end (qpairs=QUEUES: that many rx/tx queues, one per worker lcore, the
# kernel's PACKET_FANOUT spreading frames over them), the kernel-UDP ranks on the other
# (10.77.0.2), the controller on the namespace's loopback. controller_e2e_test does the checks.
# Exits 77 with the reason when root, namespaces, the SIOCETHTOOL ioctl or the EAL are missing.
#   controller_e2e.sh <controller_e2e_test> [QUEUES]   (INA_AGGREGATOR_BIN, INA_CONTROLLER_BIN set)
set -u
TEST=$1
queues=${2:-2}
here=$(cd "$(dirname "$0")" && pwd)
ns=inac$$
skip() { echo "SKIP: $*"; exit 77; }
cleanup() { ip netns del $ns 2>/dev/null; }
trap cleanup EXIT
trap 'exit 1' INT TERM  # a timeout kill still deletes the namespace

[ "$(id -u)" -eq 0 ] || skip "needs root for a network namespace and net_af_packet"
command -v ip >/dev/null || skip "needs iproute2"
ip netns add $ns 2>/dev/null || skip "cannot create network namespaces"
ip -n $ns link set lo up
ip -n $ns link add ag0 type veth peer name wk0 || { echo "FAIL: veth"; exit 1; }
ip -n $ns link set ag0 up
ip -n $ns addr add 10.77.0.2/24 dev wk0 && ip -n $ns link set wk0 up
# A raw (af_packet) receiver sees the half-done UDP checksums of veth's offload: full ones.
ip netns exec $ns /usr/bin/python3 "$here/../../scripts/tx_checksum_off.py" wk0 ||
  skip "cannot turn off transmit checksum offload on a veth (SIOCETHTOOL)"
ip netns exec $ns "$TEST" 4 net_af_packet0 "net_af_packet0,iface=ag0,qpairs=$queues" 10.77.0.1
