#!/usr/bin/env bash
# One LoRA training step of fedlora vs Hugging Face transformers + PEFT on PyPI's PyTorch (fp32
# and bf16 autocast) at MiniLM-L6, BERT-base and SmolLM2-135M geometry; see scripts/bench_hf_step.py.
#
#   bench/train/bench_hf_step.sh [BUILD_DIR] [--geometries minilm,base,smollm2] [--threads 2]
#                                [--steps 5] [--warmup 2] [--reps 1] [--fedlora-math fp32,bf16,int8]
#
# Builds nothing and installs nothing: run `scripts/setup.sh --bench` and build the
# train_step_bench and decoder_step_bench targets first (make bench-hf does all three).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR=build/default
if [[ $# -gt 0 && $1 != --* ]]; then
  BUILD_DIR=$1
  shift
fi
if [[ ! -x .venv-bench/bin/python ]]; then
  echo "bench_hf_step.sh: .venv-bench is missing: run scripts/setup.sh --bench" >&2
  exit 1
fi
exec .venv-bench/bin/python scripts/bench_hf_step.py --build-dir "$BUILD_DIR" "$@"
