#!/usr/bin/env bash
# Suite dpdk: end to end across network namespaces this test creates. Four kernel-UDP workers
# (ina-bench external mode, libina), each in its own namespace, on veth links to a bridge; the DPDK
# aggregator (ina-aggregator --backend dpdk, net_af_packet or net_af_xdp on its own veth to the
# bridge, --no-huge)
# answers ARP for its address and aggregates. int32 SUM must be exact; then again with 1% of the
# datagrams each way dropped by nftables on the bridge (numgen random mod 100 < 1).
# The namespaces are unique to the run and always deleted. Exits 77 with the reason when root,
# namespaces, the SIOCETHTOOL ioctl or the EAL are missing.
#   namespaces_e2e.sh <ina-aggregator> <ina-bench> [af_packet|af_xdp]
set -u
AGG=$1
BENCH=$2
pmd=${3:-af_packet}
here=$(cd "$(dirname "$0")" && pwd)
tag=inae$$
ns_a=${tag}a
workers=4
port=47474
agg_ip=10.77.0.1
log=$(mktemp -d /tmp/${tag}.XXXX)
agg_pid=""

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; for f in "$log"/*; do echo "--- $f"; tail -20 "$f"; done; exit 1; }
cleanup() {
  if [ -n "$agg_pid" ] && kill -0 "$agg_pid" 2>/dev/null; then
    kill -INT "$agg_pid"; sleep 1; kill -KILL "$agg_pid" 2>/dev/null
  fi
  for i in $(seq 0 $((workers - 1))); do ip netns del ${tag}w$i 2>/dev/null; done
  ip netns del $ns_a 2>/dev/null
  rm -rf "$log"
}
trap cleanup EXIT
trap 'exit 1' INT TERM  # a timeout kill still tears the namespaces down

[ "$(id -u)" -eq 0 ] || skip "needs root for network namespaces"
command -v ip >/dev/null && command -v nft >/dev/null || skip "needs iproute2 and nftables"
ip netns add $ns_a 2>/dev/null || skip "cannot create network namespaces"
ip -n $ns_a link add br0 type bridge && ip -n $ns_a link set br0 up || fail "bridge"
ip -n $ns_a link add ag0 type veth peer name ag0b || fail "veth ag0"
ip -n $ns_a link set ag0b master br0 && ip -n $ns_a link set ag0b up && ip -n $ns_a link set ag0 up
for i in $(seq 0 $((workers - 1))); do
  w=${tag}w$i
  ip netns add $w || fail "netns $w"
  ip -n $ns_a link add p$i type veth peer name eth0 netns $w || fail "veth $i"
  ip -n $ns_a link set p$i master br0 && ip -n $ns_a link set p$i up
  ip -n $w addr add 10.77.0.$((10 + i))/24 dev eth0 && ip -n $w link set eth0 up && ip -n $w link set lo up
  # veth leaves UDP checksums to an offload that never happens (CHECKSUM_PARTIAL); a raw
  # (af_packet) receiver sees half-done checksums, so the workers' kernels must write full ones.
  ip netns exec $w /usr/bin/python3 "$here/../../scripts/tx_checksum_off.py" eth0 ||
    skip "cannot turn off transmit checksum offload on a veth (SIOCETHTOOL)"
done

ip netns exec $ns_a "$AGG" --backend dpdk --world-size $workers --ip $agg_ip --port $port \
  --dpdk-port net_${pmd}0 --stats-interval-ms 0 -- --no-huge -m 512 --no-shconf --no-pci \
  --no-telemetry --file-prefix $tag -l 0-1 --vdev net_${pmd}0,iface=ag0 --log-level=3 \
  > "$log/agg.out" 2>&1 &
agg_pid=$!
for _ in $(seq 1 300); do
  grep -q "ina-aggregator (dpdk) on port" "$log/agg.out" && break
  if ! kill -0 $agg_pid 2>/dev/null; then
    wait $agg_pid; rc=$?
    [ $rc -eq 77 ] && skip "EAL: $(tail -1 "$log/agg.out")"
    fail "the aggregator exited with $rc"
  fi
  sleep 0.1
done
grep -q "ina-aggregator (dpdk) on port" "$log/agg.out" || fail "the aggregator did not start"

run_workers() {  # $1: label
  local pids=() rc=0
  for i in $(seq 0 $((workers - 1))); do
    ip netns exec ${tag}w$i env INA_TIMEOUT_MS=20000 "$BENCH" --aggregator $agg_ip:$port --rank $i \
      --workers $workers -d int32 -o sum -b 8 -e 256K -n 3 -w 1 -c 1 > "$log/$1.w$i" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  [ $rc -eq 0 ] || fail "$1: a worker failed"
  grep -q "Out of bounds values : 0 OK" "$log/$1.w0" || fail "$1: wrong results"
  echo "== $1 (rank 0)"; grep -v "^$" "$log/$1.w0" | tail -6
}

run_workers exact
# 1% loss each way, on the bridge (a drop in the workers' output hook would fail their send with
# EPERM instead of losing the datagram).
ip netns exec $ns_a nft -f - <<NFT || fail "nftables on the bridge"
table bridge $tag {
  chain loss {
    type filter hook forward priority 0;
    udp dport $port numgen random mod 100 < 1 counter drop;
    udp sport $port numgen random mod 100 < 1 counter drop;
  }
}
NFT
run_workers loss1pct
echo "== nftables drops"; ip netns exec $ns_a nft list table bridge $tag | grep counter

kill -INT $agg_pid
wait $agg_pid; rc=$?
agg_pid=""
[ $rc -eq 0 ] || fail "the aggregator exited with $rc after SIGINT"
echo "== aggregator counters"; cat "$log/agg.out" | tail -25
grep -h "results to every rank" "$log/agg.out" || true  # chains or copies, per the PMD
grep -q "arp_request" "$log/agg.out" || fail "the aggregator answered no ARP request"
echo "PASS"
