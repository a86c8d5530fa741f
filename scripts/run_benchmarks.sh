#!/usr/bin/env bash
# Runs every benchmark of docs/benchmarks.md against BUILD_DIR (default build/default). Each one
# validates its result first, then times it, and prints the figure with its ratio against a
# baseline measured in the same run.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build/default}
ninja -C "$BUILD_DIR" core_sha256_bench kernels_lora_bench compression_codec_bench aggregation_decode_add_bench aggregation_robust_bench train_step_bench decoder_step_bench \
  server_upload_ingest_bench crypto_secagg_bench server_secagg_round_bench >/dev/null
echo "== SHA-256 of each chunk and the whole blob in one pass vs two OpenSSL passes (bench/core)"
"$BUILD_DIR/bench/core/core_sha256_bench"
echo "== LoRA linear forward+backward vs OpenBLAS sgemm (bench/kernels)"
"$BUILD_DIR/bench/kernels/kernels_lora_bench"
echo "== update codecs: encode / decode vs memcpy (bench/compression)"
"$BUILD_DIR/bench/compression/compression_codec_bench"
echo "== the server's decode-and-add of sparsified updates: kept entries vs dense expansion (bench/aggregation)"
"$BUILD_DIR/bench/aggregation/aggregation_decode_add_bench"
echo "== a round with each robust rule vs FedAvg's exact streaming mean (bench/aggregation)"
"$BUILD_DIR/bench/aggregation/aggregation_robust_bench"
echo "== training step vs PyTorch (bench/train)"
bench/train/bench_train_step.sh "$BUILD_DIR"
echo "== decoder training step and generation vs transformers + PEFT (bench/train)"
bench/train/bench_decoder_step.sh "$BUILD_DIR"
echo "== upload ingest vs raw gRPC loopback (bench/server)"
"$BUILD_DIR/bench/server/server_upload_ingest_bench"
"$BUILD_DIR/bench/server/server_upload_ingest_bench" 1gb
echo "== secure aggregation: SecAgg+ steps in process vs a plain sum (bench/crypto)"
"$BUILD_DIR/bench/crypto/crypto_secagg_bench"
echo "== secure aggregation: a round through the server vs the same round in plaintext (bench/server)"
"$BUILD_DIR/bench/server/server_secagg_round_bench"
