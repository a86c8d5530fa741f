#!/usr/bin/env bash
# The Bazel build beside CMake (docs/bazel.md), offline, against the system libraries.
#
#   scripts/bazel.sh --ci     what CI runs: every CPU library, the `fedlora` command, the tests'
#                             helper binaries, and the unit tests (built and run). The integration
#                             and slow tests are neither built nor run: CTest runs them.
#   scripts/bazel.sh --full   everything: `bazel test //...` (unit and integration tests).
#
# Outputs are shared through a disk cache, $FEDLORA_BAZEL_CACHE (default
# $HOME/.cache/fedlora-bazel), so that another clone on the same machine reuses them. Bazel runs
# with --batch: no server is left running. Extra arguments go to bazel, e.g.
#   scripts/bazel.sh --full --test_output=all
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:---ci}
shift || true
CACHE=${FEDLORA_BAZEL_CACHE:-$HOME/.cache/fedlora-bazel}

# CMake lists each module's sources; the BUILD files list them again (tools/ globs its commands).
# A source file that no BUILD file names would fail the build later with an undefined symbol, or go
# untested: say so now.
check_build_files() {
  local missing=() dir f
  for dir in proto core kernels model train compression crypto privacy aggregation server client sim \
             tests/*/; do
    dir=${dir%/}
    for f in "$dir"/*.cc; do
      [[ -e $f ]] || continue
      grep -q "\"${f##*/}\"" "$dir/BUILD" 2>/dev/null || missing+=("$f")
    done
  done
  if ((${#missing[@]})); then
    echo "bazel: no BUILD file names ${missing[*]}: add it beside its CMakeLists.txt entry" >&2
    exit 1
  fi
}

command -v bazel >/dev/null || {
  echo "bazel: not found (Debian: apt-get install bazel-bootstrap; scripts/setup.sh)" >&2
  exit 1
}
check_build_files
mkdir -p "$CACHE"
FLAGS=(--disk_cache="$CACHE" --color=no --curses=no --show_progress_rate_limit=30)

case $MODE in
  --ci)
    # One invocation builds and tests, so that compiling and running overlap on the two cores.
    FILTER=-integration,-slow
    time bazel --batch test "${FLAGS[@]}" --build_tag_filters=$FILTER --test_tag_filters=$FILTER \
      "$@" //...
    ;;
  --full)
    time bazel --batch test "${FLAGS[@]}" "$@" //...
    ;;
  *)
    echo "usage: scripts/bazel.sh --ci|--full [bazel flags]" >&2
    exit 2
    ;;
esac
