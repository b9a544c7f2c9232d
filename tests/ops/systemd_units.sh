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
# --check-config runs the start's checks, the state file's folder included: the StateDirectory
# that systemd creates before ExecStart (/var/lib/ina-controller) is made under $dir instead, and
# the copies of the units and files point there.
state="$dir/state/ina-controller"
mkdir -p "$state"
for e in "${envs[@]}"; do sed "s|/var/lib/ina-controller/|$state/|g" "$e" >"$dir/etc/$(basename "$e")"; done
fail=0

for u in "${units[@]}"; do
  name=$(basename "$u")
  # The built unit, its ExecStart and EnvironmentFile pointed at the copies.
  sed -e "s|^ExecStart=$bindir/|ExecStart=$dir/bin/|" -e "s|/var/lib/ina-controller/|$state/|g" \
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
file_env() { grep -E '^[A-Z_][A-Z0-9_]*=' "$1" | sed 's/^\([A-Z_][A-Z0-9_]*\)="\(.*\)"$/\1=\2/'; }
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
    # The check recipe of the file's header, run as written (the file sourced by a shell).
    recipe=$(sed -n 's/^#   \(set -a; \. .*\)$/\1/p' "$dir/etc/$name.env")
    if [ -z "$recipe" ]; then
      echo "FAIL $name.env: no check recipe (#   set -a; . ./$name.env; ...)"; fail=1
    elif out=$(cd "$dir/etc" && PATH="$dir/bin:$PATH" bash -c "$recipe" 2>&1) &&
        grep -q "configuration ok" <<<"$out"; then
      echo "ok $name.env recipe: $recipe"
    else
      echo "FAIL $name.env recipe '$recipe':"; echo "$out"; fail=1
    fi
    # Across hosts by default: nothing advertised or served on loopback only.
    if grep -hv '^#' "$u" "$dir/etc/$name.env" | grep -q -- '--advertise 127\.\|--bind 127\.'; then
      echo "FAIL $name: loopback-only default (--advertise/--bind 127.x) in the unit or its file"
      fail=1
    fi
    if ip route get 192.0.2.1 >/dev/null 2>&1 && grep -qi "warn" <<<"$out"; then
      echo "FAIL $name.env recipe warns:"; echo "$out"; fail=1
    fi
  else
    echo "FAIL $name: no example environment file $name.env"; fail=1
  fi
done
exit $fail
