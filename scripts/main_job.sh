#!/usr/bin/env bash
# The README's main job: federated LoRA fine-tuning of all-MiniLM-L6-v2 on the fortunes corpus,
# simulated on this machine (10 non-IID clients, Dirichlet alpha 0.5, over the real protocol),
# compared with the same model fine-tuned centrally on the pooled data with the same budget of
# examples seen, and with the untuned model (the random head on the frozen encoder: round 0).
#
#   scripts/setup.sh && make build && scripts/main_job.sh build/default
#
# About 10-15 minutes on 2 CPU cores. Outputs go to runs/main_job/ (override with OUT_DIR). The
# console shows progress, the per-round table and the comparison; the federation's server and
# clients log to runs/main_job/federated/server.log (WARNING and ERROR lines also reach the console).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build/default}
OUT_DIR=${OUT_DIR:-runs/main_job}
CONFIG=${CONFIG:-configs/default.json}
FEDLORA="$BUILD_DIR/tools/fedlora"
PYTHON=${PYTHON:-python3}

if [[ ! -x "$FEDLORA" ]]; then
  echo "main job: $FEDLORA not found; build first (make build, or ninja -C $BUILD_DIR fedlora)" >&2
  exit 1
fi
for f in models/all-MiniLM-L6-v2/model.safetensors data/fortunes/train.jsonl data/fortunes/test.jsonl; do
  if [[ ! -f "$f" ]]; then
    echo "main job: $f is missing; run scripts/setup.sh first" >&2
    exit 1
  fi
done
mkdir -p "$OUT_DIR"

# Read the training budget from the config so that the centralized baseline sees exactly as many
# examples: rounds x clients_per_round x local_steps x batch_size.
# The centralized run decays its learning rate over its steps as the federation decays the
# clients' rate over its rounds (training.round_schedule).
read -r ROUNDS PER_ROUND LOCAL_STEPS BATCH LR SEQ SEED SCHEDULE < <("$PYTHON" - "$CONFIG" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
t = c["training"]
print(c["rounds"], c["selection"]["clients_per_round"], t["local_steps"], t["batch_size"],
      t["learning_rate"], c["model"]["max_seq_len"], c["seed"], t.get("round_schedule", "CONSTANT").lower())
EOF
)
CENTRAL_STEPS=$((ROUNDS * PER_ROUND * LOCAL_STEPS))
# The centralized baseline trains at its own best learning rate among those measured on this task
# (docs/results.md: 2e-3 reaches 0.78 in 480 steps, the federation's 5e-3 only 0.68), so that the
# federation is compared with the strongest baseline we know rather than a handicapped one.
CENTRAL_LR=${CENTRAL_LR:-0.002}

echo "== centralized: $CENTRAL_STEPS steps of $BATCH on the pooled data (same examples seen), lr $CENTRAL_LR" >&2
"$FEDLORA" train --model models/all-MiniLM-L6-v2 --train data/fortunes/train.jsonl \
  --eval data/fortunes/test.jsonl --out "$OUT_DIR/central" --max-steps "$CENTRAL_STEPS" \
  --batch-size "$BATCH" --lr "$CENTRAL_LR" --max-seq-len "$SEQ" --seed "$SEED" --schedule "$SCHEDULE" \
  --weight-decay 0 --warmup-steps 0 --rank 8 --alpha 16 --targets query,value --no-progress >/dev/null
CENTRAL_ACC=$("$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["final_eval"]["accuracy"])' \
  "$OUT_DIR/central/metrics.json")

# The plot draws the centralized accuracy across the federation's rounds.
echo "== federated: $CONFIG ($ROUNDS rounds x $PER_ROUND clients x $LOCAL_STEPS local steps of $BATCH)" >&2
"$FEDLORA" simulate --config "$CONFIG" --out "$OUT_DIR/federated" --reference "centralized=$CENTRAL_ACC"

"$PYTHON" - "$OUT_DIR" "$CONFIG" "$CENTRAL_LR" <<'EOF'
import json, sys
out, config, central_lr = sys.argv[1], sys.argv[2], sys.argv[3]
fed = json.load(open(f"{out}/federated/summary.json"))
central = json.load(open(f"{out}/central/metrics.json"))
rows = [
    ("untuned (round 0: random head, frozen encoder)", fed["initial_accuracy"]),
    (f"federated ({config}, {len(fed['rounds']) - 1} rounds)", fed["final_accuracy"]),
    (f"centralized (pooled data, same examples seen, lr {central_lr})", central["final_eval"]["accuracy"]),
]
print()
print(f"{'model':<64} {'held-out accuracy':>18}")
for name, acc in rows:
    print(f"{name:<64} {acc:>18.4f}")
print(f"\nfederated - centralized: {100 * (fed['final_accuracy'] - central['final_eval']['accuracy']):+.2f} points")
print(f"per-round report: {out}/federated/rounds.csv, plot: {out}/federated/rounds.svg, "
      f"log: {out}/federated/server.log")
EOF
