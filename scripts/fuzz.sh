#!/usr/bin/env bash
# Builds fedlora's libFuzzer harnesses (the `fuzz` preset: clang, ASan+UBSan) and runs each one on
# a copy of its seed corpus (fuzz/corpus/<harness>/; the committed corpus is never written).
#
#   scripts/fuzz.sh --short            # `make fuzz-ci`: ~25 s per harness
#   scripts/fuzz.sh --long             # `make fuzz`: 10 min per harness
#   scripts/fuzz.sh --short rpc update # only these harnesses
#
# Environment:
#   FEDLORA_FUZZ_SECONDS   seconds per harness (default 25 with --short, 600 with --long)
#   FEDLORA_FUZZ_RUNS      stop each harness after this many executions instead (-runs=)
#   FEDLORA_FUZZ_BUILD_JOBS  build parallelism (default 2)
#   FEDLORA_FUZZ_KEEP=1    keep the work folders (grown corpora, logs; the path is printed at the end)
#
# Exit status: 0 when no harness found anything; 1 when one crashed, leaked, timed out or ran out of
# memory (its reproducer is copied to build/fuzz/findings/<harness>/ and the path printed; rerun it
# with `build/fuzz/fuzz/fuzz_<harness> <file>`); 2 on a usage or build error.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

MODE=""
HARNESSES=()
for arg in "$@"; do
  case "$arg" in
    --short|--long) MODE=${arg#--} ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $arg" >&2; exit 2 ;;
    *) HARNESSES+=("$arg") ;;
  esac
done
if [[ -z $MODE ]]; then
  echo "usage: scripts/fuzz.sh --short|--long [harness...]" >&2
  exit 2
