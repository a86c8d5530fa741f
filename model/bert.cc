#include "model/bert.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "core/tensor.h"
#include "kernels/activation.h"
#include "kernels/attention.h"
#include "kernels/backend.h"
#include "kernels/context.h"
#include "kernels/cross_entropy.h"
#include "kernels/dropout.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/layernorm.h"
#include "kernels/linear.h"
#include "kernels/lora_linear.h"
#include "model/bert_internal.h"
#include "model/device_params.h"
#include "model/frozen.h"

namespace fedlora {

using bert_internal::InOut;
using bert_internal::kAllTargets;
using bert_internal::kStreamClassifier;
using bert_internal::kStreamLoraBase;
using bert_internal::kStreamPooler;
using bert_internal::LayerWeights;

namespace {

// Every dropout site of a step draws from its own core/rng.h stream (seed = the step's dropout
// seed), so no two sites share a mask and the backward recomputes each forward mask exactly.
kernels::DropoutSpec Spec(float p, uint64_t seed, uint64_t site) {
  return kernels::DropoutSpec{.p = p, .seed = seed, .offset = 0, .stream = site};
}
enum Site : uint64_t {
  kSiteEmbedding = 0,
  kSiteClassifier = 1,
  kSiteHeadInput = 2,   // RoBERTa's head: dropout on the <s> vector before its dense layer
  kSiteLayerBase = 16,  // + layer * kSitesPerLayer + one of the below
  kSitesPerLayer = 16,
  kSiteAttnProbs = 0,
  kSiteAttnOut = 1,
  kSiteFfnOut = 2,
  kSiteLora = 8,  // + target index
};
uint64_t LayerSite(int layer, uint64_t site) {
  return kSiteLayerBase + layer * kSitesPerLayer + site;
}

}  // namespace

// --- Names ---------------------------------------------------------------------------------------

const char* LoraTargetName(LoraTarget target) {
  switch (target) {
    case LoraTarget::kQuery:
      return "query";
    case LoraTarget::kKey:
      return "key";
    case LoraTarget::kValue:
      return "value";
    case LoraTarget::kAttnOut:
      return "attn_out";
    case LoraTarget::kIntermediate:
      return "intermediate";
    case LoraTarget::kOutput:
      return "output";
  }
  return "?";
}

const char* LoraTargetPath(LoraTarget target) {
  switch (target) {
    case LoraTarget::kQuery:
      return "attention.self.query";
    case LoraTarget::kKey:
      return "attention.self.key";
    case LoraTarget::kValue:
      return "attention.self.value";
    case LoraTarget::kAttnOut:
      return "attention.output.dense";
    case LoraTarget::kIntermediate:
      return "intermediate.dense";
    case LoraTarget::kOutput:
      return "output.dense";
  }
  return "?";
}

absl::StatusOr<LoraTarget> ParseLoraTarget(const std::string& name) {
  for (LoraTarget t : kAllTargets) {
    if (name == LoraTargetName(t) || name == LoraTargetPath(t)) return t;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown LoRA target module \"", name,
      "\" (accepted: query, key, value, attn_out, intermediate, output, or their paths such as "
      "attention.output.dense)"));
}

// --- Construction
// ----------------------------------------------------------------------------------

namespace {

// The classifier's options against the base's config: everything but bf16_weights and seed, which
// belong to the base (BertClassifier::Create compares those with the base's).
absl::Status ValidateOptions(const BertConfig& config, const ModelOptions& o) {
  if (o.num_labels < 1 || o.num_labels > 1 << 20) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_labels must be in [1, 2^20], got ", o.num_labels));
  }
  if (o.max_batch < 1 || o.max_seq < 1) {
    return absl::InvalidArgumentError(absl::StrCat("max_batch and max_seq must be positive, got ",
                                                   o.max_batch, " and ", o.max_seq));
  }
  if (o.max_seq > config.max_sequence_length()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_seq ", o.max_seq, " exceeds the ", config.max_sequence_length(),
        " positions of the model (max_position_embeddings ", config.max_position_embeddings, ")"));
  }
  const int64_t min_dim = std::min(config.hidden_size, config.intermediate_size);
  if (o.lora.rank < 1 || o.lora.rank > min_dim) {
    return absl::InvalidArgumentError(
        absl::StrCat("LoRA rank must be in [1, ", min_dim, "] for this model, got ", o.lora.rank));
  }
  if (!std::isfinite(o.lora.alpha)) return absl::InvalidArgumentError("LoRA alpha must be finite");
  auto probability = [](std::optional<float> p, float fallback, const char* what) -> absl::Status {
    const float v = p.value_or(fallback);
    if (!(v >= 0.0f && v < 1.0f)) {
      return absl::InvalidArgumentError(absl::StrCat(what, " must be in [0, 1), got ", v));
    }
    return absl::OkStatus();
  };
  FEDLORA_RETURN_IF_ERROR(probability(o.lora.dropout, 0.0f, "LoRA dropout"));
  FEDLORA_RETURN_IF_ERROR(probability(o.hidden_dropout, 0.0f, "hidden_dropout"));
  FEDLORA_RETURN_IF_ERROR(probability(o.attention_dropout, 0.0f, "attention_dropout"));
  for (const std::string& name : o.lora.target_modules) {
    FEDLORA_RETURN_IF_ERROR(ParseLoraTarget(name).status());
  }
  return absl::OkStatus();
}

}  // namespace

// --- Impl ----------------------------------------------------------------------------------------

struct BertClassifier::Impl {
  Impl(const BertConfig& c, const ModelOptions& o, std::vector<Param>& p,
       const BertBase::Weights& w)
      : config(c),
        options(o),
        params(p),
        word_emb(w.word_emb),
        pos_emb(w.pos_emb),
        type_emb(w.type_emb),
        emb_ln_gamma(w.emb_ln_gamma),
        emb_ln_beta(w.emb_ln_beta),
        layers(w.layers),
        pooler(w.pooler) {}

  const BertConfig& config;
  const ModelOptions& options;
  std::vector<Param>& params;
  // The device this classifier computes on, and its context (its stream; on the CPU, the kernels'
  // default pool unless SetThreadPool gave one). Declared before every array it allocates.
  std::shared_ptr<kernels::Backend> backend;
  kernels::ExecContext ctx;

  bool use_target[kNumLoraTargets] = {};
  float lora_scaling = 1.0f;  // alpha / rank
  float hidden_p = 0.0f, attention_p = 0.0f, classifier_p = 0.0f, lora_p = 0.0f;

