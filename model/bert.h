// BERT-family encoder (BERT, MiniLM, RoBERTa) for sequence classification, with LoRA adapters, on
// the CPU or a CUDA GPU (ModelOptions::device).
//
//   ModelOptions opts;
//   opts.num_labels = 2;
//   opts.lora.rank = 8;                       // LoRA on query and value, as PEFT's default
//   FEDLORA_ASSIGN_OR_RETURN(auto model, BertClassifier::Load("models/all-MiniLM-L6-v2", opts));
//   BertClassifier::Batch batch{...};         // token ids from model/tokenizer.h
//   model->ZeroGrad();
//   FEDLORA_ASSIGN_OR_RETURN(float loss, model->ForwardBackward(batch, /*dropout_seed=*/step));
//   for (Param& p : model->trainable_params()) { /* optimizer step on p.value with p.grad */ }
//
// The network is Hugging Face's BertForSequenceClassification: embeddings (word + position +
// token type, LayerNorm, dropout), N encoder layers (self-attention with a padding mask, output
// dense + dropout + residual + LayerNorm, GELU feed-forward + dropout + residual + LayerNorm),
// the pooler (dense + tanh on [CLS]), dropout, and a linear classifier. For RoBERTa it is
// RobertaForSequenceClassification: positions start after pad_token_id, and the head is dropout,
// classifier.dense + tanh, dropout, classifier.out_proj (no pooler). LoRA (Hu et al. 2021) adds
// (alpha / r) * B A x to the chosen linear layers, with PEFT's initialisation (A kaiming-uniform,
// i.e. U(-1/sqrt(in), 1/sqrt(in)); B zero).
//
// Trainable: the LoRA A/B matrices and the classification head (PEFT's modules_to_save
// "classifier" for SEQ_CLS: classifier.{weight,bias} for BERT, classifier.dense.* and
// classifier.out_proj.* for RoBERTa). Every base weight, BERT's pooler included, is frozen: it is
// never copied per step and gets no gradient, though the backward pass flows through it down to
// the first layer's LoRA. The backward pass skips the weight gradients of frozen layers entirely
// and the input gradient of layer 0.
//
// Padding costs no work: when every sequence of a batch starts with a token (right padding, as
// the tokenizer pads), the encoder computes only the real tokens, packed row after row, with
// attention per sequence over its own tokens; the results are those of the padded batch (padding
// is masked out of attention either way). A batch with a sequence that starts with padding is
// computed in full under the mask (its first position, which the head reads, is then a pad).
//
// Memory: activations for (max_batch, max_seq) are allocated once by Load/FromRandom/Create and
// reused; a step allocates nothing. Per token and layer 8*hidden + 2*intermediate floats are kept
// for the backward pass, plus heads*seq floats of attention probabilities: at BERT-base geometry
// (768/3072, 12 heads, 12 layers) and 8 x 128 tokens that is 12 * 1024 * (12288 + 1536) * 4 B
// = 680 MB per classifier, next to 440 MB of fp32 weights (220 MB with bf16_weights) held once
// per BertBase.
//
// Sharing the base: the frozen weights live in a BertBase, immutable once built, which any number
// of classifiers (a simulator's pool of virtual clients, say) hold through one
// shared_ptr<const BertBase>. Each classifier owns only its trainable params, its activation
// buffers and its workspace:
//
//   FEDLORA_ASSIGN_OR_RETURN(auto base, BertBase::Load("models/all-MiniLM-L6-v2", opts));
//   FEDLORA_ASSIGN_OR_RETURN(auto a, BertClassifier::Create(base, opts));
//   FEDLORA_ASSIGN_OR_RETURN(auto b, BertClassifier::Create(base, opts));  // no second copy
//
// Thread-safety: one BertClassifier must be used by one thread at a time (its activation buffers
// are shared by all calls); classifiers sharing one BertBase may run on different threads at
// once, since nothing writes to a BertBase's weights after it is built (WeightsOn makes its GPU
// copy once, under a lock). CPU parallelism is inside the
// kernels (kernels::SetNumThreads), on the kernels' default pool unless SetThreadPool gives the
// classifier a pool of its own.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/tensor.h"  // fedlora::Device
#include "kernels/base/backend.h"
#include "kernels/mirror.h"
#include "model/bert_config.h"
#include "model/param.h"

