#!/usr/bin/env bash
# Installs what INA needs on Debian 12 (apt). Idempotent: does nothing when all is installed.
#   scripts/setup-debian.sh            build + test dependencies, Open MPI and Gloo (peers)
set -euo pipefail

packages=(
  meson ninja-build g++ pkg-config        # build
  libgtest-dev libgmock-dev                # tests
  libsodium-dev                            # tests: cross-check of the in-tree SipHash
  g++-aarch64-linux-gnu qemu-user          # tests: the packet MAC's arm64 path, emulated
  clang libclang-rt-14-dev llvm            # scripts/fuzz.sh: libFuzzer, ASan/UBSan, llvm-symbolizer
  clang-format                             # tests/ops/format.sh: the layout of .clang-format
  libcli11-dev                             # argument parsing
  libcpp-httplib-dev nlohmann-json3-dev    # controller feature: ina-controller, HTTP endpoints
  etcd-server etcd-client                  # controller replicas (--store etcd://); the test
                                           # runs its own cluster (the package's etcd.service,
                                           # started under systemd, is not used)
  libibverbs-dev                           # rdma feature (compiles here; no RDMA at run time)
  libdpdk-dev                              # dpdk feature: aggregator backend, worker transport
  libxdp-dev libbpf-dev                    # xdp feature: AF_XDP worker transport
  openmpi-bin libopenmpi-dev libgloo-dev   # peers for side-by-side benchmarks
  iproute2 nftables                        # network namespaces and loss injection
  python3 python3-numpy python3-matplotlib # testbed harness, simulator, plots
  python3-torch libtorch-dev python3-dev pybind11-dev  # torch feature: the "ina" c10d backend
  python3-sklearn                          # its DDP example and test (digits dataset)
  libdpdk-dev dpdk dpdk-dev                # dpdk feature (optional): DPDK aggregator; dpdk-dev
                                           # has dpdk-testpmd, the reference of ina-dpdk-bench
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup-debian: all ${#packages[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "setup-debian: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
