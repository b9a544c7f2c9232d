#!/usr/bin/env bash
# An arm64 path on an emulated arm64 CPU: cross-compiles a check program (static) and runs it
# under qemu-user. Skips (77) without the cross compiler or qemu.
#   arm64_check.sh <source root> <scratch dir> <program> <line it must print, or -> <sources...>
# Sources are relative to the source root; the include path is the project's.
set -euo pipefail
src=$1 out=$2 program=$3 expect=$4
shift 4
for tool in aarch64-linux-gnu-g++ qemu-aarch64; do
  if ! command -v "$tool" >/dev/null; then
    echo "SKIP: $tool not found (Debian: g++-aarch64-linux-gnu, qemu-user)"
    exit 77
  fi
done
mkdir -p "$out"
sources=()
for f in "$@"; do sources+=("$src/$f"); done
aarch64-linux-gnu-g++ -O2 -std=c++20 -Wall -Wextra -Werror -static \
  -I"$src" -I"$src/kernels/include" -I"$src/protocol/include" -I"$src/base/include" \
  "${sources[@]}" -o "$out/$program"
out_text=$(qemu-aarch64 "$out/$program")
echo "$out_text"
if [ "$expect" != - ]; then
  grep -qx -- "$expect" <<<"$out_text"
fi