  // Frozen base weights: read-only views into the shared BertBase, which outlives this Impl (the
  // classifier holds it by shared_ptr) and is never written after it was built.
  const FrozenMatrix& word_emb;
  const FrozenMatrix& pos_emb;
  const FrozenMatrix& type_emb;
  const std::vector<float>& emb_ln_gamma;
  const std::vector<float>& emb_ln_beta;
  const std::vector<LayerWeights>& layers;
  const FrozenLinear& pooler;  // BERT: frozen dense + tanh on [CLS]; unused for RoBERTa
  // The same weights where the kernels read them: the host arrays above on the CPU, the base's
  // device copies on a GPU (BertBase::WeightsOn). Set by BindWeights.
  struct DevLinear {
    kernels::WeightPtr w;
    const float* bias = nullptr;
  };
  struct DevLayer {
    DevLinear lin[kNumLoraTargets];
    const float *ln1_gamma = nullptr, *ln1_beta = nullptr, *ln2_gamma = nullptr, *ln2_beta = nullptr;
  };
  std::shared_ptr<const kernels::DeviceMirror> mirror;
  kernels::WeightPtr dev_word, dev_pos, dev_type;
  const float *dev_emb_gamma = nullptr, *dev_emb_beta = nullptr;
  std::vector<DevLayer> dev_layers;
  DevLinear dev_pooler;
  // Where the kernels read and write the trainable params (model/device_params.h).
  DeviceParams dev_params{params};
  // [layer][LoraTarget]: index of lora_A in params (lora_B follows), -1 without LoRA.
  std::vector<std::array<int, kNumLoraTargets>> lora_param;
  int head_dense_param =
      -1;  // RoBERTa: trainable classifier.dense (weight, bias next); -1 for BERT
  int classifier_param = -1;  // the final linear: weight at params[classifier_param], bias next
  // The rows a call computes. A padding token never changes a real token's value (its key gets
  // the mask's -1e30, so its attention weight is exactly 0) and the head reads only each
  // sequence's first position, so when every sequence starts with a real token the padding is
  // left out: the real tokens are packed into `rows` rows, sequence s's at [start[s], start[s] +
  // len[s]), and attention runs per sequence over its own tokens. Otherwise (no padding at all,
  // or a sequence starting with padding, whose state the head reads) every position is a row,
  // attention runs once for the batch, and the mask applies where there is padding.
  struct Layout {
    int64_t rows = 0;
    bool packed = false;
    bool masked = false;  // some row is padding: attention needs mask_host
    std::vector<int64_t> start, len;
  };
  Layout layout;
  // Per row: token, token type and position ids (BERT: the index in its sequence; RoBERTa: HF's
  // create_position_ids_from_input_ids), and the attention mask (0, or -1e30 for padding).
  std::vector<int32_t> row_ids, row_types, row_positions;
  // The batch's inputs on the device (GPU only: the CPU reads the host vectors).
  kernels::DeviceArray<int32_t> dev_ids, dev_types, dev_positions, dev_labels;

  // Saved activations per layer, sized for max_batch * max_seq tokens (T) by Plan().
  using Array = kernels::DeviceArray<float>;
  struct LayerActs {
    Array q, k, v;                  // [T, H] projections (bias and LoRA included)
    Array lora_h[kNumLoraTargets];  // [T, r] dropout(x) A^T, for the LoRA backward
    Array probs;                    // [B, heads, S, S] softmax before dropout
    Array ctx;                      // [T, H] attention output
    Array z1, mean1, rstd1;         // LN1 input [T, H] and statistics [T]
    Array h1;                       // [T, H] LN1 output
    Array u, g;                     // [T, I] intermediate before / after GELU
    Array z2, mean2, rstd2;         // LN2 input and statistics
  };
  std::vector<LayerActs> acts;
  std::vector<Array> x;  // [L + 1][T, H]: x[0] embeddings output, x[l+1] layer l's output
  std::vector<float> mask_host;  // [rows] additive attention mask: 0 keep, -1e30 padding
  Array mask_add;                // mask_host on the device (GPU only)
  Array cls, pooled, cls_drop, logits;  // [B, H] x3, [B, labels]
  Array loss_value;                     // [1]
  // Training loss only: per-class offsets added to the logits before the cross-entropy (logit
  // adjustment), and the head bias with them added; empty when unset.
  std::vector<float> loss_logit_offsets, adjusted_bias_host;
  Array adjusted_bias;  // [labels]
  // Backward scratch.
  Array dx, dh, dz, dctx, dq, dk, dv, dg;  // [T, H] ..., dg [T, I]
  Array dlogits, dcls, dpooled;            // [B, labels], [B, H], [B, H]
  kernels::DeviceArray<uint8_t> workspace_storage;
  void* workspace = nullptr;  // workspace_storage.data() (256-byte aligned)
  size_t workspace_bytes = 0;

  int64_t H() const { return config.hidden_size; }
  int64_t I() const { return config.intermediate_size; }
  int64_t L() const { return config.num_hidden_layers; }
  int64_t r() const { return options.lora.rank; }

  absl::Status InitStructure(std::vector<LoraTarget>* targets);
  // The backend for options.device, and the frozen weights' pointers in `weights` (the base's
  // arrays on that device).
  absl::Status BindWeights(std::shared_ptr<const kernels::DeviceMirror> weights);
  absl::Status Plan();
  bool on_host() const { return backend->device() == Device::kCpu; }
  float* Val(int i) { return dev_params.Value(i); }
  float* Grad(int i) { return dev_params.Grad(i); }
  template <class T>
  absl::StatusOr<const T*> Stage(const std::vector<T>& host, size_t count, kernels::DeviceArray<T>& dev) {
    return fedlora::Stage(*backend, host, count, dev);
  }
  absl::Status CheckBatch(const Batch& batch, bool need_labels) const;
  // The layout and the per-row ids and mask of a checked batch.
  void Arrange(const Batch& batch);
  absl::Status Encode(const Batch& batch, bool training, uint64_t seed);
  // The head's logits; with_loss: the cross-entropy into loss_value (on the device) and dlogits.
  absl::Status Head(const Batch& batch, bool training, uint64_t seed, bool with_loss);
  absl::Status Backward(const Batch& batch, uint64_t seed);

  kernels::DropoutSpec HiddenDropout(bool training, uint64_t seed, uint64_t site) const {
    return Spec(training ? hidden_p : 0.0f, seed, site);
  }
  absl::Status LinearForward(int layer, LoraTarget t, const float* in, int64_t rows, float* y,
                             bool training, uint64_t seed);
  // Layer l's self-attention over the layout's rows: a.ctx and a.probs from a.q, a.k, a.v; one
  // call for the whole batch (masked), or one per sequence (packed).
  absl::Status Attention(int l, int64_t bsz, int64_t seq, const float* mask, bool training, uint64_t seed,
                         LayerActs& a);
  // Its backward: dq, dk, dv from dctx.
  absl::Status AttentionBackward(int l, int64_t bsz, int64_t seq, uint64_t seed, LayerActs& a);
  absl::Status LinearBackward(int layer, LoraTarget t, const float* in, const float* dy,
                              int64_t rows, float* dx, bool accumulate_dx, uint64_t seed);
};

