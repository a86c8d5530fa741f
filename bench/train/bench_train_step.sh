#!/usr/bin/env bash
# One training step (forward, backward, clip, AdamW) of fedlora vs PyTorch at MiniLM-L6 and
# BERT-base geometry, LoRA r8 on query,value, batch 8 x 128 tokens, fp32, same thread count.
#
#   bench/train/bench_train_step.sh [BUILD_DIR] [--threads N] [--geometries minilm,base] [--steps 5]
#
# Builds nothing: run `ninja -C BUILD_DIR train_step_bench` first (make bench does).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR=build/default
if [[ $# -gt 0 && $1 != --* ]]; then
  BUILD_DIR=$1
  shift
fi
exec /usr/bin/python3 scripts/bench_train_step.py --bench-bin "$BUILD_DIR/bench/train/train_step_bench" "$@"
