#!/usr/bin/env bash
# SIGKILL chaos for a small federation of `fedlora` processes on 127.0.0.1 (plaintext, --insecure).
#
#   scripts/chaos.sh --short <build_dir>   # CI: one server-kill run, one client-kill run (~1-2 min)
#   scripts/chaos.sh --long <build_dir>    # make chaos: more runs, more kills
#   CHAOS_SEED=12345 scripts/chaos.sh --short <build_dir>   # replay a seed's kill schedule
#   CHAOS_KEEP=1 ...                       # keep the logs and stores of a passing run too
#
# First an uninterrupted reference run, then chaos runs of the same config, each on a fresh store:
# the server (or a client) is SIGKILLed at moments drawn from a seeded RNG and restarted on the
# same store (or with the same id and data). Every run must finish with each round committed once,
# each round counting exactly one accepted update per client, and every round's adapter (the
# final one included) bit-identical to the reference. The config makes that possible: every
# client is selected every round, the round waits for all of them, and a client's training is
# seeded by (run seed, round, client) (server/coordinator.cc TaskSeedFor).
# docs/chaos.md says what is checked and how to replay. Exit: 0 pass, 1 failure, 2 usage,
# 77 model or data not fetched (scripts/setup.sh).
set -uo pipefail

usage() {
  echo "usage: scripts/chaos.sh [--short|--long] <build_dir>" >&2
  exit 2
}
MODE=short
case "${1:-}" in
  --short) MODE=short; shift ;;
  --long) MODE=long; shift ;;
  -h | --help) usage ;;
