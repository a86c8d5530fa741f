// Decoder-only transformers (LLaMA family: LLaMA, SmolLM, Qwen2) for causal language modelling,
// with LoRA adapters, on the CPU or a CUDA GPU (DecoderOptions::device).
//
//   DecoderOptions opts;                         // LoRA r8 on all seven projections
//   FEDLORA_ASSIGN_OR_RETURN(auto lm, CausalLm::Load("models/SmolLM2-135M-Instruct/"
//                                                    "SmolLM2-135M-Instruct.Q4_1.gguf", opts));
//   CausalLm::Batch batch{...};                 // ids from model/bpe_tokenizer.h; labels -100
//   lm->ZeroGrad();                              //   except on the response tokens
//   FEDLORA_ASSIGN_OR_RETURN(float loss, lm->ForwardBackward(batch, /*dropout_seed=*/step));
//   for (Param& p : lm->trainable_params()) { /* optimizer step on p.value with p.grad */ }
//
// The network is Hugging Face's LlamaForCausalLM (Qwen2ForCausalLM: plus q/k/v biases): token
// embeddings; N layers of x += o_proj(attention(rope(q_proj(n)), rope(k_proj(n)), v_proj(n))) with
// n = RMSNorm(x), causal grouped-query attention, then x += down_proj(silu(gate_proj(n)) *
// up_proj(n)) with n = RMSNorm(x); a final RMSNorm and the output head (tied to the embeddings or
// separate). LoRA (PEFT's lora.Linear: A kaiming-uniform, B zero, scale alpha / r) on any of the
// seven projections.
//
// The loss is transformers': logits at position t predict labels[t + 1]; the mean cross-entropy
// over targets that are not -100. The output head runs only on the rows that have a target, in
// chunks, so logits never take more than kLmHeadChunkRows x vocab floats.
//
// The frozen base (DecoderBase) holds its matrices as DecoderOptions::weights says: fp32, bf16, or
// as stored (a GGUF's Q4_1 / Q8_0 blocks stay 4 and 8 bits: QLoRA-style, the GEMMs widen panels of
// rows; model/frozen.h). LoRA weights, their gradients and all activations are fp32. The backward
// flows through the quantized weights to every layer's adapters.
//
// Memory: activations for (max_batch, max_seq) are planned once; a step allocates nothing. Per
// token and layer 2*hidden + 2*q_dim + 2*kv_dim + 2*intermediate floats are kept (the layer's
// input, x + attention, q, the attention output, k, v, gate, up) and rank floats per LoRA
// target; the norms' outputs, silu(gate) * up and the attention probabilities are recomputed in
// the backward (elementwise work and one Q K^T per layer). SmolLM2-135M: 23 KB a token and layer,
// 0.7 GB at 4 x 256 tokens. With recompute_activations only each layer's input is kept and the
// layer is recomputed in the backward (one more forward; the memory of one layer).
//
// Thread-safety: as BertClassifier: one CausalLm per thread at a time; many may share a base. CPU
// kernels run on the kernels' default pool, or on the one SetThreadPool gives.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/base/backend.h"
#include "kernels/mirror.h"
#include "model/bert.h"
#include "model/decoder_config.h"
#include "model/frozen.h"
#include "model/param.h"
#include "model/sampling.h"

