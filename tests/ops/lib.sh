# Sourced by the tests/ops scripts that start programs: a scratch directory, the started PIDs
# ended and the DPDK runtime directory removed at exit, and wait_file.
#   ops_begin NAME   dir=/tmp/NAME-XXXXXX; the EAL's --file-prefix is then "${NAME}_$$"
ops_begin() {
  ops_name=$1
  dir=$(mktemp -d "/tmp/$ops_name-XXXXXX")
  pids=()
  trap ops_cleanup EXIT
}
ops_cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  rm -rf "$dir" "/var/run/dpdk/${ops_name}_$$" 2>/dev/null
}
# wait_file FILE PID: the port written there, or "" when the process exited or 10 s passed.
wait_file() {
  for _ in $(seq 200); do
    [ -s "$1" ] && { cat "$1"; return; }
    kill -0 "$2" 2>/dev/null || return
    sleep 0.05
  done
}