fi
ALL=(safetensors gguf update sealed_update secagg run_config tokenizer bpe_tokenizer bert_config rpc)
((${#HARNESSES[@]})) || HARNESSES=("${ALL[@]}")

if [[ $MODE == short ]]; then SECONDS_EACH=${FEDLORA_FUZZ_SECONDS:-25}; else SECONDS_EACH=${FEDLORA_FUZZ_SECONDS:-600}; fi
BUILD=build/fuzz
export CCACHE_BASEDIR=$ROOT CCACHE_NOHASHDIR=1

echo "fuzz.sh: building the fuzz preset into $BUILD"
build_start=$(date +%s)
cmake --preset fuzz >/dev/null || { echo "fuzz.sh: configure failed" >&2; exit 2; }
cmake --build --preset fuzz --target fuzzers -- -j "${FEDLORA_FUZZ_BUILD_JOBS:-2}" >"$BUILD/fuzz_build.log" 2>&1 || {
  tail -40 "$BUILD/fuzz_build.log" >&2
  echo "fuzz.sh: build failed (log: $BUILD/fuzz_build.log)" >&2
  exit 2
}
echo "fuzz.sh: built in $(($(date +%s) - build_start)) s"

# Sanitizers: UBSan stops at its first report, with a stack (the preset builds with
# -fno-sanitize-recover=undefined as well). Leak detection stays on.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

# Work folders on tmpfs when there is one: the tokenizer harness writes a file per input and the
# RPC harness's server fsyncs its store, which on a disk would cost more than the inputs.
work_base=${TMPDIR:-/tmp}
[[ -d /dev/shm && -w /dev/shm ]] && work_base=/dev/shm
WORK_ROOT=$(mktemp -d "$work_base/fedlora_fuzz.XXXXXX")
cleanup() { [[ ${FEDLORA_FUZZ_KEEP:-0} == 1 ]] || rm -rf "$WORK_ROOT"; }
trap cleanup EXIT

failed=0
SUMMARY=()
for h in "${HARNESSES[@]}"; do
  bin=$BUILD/fuzz/fuzz_$h
  if [[ ! -x $bin || ! -d fuzz/corpus/$h ]]; then
    echo "fuzz.sh: no harness '$h' (known: ${ALL[*]})" >&2
    exit 2
  fi
  work=$WORK_ROOT/$h
  mkdir -p "$work/corpus" "$work/artifacts" "$work/tmp"
  cp -r "fuzz/corpus/$h/." "$work/corpus/"
  seeds=$(find "$work/corpus" -type f | wc -l)
  # One allocation over 256 MiB from a small input is a memory amplification: reported as a finding.
  flags=(-timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=256 -print_final_stats=1 "-artifact_prefix=$work/artifacts/")
  if [[ $h == rpc ]]; then
    # Eight calls per input with deadlines of 2-5 s: an input may take that long on a busy machine.
    # The server's threads run beside each input, so libFuzzer's per-input leak check would re-run
    # nearly every input under a full heap scan; the harness checks for leaks itself at exit, after
    # the server has shut down (fuzz_rpc.cc, Stop). Their coverage also makes the feature counts
    # noisy, which entropic scheduling pays for on every input.
    flags=(-timeout=60 -rss_limit_mb=3072 -print_final_stats=1 "-artifact_prefix=$work/artifacts/"
           -detect_leaks=0 -entropic=0)
  fi
  if [[ -n ${FEDLORA_FUZZ_RUNS:-} ]]; then flags+=("-runs=$FEDLORA_FUZZ_RUNS"); else flags+=("-max_total_time=$SECONDS_EACH"); fi
  [[ -f fuzz/$h.dict ]] && flags+=("-dict=fuzz/$h.dict")
  lsan=""
  [[ -f fuzz/lsan_$h.supp ]] && lsan="suppressions=$ROOT/fuzz/lsan_$h.supp"
  if [[ -n ${FEDLORA_FUZZ_RUNS:-} ]]; then budget="$FEDLORA_FUZZ_RUNS runs"; else budget="$SECONDS_EACH s"; fi
  echo "fuzz.sh: $h: $budget from $seeds seeds"
  start=$(date +%s)
  set +e
  FEDLORA_FUZZ_TMP=$work/tmp TMPDIR=$work/tmp LSAN_OPTIONS=${LSAN_OPTIONS:-$lsan} \
    "$bin" "${flags[@]}" "$work/corpus" >"$work/log" 2>&1
  rc=$?
  set -e
  took=$(($(date +%s) - start))
  final=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$work/log" | tail -1 || true)
  execs=$(grep -E '^stat::number_of_executed_units:' "$work/log" | awk '{print $2}' | tail -1 || true)
  cov=$(sed -nE 's/.* cov: ([0-9]+) .*/\1/p' <<<"$final")
  corp=$(sed -nE 's/.* corp: ([0-9]+\/[0-9]+[a-zA-Z]*) .*/\1/p' <<<"$final")
  artifacts=$(find "$work/artifacts" -type f | sort)
  if ((rc != 0)) || [[ -n $artifacts ]]; then
    failed=1
    mkdir -p "$BUILD/findings/$h"
    echo "fuzz.sh: $h FAILED (exit $rc after $took s). End of its log:" >&2
    grep -vE '^#[0-9]+[[:space:]]+(NEW|REDUCE|pulse)' "$work/log" | tail -60 >&2
    for a in $artifacts; do
      cp "$a" "$BUILD/findings/$h/"
      echo "fuzz.sh: $h reproducer: $BUILD/findings/$h/$(basename "$a")  (rerun: $bin $BUILD/findings/$h/$(basename "$a"))" >&2
    done
    cp "$work/log" "$BUILD/findings/$h/log"
    SUMMARY+=("$(printf '%-14s FAILED  exit %-3s %6s s  %10s execs  cov %-6s corpus %s' "$h" "$rc" "$took" "${execs:-?}" "${cov:-?}" "${corp:-?}")")
  else
    SUMMARY+=("$(printf '%-14s ok      %6s s  %10s execs  cov %-6s corpus %s' "$h" "$took" "${execs:-?}" "${cov:-?}" "${corp:-?}")")
  fi
done

echo "fuzz.sh: summary ($MODE)"
printf '  %s\n' "${SUMMARY[@]}"
[[ ${FEDLORA_FUZZ_KEEP:-0} == 1 ]] && echo "fuzz.sh: work folders kept in $WORK_ROOT"
if ((failed)); then
  echo "fuzz.sh: findings; reproducers under $BUILD/findings/" >&2
  exit 1
fi
echo "fuzz.sh: no findings"