absl::Status BertClassifier::Impl::InitStructure(std::vector<LoraTarget>* targets) {
  const BertConfig& c = config;
  const ModelOptions& o = options;
  FEDLORA_RETURN_IF_ERROR(ValidateOptions(c, o));
  for (const std::string& name : o.lora.target_modules) {
    FEDLORA_ASSIGN_OR_RETURN(LoraTarget t, ParseLoraTarget(name));
    use_target[static_cast<int>(t)] = true;
  }
  targets->clear();
  for (LoraTarget t : kAllTargets) {
    if (use_target[static_cast<int>(t)]) targets->push_back(t);
  }
  lora_scaling = o.lora.alpha / static_cast<float>(o.lora.rank);
  hidden_p = o.hidden_dropout.value_or(static_cast<float>(c.hidden_dropout_prob));
  attention_p = o.attention_dropout.value_or(static_cast<float>(c.attention_probs_dropout_prob));
  // An explicit option wins over the config's classifier_dropout, which wins over hidden_p.
  classifier_p = o.hidden_dropout.has_value() || c.classifier_dropout < 0.0
                     ? hidden_p
                     : static_cast<float>(c.classifier_dropout);
  lora_p = o.lora.dropout;

  const int64_t h = c.hidden_size;
  std::array<int, kNumLoraTargets> none;
  none.fill(-1);
  lora_param.assign(c.num_hidden_layers, none);
  params.clear();
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    for (LoraTarget t : kAllTargets) {
      const int ti = static_cast<int>(t);
      if (!use_target[ti]) continue;
      int64_t in, out;
      InOut(c, t, &in, &out);
      lora_param[l][ti] = static_cast<int>(params.size());
      const std::string base =
          absl::StrCat("base_model.model.", c.is_roberta() ? "roberta" : "bert", ".encoder.layer.",
                       l, ".", LoraTargetPath(t));
      Param a{base + ".lora_A.weight",
              {o.lora.rank, in},
              std::vector<float>(o.lora.rank * in),
              std::vector<float>(o.lora.rank * in, 0.0f),
              true};
      // PEFT: nn.init.kaiming_uniform_(A, a=sqrt(5)) -> bound = sqrt(6 / ((1 + 5) * fan_in)).
      FillUniform(o.seed, kStreamLoraBase + l * kNumLoraTargets + ti,
                  1.0f / std::sqrt(static_cast<float>(in)), &a.value);
      Param b{base + ".lora_B.weight",
              {out, o.lora.rank},
              std::vector<float>(out * o.lora.rank, 0.0f),
              std::vector<float>(out * o.lora.rank, 0.0f),
              true};
      params.push_back(std::move(a));
      params.push_back(std::move(b));
    }
  }
  // The head. BERT: classifier.{weight,bias} on the pooler's output. RoBERTa
  // (RobertaClassificationHead): classifier.dense + tanh, then classifier.out_proj; PEFT saves
  // the whole "classifier" module (modules_to_save), so both of its linears are trainable.
  // HF initialises them with N(0, initializer_range = 0.02) and zero biases.
  auto add_linear = [&](const std::string& name, int64_t out, int64_t in, uint64_t stream) {
    const int index = static_cast<int>(params.size());
    Param w{name + ".weight",
            {out, in},
            std::vector<float>(out * in),
            std::vector<float>(out * in, 0.0f),
            false};
    FillNormal(o.seed, stream, 0.02f, &w.value);
    Param b{
        name + ".bias", {out}, std::vector<float>(out, 0.0f), std::vector<float>(out, 0.0f), false};
    params.push_back(std::move(w));
    params.push_back(std::move(b));
    return index;
  };
  if (c.is_roberta()) {
    head_dense_param = add_linear("base_model.model.classifier.dense", h, h, kStreamPooler);
    classifier_param =
        add_linear("base_model.model.classifier.out_proj", o.num_labels, h, kStreamClassifier);
  } else {
    classifier_param =
        add_linear("base_model.model.classifier", o.num_labels, h, kStreamClassifier);
  }
  return absl::OkStatus();
}

absl::Status BertClassifier::Impl::Plan() {
  const int64_t tokens = static_cast<int64_t>(options.max_batch) * options.max_seq;
  const int64_t h = H(), inter = I(), heads = config.num_attention_heads;
  const int64_t probs =
      static_cast<int64_t>(options.max_batch) * heads * options.max_seq * options.max_seq;
  kernels::Backend& be = *backend;
  auto zeros = [&](auto* array, int64_t count) -> absl::Status {
    using A = std::remove_pointer_t<decltype(array)>;
    FEDLORA_ASSIGN_OR_RETURN(*array, A::Zeros(be, static_cast<size_t>(count)));
    return absl::OkStatus();
  };
  acts.resize(L());
  for (LayerActs& a : acts) {
    for (Array* v : {&a.q, &a.k, &a.v, &a.ctx, &a.z1, &a.h1, &a.z2}) FEDLORA_RETURN_IF_ERROR(zeros(v, tokens * h));
    for (Array* v : {&a.mean1, &a.rstd1, &a.mean2, &a.rstd2}) FEDLORA_RETURN_IF_ERROR(zeros(v, tokens));
    FEDLORA_RETURN_IF_ERROR(zeros(&a.u, tokens * inter));
    FEDLORA_RETURN_IF_ERROR(zeros(&a.g, tokens * inter));
    FEDLORA_RETURN_IF_ERROR(zeros(&a.probs, probs));
    for (int t = 0; t < kNumLoraTargets; ++t) {
      if (use_target[t]) FEDLORA_RETURN_IF_ERROR(zeros(&a.lora_h[t], tokens * r()));
    }
  }
  x.resize(L() + 1);
  for (Array& xl : x) FEDLORA_RETURN_IF_ERROR(zeros(&xl, tokens * h));
  mask_host.assign(tokens, 0.0f);
  for (auto* v : {&row_ids, &row_types, &row_positions}) v->assign(tokens, 0);
  for (Array* v : {&cls, &pooled, &cls_drop, &dcls, &dpooled})
    FEDLORA_RETURN_IF_ERROR(zeros(v, options.max_batch * h));
  FEDLORA_RETURN_IF_ERROR(zeros(&logits, options.max_batch * options.num_labels));
  FEDLORA_RETURN_IF_ERROR(zeros(&dlogits, options.max_batch * options.num_labels));
  FEDLORA_RETURN_IF_ERROR(zeros(&loss_value, 1));
  for (Array* v : {&dx, &dh, &dz, &dctx, &dq, &dk, &dv}) FEDLORA_RETURN_IF_ERROR(zeros(v, tokens * h));
  FEDLORA_RETURN_IF_ERROR(zeros(&dg, tokens * inter));
  if (!on_host()) {
    FEDLORA_RETURN_IF_ERROR(zeros(&mask_add, tokens));
    FEDLORA_RETURN_IF_ERROR(zeros(&dev_ids, tokens));
    FEDLORA_RETURN_IF_ERROR(zeros(&dev_types, tokens));
    FEDLORA_RETURN_IF_ERROR(zeros(&dev_positions, tokens));
    FEDLORA_RETURN_IF_ERROR(zeros(&dev_labels, options.max_batch));
    FEDLORA_RETURN_IF_ERROR(zeros(&adjusted_bias, options.num_labels));
  }
  FEDLORA_RETURN_IF_ERROR(dev_params.Bind(be));

  // Workspace: the largest any kernel of a step asks for at the planned sizes (every
  // requirement grows with the row count, so a smaller batch fits too).
  size_t need = 0;
  for (LoraTarget t : kAllTargets) {
    const int ti = static_cast<int>(t);
    int64_t in, out;
    InOut(config, t, &in, &out);
    const kernels::WeightPtr w = layers[0].lin[ti].w.ptr();
    if (use_target[ti]) {
      kernels::LoraLinearForwardArgs f{.rows = tokens,
                                       .in_features = in,
                                       .out_features = out,
                                       .rank = r(),
                                       .w = w,
                                       .dropout = {lora_p, 0, 0}};
      kernels::LoraLinearBackwardArgs b{.rows = tokens,
                                        .in_features = in,
                                        .out_features = out,
                                        .rank = r(),
                                        .w = w,
                                        .dropout = {lora_p, 0, 0}};
      need = std::max(
          {need, kernels::LoraLinearWorkspaceBytes(f), kernels::LoraLinearWorkspaceBytes(b)});
    } else {
      kernels::LinearForwardArgs f{.rows = tokens, .in_features = in, .out_features = out, .w = w};
      kernels::LinearBackwardArgs b{.rows = tokens, .in_features = in, .out_features = out, .w = w};
      need = std::max({need, kernels::LinearWorkspaceBytes(f), kernels::LinearWorkspaceBytes(b)});
    }
  }
  if (!config.is_roberta()) {
    kernels::LinearForwardArgs f{
        .rows = options.max_batch, .in_features = h, .out_features = h, .w = pooler.w.ptr()};
    kernels::LinearBackwardArgs b{
        .rows = options.max_batch, .in_features = h, .out_features = h, .w = pooler.w.ptr()};
    need = std::max({need, kernels::LinearWorkspaceBytes(f), kernels::LinearWorkspaceBytes(b)});
  }
  {
    kernels::AttentionDims dims{.batch = options.max_batch,
                                .heads = heads,
                                .seq = options.max_seq,
                                .head_dim = config.head_dim()};
    kernels::AttentionForwardArgs af{.dims = dims, .dropout = {attention_p, 0, 0}};
    kernels::AttentionBackwardArgs ab{.dims = dims, .dropout = {attention_p, 0, 0}};
    need = std::max(
        {need, kernels::AttentionWorkspaceBytes(af), kernels::AttentionWorkspaceBytes(ab)});
  }
  FEDLORA_RETURN_IF_ERROR(zeros(&workspace_storage, static_cast<int64_t>(need)));
  workspace = workspace_storage.data();
  workspace_bytes = need;
  return absl::OkStatus();
}

