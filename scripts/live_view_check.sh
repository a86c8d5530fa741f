#!/usr/bin/env bash
# The live view in a real browser (`make live-view-check`; not part of CI): a short real federation
# on 127.0.0.1 (a server and two clients, plaintext with --insecure, plus a third site whose data
# does not parse, so that a FAILED site shows), then Debian's chromium, headless, on the server's
# page once the run has finished: the DOM it drew is checked against /api/run.json (a row per
# round, each round's accuracy, every site's state, the failed site's message), and a screenshot
# is written to docs/images/live-view.png (the README shows it).
#
#   scripts/live_view_check.sh [BUILD_DIR]     # default build/default; chromium installed if absent
#
# LIVE_VIEW_SCREENSHOT=PATH writes the screenshot elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD_DIR=${1:-build/default}
BIN=$ROOT/$BUILD_DIR/tools/fedlora
MODEL=$ROOT/models/all-MiniLM-L6-v2
DATA=$ROOT/data/fortunes
SHOT=${LIVE_VIEW_SCREENSHOT:-$ROOT/docs/images/live-view.png}
ROUNDS=6

fail() { echo "live_view_check: FAILED: $*" >&2; exit 1; }
[[ -x $BIN ]] || fail "$BIN is not built (make build)"
[[ -d $MODEL && -f $DATA/train.jsonl ]] || fail "the model or data is missing (scripts/setup.sh)"
command -v chromium >/dev/null || scripts/setup.sh --chromium
command -v chromium >/dev/null || fail "chromium is not installed (scripts/setup.sh --chromium)"

WORK=$(mktemp -d)
PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

# A few examples per site, a held-out slice for the server's evaluation, and a site whose data
# file does not parse.
head -n 200 "$DATA/test.jsonl" >"$WORK/eval.jsonl"
sed -n '1,64p' "$DATA/train.jsonl" >"$WORK/site-a.jsonl"
sed -n '65,128p' "$DATA/train.jsonl" >"$WORK/site-b.jsonl"
{ head -n 2 "$DATA/train.jsonl"; echo '{"text": "no label here"'; } >"$WORK/site-c.jsonl"
cat >"$WORK/run.json" <<EOF
{
  "run_id": "live-view-check",
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
  "training": {"local_steps": 10, "batch_size": 8, "learning_rate": 0.005, "optimizer": "ADAMW",
               "schedule": "CONSTANT", "grad_clip_norm": 1.0},
  "selection": {"clients_per_round": 2, "over_selection": 1.0, "min_clients": 2,
                "round_deadline_seconds": 600, "heartbeat_interval_seconds": 2,
                "heartbeat_timeout_seconds": 120, "retry_after_seconds": 1},
  "aggregation": {"strategy": "FEDAVG"},
  "data": {"eval_path": "$WORK/eval.jsonl", "eval_batch_size": 32},
  "server": {"listen_address": "127.0.0.1:0", "metrics_address": "127.0.0.1:0", "store_dir": "$WORK/store"}
}
EOF

"$BIN" server --config "$WORK/run.json" --insecure --linger-seconds 600 >"$WORK/server.out" 2>"$WORK/server.err" &
PIDS+=($!)
for _ in $(seq 100); do
  grep -q '^live view: ' "$WORK/server.out" 2>/dev/null && break
  kill -0 "${PIDS[0]}" 2>/dev/null || fail "the server exited: $(tail -n 3 "$WORK/server.err")"
  sleep 0.2
done
ADDRESS=$(grep -om1 'listening on 127\.0\.0\.1:[0-9]*' "$WORK/server.out" | cut -d' ' -f3) ||
  fail "the server printed no address: $(cat "$WORK/server.out")"
URL=$(sed -n 's/^live view: \(http:[^ ]*\) .*/\1/p' "$WORK/server.out")
[[ -n $URL ]] || fail "the server printed no live view URL: $(cat "$WORK/server.out")"
echo "live_view_check: server at $ADDRESS, live view at $URL"

