#!/usr/bin/env bash
# What a deployment trips over, at the programs' level: each of these must refuse to start (exit
# non-zero within 5 s) with an error naming the cause, not start silently.
#   - a second ina-aggregator on a busy UDP --port (loopback and wildcard bind)
#   - a second ina-aggregator on a busy --http-port, and on the controller's port
#   - a second ina-controller on a busy --port
#   - the DPDK aggregator (net_null vdev, --no-huge) on a busy --http-port, when the EAL starts
#   - ina-controller with a --state-file that cannot be created (names flag, path, strerror),
#     a directory, or a bad state: refused by --check-config too, in the same words
#   - ina-aggregator with a negative --spin-us, or --spin-us with the dpdk backend
#
#   refuse_to_start.sh INA_AGGREGATOR INA_CONTROLLER
set -u
agg=$1 ctl=$2
. "$(dirname "$0")/lib.sh"
ops_begin ina_refuse
fail=0
# refused WHAT EXPECTED_TEXT COMMAND...: the command exits non-zero within 5 s saying EXPECTED_TEXT.
refused() {
  local what=$1 expect=$2
  shift 2
  timeout 5 "$@" >"$dir/out" 2>&1
  local rc=$?
  if [ $rc -eq 124 ]; then
    echo "FAIL $what: started (still running after 5 s)"; fail=1
  elif [ $rc -eq 0 ]; then
    echo "FAIL $what: exited 0"; fail=1
  elif ! grep -qF -- "$expect" "$dir/out"; then
    echo "FAIL $what: exited $rc without '$expect':"; cat "$dir/out"; fail=1
  else
    echo "ok $what: $(tail -1 "$dir/out")"
  fi
}

"$ctl" --port 0 --port-file "$dir/ctl.port" >"$dir/ctl.log" 2>&1 & pids+=($!)
cport=$(wait_file "$dir/ctl.port" "${pids[-1]}")
[ -n "$cport" ] || { echo "FAIL: ina-controller did not start"; cat "$dir/ctl.log"; exit 1; }
"$agg" --bind 127.0.0.1 --port 0 --port-file "$dir/agg.port" --controller "127.0.0.1:$cport" \
  --http-port 0 --http-port-file "$dir/agg.http" --stats-interval-ms 0 >"$dir/agg.log" 2>&1 &
pids+=($!)
aport=$(wait_file "$dir/agg.port" "${pids[-1]}")
hport=$(wait_file "$dir/agg.http" "${pids[-1]}")
[ -n "$aport" ] && [ -n "$hport" ] || { echo "FAIL: ina-aggregator did not start"; cat "$dir/agg.log"; exit 1; }

refused "second aggregator, same UDP port" "UDP port $aport is already in use" \
  "$agg" --bind 127.0.0.1 --port "$aport" --world-size 2 --stats-interval-ms 0
refused "second aggregator, same UDP port, wildcard bind" "UDP port $aport is already in use" \
  "$agg" --port "$aport" --world-size 2 --stats-interval-ms 0
refused "second aggregator, same --http-port" "TCP port $hport is already in use" \
  "$agg" --bind 127.0.0.1 --port 0 --world-size 2 --http-port "$hport" --stats-interval-ms 0
refused "aggregator --http-port on the controller's port" "TCP port $cport is already in use" \
  "$agg" --bind 127.0.0.1 --port 0 --world-size 2 --http-port "$cport" --stats-interval-ms 0
refused "second controller, same port" "TCP port $cport is already in use" \
  "$ctl" --port "$cport"
refused "controller, uncreatable --state-file" \
  "--state-file $dir/missing/state.json: cannot create $dir/missing/state.json.tmp: No such file or directory" \
  "$ctl" --port 0 --state-file "$dir/missing/state.json"
# --check-config runs the start's checks: the same path is refused with the same words.
refused "controller --check-config, uncreatable --state-file" \
  "--state-file $dir/missing/state.json: cannot create $dir/missing/state.json.tmp: No such file or directory" \
  "$ctl" --port 0 --state-file "$dir/missing/state.json" --check-config
mkdir -p "$dir/isdir.json"
refused "controller --check-config, --state-file a directory" \
  "$dir/isdir.json: Is a directory" \
  "$ctl" --port 0 --state-file "$dir/isdir.json" --check-config
refused "controller, --state-file a directory" \
  "$dir/isdir.json: Is a directory" \
  "$ctl" --port 0 --state-file "$dir/isdir.json"
echo '{"version": 9}' >"$dir/bad.json"
refused "controller --check-config, unreadable state" "--state-file $dir/bad.json: state: version 9" \
  "$ctl" --port 0 --state-file "$dir/bad.json" --check-config
refused "aggregator, negative --spin-us" "--spin-us" \
  "$agg" --bind 127.0.0.1 --port 0 --world-size 2 --spin-us -5 --stats-interval-ms 0
refused "aggregator, --spin-us with the dpdk backend" "--spin-us is for --backend udp only" \
  "$agg" --backend dpdk --spin-us 100 --ip 10.0.0.1 --world-size 2

if "$agg" --version | grep -q 'dpdk: built'; then
  refused "DPDK aggregator, busy --http-port" "TCP port $hport is already in use" \
    "$agg" --backend dpdk --dpdk-port net_null0 --ip 10.0.0.1 --port 47474 --world-size 2 \
    --http-port "$hport" --stats-interval-ms 0 -- --no-huge -m 256 --no-shconf --no-pci \
    --no-telemetry --log-level=3 --file-prefix "${ops_name}_$$" --lcores 0@0,1@0 --vdev net_null0
fi
# The first ones still serve.
for p in "${pids[@]}"; do
  kill -0 "$p" 2>/dev/null || { echo "FAIL: process $p (the first instance) exited"; fail=1; }
done
exit $fail