absl::Status BertClassifier::Impl::CheckBatch(const Batch& b, bool need_labels) const {
  if (b.batch_size < 1 || b.seq_len < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("empty batch: batch_size ", b.batch_size, ", seq_len ", b.seq_len));
  }
  if (b.batch_size > options.max_batch || b.seq_len > options.max_seq) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch ", b.batch_size, " x ", b.seq_len, " exceeds the planned maximum ",
        options.max_batch, " x ", options.max_seq, " (ModelOptions max_batch, max_seq)"));
  }
  const size_t n = static_cast<size_t>(b.batch_size) * b.seq_len;
  if (b.input_ids.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat("input_ids has ", b.input_ids.size(),
                                                   " entries, expected ", b.batch_size, " x ",
                                                   b.seq_len, " = ", n));
  }
  if (!b.token_type_ids.empty() && b.token_type_ids.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat("token_type_ids has ", b.token_type_ids.size(),
                                                   " entries, expected 0 or ", n));
  }
  if (!b.attention_mask.empty() && b.attention_mask.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat("attention_mask has ", b.attention_mask.size(),
                                                   " entries, expected 0 or ", n));
  }
  for (size_t i = 0; i < n; ++i) {
    if (b.input_ids[i] < 0 || b.input_ids[i] >= config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("input_ids[", i, "] = ", b.input_ids[i],
                                                     " outside the vocabulary [0, ",
                                                     config.vocab_size, ")"));
    }
    if (!b.token_type_ids.empty() &&
        (b.token_type_ids[i] < 0 || b.token_type_ids[i] >= config.type_vocab_size)) {
      return absl::InvalidArgumentError(absl::StrCat("token_type_ids[", i,
                                                     "] = ", b.token_type_ids[i], " outside [0, ",
                                                     config.type_vocab_size, ")"));
    }
    if (!b.attention_mask.empty() && b.attention_mask[i] != 0 && b.attention_mask[i] != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("attention_mask[", i, "] = ", b.attention_mask[i], ", expected 0 or 1"));
    }
  }
  if (!b.attention_mask.empty()) {
    for (int s = 0; s < b.batch_size; ++s) {
      const auto row = b.attention_mask.begin() + static_cast<size_t>(s) * b.seq_len;
      if (std::find(row, row + b.seq_len, 1) == row + b.seq_len) {
        return absl::InvalidArgumentError(
            absl::StrCat("sequence ", s, " is all padding (attention_mask all 0)"));
      }
    }
  }
  if (need_labels) {
    if (b.labels.size() != static_cast<size_t>(b.batch_size)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "labels has ", b.labels.size(), " entries, expected batch_size ", b.batch_size));
    }
    for (int s = 0; s < b.batch_size; ++s) {
      if (b.labels[s] < 0 || b.labels[s] >= options.num_labels) {
        return absl::InvalidArgumentError(absl::StrCat("labels[", s, "] = ", b.labels[s],
                                                       " outside [0, num_labels ",
                                                       options.num_labels, ")"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status BertClassifier::Impl::LinearForward(int layer, LoraTarget t, const float* in,
                                                 int64_t rows, float* y, bool training,
                                                 uint64_t seed) {
  const int ti = static_cast<int>(t);
  const FrozenLinear& lin = layers[layer].lin[ti];
  const DevLinear& dl = dev_layers[layer].lin[ti];
  const int lp = lora_param[layer][ti];
  if (lp < 0) {
    return kernels::LinearForward(ctx, {.rows = rows,
                                        .in_features = lin.w.cols,
                                        .out_features = lin.w.rows,
                                        .x = in,
                                        .w = dl.w,
                                        .bias = dl.bias,
                                        .y = y,
                                        .workspace = workspace,
                                        .workspace_bytes = workspace_bytes});
  }
  return kernels::LoraLinearForward(
      ctx, {.rows = rows,
            .in_features = lin.w.cols,
            .out_features = lin.w.rows,
            .rank = r(),
            .x = in,
            .w = dl.w,
            .bias = dl.bias,
            .lora_a = Val(lp),
            .lora_b = Val(lp + 1),
            .scaling = lora_scaling,
            .dropout = Spec(training ? lora_p : 0.0f, seed, LayerSite(layer, kSiteLora + ti)),
            .y = y,
            .h = acts[layer].lora_h[ti].data(),
            .workspace = workspace,
            .workspace_bytes = workspace_bytes});
}

absl::Status BertClassifier::Impl::LinearBackward(int layer, LoraTarget t, const float* in,
                                                  const float* dy, int64_t rows, float* dx_out,
                                                  bool accumulate_dx, uint64_t seed) {
  const int ti = static_cast<int>(t);
  const FrozenLinear& lin = layers[layer].lin[ti];
  const DevLinear& dl = dev_layers[layer].lin[ti];
  const int lp = lora_param[layer][ti];
  if (lp < 0) {
    if (dx_out == nullptr)
      return absl::OkStatus();  // frozen, and nothing below needs its input gradient
    return kernels::LinearBackward(ctx, {.rows = rows,
                                         .in_features = lin.w.cols,
                                         .out_features = lin.w.rows,
                                         .w = dl.w,
                                         .dy = dy,
                                         .dx = dx_out,
                                         .accumulate_dx = accumulate_dx,
                                         .workspace = workspace,
                                         .workspace_bytes = workspace_bytes});
  }
  return kernels::LoraLinearBackward(
      ctx, {.rows = rows,
            .in_features = lin.w.cols,
            .out_features = lin.w.rows,
            .rank = r(),
            .x = in,
            .w = dl.w,
            .lora_a = Val(lp),
            .lora_b = Val(lp + 1),
            .scaling = lora_scaling,
            .dropout = Spec(lora_p, seed, LayerSite(layer, kSiteLora + ti)),
            .h = acts[layer].lora_h[ti].data(),
            .dy = dy,
            .dx = dx_out,
            .accumulate_dx = accumulate_dx,
            .da = Grad(lp),
            .db = Grad(lp + 1),
            .accumulate_params = true,
            .workspace = workspace,
            .workspace_bytes = workspace_bytes});
}

absl::Status BertClassifier::Impl::Attention(int l, int64_t bsz, int64_t seq, const float* mask, bool training,
                                             uint64_t seed, LayerActs& a) {
  const int64_t h = H(), heads = config.num_attention_heads;
  const kernels::DropoutSpec spec = Spec(training ? attention_p : 0.0f, seed, LayerSite(l, kSiteAttnProbs));
  auto run = [&](int64_t batch, int64_t n, int64_t row, int64_t prob, const float* m) {
    kernels::DropoutSpec d = spec;
    d.offset = static_cast<uint64_t>(prob);
    return kernels::AttentionForward(
        ctx, {.dims = {.batch = batch, .heads = heads, .seq = n, .head_dim = config.head_dim(),
                       .layout = kernels::AttentionLayout::kBSHD},
              .q = a.q.data() + row * h,
              .k = a.k.data() + row * h,
              .v = a.v.data() + row * h,
              .mask = m,
              .dropout = d,
              .probs = a.probs.data() + prob,
              .out = a.ctx.data() + row * h,
              .workspace = workspace,
              .workspace_bytes = workspace_bytes});
  };
  if (!layout.packed) return run(bsz, seq, 0, 0, mask);
  int64_t prob = 0;
  for (int64_t s = 0; s < bsz; ++s) {
    const int64_t n = layout.len[s];
    FEDLORA_RETURN_IF_ERROR(run(1, n, layout.start[s], prob, nullptr));
    prob += heads * n * n;
  }
  return absl::OkStatus();
}

absl::Status BertClassifier::Impl::AttentionBackward(int l, int64_t bsz, int64_t seq, uint64_t seed, LayerActs& a) {
  const int64_t h = H(), heads = config.num_attention_heads;
  const kernels::DropoutSpec spec = Spec(attention_p, seed, LayerSite(l, kSiteAttnProbs));
  auto run = [&](int64_t batch, int64_t n, int64_t row, int64_t prob) {
    kernels::DropoutSpec d = spec;
    d.offset = static_cast<uint64_t>(prob);
    return kernels::AttentionBackward(
        ctx, {.dims = {.batch = batch, .heads = heads, .seq = n, .head_dim = config.head_dim(),
                       .layout = kernels::AttentionLayout::kBSHD},
              .q = a.q.data() + row * h,
              .k = a.k.data() + row * h,
              .v = a.v.data() + row * h,
              .probs = a.probs.data() + prob,
              .dropout = d,
              .dout = dctx.data() + row * h,
              .dq = dq.data() + row * h,
              .dk = dk.data() + row * h,
              .dv = dv.data() + row * h,
              .workspace = workspace,
              .workspace_bytes = workspace_bytes});
  };
  if (!layout.packed) return run(bsz, seq, 0, 0);
  int64_t prob = 0;
  for (int64_t s = 0; s < bsz; ++s) {
    const int64_t n = layout.len[s];
    FEDLORA_RETURN_IF_ERROR(run(1, n, layout.start[s], prob));
    prob += heads * n * n;
  }
  return absl::OkStatus();
}

void BertClassifier::Impl::Arrange(const Batch& b) {
  const int64_t bsz = b.batch_size, seq = b.seq_len;
  auto real = [&](int64_t t) { return b.attention_mask.empty() || b.attention_mask[t] != 0; };
  Layout& lay = layout;
  // Packed when it leaves something out: a batch without padding keeps one batched attention.
  bool any_padding = false;
  for (int64_t t = 0; t < bsz * seq; ++t) any_padding = any_padding || !real(t);
  lay.packed = any_padding;
  for (int64_t s = 0; s < bsz; ++s) lay.packed = lay.packed && real(s * seq);
  lay.masked = false;
  lay.start.assign(bsz, 0);
  lay.len.assign(bsz, 0);
  const int32_t pad = static_cast<int32_t>(config.pad_token_id);
  int64_t row = 0;
  for (int64_t s = 0; s < bsz; ++s) {
    lay.start[s] = row;
    int32_t count = 0;  // RoBERTa: real (non-pad) ids so far in the sequence
    for (int64_t j = 0; j < seq; ++j) {
      const int64_t t = s * seq + j;
      int32_t position = static_cast<int32_t>(j);
      if (config.is_roberta()) {
        // HF create_position_ids_from_input_ids: pad + cumulative count of non-pad ids; pads get pad.
        const bool not_pad = b.input_ids[t] != pad;
        count += not_pad ? 1 : 0;
        position = not_pad ? pad + count : pad;
      }
      if (lay.packed && !real(t)) continue;
      row_ids[row] = b.input_ids[t];
      row_types[row] = b.token_type_ids.empty() ? 0 : b.token_type_ids[t];
      row_positions[row] = position;
      // Padding gets a large negative additive bias, so exp() underflows to exactly 0 (HF uses the
      // dtype's minimum; any value below about -100 times the score scale gives the same result).
      mask_host[row] = real(t) ? 0.0f : -1e30f;
      lay.masked = lay.masked || !real(t);
      ++row;
    }
    lay.len[s] = row - lay.start[s];
  }
  lay.rows = row;
}

absl::Status BertClassifier::Impl::Encode(const Batch& b, bool training, uint64_t seed) {
  const int64_t bsz = b.batch_size, seq = b.seq_len, h = H();
  Arrange(b);
  const int64_t tokens = layout.rows;
  const float* mask = nullptr;
  if (layout.masked) {
    FEDLORA_ASSIGN_OR_RETURN(mask, Stage(mask_host, tokens, mask_add));
  }
  FEDLORA_ASSIGN_OR_RETURN(const int32_t* ids, Stage(row_ids, tokens, dev_ids));
  const int32_t* types = nullptr;
  if (!b.token_type_ids.empty()) {
    FEDLORA_ASSIGN_OR_RETURN(types, Stage(row_types, tokens, dev_types));
  }
  FEDLORA_ASSIGN_OR_RETURN(const int32_t* positions, Stage(row_positions, tokens, dev_positions));
  float* x0 = x[0].data();
  FEDLORA_RETURN_IF_ERROR(kernels::EmbeddingForward(
      ctx, {.tokens = tokens,
            .hidden = h,
            .seq_len = seq,
            .vocab = word_emb.rows,
            .max_positions = pos_emb.rows,
            .type_vocab = type_emb.rows,
            .input_ids = ids,
            .position_ids = positions,
            .token_type_ids = types,
            .word = dev_word,
            .position = dev_pos,
            .token_type = dev_type,
            .out = x0}));
  // The embeddings are frozen: their LayerNorm needs no saved statistics.
  FEDLORA_RETURN_IF_ERROR(
      kernels::LayerNormForward(ctx, {.rows = tokens,
                                      .cols = h,
                                      .eps = static_cast<float>(config.layer_norm_eps),
                                      .x = x0,
                                      .gamma = dev_emb_gamma,
                                      .beta = dev_emb_beta,
                                      .y = x0}));
  FEDLORA_RETURN_IF_ERROR(
      kernels::Dropout(ctx, {.n = tokens * h,
                             .spec = HiddenDropout(training, seed, kSiteEmbedding),
                             .x = x0,
                             .out = x0}));

  const float eps = static_cast<float>(config.layer_norm_eps);
  for (int l = 0; l < L(); ++l) {
    LayerActs& a = acts[l];
    const DevLayer& lw = dev_layers[l];
    const float* in = x[l].data();
    FEDLORA_RETURN_IF_ERROR(
        LinearForward(l, LoraTarget::kQuery, in, tokens, a.q.data(), training, seed));
    FEDLORA_RETURN_IF_ERROR(
        LinearForward(l, LoraTarget::kKey, in, tokens, a.k.data(), training, seed));
    FEDLORA_RETURN_IF_ERROR(
        LinearForward(l, LoraTarget::kValue, in, tokens, a.v.data(), training, seed));
    FEDLORA_RETURN_IF_ERROR(Attention(l, bsz, seq, mask, training, seed, a));
    // z1 = x + dropout(ctx Wo^T + bo);  h1 = LN(z1)
    FEDLORA_RETURN_IF_ERROR(
        LinearForward(l, LoraTarget::kAttnOut, a.ctx.data(), tokens, a.z1.data(), training, seed));
    FEDLORA_RETURN_IF_ERROR(
        kernels::Dropout(ctx, {.n = tokens * h,
                               .spec = HiddenDropout(training, seed, LayerSite(l, kSiteAttnOut)),
                               .x = a.z1.data(),
                               .out = a.z1.data()}));
    FEDLORA_RETURN_IF_ERROR(
        kernels::Add(ctx, {.n = tokens * h, .a = a.z1.data(), .b = in, .out = a.z1.data()}));
    FEDLORA_RETURN_IF_ERROR(kernels::LayerNormForward(ctx, {.rows = tokens,
                                                            .cols = h,
                                                            .eps = eps,
                                                            .x = a.z1.data(),
                                                            .gamma = lw.ln1_gamma,
                                                            .beta = lw.ln1_beta,
                                                            .y = a.h1.data(),
                                                            .mean = a.mean1.data(),
                                                            .rstd = a.rstd1.data()}));
    // FFN: g = gelu(h1 Wi^T + bi);  z2 = h1 + dropout(g Wo2^T + bo2);  x' = LN(z2)
    FEDLORA_RETURN_IF_ERROR(LinearForward(l, LoraTarget::kIntermediate, a.h1.data(), tokens,
                                          a.u.data(), training, seed));
    FEDLORA_RETURN_IF_ERROR(kernels::ActivationForward(
        ctx,
        {.kind = kernels::Activation::kGelu, .n = tokens * I(), .x = a.u.data(), .y = a.g.data()}));
    FEDLORA_RETURN_IF_ERROR(
        LinearForward(l, LoraTarget::kOutput, a.g.data(), tokens, a.z2.data(), training, seed));
    FEDLORA_RETURN_IF_ERROR(
        kernels::Dropout(ctx, {.n = tokens * h,
                               .spec = HiddenDropout(training, seed, LayerSite(l, kSiteFfnOut)),
                               .x = a.z2.data(),
                               .out = a.z2.data()}));
    FEDLORA_RETURN_IF_ERROR(kernels::Add(
        ctx, {.n = tokens * h, .a = a.z2.data(), .b = a.h1.data(), .out = a.z2.data()}));
    FEDLORA_RETURN_IF_ERROR(kernels::LayerNormForward(ctx, {.rows = tokens,
                                                            .cols = h,
                                                            .eps = eps,
                                                            .x = a.z2.data(),
                                                            .gamma = lw.ln2_gamma,
                                                            .beta = lw.ln2_beta,
                                                            .y = x[l + 1].data(),
                                                            .mean = a.mean2.data(),
                                                            .rstd = a.rstd2.data()}));
  }
  return absl::OkStatus();
}

absl::Status BertClassifier::Impl::Head(const Batch& b, bool training, uint64_t seed, bool with_loss) {
  const int64_t bsz = b.batch_size, h = H();
  const size_t row = static_cast<size_t>(h) * sizeof(float);
  // Gather the [CLS] / <s> rows (each sequence's first): B*H floats.
  for (int64_t s = 0; s < bsz; ++s) {
    FEDLORA_RETURN_IF_ERROR(
        backend->CopyRows(cls.data() + s * h, row, x[L()].data() + layout.start[s] * h, row, row, 1));
  }
  // pooled = tanh(dense(cls)): BERT's frozen pooler, or RoBERTa's trainable classifier.dense
  // applied after a dropout (kept in place in cls: the backward needs the dropped input).
  if (head_dense_param >= 0) {
    FEDLORA_RETURN_IF_ERROR(
        kernels::Dropout(ctx, {.n = bsz * h,
                               .spec = Spec(training ? classifier_p : 0.0f, seed, kSiteHeadInput),
                               .x = cls.data(),
                               .out = cls.data()}));
    FEDLORA_RETURN_IF_ERROR(kernels::LinearForward(
        ctx, {.rows = bsz,
              .in_features = h,
              .out_features = h,
              .x = cls.data(),
              .w = kernels::WeightPtr::F32(Val(head_dense_param)),
              .bias = Val(head_dense_param + 1),
              .y = pooled.data()}));
  } else {
    FEDLORA_RETURN_IF_ERROR(kernels::LinearForward(ctx, {.rows = bsz,
                                                         .in_features = h,
                                                         .out_features = h,
                                                         .x = cls.data(),
                                                         .w = dev_pooler.w,
                                                         .bias = dev_pooler.bias,
                                                         .y = pooled.data(),
                                                         .workspace = workspace,
                                                         .workspace_bytes = workspace_bytes}));
  }
  FEDLORA_RETURN_IF_ERROR(kernels::ActivationForward(
      ctx,
      {.kind = kernels::Activation::kTanh, .n = bsz * h, .x = pooled.data(), .y = pooled.data()}));
  FEDLORA_RETURN_IF_ERROR(
      kernels::Dropout(ctx, {.n = bsz * h,
                             .spec = Spec(training ? classifier_p : 0.0f, seed, kSiteClassifier),
                             .x = pooled.data(),
                             .out = cls_drop.data()}));
  const Param& bias = params[classifier_param + 1];
  // Logit adjustment shifts every row's logits by the same per-class offsets, so it is the head's
  // bias plus the offsets; the bias gradient (the column sums of dlogits) is unchanged by it.
  const float* head_bias = Val(classifier_param + 1);
  if (with_loss && !loss_logit_offsets.empty()) {
    adjusted_bias_host.resize(loss_logit_offsets.size());
    for (size_t c = 0; c < adjusted_bias_host.size(); ++c)
      adjusted_bias_host[c] = bias.value[c] + loss_logit_offsets[c];
    FEDLORA_ASSIGN_OR_RETURN(head_bias, Stage(adjusted_bias_host, adjusted_bias_host.size(), adjusted_bias));
  }
  FEDLORA_RETURN_IF_ERROR(kernels::LinearForward(ctx, {.rows = bsz,
                                                       .in_features = h,
                                                       .out_features = options.num_labels,
                                                       .x = cls_drop.data(),
                                                       .w = kernels::WeightPtr::F32(Val(classifier_param)),
                                                       .bias = head_bias,
                                                       .y = logits.data()}));
  if (with_loss) {
    FEDLORA_ASSIGN_OR_RETURN(const int32_t* labels, Stage(b.labels, bsz, dev_labels));
    FEDLORA_RETURN_IF_ERROR(kernels::SoftmaxCrossEntropy(ctx, {.batch = bsz,
                                                               .classes = options.num_labels,
                                                               .logits = logits.data(),
                                                               .labels = labels,
                                                               .loss = loss_value.data(),
                                                               .dlogits = dlogits.data()}));
  }
  return absl::OkStatus();
}

absl::Status BertClassifier::Impl::Backward(const Batch& b, uint64_t seed) {
  const int64_t bsz = b.batch_size, seq = b.seq_len, tokens = layout.rows, h = H();
  // Final linear (trainable): dW += dlogits^T x, db += sum dlogits, dx = dlogits W.
  FEDLORA_RETURN_IF_ERROR(
      kernels::LinearBackward(ctx, {.rows = bsz,
                                    .in_features = h,
                                    .out_features = options.num_labels,
                                    .x = cls_drop.data(),
                                    .w = kernels::WeightPtr::F32(Val(classifier_param)),
                                    .dy = dlogits.data(),
                                    .dx = dcls.data(),
                                    .dw = Grad(classifier_param),
                                    .dbias = Grad(classifier_param + 1),
                                    .accumulate_params = true}));
  const bool encoder_trainable =
      std::any_of(std::begin(use_target), std::end(use_target), [](bool u) { return u; });
  if (!encoder_trainable && head_dense_param < 0)
    return absl::OkStatus();  // nothing below is trainable
  FEDLORA_RETURN_IF_ERROR(kernels::Dropout(ctx, {.n = bsz * h,
                                                 .spec = Spec(classifier_p, seed, kSiteClassifier),
                                                 .x = dcls.data(),
                                                 .out = dcls.data()}));
  FEDLORA_RETURN_IF_ERROR(kernels::ActivationBackward(ctx, {.kind = kernels::Activation::kTanh,
                                                            .n = bsz * h,
                                                            .saved = pooled.data(),
                                                            .dy = dcls.data(),
                                                            .dx = dpooled.data()}));
  if (head_dense_param >= 0) {
    FEDLORA_RETURN_IF_ERROR(
        kernels::LinearBackward(ctx, {.rows = bsz,
                                      .in_features = h,
                                      .out_features = h,
                                      .x = cls.data(),
                                      .w = kernels::WeightPtr::F32(Val(head_dense_param)),
                                      .dy = dpooled.data(),
                                      .dx = encoder_trainable ? dcls.data() : nullptr,
                                      .dw = Grad(head_dense_param),
                                      .dbias = Grad(head_dense_param + 1),
                                      .accumulate_params = true}));
    if (!encoder_trainable) return absl::OkStatus();
    FEDLORA_RETURN_IF_ERROR(kernels::Dropout(ctx, {.n = bsz * h,
                                                   .spec = Spec(classifier_p, seed, kSiteHeadInput),
                                                   .x = dcls.data(),
                                                   .out = dcls.data()}));
  } else {
    FEDLORA_RETURN_IF_ERROR(kernels::LinearBackward(ctx, {.rows = bsz,
                                                          .in_features = h,
                                                          .out_features = h,
                                                          .w = dev_pooler.w,
                                                          .dy = dpooled.data(),
                                                          .dx = dcls.data(),
                                                          .workspace = workspace,
                                                          .workspace_bytes = workspace_bytes}));
  }
  // Only the [CLS] rows of the last hidden state receive a gradient.
  const size_t row = static_cast<size_t>(h) * sizeof(float);
  FEDLORA_RETURN_IF_ERROR(backend->Zero(dx.data(), tokens * row));
  for (int64_t s = 0; s < bsz; ++s) {
    FEDLORA_RETURN_IF_ERROR(backend->CopyRows(dx.data() + layout.start[s] * h, row, dcls.data() + s * h, row, row, 1));
  }
  const int64_t n = tokens * h;
  for (int l = static_cast<int>(L()) - 1; l >= 0; --l) {
    LayerActs& a = acts[l];
    const DevLayer& lw = dev_layers[l];
    const float* in = x[l].data();
    // dx holds d(loss)/d(layer output). LN2: dh = d/dz2; it is also the residual gradient to h1.
    FEDLORA_RETURN_IF_ERROR(kernels::LayerNormBackward(ctx, {.rows = tokens,
                                                             .cols = h,
                                                             .x = a.z2.data(),
                                                             .gamma = lw.ln2_gamma,
                                                             .mean = a.mean2.data(),
                                                             .rstd = a.rstd2.data(),
                                                             .dy = dx.data(),
                                                             .dx = dh.data()}));
    // dz = dropout'(dh), the gradient of the FFN output dense; without dropout it is dh itself.
    const float* d_ffn = dh.data();
    if (hidden_p > 0.0f) {
      FEDLORA_RETURN_IF_ERROR(
          kernels::Dropout(ctx, {.n = n,
                                 .spec = HiddenDropout(true, seed, LayerSite(l, kSiteFfnOut)),
                                 .x = dh.data(),
                                 .out = dz.data()}));
      d_ffn = dz.data();
    }
    FEDLORA_RETURN_IF_ERROR(LinearBackward(l, LoraTarget::kOutput, a.g.data(), d_ffn, tokens,
                                           dg.data(),
                                           /*accumulate_dx=*/false, seed));
    FEDLORA_RETURN_IF_ERROR(kernels::ActivationBackward(ctx, {.kind = kernels::Activation::kGelu,
                                                              .n = tokens * I(),
                                                              .saved = a.u.data(),
                                                              .dy = dg.data(),
                                                              .dx = dg.data()}));
    FEDLORA_RETURN_IF_ERROR(LinearBackward(l, LoraTarget::kIntermediate, a.h1.data(), dg.data(),
                                           tokens, dh.data(),
                                           /*accumulate_dx=*/true, seed));
    // LN1: dx = d/dz1, the residual gradient to the layer input; dz = d/d(attention dense output).
    FEDLORA_RETURN_IF_ERROR(kernels::LayerNormBackward(ctx, {.rows = tokens,
                                                             .cols = h,
                                                             .x = a.z1.data(),
                                                             .gamma = lw.ln1_gamma,
                                                             .mean = a.mean1.data(),
                                                             .rstd = a.rstd1.data(),
                                                             .dy = dh.data(),
                                                             .dx = dx.data()}));
    const float* d_attn = dx.data();
    if (hidden_p > 0.0f) {
      FEDLORA_RETURN_IF_ERROR(
          kernels::Dropout(ctx, {.n = n,
                                 .spec = HiddenDropout(true, seed, LayerSite(l, kSiteAttnOut)),
                                 .x = dx.data(),
                                 .out = dz.data()}));
      d_attn = dz.data();
    }
    FEDLORA_RETURN_IF_ERROR(LinearBackward(l, LoraTarget::kAttnOut, a.ctx.data(), d_attn, tokens,
                                           dctx.data(),
                                           /*accumulate_dx=*/false, seed));
    FEDLORA_RETURN_IF_ERROR(AttentionBackward(l, bsz, seq, seed, a));
    // The embeddings are frozen: layer 0 needs no input gradient, only its LoRA gradients.
    float* dx_in = l > 0 ? dx.data() : nullptr;
    FEDLORA_RETURN_IF_ERROR(
        LinearBackward(l, LoraTarget::kQuery, in, dq.data(), tokens, dx_in, true, seed));
    FEDLORA_RETURN_IF_ERROR(
        LinearBackward(l, LoraTarget::kKey, in, dk.data(), tokens, dx_in, true, seed));
    FEDLORA_RETURN_IF_ERROR(
        LinearBackward(l, LoraTarget::kValue, in, dv.data(), tokens, dx_in, true, seed));
  }
  return absl::OkStatus();
}

absl::Status BertClassifier::Impl::BindWeights(std::shared_ptr<const kernels::DeviceMirror> weights) {
  FEDLORA_ASSIGN_OR_RETURN(backend, OpenBackend(options.device, &ctx));
  mirror = std::move(weights);
  const kernels::DeviceMirror& m = *mirror;
  auto linear = [&](const FrozenLinear& lin, DevLinear* d) -> absl::Status {
    FEDLORA_ASSIGN_OR_RETURN(d->w, m.Get(lin.w.ptr()));
    FEDLORA_ASSIGN_OR_RETURN(d->bias, m.Get(lin.bias.data()));
    return absl::OkStatus();
  };
  FEDLORA_ASSIGN_OR_RETURN(dev_word, m.Get(word_emb.ptr()));
  FEDLORA_ASSIGN_OR_RETURN(dev_pos, m.Get(pos_emb.ptr()));
  FEDLORA_ASSIGN_OR_RETURN(dev_type, m.Get(type_emb.ptr()));
  FEDLORA_ASSIGN_OR_RETURN(dev_emb_gamma, m.Get(emb_ln_gamma.data()));
  FEDLORA_ASSIGN_OR_RETURN(dev_emb_beta, m.Get(emb_ln_beta.data()));
  dev_layers.resize(layers.size());
  for (size_t l = 0; l < layers.size(); ++l) {
    const LayerWeights& lw = layers[l];
    DevLayer& dl = dev_layers[l];
    for (int t = 0; t < kNumLoraTargets; ++t) FEDLORA_RETURN_IF_ERROR(linear(lw.lin[t], &dl.lin[t]));
    FEDLORA_ASSIGN_OR_RETURN(dl.ln1_gamma, m.Get(lw.ln1_gamma.data()));
    FEDLORA_ASSIGN_OR_RETURN(dl.ln1_beta, m.Get(lw.ln1_beta.data()));
    FEDLORA_ASSIGN_OR_RETURN(dl.ln2_gamma, m.Get(lw.ln2_gamma.data()));
    FEDLORA_ASSIGN_OR_RETURN(dl.ln2_beta, m.Get(lw.ln2_beta.data()));
  }
  return linear(pooler, &dev_pooler);
}

// --- Public API
// ------------------------------------------------------------------------------------

BertClassifier::BertClassifier(std::shared_ptr<const BertBase> base, ModelOptions options)
    : base_(std::move(base)),
      options_(std::move(options)),
      impl_(std::make_unique<Impl>(base_->config(), options_, params_, *base_->weights_)) {}

BertClassifier::~BertClassifier() = default;

void BertClassifier::ZeroGrad() {
  for (Param& p : params_) std::fill(p.grad.begin(), p.grad.end(), 0.0f);
}

void BertClassifier::SetThreadPool(ThreadPool* pool) { impl_->ctx.pool = pool; }

absl::StatusOr<std::unique_ptr<BertClassifier>> BertClassifier::Create(
    std::shared_ptr<const BertBase> base, const ModelOptions& options) {
  if (base == nullptr)
    return absl::InvalidArgumentError("BertClassifier::Create: the base is null");
  if (options.bf16_weights != base->bf16_weights()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ModelOptions.bf16_weights is ", options.bf16_weights ? "true" : "false",
        " but the shared base holds its weights as ", base->bf16_weights() ? "bf16" : "fp32"));
  }
  if (options.bf16_math != base->bf16_math()) {
    return absl::InvalidArgumentError(absl::StrCat("ModelOptions.bf16_math is ", options.bf16_math ? "true" : "false",
                                                   " but the shared base's is ", base->bf16_math() ? "true" : "false"));
  }
  if (options.device == Device::kCuda && options.bf16_math) {
    return absl::UnimplementedError("ModelOptions.bf16_math runs on the CPU only so far: on CUDA the GEMMs are fp32");
  }
  if (base->weight_seed().has_value() && *base->weight_seed() != options.seed) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ModelOptions.seed is ", options.seed, " but the shared base drew some of its weights (",
        "FromRandom's, or a pooler missing from the checkpoint) from seed ", *base->weight_seed(),
        "; a classifier on this base must use that seed"));
  }
  FEDLORA_ASSIGN_OR_RETURN(auto weights, base->WeightsOn(options.device));
  std::unique_ptr<BertClassifier> model(new BertClassifier(std::move(base), options));
  FEDLORA_RETURN_IF_ERROR(model->impl_->InitStructure(&model->targets_));
  FEDLORA_RETURN_IF_ERROR(model->impl_->BindWeights(std::move(weights)));
  FEDLORA_RETURN_IF_ERROR(model->impl_->Plan());
  return model;
}