client() {  # client <site>
  "$BIN" client --server "$ADDRESS" --insecure --id "$1" --model "$MODEL" --data "$WORK/$1.jsonl" --threads 1 \
    >"$WORK/$1.out" 2>"$WORK/$1.err"
}
# The broken site first, alone: it exits on its data error and the server records it as failed.
if client site-c; then fail "site-c, whose data does not parse, exited 0"; fi
client site-a & A=$!
client site-b & B=$!
PIDS+=("$A" "$B")
wait "$A" || fail "site-a exited non-zero: $(tail -n 3 "$WORK/site-a.err")"
wait "$B" || fail "site-b exited non-zero: $(tail -n 3 "$WORK/site-b.err")"
echo "live_view_check: the run finished; opening the page in chromium"

CHROME=(chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --hide-scrollbars
        --user-data-dir="$WORK/chromium" --virtual-time-budget=4000)
curl -sf "${URL}api/run.json" >"$WORK/run_state.json" || fail "GET ${URL}api/run.json failed"
"${CHROME[@]}" --dump-dom "$URL" >"$WORK/dom.html" 2>"$WORK/chromium.err" ||
  fail "chromium --dump-dom failed: $(tail -n 3 "$WORK/chromium.err")"

# The DOM the page's script drew, against the server's JSON.
python3 - "$WORK/dom.html" "$WORK/run_state.json" "$ROUNDS" <<'EOF'
import html, json, re, sys
dom, state, rounds = open(sys.argv[1]).read(), json.load(open(sys.argv[2])), int(sys.argv[3])
problems = []
rows = re.findall(r'<tr data-round="(\d+)">(.*?)</tr>', dom, re.S)
if sorted(int(r) for r, _ in rows) != list(range(1, rounds + 1)):
    problems.append(f"rounds table rows {[r for r, _ in rows]}, not 1..{rounds}")
by_round = {int(r): body for r, body in rows}
for r in state["history"]:
    acc = re.search(r'<td class="acc">([^<]*)</td>', by_round.get(r["round"], ""))
    want = f'{r["eval_accuracy"]:.4f}'
    if not acc or acc.group(1) != want:
        problems.append(f'round {r["round"]}: accuracy {acc.group(1) if acc else "missing"} shown, {want} in the JSON')
for c in state["clients"]:
    m = re.search(r'<tr data-site="%s"[^>]*>.*?<span class="state ([a-z ]+)">' % re.escape(c["client_id"]), dom, re.S)
    want = c["state"].replace("CLIENT_STATE_", "").lower().replace("_", " ")
    if not m or m.group(1) != want:
        problems.append(f'site {c["client_id"]}: state {m.group(1) if m else "missing"} shown, {want} in the JSON')
    if c["failure"] and html.escape(c["failure"], quote=False) not in dom:
        problems.append(f'site {c["client_id"]}: its failure message is not shown')
states = {c["client_id"]: c["state"] for c in state["clients"]}
if states.get("site-c") != "CLIENT_STATE_FAILED":
    problems.append(f"site-c is {states.get('site-c')}, not CLIENT_STATE_FAILED")
if f"round {rounds} of {rounds}" not in dom or '<span class="phase finished"' not in dom:
    problems.append("the header does not say the run finished its rounds")
if problems:
    print("live_view_check: FAILED:\n  " + "\n  ".join(problems), file=sys.stderr)
    sys.exit(1)
print(f"live_view_check: the page shows {len(rows)} rounds, their accuracies and {len(state['clients'])} sites as the JSON has them")
EOF

mkdir -p "$(dirname "$SHOT")"
"${CHROME[@]}" --window-size=1280,900 --screenshot="$SHOT" "$URL" >/dev/null 2>>"$WORK/chromium.err" ||
  fail "chromium --screenshot failed: $(tail -n 3 "$WORK/chromium.err")"
[[ -s $SHOT ]] || fail "no screenshot at $SHOT"
echo "live_view_check: OK; screenshot $SHOT ($(stat -c %s "$SHOT") bytes)"
