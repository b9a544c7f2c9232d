#!/usr/bin/env bash
# One run: the DPDK aggregator (net_memif server, worker lcore on CPU 1) and 4 ranks as threads of
# one ina-bench process (net_memif client, pinned to CPU 0), float32 SUM, every element checked;
# then the aggregator's tx_dropped. Root (DPDK vdevs, /var/run/dpdk).
#   BENCH=path/to/ina-bench AGG=path/to/ina-aggregator run.sh [ina-bench args...]
set -u
S=/tmp/ina_memif_ranks_$$.sock
AGG=${AGG:-build-main/aggregator/ina-aggregator}
BENCH=${BENCH:-build-main/testbed/ina-bench}
log=$(mktemp)
"$AGG" --backend dpdk --world-size 4 --ip 10.78.0.1 --port 47474 --dpdk-port net_memif0 \
  --stats-interval-ms 0 -- --no-huge -m 512 --no-shconf --no-pci --no-telemetry \
  --file-prefix ina_mr_agg_$$ -l 0-1 --vdev net_memif0,role=server,socket=$S --log-level=3 \
  > "$log" 2>&1 &
agg=$!
sleep 2
INA_TRANSPORT=dpdk INA_LOCAL_IP=10.78.0.2 INA_TIMEOUT_MS=20000 \
  INA_DPDK_ARGS="--no-huge -m 512 --no-shconf --no-pci --no-telemetry --log-level=3 --file-prefix ina_mr_w_$$ --vdev=net_memif0,role=client,socket=$S --lcores 0@0" \
  timeout 120 taskset -c 0 "$BENCH" --aggregator 10.78.0.1:47474 --rank 0 --workers 4 \
  --local-ranks 4 "$@" | grep -E "^ +[0-9]|rank 0:|FAIL"
kill -INT $agg; wait $agg
echo "aggregator tx_dropped: $(grep tx_dropped "$log" | awk '{print $2}')"
rm -f "$log" "$S"
rm -rf "/var/run/dpdk/ina_mr_agg_$$" "/var/run/dpdk/ina_mr_w_$$"  # the EALs' runtime dirs
