#!/usr/bin/env bash
# Runs the `rdma` test suite (VerbsMesh on a real verbs device) on a soft-RoCE device: an rdma_rxe
# link over a veth pair created for this run (unique names, deleted on exit). For Linux machines
# without an RDMA NIC whose kernel has the rdma_rxe module. Needs root.
# Exits 77 (SKIP) naming the reason when it cannot create the device.
#
#   testbed/rdma_rxe_check.sh [build-dir]     (default: build)
set -euo pipefail
build=${1:-build}
[ "$(id -u)" = 0 ] || { echo "SKIP: needs root (to create a veth pair and an rxe device)"; exit 77; }
command -v rdma >/dev/null || { echo "SKIP: the rdma tool (iproute2) is missing"; exit 77; }
modprobe rdma_rxe 2>/dev/null || { echo "SKIP: the kernel has no rdma_rxe module (soft RoCE)"; exit 77; }

tag="ina$$"
va="${tag}a"
vb="${tag}b"
dev="rxe_${tag}"
cleanup() {
  rdma link delete "$dev" 2>/dev/null || true
  ip link delete "$va" 2>/dev/null || true   # deletes the peer too
}
trap cleanup EXIT

ip link add "$va" type veth peer name "$vb"
ip link set "$va" up
ip link set "$vb" up
ip addr add 192.0.2.1/32 dev "$va"   # TEST-NET-1, on this veth only: an IPv4-mapped GID
rdma link add "$dev" type rxe netdev "$va"
for _ in $(seq 50); do
  rdma link show "$dev/1" 2>/dev/null | grep -q "state ACTIVE" && break
  sleep 0.1
done

# GID index 0 is the link-local IPv6 GID derived from the MAC: enough for one device talking to
# itself (all ranks of the tests share it).
export INA_VERBS_DEVICE="$dev"
export INA_VERBS_GID_INDEX="${INA_VERBS_GID_INDEX:-0}"
export INA_HOST_TRANSPORT=verbs
meson test -C "$build" --suite rdma --print-errorlogs
