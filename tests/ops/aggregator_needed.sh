#!/usr/bin/env bash
# ina-aggregator needs no DPDK library at load time: its NEEDED list (readelf -d) names no
# librte_*; the DPDK backend is libina-aggregator-dpdk.so, loaded by --backend dpdk only. When the
# plugin cannot be loaded, --backend dpdk fails naming it and the reason, and the kernel UDP
# backend still checks its configuration.
#   aggregator_needed.sh INA_AGGREGATOR [DPDK_PLUGIN]
set -u
agg=$1 plugin=${2:-}
command -v readelf >/dev/null || { echo "SKIP: readelf not installed (binutils)"; exit 77; }
fail=0
needed=$(readelf -d "$agg" | grep NEEDED)
if grep -q 'librte_' <<<"$needed"; then
  echo "FAIL ina-aggregator needs DPDK at load time:"; grep librte_ <<<"$needed"; fail=1
else
  echo "ok ina-aggregator NEEDED: $(sed 's/.*\[\(.*\)\]/\1/' <<<"$needed" | tr '\n' ' ')"
fi
if [ -n "$plugin" ]; then
  if readelf -d "$plugin" | grep NEEDED | grep -q 'librte_'; then
    echo "ok $(basename "$plugin") links DPDK"
  else
    echo "FAIL $(basename "$plugin") does not link DPDK"; fail=1
  fi
  exports=$(readelf --dyn-syms -W "$plugin" | awk '$5 == "GLOBAL" && $7 != "UND" { print $8 }' | sort -u)
  if [ "$exports" != "ina_aggregator_dpdk_main" ]; then
    echo "FAIL $(basename "$plugin") exports more than its entry point:"; echo "$exports" | head; fail=1
  fi
  out=$(INA_AGGREGATOR_PLUGIN_DIR=/nonexistent timeout 10 "$agg" --backend dpdk --ip 10.0.0.1 --world-size 2 2>&1)
  rc=$?
  if [ $rc -ne 0 ] && grep -q "cannot load the DPDK backend plugin /nonexistent/libina-aggregator-dpdk.so" <<<"$out"; then
    echo "ok --backend dpdk without its plugin: $(tail -1 <<<"$out")"
  else
    echo "FAIL --backend dpdk without its plugin: exit $rc:"; echo "$out"; fail=1
  fi
fi
out=$(INA_AGGREGATOR_PLUGIN_DIR=/nonexistent "$agg" --bind 127.0.0.1 --port 0 --world-size 2 --check-config 2>&1) ||
  { echo "FAIL the kernel UDP backend with no DPDK plugin:"; echo "$out"; fail=1; }
exit $fail
