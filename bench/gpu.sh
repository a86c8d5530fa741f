#!/usr/bin/env bash
# The GPU benchmark (docs/benchmarks.md, "The engine on the GPU"): builds, runs every GPU test,
# then times on the GPU, each against a baseline measured in the same run:
#   1. federated averaging's exact accumulation of 100 updates against a device-to-device copy
#      (bench/kernels/aggregation_bench.cc), and the server's decode-and-add of sparsified updates,
#      the kept entries against the dense expansion (bench/aggregation/decode_add_bench.cc);
#   2. one LoRA training step (r8, batch 32) of MiniLM-L6, BERT-base and SmolLM2-135M geometry at
#      sequence 128 and 512: fedlora in fp32 and with bf16 math (the frozen base in bf16, cuBLASLt)
#      against Hugging Face transformers + PEFT in fp32 and with bf16 autocast, tokens/s and MFU against a cuBLAS bf16 GEMM peak measured in the run
#      (scripts/bench_hf_step.py --device cuda).
#
#   bench/gpu.sh OUT_FILE [BUILD_DIR]
#
# Prints the tables and writes them to OUT_FILE. Needs an NVIDIA GPU, the project's build
# dependencies (scripts/setup.sh) and a python3 with torch (CUDA), transformers, peft and numpy
# (PYTHON overrides which). Not yet timed on a GPU; the timings after the build are sized for 5
# minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $# -lt 1 || $1 == -* ]]; then
  echo "usage: bench/gpu.sh OUT_FILE [BUILD_DIR]" >&2
  exit 2
fi
OUT=$(realpath -m "$1")
BUILD_DIR=${2:-build/gpu}
PYTHON=${PYTHON:-python3}

if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "bench/gpu.sh: no NVIDIA GPU here (nvidia-smi -L failed)" >&2
  exit 1
fi
"$PYTHON" -c 'import torch, transformers, peft, numpy; assert torch.cuda.is_available()' || {
  echo "bench/gpu.sh: $PYTHON lacks torch with CUDA, transformers, peft or numpy" >&2
  exit 1
}

echo "== build ($BUILD_DIR)" >&2
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD_DIR"

echo "== GPU tests" >&2
# Every test labelled gpu must run here: a skip means the GPU was not usable to it.
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT
ctest --test-dir "$BUILD_DIR" -L gpu --output-on-failure -j 4 | tee "$LOG"
if grep -q "(Skipped)" "$LOG"; then
  echo "bench/gpu.sh: GPU tests skipped on a GPU machine" >&2
  exit 1
fi

{
  echo "# fedlora on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1), $(date -u +%F)"
  echo
  echo "## Exact aggregation of 100 updates against a device-to-device copy"
  echo
  "$BUILD_DIR/bench/kernels/kernels_aggregation_bench" cuda $((1 << 24)) 100 5
  echo
  echo "## Decoding and adding sparsified updates: the kept entries against the dense expansion"
  echo
  "$BUILD_DIR/bench/aggregation/aggregation_decode_add_bench" cuda $((1 << 24)) 16 3
  for seq in 128 512; do
    echo
    echo "## One LoRA training step, batch 32 x $seq"
    "$PYTHON" scripts/bench_hf_step.py --build-dir "$BUILD_DIR" --device cuda --batch 32 --seq "$seq" \
      --geometries minilm,base,smollm2 --hf-modes fp32,bf16 --fedlora-math fp32,bf16 --steps 5 --warmup 2 \
      --json-out "${OUT%.*}-seq$seq.json" | sed -n '/^batch /,$p'
  done
} | tee "$OUT"
