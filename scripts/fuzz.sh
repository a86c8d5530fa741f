#!/usr/bin/env bash
# Builds fedlora's libFuzzer harnesses (the `sanitize` preset: clang, ASan+UBSan, the build that
# `make asan` tests too) and runs each one on a copy of its seed corpus (fuzz/corpus/<harness>/;
# the committed corpus is never written), two at a time.
#
#   scripts/fuzz.sh --short            # `make fuzz-ci`: ~25 s per harness
#   scripts/fuzz.sh --long             # `make fuzz`: 10 min per harness
#   scripts/fuzz.sh --short rpc update # only these harnesses
#
# Environment:
#   FEDLORA_FUZZ_SECONDS   seconds per harness (default 25 with --short, 600 with --long)
#   FEDLORA_FUZZ_RUNS      stop each harness after this many executions instead (-runs=)
#   FEDLORA_FUZZ_JOBS      harnesses run at once (default 2)
#   FEDLORA_FUZZ_BUILD_JOBS  build parallelism (default 2)
#   FEDLORA_FUZZ_KEEP=1    keep the work folders (grown corpora, logs; the path is printed at the end)
#   FEDLORA_FUZZ_SEGMENT_SECONDS  restart each harness's process after this many seconds, on the
#                          corpus it has grown, until its budget is spent; the summary adds up the
#                          segments' executions (default: one process for the whole budget)
#
# Exit status: 0 when no harness found anything; 1 when one crashed, leaked, timed out or ran out of
# memory (its reproducer is copied to build/sanitize/findings/<harness>/ and the path printed; rerun it
# with `build/sanitize/fuzz/fuzz_<harness> <file>`); 2 on a usage or build error.
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
ALL=(safetensors gguf update downlink sealed_update secagg run_config tokenizer bpe_tokenizer bert_config rpc
     rpc_private rpc_tls metrics_http peft state_files dataset chat_template decoder_config)
