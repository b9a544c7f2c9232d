#!/usr/bin/env bash
# The rendezvous store's and the TCP mesh's setup tests, repeated beside CPU hogs: the flakes of
# setup (a TCP self-connect, a reset or a slow accept while the mesh forms) show only under load
# and over many runs. Not part of a suite (minutes long); run by hand:
#   tests/host/setup_soak.sh BUILD_DIR [RUNS=500] [HOGS=2]
# Each run: host_store_test (every TcpStore and TcpMesh test), host_setup_test when built (the
# self-connect, a reset or slow accept in the handshake, the mesh address) and
# host_collectives_test's World/HostCollectives.* (42 meshes of 1 to 8 ranks). Prints the runs
# that failed, and their first failure lines; exits 1 when any failed.
set -u
build=${1:?usage: setup_soak.sh BUILD_DIR [RUNS] [HOGS]}
runs=${2:-500}
hogs=${3:-2}
store=$build/tests/host/host_store_test
coll=$build/tests/host/host_collectives_test
setup=$build/tests/host/host_setup_test
[ -x "$store" ] && [ -x "$coll" ] || { echo "build $store and $coll first"; exit 2; }
log=$(mktemp -d /tmp/setup_soak.XXXX)
pids=()
# The hogs are bounded (timeout) and killed by PID at the end.
for _ in $(seq 1 "$hogs"); do
  timeout 3600 sh -c 'while :; do :; done' &
  pids+=($!)
done
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done' EXIT
fail=0
start=$(date +%s)
for i in $(seq 1 "$runs"); do
  if ! "$store" > "$log/store.$i" 2>&1; then
    fail=$((fail + 1))
    echo "run $i: host_store_test failed:"
    grep -m3 -E "Failure|error|FAILED" "$log/store.$i" | sed 's/^/  /'
  fi
  if [ -x "$setup" ] && ! "$setup" > "$log/setup.$i" 2>&1; then
    fail=$((fail + 1))
    echo "run $i: host_setup_test failed:"
    grep -m3 -E "Failure|error|FAILED" "$log/setup.$i" | sed 's/^/  /'
  fi
  if ! "$coll" --gtest_filter='World/HostCollectives.*' > "$log/coll.$i" 2>&1; then
    fail=$((fail + 1))
    echo "run $i: host_collectives_test failed:"
    grep -m3 -E "Failure|error|FAILED" "$log/coll.$i" | sed 's/^/  /'
  fi
  rm -f "$log/store.$i" "$log/setup.$i" "$log/coll.$i"
done
echo "setup_soak: $runs runs of host_store_test, host_setup_test and World/HostCollectives.*" \
  "beside $hogs CPU" \
  "hogs in $(( $(date +%s) - start )) s: $fail failed; load $(cut -d' ' -f1-3 /proc/loadavg)"
rmdir "$log" 2>/dev/null
[ "$fail" -eq 0 ]
