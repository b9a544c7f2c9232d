#!/usr/bin/env bash
# The codec kernels' arm64 path (NEON) on an emulated arm64 CPU: cross-compiles kernels/codec/
# with tests/kernels/codec_kernels_test.cc and runs it under qemu-user (the NEON table against
# the portable loops, bit for bit). Skips (77) without the cross compiler or qemu.
#   codec_arm64.sh <source root> <scratch dir>
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
  -I"$src" -I"$src/kernels/include" -I"$src/protocol/include" -I"$src/base/include" \
  "$src/tests/kernels/codec_kernels_test.cc" "$src"/kernels/codec/*.cc \
  -o "$out/codec_kernels_test"
out_text=$(qemu-aarch64 "$out/codec_kernels_test")
echo "$out_text"
# The NEON table must have been run, not only listed.
grep -q '^neon: ok$' <<<"$out_text"