namespace fedlora {

class DeviceParams;  // model/device_params.h

// The seven projections of a decoder layer that can carry LoRA, named as PEFT's target_modules.
enum class DecoderTarget { kQProj = 0, kKProj, kVProj, kOProj, kGateProj, kUpProj, kDownProj };
inline constexpr int kNumDecoderTargets = 7;
// "q_proj", ..., "down_proj".
const char* DecoderTargetName(DecoderTarget target);
// The module path inside one layer: "self_attn.q_proj", ..., "mlp.down_proj".
const char* DecoderTargetPath(DecoderTarget target);
// Accepts the names and the paths; InvalidArgument naming the text and the accepted names.
absl::StatusOr<DecoderTarget> ParseDecoderTarget(const std::string& name);

// Rows of logits computed at once by the output head (64 x 49,152 floats = 12.6 MB for SmolLM2).
inline constexpr int64_t kLmHeadChunkRows = 64;

struct DecoderOptions {
  // LoraOptions' rank, alpha and dropout; every projection.
  LoraOptions lora{.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                      "up_proj", "down_proj"}};
  WeightStorage weights = WeightStorage::kAsStored;
  uint64_t seed = 0;  // LoRA A initialisation; FromRandom's base weights
  // Largest batch and sequence length any call will use (generation: prompt + new tokens).
  int max_batch = 4;
  int max_seq = 256;
  bool recompute_activations = false;
  // Attention through kernels/fused_attention.h: the log-sum-exp of each row kept instead of the
  // [batch, heads, seq, seq] probabilities (memory grows with tokens, not seq^2). Unset: on for
  // kCuda, off for kCpu, where the materialising attention's GEMMs are faster. Same results up to
  // fp32 summation order.
  std::optional<bool> fused_attention;
  // Multiply with the frozen projections and the LM head in bf16 (activation operand rounded to
  // bf16, fp32 accumulation: kernels/gemm.h) on CPUs with AVX512_BF16 and on CUDA (cuBLASLt); the
  // exact fp32 products on other CPUs. Needs weights == kBF16 (a 4- or 8-bit GGUF base is then widened to bf16). LoRA
  // factors, gradients and the optimizer stay fp32. A property of the DecoderBase.
  bool bf16_math = false;
  // Multiply the forward products of the Q8_0 frozen matrices in int8 (the activation quantized
  // per block of 32, exact int32 block sums: kernels/gemm.h) on CPUs with AVX512-VNNI; the exact
  // products elsewhere and for the input gradients. Needs weights == kQ8_0. A property of the
  // DecoderBase; not with bf16_math.
  bool int8_math = false;
  std::string base_model_name;  // recorded in the PEFT adapter_config.json
  // Where the model computes, as ModelOptions::device (model/bert.h): training, evaluation and
  // greedy decoding. On kCuda, int8_math is refused (a CPU kernel; the CUDA GEMMs are fp32, or
  // bf16 through cuBLASLt with bf16_math).
  Device device = Device::kCpu;
};

// The frozen part: config and base weights. Immutable once built; share it between CausalLms.
class DecoderBase {
 public:
  // `path` is a directory with config.json and model.safetensors (or a sharded
  // model.safetensors.index.json), or a .gguf file. Reads DecoderOptions::weights, bf16_math and int8_math.
  static absl::StatusOr<std::shared_ptr<const DecoderBase>> Load(const std::string& path,
                                                                 const DecoderOptions& options);
  // Random weights (N(0, 0.02), norms 1, biases 0) from options.seed, for tests and benchmarks.
  static absl::StatusOr<std::shared_ptr<const DecoderBase>> FromRandom(
      const DecoderConfig& config, const DecoderOptions& options);
  ~DecoderBase();
  DecoderBase(const DecoderBase&) = delete;
  DecoderBase& operator=(const DecoderBase&) = delete;

  const DecoderConfig& config() const { return config_; }
  // Bytes of weight storage held (matrices at their storage type, fp32 norms and biases).
  int64_t weight_bytes() const;
  // A short description of the storage, e.g. "Q4_1 x 210, Q8_0 x 1, F32 x 61".
  std::string storage_summary() const;
  // DecoderOptions::bf16_math at load: GEMMs with the frozen matrices may run in bf16 (they do
  // on CUDA, and on the CPU where kernels::Bf16MathAvailable()).
  bool bf16_math() const { return bf16_math_; }
  // DecoderOptions::int8_math at load: forward GEMMs with the Q8_0 matrices may run in int8 (they
  // do where kernels::Int8MathAvailable()).
  bool int8_math() const { return int8_math_; }

  struct Weights;  // model/decoder_weights.h
  const Weights& weights() const { return *weights_; }
  // The frozen weights on `device`, as BertBase::WeightsOn.
  absl::StatusOr<std::shared_ptr<const kernels::DeviceMirror>> WeightsOn(Device device) const;

 private:
  friend absl::StatusOr<std::shared_ptr<const DecoderBase>> MakeDecoderBase(
      DecoderConfig config, std::unique_ptr<Weights> weights, bool bf16_math, bool int8_math);
  DecoderBase(DecoderConfig config, std::unique_ptr<Weights> weights, bool bf16_math,
              bool int8_math);
  DecoderConfig config_;
  std::unique_ptr<Weights> weights_;
  bool bf16_math_ = false;
  bool int8_math_ = false;
  kernels::MirrorCache mirrors_;
};

