#!/usr/bin/env bash
# Suite integration: a job across "hosts" as a launcher runs it. Four ranks, each in a network
# namespace of its own on a veth link to a bridge (10.78.0.10 .. 13), are given only the
# launcher's variables: MASTER_ADDR (rank 0's namespace address) and MASTER_PORT, or INA_STORE,
# and no INA_MESH_ADDR. Each must find its mesh address itself (the route to the store's host)
# and the job must complete:
#   1. host only (ina-bench --transport host: every collective on the TCP mesh), MASTER_ADDR;
#   2. in-network through an ina-aggregator in rank 0's namespace, INA_STORE for the fallback
#      mesh: results checked, and the run must stay in-network (no fallback);
#   3. INA_SOCKET_IFNAME=eth0 instead of the route.
# Exits 77 with the reason without root or network namespaces.
#   mesh_netns.sh <ina-bench> <ina-aggregator>
set -u
BENCH=$1
AGG=$2
tag=inam$$
workers=4
log=$(mktemp -d /tmp/${tag}.XXXX)
agg_pid=""

skip() { echo "SKIP: $*"; exit 77; }
fail() {
  echo "FAIL: $*"
  for f in "$log"/*; do echo "--- $f"; tail -15 "$f"; done
  exit 1
}
cleanup() {
  [ -n "$agg_pid" ] && kill "$agg_pid" 2>/dev/null && wait "$agg_pid" 2>/dev/null
  for i in $(seq 0 $((workers - 1))); do ip netns del ${tag}w$i 2>/dev/null; done
  ip netns del ${tag}br 2>/dev/null
  rm -rf "$log"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

[ "$(id -u)" -eq 0 ] || skip "needs root for network namespaces"
command -v ip >/dev/null || skip "needs iproute2"
ip netns add ${tag}br 2>/dev/null || skip "cannot create network namespaces"
ip -n ${tag}br link add br0 type bridge && ip -n ${tag}br link set br0 up || fail "bridge"
for i in $(seq 0 $((workers - 1))); do
  w=${tag}w$i
  ip netns add $w || fail "netns $w"
  ip -n ${tag}br link add p$i type veth peer name eth0 netns $w || fail "veth $i"
  ip -n ${tag}br link set p$i master br0 && ip -n ${tag}br link set p$i up
  ip -n $w addr add 10.78.0.$((10 + i))/24 dev eth0 && ip -n $w link set eth0 up &&
    ip -n $w link set lo up || fail "address of $w"
done
master=10.78.0.10

# $1: label; the rest: ina-bench arguments. Every rank gets only the variables in $extra.
run_ranks() {
  local label=$1
  shift
  local pids=() rc=0
  for i in $(seq 0 $((workers - 1))); do
    ip netns exec ${tag}w$i env -u INA_MESH_ADDR -u INA_STORE -u INA_AGGREGATOR $extra \
      INA_TIMEOUT_MS=20000 RANK=$i WORLD_SIZE=$workers "$BENCH" "$@" --rank $i \
      --workers $workers -d float32 -o sum -b 8 -e 1M -n 3 -w 1 -c 1 > "$log/$label.w$i" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  [ $rc -eq 0 ] || fail "$label: a rank failed"
  grep -q "Out of bounds values : 0 OK" "$log/$label.w0" || fail "$label: wrong results"
  echo "PASS $label"
}

extra="MASTER_ADDR=$master MASTER_PORT=29500"
run_ranks host-only-master-addr --transport host

ip netns exec ${tag}w0 "$AGG" --bind $master --port 47474 --world-size $workers \
  > "$log/aggregator" 2>&1 &
agg_pid=$!
extra="INA_STORE=$master:29501 INA_AGGREGATOR=$master:47474"
run_ranks in-network-store
grep -q "# path: in-network" "$log/in-network-store.w0" ||
  fail "in-network-store: not in-network ($(grep '# path' "$log/in-network-store.w0"))"

extra="MASTER_ADDR=$master MASTER_PORT=29502 INA_SOCKET_IFNAME=eth0"
run_ranks host-only-ifname --transport host
exit 0
