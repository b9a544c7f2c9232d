#!/usr/bin/env bash
# Every /metrics endpoint passes `promtool check metrics` (Prometheus' own linter) and follows
# the conventions a scrape relies on: the kernel-UDP aggregator's (--http-port, a job admitted
# through the controller so the per-job and per-rank series are there), the controller's, and
# the DPDK aggregator's (net_null vdev, --no-huge) when the binary has DPDK and the EAL starts.
# Besides promtool: no label called "job" (Prometheus renames it exported_job) and no family
# that mixes an unlabelled sample with labelled ones (sum() would count twice); every family of
# a program under its prefix (ina_aggregator_, ina_controller_); histogram bounds exact (the lag
# buckets are 2^k microseconds: le="1.048576", never a rounding such as 1.04858).
#
#   metrics_promtool.sh INA_AGGREGATOR INA_CONTROLLER
# Exits 77 (skip) without promtool (Debian: apt-get install prometheus).
set -u
agg=$1 ctl=$2
command -v promtool >/dev/null || { echo "SKIP: promtool not installed (Debian package prometheus)"; exit 77; }
command -v curl >/dev/null || { echo "SKIP: curl not installed"; exit 77; }
. "$(dirname "$0")/lib.sh"
ops_begin ina_prom
fail=0
check() {  # NAME URL PREFIX
  local name=$1 url=$2 prefix=$3 text
  text=$(curl -sf "$url") || { echo "FAIL $name: GET $url"; fail=1; return; }
  if ! out=$(printf '%s\n' "$text" | promtool check metrics 2>&1); then
    echo "FAIL $name: promtool check metrics:"; echo "$out"; fail=1
  fi
  if printf '%s\n' "$text" | grep -Eq '^[a-z_:]+\{(.*,)?job='; then
    echo "FAIL $name: a series has a label named job (Prometheus renames it exported_job):"
    printf '%s\n' "$text" | grep -E '^[a-z_:]+\{(.*,)?job=' | head -3; fail=1
  fi
  mixed=$(printf '%s\n' "$text" | awk '!/^#/ && NF {
      n = $1; sub(/\{.*/, "", n); if (index($1, "{")) l[n] = 1; else u[n] = 1 }
      END { for (n in u) if (n in l) print n }')
  if [ -n "$mixed" ]; then
    echo "FAIL $name: unlabelled and labelled samples in one family: $mixed"; fail=1
  fi
  foreign=$(printf '%s\n' "$text" | awk -v p="$prefix" '$1 == "#" && $2 == "TYPE" && index($3, p) != 1 { print $3 }')
  if [ -n "$foreign" ]; then
    echo "FAIL $name: families without the $prefix prefix:" $foreign; fail=1
  fi
  inexact=$(printf '%s\n' "$text" | grep -o 'lag_seconds_bucket{[^}]*le="[^"+]*"' | sed 's/.*le="//; s/"$//' |
    sort -u | awk '{ v = $1 * 1e6; r = int(v + 0.5); x = r; while (x > 1 && x % 2 == 0) x /= 2;
      if (index($1, "e") || v - r > 1e-6 || r - v > 1e-6 || x != 1) print $1 }')
  if [ -n "$inexact" ]; then
    echo "FAIL $name: lag bucket bounds that are not exactly 2^k us:" $inexact; fail=1
  fi
  [ "$fail" = 0 ] && echo "ok $name: $(printf '%s\n' "$text" | grep -vc '^#') samples"
}

"$ctl" --port 0 --port-file "$dir/ctl.port" >"$dir/ctl.log" 2>&1 & pids+=($!)
cport=$(wait_file "$dir/ctl.port" "${pids[-1]}")
[ -n "$cport" ] || { echo "FAIL: ina-controller did not start"; cat "$dir/ctl.log"; exit 1; }
"$agg" --bind 127.0.0.1 --port 0 --port-file "$dir/agg.port" --controller "127.0.0.1:$cport" \
  --http-port 0 --http-port-file "$dir/agg.http" --heartbeat-ms 50 --stats-interval-ms 0 \
  >"$dir/agg.log" 2>&1 & pids+=($!)
hport=$(wait_file "$dir/agg.http" "${pids[-1]}")
[ -n "$hport" ] || { echo "FAIL: ina-aggregator did not start"; cat "$dir/agg.log"; exit 1; }
# A job (world 2) so the aggregator serves one; wait for it in its /metrics.
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$cport/v1/admit?name=prom&world=2&rank=0" | grep -q '^admitted' && break
  sleep 0.05
done
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$hport/metrics" | grep -q '^ina_aggregator_jobs 1$' && break
  sleep 0.05
done
check "ina-aggregator (udp)" "http://127.0.0.1:$hport/metrics" ina_aggregator_
check "ina-controller" "http://127.0.0.1:$cport/metrics" ina_controller_

if "$agg" --version | grep -q 'dpdk: built'; then
  "$agg" --backend dpdk --dpdk-port net_null0 --ip 10.0.0.1 --port 47474 --world-size 2 \
    --http-port 0 --http-port-file "$dir/dpdk.http" --stats-interval-ms 0 -- --no-huge -m 256 \
    --no-shconf --no-pci --no-telemetry --log-level=3 --file-prefix "${ops_name}_$$" --lcores 0@0,1@0 \
    --vdev net_null0 >"$dir/dpdk.log" 2>&1 & pids+=($!)
  dport=$(wait_file "$dir/dpdk.http" "${pids[-1]}")
  if [ -n "$dport" ]; then
    check "ina-aggregator (dpdk)" "http://127.0.0.1:$dport/metrics" ina_aggregator_
  else
    echo "note: the DPDK aggregator did not start here (EAL), its /metrics is not checked:"
    tail -3 "$dir/dpdk.log"
  fi
fi
exit $fail