absl::StatusOr<std::unique_ptr<BertClassifier>> BertClassifier::Load(const std::string& model_dir,
                                                                     const ModelOptions& options) {
  FEDLORA_ASSIGN_OR_RETURN(BertConfig config, ReadBertConfig(model_dir + "/config.json"));
  // Bad options are reported before the weights, possibly hundreds of MB, are read.
  FEDLORA_RETURN_IF_ERROR(config.Validate());
  FEDLORA_RETURN_IF_ERROR(ValidateOptions(config, options));
  const std::string path = model_dir + "/model.safetensors";
  FEDLORA_ASSIGN_OR_RETURN(auto base, BertBase::Make(std::move(config), options, &path));
  return Create(std::move(base), options);
}

absl::StatusOr<std::unique_ptr<BertClassifier>> BertClassifier::FromRandom(
    const BertConfig& config, const ModelOptions& options) {
  FEDLORA_RETURN_IF_ERROR(config.Validate());
  FEDLORA_RETURN_IF_ERROR(ValidateOptions(config, options));
  FEDLORA_ASSIGN_OR_RETURN(auto base, BertBase::Make(config, options, nullptr));
  return Create(std::move(base), options);
}

absl::StatusOr<float> BertClassifier::ForwardBackward(const Batch& batch, uint64_t dropout_seed) {
  FEDLORA_RETURN_IF_ERROR(impl_->CheckBatch(batch, /*need_labels=*/true));
  FEDLORA_RETURN_IF_ERROR(impl_->dev_params.ToDevice(/*grads=*/true));
  FEDLORA_RETURN_IF_ERROR(impl_->Encode(batch, /*training=*/true, dropout_seed));
  FEDLORA_RETURN_IF_ERROR(impl_->Head(batch, /*training=*/true, dropout_seed, /*with_loss=*/true));
  FEDLORA_RETURN_IF_ERROR(impl_->Backward(batch, dropout_seed));
  float loss = 0.0f;
  FEDLORA_RETURN_IF_ERROR(impl_->backend->Download(&loss, impl_->loss_value.data(), sizeof(float)));
  FEDLORA_RETURN_IF_ERROR(impl_->dev_params.GradsToHost());
  return loss;
}

