#!/usr/bin/env bash
# Every installed program answers --version with "NAME VERSION" on its first line and exits 0.
#   version.sh VERSION PROGRAM...
set -u
version=$1
shift
fail=0
for bin in "$@"; do
  name=$(basename "$bin")
  out=$("$bin" --version 2>&1)
  rc=$?
  first=$(printf '%s\n' "$out" | head -1)
  if [ $rc -ne 0 ] || [ "$first" != "$name $version" ]; then
    echo "FAIL $name --version: exit $rc, first line '$first' (expected '$name $version')"
    fail=1
  else
    echo "ok $first"
  fi
done
exit $fail
