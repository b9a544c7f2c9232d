#!/usr/bin/env bash
# Memory for the DPDK EAL: reserves 2 MiB hugepages and mounts hugetlbfs when it can (root, enough
# free memory), and prints the EAL memory arguments to use on stdout; otherwise it says why on
# stderr and prints the --no-huge fallback (slower: 4 KiB pages, more TLB misses, but it runs
# anywhere the EAL can read /proc/self/pagemap).
#
#   EAL_MEM=$(scripts/dpdk-hugepages.sh [PAGES])   # default 256 pages (512 MiB)
#   ina-aggregator --backend dpdk --ip 10.0.0.1 ... -- $EAL_MEM -l 0-2 --no-pci --vdev ...
#   scripts/dpdk-hugepages.sh --release             # give the pages back (nr_hugepages = 0)
set -euo pipefail

mnt=/dev/hugepages
fallback() {
  echo "dpdk-hugepages: $1; falling back to --no-huge (4 KiB pages)" >&2
  echo "--no-huge -m 512 --no-shconf"
  exit 0
}

if [ "${1:-}" = "--release" ]; then
  echo 0 > /proc/sys/vm/nr_hugepages
  echo "dpdk-hugepages: released (nr_hugepages = 0)" >&2
  exit 0
fi
pages=${1:-256}
case "$pages" in ''|*[!0-9]*) echo "dpdk-hugepages: PAGES must be a number, got '$pages'" >&2; exit 2;; esac

[ "$(id -u)" -eq 0 ] || fallback "not root, cannot reserve hugepages"
[ -w /proc/sys/vm/nr_hugepages ] || fallback "/proc/sys/vm/nr_hugepages is not writable (container?)"
have=$(cat /proc/sys/vm/nr_hugepages)
if [ "$have" -lt "$pages" ]; then
  echo "$pages" > /proc/sys/vm/nr_hugepages 2>/dev/null || true
  have=$(cat /proc/sys/vm/nr_hugepages)
fi
free=$(awk '/HugePages_Free/ {print $2}' /proc/meminfo)
[ "${free:-0}" -ge 64 ] || fallback "only ${free:-0} free hugepages (asked for $pages; memory fragmented?)"
if ! grep -qs " $mnt hugetlbfs " /proc/mounts; then
  mkdir -p "$mnt"
  mount -t hugetlbfs nodev "$mnt" 2>/dev/null || fallback "cannot mount hugetlbfs on $mnt"
fi
echo "dpdk-hugepages: $free free 2 MiB hugepages on $mnt" >&2
echo "--in-memory"  # hugepages, no files left behind in $mnt