namespace fedlora {

class ThreadPool;    // core/thread_pool.h
class DeviceParams;  // model/device_params.h

// A linear layer that can carry a LoRA adapter. The names are those of PEFT's target_modules
// where unambiguous; "attn_out" is BERT's attention.output.dense and "output" the FFN's
// output.dense (PEFT would need the full path to tell them apart).
enum class LoraTarget { kQuery = 0, kKey, kValue, kAttnOut, kIntermediate, kOutput };
inline constexpr int kNumLoraTargets = 6;
// "query", "key", "value", "attn_out", "intermediate", "output".
const char* LoraTargetName(LoraTarget target);
// The module path inside one encoder layer: "attention.self.query", "attention.output.dense",
// "intermediate.dense", "output.dense", ...
const char* LoraTargetPath(LoraTarget target);
// Accepts the names above and also the full paths ("attention.output.dense" etc.).
// InvalidArgument naming the text and the accepted names otherwise.
absl::StatusOr<LoraTarget> ParseLoraTarget(const std::string& name);

struct LoraOptions {
  int rank = 8;          // r; must be in [1, min(in, out)] of every target
  float alpha = 16.0f;   // the update is scaled by alpha / rank (PEFT's lora_alpha)
  float dropout = 0.0f;  // on the adapter input only (PEFT's lora_dropout), in [0, 1)
  std::vector<std::string> target_modules = {"query", "value"};
  // FFA-LoRA: every lora_A keeps its seeded (or loaded) values; its Param is marked frozen.
  bool freeze_a = false;
};

struct ModelOptions {
  int num_labels = 2;
  LoraOptions lora;
  // Hold the frozen base weights as bf16 (half the memory); activations and trainable
  // parameters stay fp32. Weights stored as F32 or F16 are rounded to nearest bf16 on load.
  // A property of the BertBase: BertClassifier::Create refuses a value that differs from its
  // base's.
  bool bf16_weights = false;
  // Multiply with the frozen matrices in bf16 (each GEMM's activation operand rounded to bf16,
  // fp32 accumulation: kernels/gemm.h) on CPUs with AVX512_BF16, about twice the fp32 rate, and
  // on CUDA (cuBLASLt); on other CPUs the exact fp32 products run. Needs bf16_weights. LoRA
  // factors, gradients and the optimizer stay fp32. A property of the BertBase, like bf16_weights.
  bool bf16_math = false;
  // Dropout probabilities in training mode; unset means the config's hidden_dropout_prob
  // (classifier_dropout for the classifier when the config has one) and
  // attention_probs_dropout_prob.
  std::optional<float> hidden_dropout;
  std::optional<float> attention_dropout;
  // Seeds the LoRA A initialisation and the classifier initialisation (N(0, 0.02), bias 0, as
  // HF's initializer_range), and the pooler when the checkpoint has none (FromRandom: every base
  // weight). When a BertBase drew weights from its seed, Create refuses a different one, so that
  // Create(BertBase::Load(dir, o), o) and BertClassifier::Load(dir, o) are the same model.
  uint64_t seed = 0;
  // Largest batch and sequence length any call will use; activations are planned for them and
  // scale with max_batch * max_seq: ~85 MB per 128-token sequence at BERT-base geometry, ~8 MB
  // for MiniLM-L6 (see Memory above).
  int max_batch = 32;
  int max_seq = 128;
  // Attention through kernels/fused_attention.h, one call per batch, each row's log-sum-exp kept
  // instead of the [batch, heads, seq, seq] probabilities. Unset: on for kCuda, off for kCpu
  // (where the materialising attention's GEMMs are faster). Same results up to fp32 summation
  // order.
  std::optional<bool> fused_attention;
  // Name of the base model recorded in the PEFT adapter_config.json.
  std::string base_model_name;
  // Where the classifier computes (kernels/base/backend.h). kCuda: activations, inputs and a copy of
  // the trainable params live on the GPU, the base's frozen weights are copied there once per
  // base and shared by its classifiers, and every call returns its results on the host (params'
  // values are uploaded before each call, gradients downloaded after ForwardBackward, except
  // while a training loop holds them on the device: device_params()).
  // FailedPrecondition from Create when CUDA is not usable. A property of each classifier.
  Device device = Device::kCpu;
};

enum class Pooling { kMean, kCls };

// The frozen part of a BERT-family encoder: its config and every base weight (word, position and
// token-type embeddings and their LayerNorm; per layer the six linears and two LayerNorms; BERT's
// pooler). Immutable after Load/FromRandom return, so one copy can serve many classifiers on many
// threads (see BertClassifier::Create). Of ModelOptions it reads only bf16_weights (the storage
// type), bf16_math and seed (a missing pooler, or FromRandom's weights); the other fields belong to each
// classifier.
class BertBase {
 public:
  // Reads model_dir/config.json and model_dir/model.safetensors with the checks described at
  // BertClassifier::Load (the same errors).
  static absl::StatusOr<std::shared_ptr<const BertBase>> Load(const std::string& model_dir,
                                                              const ModelOptions& options);
  // Random weights (N(0, 0.02); LayerNorm gains 1 and all biases 0, as HF initialises) from
  // options.seed, for tests and benchmarks.
  static absl::StatusOr<std::shared_ptr<const BertBase>> FromRandom(const BertConfig& config,
                                                                    const ModelOptions& options);
  ~BertBase();
  BertBase(const BertBase&) = delete;
  BertBase& operator=(const BertBase&) = delete;