((${#HARNESSES[@]})) || HARNESSES=("${ALL[@]}")

if [[ -n ${FEDLORA_FUZZ_SEGMENT_SECONDS:-} && ! ${FEDLORA_FUZZ_SEGMENT_SECONDS} =~ ^[1-9][0-9]*$ ]]; then
  echo "fuzz.sh: FEDLORA_FUZZ_SEGMENT_SECONDS must be a positive integer, not '$FEDLORA_FUZZ_SEGMENT_SECONDS'" >&2
  exit 2
fi
if [[ $MODE == short ]]; then SECONDS_EACH=${FEDLORA_FUZZ_SECONDS:-25}; else SECONDS_EACH=${FEDLORA_FUZZ_SECONDS:-600}; fi
BUILD=build/sanitize
export CCACHE_BASEDIR=$ROOT CCACHE_NOHASHDIR=1

echo "fuzz.sh: building the harnesses of the sanitize preset in $BUILD"
build_start=$(date +%s)
cmake --preset sanitize >/dev/null || { echo "fuzz.sh: configure failed" >&2; exit 2; }
cmake --build --preset sanitize --target fuzzers -- -j "${FEDLORA_FUZZ_BUILD_JOBS:-2}" >"$BUILD/fuzz_build.log" 2>&1 || {
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

for h in "${HARNESSES[@]}"; do
  if [[ ! -x $BUILD/fuzz/fuzz_$h || ! -d fuzz/corpus/$(sed -E 's/_(private|tls)$//' <<<"$h") ]]; then
    echo "fuzz.sh: no harness '$h' (known: ${ALL[*]})" >&2
    exit 2
  fi
done

# Runs harness $1 in its work folder; leaves there its summary line, and on a finding a report and
# a file named failed.
fuzz_one() {
  local h=$1
  local bin=$BUILD/fuzz/fuzz_$h work=$WORK_ROOT/$h
  local seeds flags lsan budget start rc took final execs cov corp artifacts a
  # rpc_private and rpc_tls are fuzz_rpc.cc on a SecAgg+ / DP federation and over mutual TLS: the
  # same input format, rpc's seeds.
  local base=${h%_private}
  base=${base%_tls}
  mkdir -p "$work/corpus" "$work/artifacts" "$work/tmp"
  cp -r "fuzz/corpus/$base/." "$work/corpus/"
  seeds=$(find "$work/corpus" -type f | wc -l)
  # One allocation over 256 MiB from a small input is a memory amplification: reported as a finding.
  flags=(-timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=256 -print_final_stats=1 "-artifact_prefix=$work/artifacts/")
  if [[ $h == metrics_http ]]; then
    # Each input goes over a loopback connection to the server's threads, as for rpc below: the
    # harness checks for leaks itself at exit, after the server has stopped (fuzz_metrics_http.cc).
    flags=(-timeout=30 -rss_limit_mb=2048 -print_final_stats=1 "-artifact_prefix=$work/artifacts/" -detect_leaks=0)
  fi
  if [[ $base == rpc ]]; then
    # Eight calls per input with deadlines of 2-5 s: an input may take that long on a busy machine.
    # The server's threads run beside each input, so libFuzzer's per-input leak check would re-run
    # nearly every input under a full heap scan; the harness checks for leaks itself at exit, after
    # the server has shut down (fuzz_rpc.cc, Stop). Their coverage also makes the feature counts
    # noisy, which entropic scheduling pays for on every input.
    flags=(-timeout=60 -rss_limit_mb=3072 -print_final_stats=1 "-artifact_prefix=$work/artifacts/"
           -detect_leaks=0 -entropic=0)
  fi
  [[ -f fuzz/$base.dict ]] && flags+=("-dict=fuzz/$base.dict")
  lsan=""
  [[ -f fuzz/lsan_$base.supp ]] && lsan="suppressions=$ROOT/fuzz/lsan_$base.supp"
  if [[ -n ${FEDLORA_FUZZ_RUNS:-} ]]; then budget="$FEDLORA_FUZZ_RUNS runs"; else budget="$SECONDS_EACH s"; fi
  echo "fuzz.sh: $h: $budget from $seeds seeds"
  start=$(date +%s)
  # One process, or segments of FEDLORA_FUZZ_SEGMENT_SECONDS: a long rpc run slows as its process
  # ages (docs/benchmarks.md), so it is restarted on its grown corpus. Each segment ends with the
  # harness's own checks at exit; the first that fails ends the run.
  execs=0
  segment=0
  : >"$work/log"
  while :; do
    local seg_flags=("${flags[@]}") left
    if [[ -n ${FEDLORA_FUZZ_RUNS:-} ]]; then
      left=$((FEDLORA_FUZZ_RUNS - execs))
      seg_flags+=("-runs=$left")
      [[ -n ${FEDLORA_FUZZ_SEGMENT_SECONDS:-} ]] && seg_flags+=("-max_total_time=$FEDLORA_FUZZ_SEGMENT_SECONDS")
    else
      left=$((SECONDS_EACH - ($(date +%s) - start)))
      ((left > 0)) || break
      [[ -n ${FEDLORA_FUZZ_SEGMENT_SECONDS:-} ]] && ((left > FEDLORA_FUZZ_SEGMENT_SECONDS)) && left=$FEDLORA_FUZZ_SEGMENT_SECONDS
      seg_flags+=("-max_total_time=$left")
    fi
    segment=$((segment + 1))
    set +e
    FEDLORA_FUZZ_TMP=$work/tmp TMPDIR=$work/tmp LSAN_OPTIONS=${LSAN_OPTIONS:-$lsan} \
      "$bin" "${seg_flags[@]}" "$work/corpus" >"$work/segment.log" 2>&1
    rc=$?
    set -e
    cat "$work/segment.log" >>"$work/log"
    final=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$work/segment.log" | tail -1 || true)
    local n
    n=$(grep -E '^stat::number_of_executed_units:' "$work/segment.log" | awk '{print $2}' | tail -1 || true)
    execs=$((execs + ${n:-0}))
    ((rc == 0)) || break
    [[ -n $(find "$work/artifacts" -type f ! -name 'slow-unit-*') ]] && break
    [[ -n ${FEDLORA_FUZZ_SEGMENT_SECONDS:-} ]] || break
    [[ -n ${FEDLORA_FUZZ_RUNS:-} ]] && ((execs >= FEDLORA_FUZZ_RUNS)) && break
    [[ -n $n && $n -gt 0 ]] || break  # a segment that ran nothing would loop forever
  done
  rm -f "$work/segment.log"
  ((segment > 1)) && echo "fuzz.sh: $h: $segment segments" >>"$work/notes"
  took=$(($(date +%s) - start))
  cov=$(sed -nE 's/.* cov: ([0-9]+) .*/\1/p' <<<"$final")
  corp=$(sed -nE 's/.* corp: ([0-9]+\/[0-9]+[a-zA-Z]*) .*/\1/p' <<<"$final")
  # A slow unit (libFuzzer's report past 10 s) is not a finding: -timeout catches a real hang, and
  # a busy or paused machine stalls whichever input is running (rerun alone, such inputs take
  # milliseconds). It is kept beside the findings and named, without failing the run.
  for a in $(find "$work/artifacts" -type f -name 'slow-unit-*' | sort); do
    mkdir -p "$BUILD/findings/$h"
    cp "$a" "$BUILD/findings/$h/"
    echo "fuzz.sh: $h: a slow unit (not a finding): $BUILD/findings/$h/$(basename "$a")" >> "$work/notes"
  done
  artifacts=$(find "$work/artifacts" -type f ! -name 'slow-unit-*' | sort)
  if ((rc != 0)) || [[ -n $artifacts ]]; then
    mkdir -p "$BUILD/findings/$h"
    {
      echo "fuzz.sh: $h FAILED (exit $rc after $took s). End of its log:"
      grep -vE '^#[0-9]+[[:space:]]+(NEW|REDUCE|pulse)' "$work/log" | tail -60
      for a in $artifacts; do
        cp "$a" "$BUILD/findings/$h/"
        echo "fuzz.sh: $h reproducer: $BUILD/findings/$h/$(basename "$a")  (rerun: $bin $BUILD/findings/$h/$(basename "$a"))"
      done
    } > "$work/report"
    cp "$work/log" "$BUILD/findings/$h/log"
    printf '%-14s FAILED  exit %-3s %6s s  %10s execs  cov %-6s corpus %s\n' "$h" "$rc" "$took" "${execs:-?}" "${cov:-?}" "${corp:-?}" > "$work/summary"
    touch "$work/failed"
  else
    printf '%-14s ok      %6s s  %10s execs  cov %-6s corpus %s\n' "$h" "$took" "${execs:-?}" "${cov:-?}" "${corp:-?}" > "$work/summary"
  fi
}

# FEDLORA_FUZZ_JOBS harnesses at a time (default 2, one per core here): each is one process and
# gets its whole budget of seconds.
JOBS=${FEDLORA_FUZZ_JOBS:-2}
[[ $JOBS =~ ^[1-9][0-9]*$ ]] || { echo "fuzz.sh: FEDLORA_FUZZ_JOBS must be a positive integer, not '$JOBS'" >&2; exit 2; }
running=0
for h in "${HARNESSES[@]}"; do
  fuzz_one "$h" &
  if ((++running >= JOBS)); then
    wait -n || true
    running=$((running - 1))
  fi
done
wait

failed=0
SUMMARY=()
for h in "${HARNESSES[@]}"; do
  if [[ -f $WORK_ROOT/$h/failed ]]; then
    failed=1
    cat "$WORK_ROOT/$h/report" >&2
  fi
  [[ -f $WORK_ROOT/$h/notes ]] && cat "$WORK_ROOT/$h/notes"
  SUMMARY+=("$(cat "$WORK_ROOT/$h/summary" 2>/dev/null || echo "$h: no summary (the harness's shell died)")")
  [[ -f $WORK_ROOT/$h/summary ]] || failed=1
done

echo "fuzz.sh: summary ($MODE)"
printf '  %s\n' "${SUMMARY[@]}"
[[ ${FEDLORA_FUZZ_KEEP:-0} == 1 ]] && echo "fuzz.sh: work folders kept in $WORK_ROOT"
if ((failed)); then
  echo "fuzz.sh: findings; reproducers under $BUILD/findings/" >&2
  exit 1
fi
echo "fuzz.sh: no findings"
