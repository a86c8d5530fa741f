#!/usr/bin/env bash
# The checks that need no build (make lint; CI's first stage):
#   - every C++ and CUDA source in git is as clang-format (.clang-format) writes it;
#     scripts/lint.sh --fix rewrites the ones that are not;
#   - every Bazel BUILD file lists the sources and fedlora dependencies of the CMake list it mirrors
#     (scripts/check_bazel.py).
set -euo pipefail
cd "$(dirname "$0")/.."
FIX=0
[[ "${1:-}" == "--fix" ]] && FIX=1
command -v clang-format >/dev/null || {
  echo "lint: clang-format is missing (scripts/setup.sh --tests installs it)" >&2
  exit 1
}
mapfile -t SOURCES < <(git ls-files -- '*.cc' '*.h' '*.cu' '*.cuh' ':!:third_party/*')
if ((FIX)); then
  clang-format -i "${SOURCES[@]}"
  echo "lint: formatted ${#SOURCES[@]} files"
  exit 0
fi
mapfile -t BAD < <(clang-format --dry-run "${SOURCES[@]}" 2>&1 |
  sed -n 's/^\(.*\):[0-9]*:[0-9]*: warning: code should be clang-formatted.*/\1/p' | sort -u)
if ((${#BAD[@]})); then
  echo "lint: ${#BAD[@]} file(s) differ from clang-format (run scripts/lint.sh --fix):" >&2
  printf '  %s\n' "${BAD[@]}" >&2
  exit 1
fi
echo "lint: ${#SOURCES[@]} C++/CUDA files formatted"
python3 scripts/check_bazel.py