  const BertConfig& config() const { return config_; }
  // True when the frozen matrices are held as bf16 (ModelOptions::bf16_weights at creation).
  bool bf16_weights() const { return bf16_weights_; }
  // True when GEMMs with the frozen matrices may run in bf16 (ModelOptions::bf16_math at
  // creation); they do on CUDA, and on the CPU where kernels::Bf16MathAvailable().
  bool bf16_math() const { return bf16_math_; }
  // The seed some of the weights were drawn from (FromRandom; Load of a checkpoint without a
  // pooler), or nullopt when every weight came from the checkpoint.
  const std::optional<uint64_t>& weight_seed() const { return weight_seed_; }
  // Bytes of weight storage this base holds (matrices at their storage type, fp32 biases and
  // LayerNorm parameters): the memory that every further classifier sharing it does not need.
  int64_t weight_bytes() const;
  // The frozen weights on `device`: on the CPU the host arrays themselves; on CUDA a copy made by
  // the first call and shared by every later one (thread-safe).
  absl::StatusOr<std::shared_ptr<const kernels::DeviceMirror>> WeightsOn(Device device) const;

 private:
  friend class BertClassifier;
  struct Weights;  // defined in bert_internal.h
  // Builds the base from `config`: from the checkpoint at weights_path, or random when it is null.
  static absl::StatusOr<std::shared_ptr<const BertBase>> Make(BertConfig config,
                                                              const ModelOptions& options,
                                                              const std::string* weights_path);
  BertBase(BertConfig config, bool bf16_weights, bool bf16_math);

  BertConfig config_;
  bool bf16_weights_ = false;
  bool bf16_math_ = false;
  std::optional<uint64_t> weight_seed_;
  std::unique_ptr<Weights> weights_;
  kernels::MirrorCache mirrors_;
};

class BertClassifier {
 public:
  // A batch of token sequences, all padded to seq_len. Row-major [batch_size, seq_len].
  struct Batch {
    int batch_size = 0;
    int seq_len = 0;
    std::vector<int32_t> input_ids;       // in [0, vocab_size)
    std::vector<int32_t> token_type_ids;  // empty means all zero; in [0, type_vocab_size)
    // 1 = token, 0 = padding; empty means all ones. Every sequence needs at least one token.
    // (RoBERTa's positions follow the pad id in input_ids, as in HF, not this mask.)
    std::vector<int32_t> attention_mask;
    std::vector<int32_t> labels;  // [batch_size]; needed by ForwardBackward only
  };

