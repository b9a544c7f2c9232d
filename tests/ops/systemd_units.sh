#!/usr/bin/env bash
# The systemd units as built for installation (deploy/systemd): `systemd-analyze verify` accepts
# them (when systemd-analyze is installed), and each ExecStart command line parses: the binary
# runs with the unit's arguments ($VAR expanded from its Environment= default, then from the
# example environment file as EnvironmentFile would) plus --check-config and exits 0.
#
#   systemd_units.sh INSTALLED_BINDIR UNIT... -- ENV_FILE... -- BINARY...
# The units name INSTALLED_BINDIR/<binary>; the test points them at the built BINARY of that
# name in a copy.
set -u
bindir=$1
shift
units=() envs=() bins=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do units+=("$1"); shift; done
shift
while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
shift
bins=("$@")
dir=$(mktemp -d /tmp/ina-units-XXXXXX)
trap 'rm -rf "$dir"' EXIT
mkdir -p "$dir/bin" "$dir/units" "$dir/etc"
for b in "${bins[@]}"; do ln -s "$(realpath "$b")" "$dir/bin/$(basename "$b")"; done
for e in "${envs[@]}"; do cp "$e" "$dir/etc/"; done
fail=0

for u in "${units[@]}"; do
  name=$(basename "$u")
  # The built unit, its ExecStart and EnvironmentFile pointed at the copies.
  sed -e "s|^ExecStart=$bindir/|ExecStart=$dir/bin/|" \
      -e "s|^EnvironmentFile=-.*/\([^/]*\)$|EnvironmentFile=-$dir/etc/\1|" "$u" >"$dir/units/$name"
  grep -q "^ExecStart=$dir/bin/" "$dir/units/$name" ||
    { echo "FAIL $name: ExecStart does not run a program from $bindir"; fail=1; continue; }
done

if command -v systemd-analyze >/dev/null; then
  # Unknown keys and bad values are only warnings to verify (exit 0): any output is a failure.
  out=$(cd "$dir/units" && systemd-analyze verify --man=no ./*.service 2>&1)
  rc=$?
  if [ $rc -eq 0 ] && [ -z "$out" ]; then
    echo "ok systemd-analyze verify ${units[*]##*/}"
  else
    echo "FAIL systemd-analyze verify (exit $rc):"; echo "$out"; fail=1
  fi
else
  echo "note: systemd-analyze not installed; only the command lines are checked"
fi

# KEY=VALUE from the unit's Environment= lines (quotes removed), then an environment file's.
unit_env() { sed -n 's/^Environment=//p' "$1" | sed 's/^"\(.*\)"$/\1/'; }
file_env() { grep -E '^[A-Z_][A-Z0-9_]*=' "$1"; }
run_exec() {  # UNIT WHAT ENV_LINES...
  local unit=$1 what=$2
  shift 2
  declare -A env=()
  local kv
  for kv in "$@"; do env[${kv%%=*}]=${kv#*=}; done
  local line words=() w
  line=$(sed -n 's/^ExecStart=//p' "$unit")
  for w in $line; do
    if [[ $w == \$* ]]; then
      local v=${env[${w#\$}]-}
      [ -n "$v" ] || { echo "FAIL $(basename "$unit") ($what): $w is empty"; fail=1; return; }
      # shellcheck disable=SC2206  # split at spaces, as systemd does for an unbraced $VAR
      words+=($v)
    else
      words+=("$w")
    fi
  done
  local out rc
  out=$("${words[@]}" --check-config 2>&1)
  rc=$?
  if [ $rc -ne 0 ] || ! grep -q "configuration ok" <<<"$out"; then
    echo "FAIL $(basename "$unit") ($what): $(basename "${words[0]}") ${words[*]:1} --check-config exited $rc:"
    echo "$out"; fail=1
  else
    echo "ok $(basename "$unit") ($what): $out"
  fi
}
for u in "$dir"/units/*.service; do
  name=$(basename "$u" .service)
  mapfile -t defaults < <(unit_env "$u")
  run_exec "$u" "unit defaults" "${defaults[@]}"
  if [ -f "$dir/etc/$name.env" ]; then
    mapfile -t file < <(file_env "$dir/etc/$name.env")
    run_exec "$u" "$name.env" "${defaults[@]}" "${file[@]}"
  else
    echo "FAIL $name: no example environment file $name.env"; fail=1
  fi
done
exit $fail