esac
[[ $# -eq 1 ]] || usage
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "$1" 2>/dev/null && pwd) || { echo "chaos: build dir $1 not found" >&2; exit 1; }
BIN=$BUILD/tools/fedlora
MODEL=$ROOT/models/all-MiniLM-L6-v2
DATA=$ROOT/data/fortunes

for f in "$MODEL/model.safetensors" "$DATA/train.jsonl" "$DATA/test.jsonl"; do
  if [[ ! -f $f ]]; then
    echo "chaos: SKIP: $f not found (scripts/setup.sh fetches the model and data)"
    exit 77
  fi
done
[[ -x $BIN ]] || { echo "chaos: FAIL: $BIN not built (ninja -C $BUILD fedlora)" >&2; exit 1; }
command -v sqlite3 >/dev/null || { echo "chaos: FAIL: sqlite3 not installed (scripts/setup.sh)" >&2; exit 1; }

# --- Settings per mode -----------------------------------------------------------------------
CLIENTS=3
# The server keeps serving this long after the run finished: longer than a client's backoff after
# a server restart (0.2 s doubling: 6.4 s by the sixth try, 12.8 s by the seventh), so that a client
# waiting one out still finds the server to tell it the run is over.
LINGER_S=15
# Kill k waits for round ROUND_k (spread over the run: 1 + k * ROUNDS / kills) and then a delay of
# 0..KILL_MAX_MS from the moment that round was seen open, or from the previous restart if later.
if [[ $MODE == short ]]; then
  ROUNDS=4
  RUN_LIMIT_S=180    # a run (reference or chaos) not finished by then is a wedge
  RUNS=("server 3" "client 3")
  KILL_MAX_MS=1500   # an idle machine trains a short round in about 1 s: a longer delay can outlast
                     # the whole run, and then no kill happens
else
  ROUNDS=4
  RUN_LIMIT_S=300
  RUNS=("server 5" "server 5" "client 5" "client 5" "both 8")
  KILL_MAX_MS=4500
fi
DOWN_MAX_MS=1000     # a killed process stays down 0..DOWN_MAX_MS before its restart
RUN_ID=chaos

SEED=${CHAOS_SEED:-$(( $(date +%s%N) % 2147483646 + 1 ))}
[[ $SEED =~ ^[0-9]+$ ]] || { echo "chaos: CHAOS_SEED must be a number" >&2; exit 2; }
REPLAY="CHAOS_SEED=$SEED scripts/chaos.sh --$MODE $1"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/fedlora-chaos.XXXXXX")
FAILED=1             # cleared only when every run passed
declare -A TPID=()   # role (server, site-N) -> pid of its `timeout` wrapper

# --- Process handling ------------------------------------------------------------------------
# Every fedlora process runs under `timeout -s KILL`, so none outlives this script by more than
# the run limit even if the script itself is SIGKILLed.
child_of() {  # the fedlora process under a timeout wrapper
  local c
  for _ in $(seq 50); do
    c=$(pgrep -P "$1" 2>/dev/null | head -1)
    [[ -n $c ]] && { echo "$c"; return 0; }
    kill -0 "$1" 2>/dev/null || return 1
    sleep 0.02
  done
  return 1
}
alive() { [[ -n ${TPID[$1]:-} ]] && kill -0 "${TPID[$1]}" 2>/dev/null; }
RC=0
reap() {  # waits for a role's wrapper; its exit status into RC (not in a subshell: wait needs the parent)
  local p=${TPID[$1]:-}
  RC=255
  [[ -n $p ]] || return 0
  { wait "$p"; RC=$?; } 2>/dev/null
  unset "TPID[$1]"
}
sigkill() {  # SIGKILLs a role's fedlora process and reaps it
  local c
  c=$(child_of "${TPID[$1]}") && kill -KILL "$c" 2>/dev/null
  kill -KILL "${TPID[$1]}" 2>/dev/null
  reap "$1"
  # fedlora is timeout's child, not ours: wait (at most 10 s) until it is gone, so that its store
  # lock is released before a restart takes the store.
  local i
  for ((i = 0; i < 200 && ${#c} > 0; i++)); do kill -0 "$c" 2>/dev/null || break; sleep 0.05; done
}
cleanup() {
  local r
  for r in "${!TPID[@]}"; do sigkill "$r"; done
  if ((FAILED)) || [[ -n ${CHAOS_KEEP:-} ]]; then
    echo "chaos: logs and stores kept in $WORK"
    echo "chaos: replay with: $REPLAY"
  else
    rm -rf "$WORK"
  fi
}
trap cleanup EXIT
trap 'echo "chaos: interrupted"; exit 1' INT TERM HUP

NOW=0
now() { local t=${EPOCHREALTIME//[.,]/}; NOW=$(( 10#$t / 1000 )); }  # milliseconds, into NOW (no subshell)

# Park-Miller minimal standard RNG: portable, no overflow in bash arithmetic. Result in REPLY.
RNG=1
rng_seed() { RNG=$(( $1 % 2147483646 + 1 )); rand; rand; }
rand() { RNG=$(( RNG * 48271 % 2147483647 )); REPLY=$RNG; }
rand_in() { rand; REPLY=$(( $1 + REPLY % ($2 - $1 + 1) )); }  # uniform in [lo, hi]

# --- The federation ----------------------------------------------------------------------------
mkdir -p "$WORK/data"
head -n 16 "$DATA/test.jsonl" >"$WORK/data/eval.jsonl"
for ((i = 0; i < CLIENTS; ++i)); do
  sed -n "$((i * 48 + 1)),$((i * 48 + 48))p" "$DATA/train.jsonl" >"$WORK/data/site-$i.jsonl"
done
# From configs/two_sites.json, shrunk: every client selected every round, the round waiting for
# all of them (a deadline no run reaches), few short steps.
cat >"$WORK/run.json" <<EOF
{
  "run_id": "$RUN_ID",
  "seed": 7,
  "rounds": $ROUNDS,
  "model": {"id": "all-MiniLM-L6-v2", "path": "$MODEL", "max_seq_len": 32},
  "lora": {"rank": 4, "alpha": 8, "target_modules": ["query", "value"]},
  "task": {
    "kind": "SEQUENCE_CLASSIFICATION",
    "labels": ["computers", "definitions", "men-women", "politics", "science", "songs-poems", "work", "zippy"],
    "text_field": "text",
    "label_field": "label"
  },
  "training": {"local_steps": 2, "batch_size": 8, "learning_rate": 0.002, "optimizer": "ADAMW",
               "schedule": "CONSTANT", "grad_clip_norm": 1.0},
  "selection": {"clients_per_round": $CLIENTS, "over_selection": 1.0, "min_clients": $CLIENTS,
                "round_deadline_seconds": 3600, "heartbeat_interval_seconds": 2,
                "heartbeat_timeout_seconds": 120, "retry_after_seconds": 1},
  "aggregation": {"strategy": "FEDAVG"},
  "data": {"eval_path": "$WORK/data/eval.jsonl", "eval_batch_size": 16},
  "server": {"listen_address": "127.0.0.1:0", "store_dir": "$WORK/unused-store"}
}
EOF

declare -A INCARNATION=()
PORT=0
DIR=""
spawn() {  # spawn <role> <args...>: one more incarnation of a role, logs in $DIR/<role>.<n>.{out,err}
  local role=$1
  shift
  INCARNATION[$role]=$(( ${INCARNATION[$role]:-0} + 1 ))
  local log=$DIR/$role.${INCARNATION[$role]}
  timeout -s KILL "$((RUN_LIMIT_S + 120))" "$BIN" "$@" >"$log.out" 2>"$log.err" &
  TPID[$role]=$!
}
start_server() {
  spawn server server --config "$WORK/run.json" --insecure --listen "127.0.0.1:$PORT" --store "$DIR/store" \
    --linger-seconds "$LINGER_S"
}
start_client() {
  spawn "site-$1" client --server "127.0.0.1:$PORT" --insecure --id "site-$1" --model "$MODEL" \
    --data "$WORK/data/site-$1.jsonl" --threads 1
}
# The round the server is in (ROUNDS + 1 once the run finished), into CUR_ROUND, from `fedlora
# status`; unchanged while the server is down.
CUR_ROUND=0
current_round() {
  local out
  out=$(timeout 5 "$BIN" status --server "127.0.0.1:$PORT" --insecure --json --deadline-ms 2000 2>/dev/null) || return 0
  if [[ $out == *'"phase": "ROUND_PHASE_FINISHED"'* ]]; then
    CUR_ROUND=$((ROUNDS + 1))
  elif [[ $out =~ \"current_round\":\ \"?([0-9]+) ]]; then
    CUR_ROUND=${BASH_REMATCH[1]}
  fi
}
last_log() { local f=$DIR/$1.${INCARNATION[$1]}.err; [[ -f $f ]] && tail -n 1 "$f" | cut -c1-160; }

RUN_NAME=""
fail() {
  echo "chaos: FAIL [$RUN_NAME]: $*" >&2
  local r f
  for f in "$DIR"/server.*.err; do
    [[ -f $f ]] || continue
    echo "--- tail of $f" >&2
    tail -n 15 "$f" >&2
  done
  for r in "${!INCARNATION[@]}"; do
    [[ $r == server ]] && continue
    f=$DIR/$r.${INCARNATION[$r]}.err
    [[ -f $f ]] && { echo "--- tail of $f" >&2; tail -n 5 "$f" >&2; }
  done
  exit 1
}

q() { timeout 30 sqlite3 -batch -noheader "$DIR/store/fedlora.db" "$1"; }
jget() { timeout 30 sqlite3 -batch -noheader :memory: "SELECT json_extract(readfile('$1'), '$2')"; }

declare -a REF_ROUNDS=()   # the reference run's per-round adapter hashes
REF_FINAL=""

# run_federation <name> <server|client|both|none> <kills> <seed>
run_federation() {
  RUN_NAME=$1
  local mode=$2 nkills=$3 seed=$4
  DIR=$WORK/$RUN_NAME
  mkdir -p "$DIR"
  INCARNATION=()
  PORT=0
  rng_seed "$seed"
  # The kill schedule, drawn before anything runs so that a seed always gives the same one.
  local -a round=() delay=() down=() target=()
  local k
  for ((k = 0; k < nkills; ++k)); do
    round[k]=$((1 + k * ROUNDS / nkills))
    rand_in 0 "$KILL_MAX_MS"; delay[k]=$REPLY
    rand_in 0 "$DOWN_MAX_MS"; down[k]=$REPLY
    case $mode in
      server) target[k]=server ;;
      client) rand; target[k]=site-$(((REPLY >> 12) % CLIENTS)) ;;
      both) rand; if (((REPLY >> 12) % 2)); then target[k]=server; else rand; target[k]=site-$(((REPLY >> 12) % CLIENTS)); fi ;;
    esac
  done
  local plan=""
  for ((k = 0; k < nkills; ++k)); do plan+=" ${target[k]}@r${round[k]}+${delay[k]}ms(down ${down[k]}ms)"; done
  if ((nkills)); then
    echo "chaos: run $RUN_NAME: seed $seed, $nkills kills planned:$plan"
  else
    echo "chaos: run $RUN_NAME: uninterrupted"
  fi

  now
  local t0=$NOW deadline=$((NOW + RUN_LIMIT_S * 1000))
  start_server
  # The first start's port, reused by every restart.
  while :; do
    if [[ -f $DIR/server.1.out ]] && PORT=$(grep -om1 '127\.0\.0\.1:[0-9]*' "$DIR/server.1.out" | cut -d: -f2) &&
      [[ -n $PORT ]]; then
      break
    fi
    alive server || { reap server; fail "server exited before listening (status $RC): $(last_log server)"; }
    now; ((NOW < t0 + 60000)) || fail "server not listening after 60 s"
    sleep 0.05
  done
  local i
  for ((i = 0; i < CLIENTS; ++i)); do start_client "$i"; done

  local -A done_=()
  local ndone=0 ki=0 kills=0 skipped=0
  now
  local since=$NOW seen=0 kill_log="" tick=0
  CUR_ROUND=0
  while ((ndone < CLIENTS)); do
    for ((i = 0; i < CLIENTS; ++i)); do
      [[ -n ${done_[$i]:-} ]] && continue
      if ! alive "site-$i"; then
        reap "site-$i"
        ((RC == 0)) || fail "client site-$i exited with status $RC (not killed by chaos): $(last_log "site-$i")"
        done_[$i]=1
        ((++ndone))
      fi
    done
    ((ndone < CLIENTS)) || break
    if ! alive server; then
      reap server
      fail "server exited with status $RC while clients were still running: $(last_log server)"
    fi
    now
    if ((NOW >= deadline)); then
      current_round
      fail "run not finished within $RUN_LIMIT_S s (server's logs reach round $CUR_ROUND of $ROUNDS; $ki of $nkills kills done)"
    fi
    if ((ki < nkills && seen == 0 && ++tick % 5 == 0)); then  # status twice a second
      current_round
      ((CUR_ROUND >= round[ki])) && seen=$((NOW > since ? NOW : since))
    fi
    if ((ki < nkills && seen > 0 && NOW >= seen + delay[ki])); then
      local who=${target[ki]}
      current_round
      # No kill after the run finished: a client restarted then, or a client waiting out its
      # backoff while a restarted server loads, can miss the server's short linger (LINGER_S)
      # and find no server left to tell it the run is over.
      if ((CUR_ROUND > ROUNDS)); then
        ((++skipped))
        echo "chaos:   kill $((ki + 1)): $who not killed, the run has finished"
      elif alive "$who"; then
        local line
        line=$(last_log "$who")
        sigkill "$who"
        ((++kills))
        echo "chaos:   kill $((ki + 1)): $who (incarnation ${INCARNATION[$who]}) in round $CUR_ROUND at $(((NOW - t0) / 1000)).$(((NOW - t0) % 1000 / 100)) s; last log: ${line:-<none>}"
        kill_log+="$who "
        sleep "$((down[ki] / 1000)).$(printf '%03d' "$((down[ki] % 1000))")"
        if [[ $who == server ]]; then start_server; else start_client "${who#site-}"; fi
      else
        ((++skipped))
        echo "chaos:   kill $((ki + 1)): $who already finished; skipped"
      fi
      ((++ki))
      now
      since=$NOW
      seen=0
    fi
    sleep 0.1
  done

  # All clients finished: the server lingers, finished, for LINGER_S. Ask it, then let it exit. A server
  # restarted by a late kill may still be loading the model: ask again until it listens (20 s at most).
  local asked=0
  until timeout 20 "$BIN" status --server "127.0.0.1:$PORT" --insecure --json >"$DIR/status.json" 2>"$DIR/status.err"; do
    ((++asked < 40)) && alive server || fail "fedlora status failed: $(tail -n 2 "$DIR/status.err")"
    sleep 0.5
  done
  local waited=0
  while alive server; do
    ((++waited <= (LINGER_S + 30) * 10)) || fail "server still running $((LINGER_S + 30)) s after the run finished"
    sleep 0.1
  done
  reap server
  ((RC == 0)) || fail "server's last incarnation exited with status $RC: $(last_log server)"
  ((nkills == 0 || kills > 0)) || fail "no kill happened before the run finished ($skipped skipped): nothing was tested"
  now
  local wall=$(((NOW - t0) / 1000))
  check_run
  # What each restarted server found in the store.
  grep -h "resuming round" "$DIR"/server.*.err 2>/dev/null | sed 's/^.*\] /chaos:   restart: /'
  local failed_tasks
  failed_tasks=$(cat "$DIR"/site-*.out 2>/dev/null | grep -o '"tasks_failed":[1-9][0-9]*' | tr '\n' ' ')
  echo "chaos: run $RUN_NAME passed in ${wall} s: $kills of $nkills planned kills (${kill_log:-none}), $skipped skipped," \
    "server started ${INCARNATION[server]} times${failed_tasks:+; client incarnations reporting given-up tasks: $failed_tasks}"
  TOTAL_KILLS=$((TOTAL_KILLS + kills))
}

# Checks one finished run against the reference (the reference itself: against itself): the
# store's rounds and accepted updates first, so that a divergence names its first round; then the
# adapter the server printed, each client's summary, and `fedlora status`.
check_run() {
  local out=$DIR/server.${INCARNATION[server]}.out s=$DIR/status.json final="" n i r st h u
  final=$(sed -n "s/^run finished: $ROUNDS rounds committed, adapter \([0-9a-f]\{64\}\)$/\1/p" "$out")
  [[ -n $final ]] || fail "server did not print 'run finished: $ROUNDS rounds committed, adapter <sha256>': $(tail -n 1 "$out")"

  # The store: one run; rounds 1..ROUNDS, each committed once with one update per client.
  [[ $(q "SELECT COUNT(*) FROM runs") == 1 ]] || fail "store holds $(q "SELECT COUNT(*) FROM runs") runs, not 1"
  local -a rows=() acc=() hashes=()
  mapfile -t rows < <(q "SELECT round || '|' || state || '|' || result_adapter_hash || '|' ||
                                 COALESCE(json_extract(metrics_json, '\$.updates'), '?')
                          FROM rounds WHERE run_id = '$RUN_ID' ORDER BY round")
  ((${#rows[@]} == ROUNDS)) || fail "store holds ${#rows[@]} rounds, not $ROUNDS: ${rows[*]}"
  # Accepted updates per round: count and distinct clients (a client counted twice shows here).
  mapfile -t acc < <(q "SELECT round || '|' || COUNT(*) || '|' || COUNT(DISTINCT client_id) FROM uploads
                        WHERE run_id = '$RUN_ID' AND state = 'accepted' GROUP BY round ORDER BY round")
  ((${#acc[@]} == ROUNDS)) || fail "accepted updates in ${#acc[@]} rounds, not $ROUNDS: ${acc[*]}"
  for ((i = 0; i < ROUNDS; ++i)); do
    IFS='|' read -r r st h u <<<"${rows[i]}"
    [[ $r == $((i + 1)) && $st == committed ]] || fail "store round row '${rows[i]}': expected round $((i + 1)) committed"
    if [[ ${acc[i]} != "$r|$CLIENTS|$CLIENTS" ]]; then
      fail "round $r: accepted updates (round|count|distinct clients) ${acc[i]}, expected $r|$CLIENTS|$CLIENTS;" \
        "accepted rows (round|client|upload|task): $(q "SELECT round || '|' || client_id || '|' || upload_id || '|' ||
          task_id FROM uploads WHERE state = 'accepted' AND round = $r ORDER BY client_id" | tr '\n' ' ')"
    fi
    [[ $u == "$CLIENTS" ]] || fail "round $r committed with $u updates aggregated (metrics_json), not $CLIENTS"
    if ((${#REF_ROUNDS[@]})); then
      [[ $h == "${REF_ROUNDS[i]}" ]] || fail "round $r's adapter $h differs from the uninterrupted run's ${REF_ROUNDS[i]}"
    fi
    hashes[i]=$h
  done
  n=$(q "SELECT COUNT(*) FROM uploads u WHERE u.state = 'accepted' AND NOT EXISTS (SELECT 1 FROM round_selections s
         WHERE s.run_id = u.run_id AND s.round = u.round AND s.client_id = u.client_id)")
  [[ $n == 0 ]] || fail "$n accepted updates from clients not selected for their round"
  [[ ${hashes[ROUNDS - 1]} == "$final" ]] || fail "the server printed adapter $final, the store's last round ${hashes[ROUNDS - 1]}"

  local want=${REF_FINAL:-$final}
  [[ $final == "$want" ]] || fail "final adapter $final differs from the uninterrupted run's $want"
  # Each client's last incarnation saw the same end.
  for ((i = 0; i < CLIENTS; ++i)); do
    local cout=$DIR/site-$i.${INCARNATION[site-$i]}.out
    grep -q "\"final_round\":$ROUNDS,\"final_adapter_sha256\":\"$want\"" "$cout" ||
      fail "client site-$i's summary does not end at round $ROUNDS with adapter $want: $(cat "$cout")"
  done
  # fedlora status, asked while the server lingered.
  [[ $(jget "$s" '$.phase') == ROUND_PHASE_FINISHED ]] || fail "status phase is $(jget "$s" '$.phase'), not finished"
  [[ $(jget "$s" '$.global_adapter.sha256') == "$want" ]] ||
    fail "status shows adapter $(jget "$s" '$.global_adapter.sha256'), not $want"
  n=$(timeout 30 sqlite3 -batch -noheader :memory: "SELECT json_array_length(readfile('$s'), '\$.history')")
  [[ $n == "$ROUNDS" ]] || fail "status history lists $n rounds, not $ROUNDS"
  for ((i = 0; i < ROUNDS; ++i)); do
    [[ $(jget "$s" "\$.history[$i].updates_accepted") == "$CLIENTS" ]] ||
      fail "status: round $((i + 1)) accepted $(jget "$s" "\$.history[$i].updates_accepted") updates, not $CLIENTS"
    [[ $(jget "$s" "\$.history[$i].global_adapter_sha256") == "${hashes[i]}" ]] ||
      fail "status and store disagree on round $((i + 1))'s adapter"
  done

  if ((${#REF_ROUNDS[@]} == 0)); then
    REF_ROUNDS=("${hashes[@]}")
    REF_FINAL=$final
  fi
}

# --- Runs --------------------------------------------------------------------------------------
echo "chaos: seed $SEED ($MODE: $CLIENTS clients, $ROUNDS rounds; replay with $REPLAY)"
echo "chaos: work dir $WORK"
TOTAL_KILLS=0
now
T_START=$NOW
run_federation reference none 0 0
echo "chaos: reference adapter $REF_FINAL (rounds: ${REF_ROUNDS[*]})"
idx=0
for spec in "${RUNS[@]}"; do
  read -r mode kills <<<"$spec"
  ((++idx))
  run_federation "$idx-$mode-kills" "$mode" "$kills" "$((SEED + 7919 * idx))"
done
now
FAILED=0
echo "chaos: PASS: ${#RUNS[@]} chaos runs, $TOTAL_KILLS kills, every run bit-identical to the reference" \
  "($(((NOW - T_START) / 1000)) s, seed $SEED)"