absl::Status BertClassifier::SetTrainingLogitOffsets(std::vector<float> offsets) {
  if (!offsets.empty() && offsets.size() != static_cast<size_t>(options_.num_labels)) {
    return absl::InvalidArgumentError(absl::StrCat("training logit offsets: got ", offsets.size(),
                                                   " values for ", options_.num_labels,
                                                   " classes"));
  }
  for (size_t c = 0; c < offsets.size(); ++c) {
    if (!std::isfinite(offsets[c])) {
      return absl::InvalidArgumentError(
          absl::StrCat("training logit offset of class ", c, " is not finite: ", offsets[c]));
    }
  }
  impl_->loss_logit_offsets = std::move(offsets);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> BertClassifier::Logits(const Batch& batch) {
  FEDLORA_RETURN_IF_ERROR(impl_->CheckBatch(batch, /*need_labels=*/false));
  FEDLORA_RETURN_IF_ERROR(impl_->dev_params.ToDevice(/*grads=*/false));
  FEDLORA_RETURN_IF_ERROR(impl_->Encode(batch, /*training=*/false, 0));
  FEDLORA_RETURN_IF_ERROR(impl_->Head(batch, /*training=*/false, 0, /*with_loss=*/false));
  std::vector<float> out(static_cast<size_t>(batch.batch_size) * options_.num_labels);
  FEDLORA_RETURN_IF_ERROR(impl_->backend->Download(out.data(), impl_->logits.data(), out.size() * sizeof(float)));
  return out;
}

absl::StatusOr<std::vector<float>> BertClassifier::PooledEmbeddings(const Batch& batch,
                                                                    Pooling pooling) {
  FEDLORA_RETURN_IF_ERROR(impl_->CheckBatch(batch, /*need_labels=*/false));
  FEDLORA_RETURN_IF_ERROR(impl_->dev_params.ToDevice(/*grads=*/false));
  FEDLORA_RETURN_IF_ERROR(impl_->Encode(batch, /*training=*/false, 0));
  const int64_t h = config().hidden_size;
  const Impl::Layout& lay = impl_->layout;
  const float* last = impl_->x[config().num_hidden_layers].data();
  std::vector<float> last_host;  // GPU: the last hidden state, downloaded
  if (!impl_->on_host()) {
    last_host.resize(static_cast<size_t>(lay.rows) * h);
    FEDLORA_RETURN_IF_ERROR(impl_->backend->Download(last_host.data(), last, last_host.size() * sizeof(float)));
    last = last_host.data();
  }
  std::vector<float> out(static_cast<size_t>(batch.batch_size) * h, 0.0f);
  std::vector<double> sum(h);
  for (int64_t s = 0; s < batch.batch_size; ++s) {
    float* o = out.data() + s * h;
    if (pooling == Pooling::kCls) {
      std::memcpy(o, last + lay.start[s] * h, h * sizeof(float));
      continue;
    }
    // Mean over unpadded tokens, accumulated in double (seq up to 512 terms).
    std::fill(sum.begin(), sum.end(), 0.0);
    int64_t count = 0;
    for (int64_t r = lay.start[s]; r < lay.start[s] + lay.len[s]; ++r) {
      if (impl_->mask_host[r] != 0.0f) continue;  // padding (kept only when not packed)
      const float* row = last + r * h;
      for (int64_t c = 0; c < h; ++c) sum[c] += row[c];
      ++count;
    }
    for (int64_t c = 0; c < h; ++c) o[c] = static_cast<float>(sum[c] / static_cast<double>(count));
  }
  return out;
}

}  // namespace fedlora