  // Reads model_dir/config.json and model_dir/model.safetensors. Tensor names may carry the
  // "bert." / "roberta." prefix (*For* checkpoints) or not (BertModel / sentence-transformers).
  // Every tensor's shape and dtype (F32, F16 or BF16) is checked against the config; errors list
  // the missing tensors by name. The pooler may be absent (sentence-transformers checkpoints can
  // lack it): it is then initialised as HF does for a missing weight (N(0, 0.02), bias 0) from
  // options.seed. Unused tensors (an MLM head, position_ids, RoBERTa's pooler) are ignored.
  // Equivalent to Create(BertBase::Load(model_dir, options), options), except that the options are
  // checked before the weights are read.
  static absl::StatusOr<std::unique_ptr<BertClassifier>> Load(const std::string& model_dir,
                                                              const ModelOptions& options);
  // Random base weights (N(0, 0.02); LayerNorm gains 1 and all biases 0, as HF initialises), for
  // tests and benchmarks.
  static absl::StatusOr<std::unique_ptr<BertClassifier>> FromRandom(const BertConfig& config,
                                                                    const ModelOptions& options);
  // A classifier on a shared base: its own LoRA adapters and head (initialised from options.seed),
  // activation buffers and workspace; the base's weights are read, never copied or written.
  // InvalidArgument when base is null, when an option is invalid for the base's config (as Load),
  // or when options disagree with the base: bf16_weights or bf16_math differs, or seed differs from the
  // base's weight_seed().
  static absl::StatusOr<std::unique_ptr<BertClassifier>> Create(
      std::shared_ptr<const BertBase> base, const ModelOptions& options);
  ~BertClassifier();
  BertClassifier(const BertClassifier&) = delete;
  BertClassifier& operator=(const BertClassifier&) = delete;

  // Training mode (dropout on, its masks drawn from dropout_seed): returns the mean cross-entropy
  // over the batch and ADDS d(loss)/d(param) to every trainable param's grad.
  absl::StatusOr<float> ForwardBackward(const Batch& batch, uint64_t dropout_seed);
  // Logit adjustment of the training loss (Menon et al. 2021, "Long-tail learning via logit
  // adjustment"; FedLC for federated label skew): ForwardBackward adds offsets[c] to class c's
  // logit before the softmax cross-entropy, so a model trained on skewed labels learns scores
  // that are not tilted towards its frequent classes. Logits() never adds them. Empty (the
  // default) turns it off. InvalidArgument unless empty or num_labels finite values.
  absl::Status SetTrainingLogitOffsets(std::vector<float> offsets);
  // Eval mode (no dropout): logits, row-major [batch_size, num_labels].
  absl::StatusOr<std::vector<float>> Logits(const Batch& batch);
  // Eval mode: the last hidden state pooled per sequence, [batch_size, hidden_size]: the mean over
  // the unpadded tokens (sentence-transformers' mean pooling) or the [CLS] vector.
  absl::StatusOr<std::vector<float>> PooledEmbeddings(const Batch& batch, Pooling pooling);

  // LoRA A/B per layer (in LoraTarget order), then the head. Values may be changed in place
  // (optimizers, adapter loading); the vector itself must keep its size and shapes.
  std::vector<Param>& trainable_params() { return params_; }
  const std::vector<Param>& trainable_params() const { return params_; }
  void ZeroGrad();
  // The params where the kernels read them (model/device_params.h): a training loop that steps
  // on the device holds them there between Acquire and Release.
  DeviceParams& device_params();
  // The pool this classifier's CPU kernels run on; null (the default): kernels::DefaultPool().
  // The pool must outlive its use here. Its width may change between calls: the kernels' results
  // do not depend on it (kernels/base/context.h). The simulator gives each pooled model one.
  void SetThreadPool(ThreadPool* pool);
  const BertConfig& config() const { return base_->config(); }
  const ModelOptions& options() const { return options_; }
  // The frozen base this classifier reads (shared with every classifier created from it).
  const std::shared_ptr<const BertBase>& base() const { return base_; }
  // The LoRA targets in use, in LoraTarget order.
  const std::vector<LoraTarget>& lora_targets() const { return targets_; }

 private:
  struct Impl;
  BertClassifier(std::shared_ptr<const BertBase> base, ModelOptions options);

  std::shared_ptr<const BertBase> base_;  // never null
  ModelOptions options_;
  std::vector<LoraTarget> targets_;
  std::vector<Param> params_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fedlora
