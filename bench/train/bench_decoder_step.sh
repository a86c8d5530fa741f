#!/usr/bin/env bash
# One decoder LoRA training step and greedy generation at SmolLM2-135M geometry, fedlora (4-bit
# and fp32 base) vs transformers + PEFT on PyTorch; see scripts/bench_decoder_step.py.
#
#   bench/train/bench_decoder_step.sh [BUILD_DIR] [--threads N] [--reps 3] [--steps 3]
#
# Builds nothing: run `ninja -C BUILD_DIR decoder_step_bench` first (make bench does).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR=build/default
if [[ $# -gt 0 && $1 != --* ]]; then
  BUILD_DIR=$1
  shift
fi
exec .venv/bin/python scripts/bench_decoder_step.py --bench-bin "$BUILD_DIR/bench/train/decoder_step_bench" "$@"