// Whether `path` names a decoder checkpoint: a .gguf file, or a directory whose config.json has a
// decoder model_type (IsDecoderConfig). Anything else is taken for a BERT-family encoder.
bool IsDecoderCheckpoint(const std::string& path);
bool IsGgufPath(const std::string& path);
// The architecture of a checkpoint DecoderBase::Load reads, without its weights.
absl::StatusOr<DecoderConfig> ReadDecoderCheckpointConfig(const std::string& path);
// The file model.sha256 covers: the .gguf itself, or the directory's model.safetensors.
std::string DecoderWeightsFile(const std::string& path);
// llama.cpp's converter stores LLaMA's q_proj / k_proj rows per head as interleaved pairs: its
// row h*D + 2i + j is Hugging Face's row h*D + j*(D/2) + i (j = 0, 1; i < D/2; D = head_dim). The
// Hugging Face row that GGUF row `row` holds.
int64_t HfRowOfGgufRow(int64_t row, int64_t head_dim);

class CausalLm {
 public:
  // Row-major [batch_size, seq_len]. Sequences are right-padded: attention_mask is 1...1 0...0
  // per row (empty: all 1). labels: -100 or a token id; empty means no loss (Logits/Generate).
  struct Batch {
    int batch_size = 0;
    int seq_len = 0;
    std::vector<int32_t> input_ids;
    std::vector<int32_t> attention_mask;
    std::vector<int32_t> labels;
  };
  struct LossSum {
    double nll = 0.0;    // summed over the targets
    int64_t tokens = 0;  // targets counted
  };
  struct GenerateOptions {
    int max_new_tokens = 64;
    std::vector<int32_t> stop_ids;  // generation ends after emitting one of these
    bool use_cache = true;          // false recomputes the whole sequence each step (tests)
    SamplingOptions sampling{};     // default: greedy
    // Called with each token as it is chosen (streaming); may be empty.
    std::function<void(int32_t)> on_token{};
  };

  static absl::StatusOr<std::unique_ptr<CausalLm>> Load(const std::string& path,
                                                        const DecoderOptions& options);
  static absl::StatusOr<std::unique_ptr<CausalLm>> Create(std::shared_ptr<const DecoderBase> base,
                                                          const DecoderOptions& options);
  ~CausalLm();
  CausalLm(const CausalLm&) = delete;
  CausalLm& operator=(const CausalLm&) = delete;

  // Training mode (LoRA dropout on, masks from dropout_seed): the mean loss over the batch's
  // targets; ADDS d(loss)/d(param) to every trainable param's grad. InvalidArgument when the
  // batch has no target.
  absl::StatusOr<float> ForwardBackward(const Batch& batch, uint64_t dropout_seed);
  // Eval mode: the summed loss and the number of targets (perplexity = exp(nll / tokens)).
  absl::StatusOr<LossSum> Evaluate(const Batch& batch);
  // Eval mode: logits at every position, [batch_size, seq_len, vocab_size].
  absl::StatusOr<std::vector<float>> Logits(const Batch& batch);
  // Greedy decoding of one prompt: the new tokens (the stop token included when one is hit).
  // prompt + max_new_tokens must fit in max_seq.
  absl::StatusOr<std::vector<int32_t>> Generate(const std::vector<int32_t>& prompt,
                                                const GenerateOptions& options);

  std::vector<Param>& trainable_params() { return params_; }
  const std::vector<Param>& trainable_params() const { return params_; }
  void ZeroGrad();
  // The params where the kernels read them (model/device_params.h): a training loop that steps
  // on the device holds them there between Acquire and Release.
  DeviceParams& device_params();
  // As BertClassifier::SetThreadPool.
  void SetThreadPool(ThreadPool* pool);
  const DecoderConfig& config() const { return base_->config(); }
  const DecoderOptions& options() const { return options_; }
  const std::shared_ptr<const DecoderBase>& base() const { return base_; }
  const std::vector<DecoderTarget>& lora_targets() const { return targets_; }

 private:
  struct Impl;
  CausalLm(std::shared_ptr<const DecoderBase> base, DecoderOptions options);

  std::shared_ptr<const DecoderBase> base_;
  DecoderOptions options_;
  std::vector<DecoderTarget> targets_;
  std::vector<Param> params_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fedlora
