#!/usr/bin/env bash
# The sources follow .clang-format (include order too) and no line of them passes 100 columns.
#   format.sh SOURCE_ROOT
# SKIP (77) without clang-format 14, the version the layout is pinned to (Debian 12's): another
# version lays some constructs out differently, which is not a fault of the sources.
set -u
root=$1
cf=$(command -v clang-format-14 || command -v clang-format || true)
if [ -z "$cf" ]; then
  echo "SKIP: clang-format not installed (apt-get install clang-format)"
  exit 77
fi
major=$("$cf" --version | sed -n 's/.*version \([0-9]*\).*/\1/p')
if [ "$major" != 14 ]; then
  echo "SKIP: $cf is version $major; the layout is pinned to clang-format 14"
  exit 77
fi
cd "$root" || exit 1
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files '*.cc' '*.h' '*.c' '*.cu' '*.cuh')
else
  mapfile -t files < <(find . -path './build*' -prune -o -type f \
    \( -name '*.cc' -o -name '*.h' -o -name '*.c' -o -name '*.cu' -o -name '*.cuh' \) -print)
fi
echo "checking ${#files[@]} files with $cf"
fail=0
if ! out=$("$cf" --dry-run -Werror "${files[@]}" 2>&1); then
  printf '%s\n' "$out" | grep -m 20 'clang-format-violations'
  echo "FAIL: the files above differ from .clang-format; fix with: clang-format -i FILE"
  fail=1
fi
long=$(awk 'length > 100 { printf "%s:%d: %d columns\n", FILENAME, FNR, length }' "${files[@]}")
if [ -n "$long" ]; then
  printf '%s\n' "$long" | head -20
  echo "FAIL: lines over 100 columns"
  fail=1
fi
[ $fail -eq 0 ] && echo "ok: ${#files[@]} files formatted, none over 100 columns"
exit $fail
