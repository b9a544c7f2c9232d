#!/usr/bin/env bash
# The packet MAC's arm64 path (PMULL) on an emulated arm64 CPU: cross-compiles mac.cc with
# tests/protocol/mac_arm64_check.cc and runs it under qemu-user (every path against the portable
# one, RFC 8452's vector). Skips (77) without the cross compiler or qemu.
#   mac_arm64.sh <source root> <scratch dir>
set -euo pipefail
src=$1 out=$2
for tool in aarch64-linux-gnu-g++ qemu-aarch64; do
  if ! command -v "$tool" >/dev/null; then
    echo "SKIP: $tool not found (Debian: g++-aarch64-linux-gnu, qemu-user)"
    exit 77
  fi
done
mkdir -p "$out"
aarch64-linux-gnu-g++ -O2 -std=c++20 -Wall -Wextra -Werror -static \
  -I"$src/protocol/include" -I"$src/base/include" \
  "$src/tests/protocol/mac_arm64_check.cc" "$src/protocol/mac.cc" "$src/protocol/siphash.cc" \
  -o "$out/mac_arm64_check"
qemu-aarch64 "$out/mac_arm64_check"
