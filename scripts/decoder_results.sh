#!/usr/bin/env bash
# The decoder results of docs/results.md: SmolLM2-135M-Instruct (4-bit base, LoRA r8 on all seven
# projections) untuned, fine-tuned centrally with `fedlora train`, and fine-tuned by a simulated
# federation with `fedlora simulate`, with the same budget of optimizer steps of 8 conversations.
#
#   scripts/decoder_results.sh [BUILD_DIR] [wordnet|fortunes|lr|all]
#
# wordnet   "define X" -> gloss (data/wordnet), 8 sites = 8 WordNet domains (configs/wordnet_smollm2.json):
#           32 steps; response perplexity on 80 held-out words (data/wordnet/test_small.jsonl);
#           seeds 1, 2, 3.
# fortunes  classification by generation (configs/fortunes_smollm2.json): 16 steps on 128 fortunes,
#           4 sites holding 2 labels each; exact match on 80 held-out fortunes; seeds 1, 2, 3.
# lr        the learning rate compared for the defaults: WordNet and fortunes at 5e-4 (seed 1,
#           centralized; 2e-3 is the runs above).
# A step of 8 conversations takes about 9 s on two cores: `all` takes about an hour and 40 minutes.
# Outputs under runs/decoder_results/ (OUT_DIR); the last lines print the table.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build/default}
WHAT=${2:-all}
OUT=${OUT_DIR:-runs/decoder_results}
F="$BUILD_DIR/tools/fedlora"
M=models/SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf
SYS="Classify the fortune as one of: computers, definitions, men-women, politics, science, songs-poems, work, zippy."
for f in "$F" "$M" data/wordnet/train.jsonl data/wordnet/test_small.jsonl data/fortunes/train.jsonl; do
  [[ -e "$f" ]] || { echo "decoder results: $f is missing (make build; scripts/setup.sh)" >&2; exit 1; }
done
mkdir -p "$OUT"
python3 scripts/fortunes_subset.py --per-class 16 data/fortunes/train.jsonl "$OUT/fortunes_train128.jsonl" >/dev/null
python3 scripts/fortunes_subset.py --per-class 10 data/fortunes/test.jsonl "$OUT/fortunes_test80.jsonl" >/dev/null

# run NAME COMMAND...: runs once (a finished run's stamp skips it), its stdout in NAME.out.
run() {
  local name=$1; shift
  if [[ -f "$OUT/$name.done" ]]; then return; fi
  echo "decoder results: $name" >&2
  "$@" >"$OUT/$name.out" 2>"$OUT/$name.err"
  touch "$OUT/$name.done"
}

wordnet_central() {  # SEED LR
  run "wn-central-lr$2-s$1" "$F" train --model "$M" --train data/wordnet/train.jsonl \
    --eval data/wordnet/test_small.jsonl --max-steps 32 --batch-size 8 --lr "$2" --schedule constant \
    --max-seq-len 128 --seed "$1" --threads 2 --out "$OUT/wn-central-lr$2-s$1"
}
fortunes_central() {  # SEED LR (the recipe of the centralized fortunes row: warmup 2, linear decay)
  run "fo-central-lr$2-s$1" "$F" train --model "$M" --train "$OUT/fortunes_train128.jsonl" \
    --eval "$OUT/fortunes_test80.jsonl" --exact-match --prompt-field text --response-field label \
    --system "$SYS" --epochs 1 --batch-size 8 --lr "$2" --warmup-steps 2 --max-seq-len 128 \
    --seed "$1" --threads 2 --out "$OUT/fo-central-lr$2-s$1"
}

if [[ $WHAT == wordnet || $WHAT == all ]]; then
  run wn-untuned "$F" eval --model "$M" --data data/wordnet/test_small.jsonl --max-seq-len 128 --threads 2
  for s in 1 2 3; do
    wordnet_central "$s" 2e-3
    run "wn-fed-s$s" "$F" simulate --config configs/wordnet_smollm2.json --seed "$s" --out "$OUT/wn-fed-s$s" \
      --progress=false
  done
fi
if [[ $WHAT == fortunes || $WHAT == all ]]; then
  run fo-untuned "$F" eval --model "$M" --data "$OUT/fortunes_test80.jsonl" --prompt-field text \
    --response-field label --system "$SYS" --exact-match --max-seq-len 128 --threads 2
  for s in 1 2 3; do
    fortunes_central "$s" 2e-3
    run "fo-fed-s$s" "$F" simulate --config configs/fortunes_smollm2.json --seed "$s" --out "$OUT/fo-fed-s$s" \
      --progress=false
  done
fi
if [[ $WHAT == lr || $WHAT == all ]]; then
  wordnet_central 1 5e-4
  fortunes_central 1 5e-4
fi

python3 - "$OUT" <<'EOF'
import glob, json, os, sys
out = sys.argv[1]
def last_json(path):
    lines = [l for l in open(path) if l.startswith("{")]
    return json.loads(lines[-1]) if lines else None
rows = []
for name in sorted(os.listdir(out)):
    p = os.path.join(out, name)
    if name.endswith("-untuned.out"):
        r = last_json(p)
        rows.append((name[:-4], r.get("perplexity"), r.get("exact_match")))
    elif os.path.isfile(os.path.join(p, "metrics.json")):
        r = json.load(open(os.path.join(p, "metrics.json"))).get("final_eval", {})
        rows.append((name, r.get("perplexity"), r.get("exact_match")))
    elif os.path.isfile(os.path.join(p, "summary.json")):
        r = json.load(open(os.path.join(p, "summary.json")))
        rows.append((name, r.get("final_perplexity"), r.get("final_accuracy")))
print(f"{'run':28} {'perplexity':>10} {'exact_match':>11}")
for name, ppl, em in rows:
    f = lambda v, fmt: "-" if v is None else format(v, fmt)
    print(f"{name:28} {f(ppl, '10.3f')} {f(em, '11.4f')}")
EOF
