#include "model/bert.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/rng.h"
#include "core/safetensors.h"
#include "core/status.h"
#include "core/tensor.h"
#include "kernels/activation.h"
#include "kernels/attention.h"
#include "kernels/context.h"
#include "kernels/cross_entropy.h"
#include "kernels/dropout.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/layernorm.h"
#include "kernels/linear.h"
#include "kernels/lora_linear.h"
#include "model/frozen.h"

namespace fedlora {
namespace {

constexpr LoraTarget kAllTargets[kNumLoraTargets] = {
    LoraTarget::kQuery,   LoraTarget::kKey,          LoraTarget::kValue,
    LoraTarget::kAttnOut, LoraTarget::kIntermediate, LoraTarget::kOutput};

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

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

// --- Frozen weights
// --------------------------------------------------------------------------------

namespace {

struct LayerWeights {
  FrozenLinear lin[kNumLoraTargets];  // indexed by LoraTarget
  std::vector<float> ln1_gamma, ln1_beta, ln2_gamma, ln2_beta;
};

// Copies `t` (F32, F16 or BF16; possibly unaligned) into fp32.
void ToF32(const SafetensorsTensor& t, float* out) {
  const size_t n = static_cast<size_t>(t.numel());
  if (t.dtype == DType::kF32) {
    std::memcpy(out, t.data, n * sizeof(float));
    return;
  }
  std::vector<uint16_t> bits(n);
  std::memcpy(bits.data(), t.data, n * sizeof(uint16_t));
  if (t.dtype == DType::kBF16) {
    ConvertBF16ToF32(bits.data(), out, n);
  } else {
    ConvertF16ToF32(bits.data(), out, n);
  }
}

void FillMatrix(const SafetensorsTensor& t, bool want_bf16, FrozenMatrix* m) {
  const size_t n = static_cast<size_t>(t.numel());
  if (want_bf16 && t.dtype == DType::kBF16) {
    m->bf16.resize(n);
    std::memcpy(m->bf16.data(), t.data, n * sizeof(uint16_t));
    return;
  }
  std::vector<float> f(n);
  ToF32(t, f.data());
  if (want_bf16) {
    m->bf16.resize(n);
    ConvertF32ToBF16(f.data(), m->bf16.data(), n);
  } else {
    m->f32 = std::move(f);
  }
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

// Deterministic initialisation: each tensor draws from its own core/rng.h stream of options.seed.
void FillUniform(uint64_t seed, uint64_t stream, float bound, std::vector<float>* v) {
  Rng rng(seed, stream);
  for (float& x : *v) x = static_cast<float>((2.0 * rng.Uniform() - 1.0) * bound);
}

void FillNormal(uint64_t seed, uint64_t stream, float stddev, std::vector<float>* v) {
  Rng rng(seed, stream);
  for (float& x : *v) x = static_cast<float>(rng.Normal(0.0, stddev));
}

// Stream ids for initialisation.
constexpr uint64_t kStreamClassifier = 1;
constexpr uint64_t kStreamPooler = 2;
constexpr uint64_t kStreamRandomBase = 3;      // FromRandom's base weights: + tensor index
constexpr uint64_t kStreamLoraBase = 1 << 20;  // + layer * kNumLoraTargets + target

// Input and output features of one encoder-layer linear.
void InOut(const BertConfig& c, LoraTarget t, int64_t* in, int64_t* out) {
  *in = t == LoraTarget::kOutput ? c.intermediate_size : c.hidden_size;
  *out = t == LoraTarget::kIntermediate ? c.intermediate_size : c.hidden_size;
}

}  // namespace

// --- BertBase ------------------------------------------------------------------------------------

// The frozen weights. Written only by BertBase::Make, before the base is shared; read-only after.
struct BertBase::Weights {
  FrozenMatrix word_emb, pos_emb, type_emb;
  std::vector<float> emb_ln_gamma, emb_ln_beta;
  std::vector<LayerWeights> layers;
  FrozenLinear pooler;  // BERT: dense + tanh on [CLS]; left empty for RoBERTa, whose head has none

  // Sets every shape from the config, LayerNorm gains to 1 and biases to 0 (HF's initialisation).
  void Shape(const BertConfig& config);
  // Fills every tensor from the safetensors file at `path`; sets *used_seed when the pooler was
  // missing and had to be drawn from `seed`.
  absl::Status Load(const std::string& path, const BertConfig& config, bool bf16, uint64_t seed,
                    bool* used_seed);
  // N(0, 0.02) matrices from `seed`, one stream per tensor.
  void Random(const BertConfig& config, bool bf16, uint64_t seed);
  int64_t Bytes() const;
};

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
  kernels::ExecContext ctx;  // CPU, kernels' default pool unless SetThreadPool gave one

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
  // [layer][LoraTarget]: index of lora_A in params (lora_B follows), -1 without LoRA.
  std::vector<std::array<int, kNumLoraTargets>> lora_param;
  int head_dense_param =
      -1;  // RoBERTa: trainable classifier.dense (weight, bias next); -1 for BERT
  int classifier_param = -1;  // the final linear: weight at params[classifier_param], bias next
  std::vector<int32_t> position_ids;  // [T], RoBERTa only (BERT's positions are 0..S-1)

  // Saved activations per layer, sized for max_batch * max_seq tokens (T) by Plan().
  struct LayerActs {
    std::vector<float> q, k, v;                  // [T, H] projections (bias and LoRA included)
    std::vector<float> lora_h[kNumLoraTargets];  // [T, r] dropout(x) A^T, for the LoRA backward
    std::vector<float> probs;                    // [B, heads, S, S] softmax before dropout
    std::vector<float> ctx;                      // [T, H] attention output
    std::vector<float> z1, mean1, rstd1;         // LN1 input [T, H] and statistics [T]
    std::vector<float> h1;                       // [T, H] LN1 output
    std::vector<float> u, g;                     // [T, I] intermediate before / after GELU
    std::vector<float> z2, mean2, rstd2;         // LN2 input and statistics
  };
  std::vector<LayerActs> acts;
  std::vector<std::vector<float>>
      x;                        // [L + 1][T, H]: x[0] embeddings output, x[l+1] layer l's output
  std::vector<float> mask_add;  // [B, S] additive attention mask: 0 keep, -1e30 padding
  std::vector<float> cls, pooled, cls_drop, logits;  // [B, H] x3, [B, labels]
  // Training loss only: per-class offsets added to the logits before the cross-entropy (logit
  // adjustment), and the head bias with them added; both empty when unset.
  std::vector<float> loss_logit_offsets, adjusted_bias;
  // Backward scratch.
  std::vector<float> dx, dh, dz, dctx, dq, dk, dv, dg;  // [T, H] ..., dg [T, I]
  std::vector<float> dlogits, dcls, dpooled;            // [B, labels], [B, H], [B, H]
  std::vector<float> workspace_storage;
  void* workspace = nullptr;  // 64-byte aligned start inside workspace_storage
  size_t workspace_bytes = 0;

  int64_t H() const { return config.hidden_size; }
  int64_t I() const { return config.intermediate_size; }
  int64_t L() const { return config.num_hidden_layers; }
  int64_t r() const { return options.lora.rank; }

  absl::Status InitStructure(std::vector<LoraTarget>* targets);
  absl::Status Plan();
  absl::Status CheckBatch(const Batch& batch, bool need_labels) const;
  absl::Status Encode(const Batch& batch, bool training, uint64_t seed);
  absl::Status Head(const Batch& batch, bool training, uint64_t seed, float* loss);
  absl::Status Backward(const Batch& batch, uint64_t seed);

  kernels::DropoutSpec HiddenDropout(bool training, uint64_t seed, uint64_t site) const {
    return Spec(training ? hidden_p : 0.0f, seed, site);
  }
  absl::Status LinearForward(int layer, LoraTarget t, const float* in, int64_t rows, float* y,
                             bool training, uint64_t seed);
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

void BertBase::Weights::Shape(const BertConfig& c) {
  const int64_t h = c.hidden_size;
  word_emb.rows = c.vocab_size;
  pos_emb.rows = c.max_position_embeddings;
  type_emb.rows = c.type_vocab_size;
  word_emb.cols = pos_emb.cols = type_emb.cols = h;
  emb_ln_gamma.assign(h, 1.0f);
  emb_ln_beta.assign(h, 0.0f);
  layers.resize(c.num_hidden_layers);
  for (LayerWeights& lw : layers) {
    for (LoraTarget t : kAllTargets) {
      int64_t in, out;
      InOut(c, t, &in, &out);
      FrozenLinear& lin = lw.lin[static_cast<int>(t)];
      lin.w.rows = out;
      lin.w.cols = in;
      lin.bias.assign(out, 0.0f);
    }
    lw.ln1_gamma.assign(h, 1.0f);
    lw.ln1_beta.assign(h, 0.0f);
    lw.ln2_gamma.assign(h, 1.0f);
    lw.ln2_beta.assign(h, 0.0f);
  }
  if (!c.is_roberta()) {
    pooler.w.rows = pooler.w.cols = h;
    pooler.bias.assign(h, 0.0f);
  }
}

absl::Status BertBase::Weights::Load(const std::string& path, const BertConfig& config, bool bf16,
                                     uint64_t seed, bool* used_seed) {
  FEDLORA_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(path));
  // BertFor* / RobertaFor* checkpoints prefix every name with "bert." / "roberta."; BertModel,
  // RobertaModel and sentence-transformers checkpoints do not.
  const std::string model_prefix = config.is_roberta() ? "roberta." : "bert.";
  const std::string prefix =
      file->Contains(model_prefix + "embeddings.word_embeddings.weight") ? model_prefix : "";
  struct Slot {
    std::string name;  // without prefix
    std::vector<int64_t> shape;
    FrozenMatrix* matrix = nullptr;  // exactly one of matrix / vec
    std::vector<float>* vec = nullptr;
    bool is_pooler = false;
  };
  std::vector<Slot> slots;
  auto matrix = [&](std::string name, FrozenMatrix* m, bool is_pooler = false) {
    slots.push_back(Slot{std::move(name), {m->rows, m->cols}, m, nullptr, is_pooler});
  };
  auto vec = [&](std::string name, std::vector<float>* v, bool is_pooler = false) {
    slots.push_back(
        Slot{std::move(name), {static_cast<int64_t>(v->size())}, nullptr, v, is_pooler});
  };
  matrix("embeddings.word_embeddings.weight", &word_emb);
  matrix("embeddings.position_embeddings.weight", &pos_emb);
  matrix("embeddings.token_type_embeddings.weight", &type_emb);
  vec("embeddings.LayerNorm.weight", &emb_ln_gamma);
  vec("embeddings.LayerNorm.bias", &emb_ln_beta);
  for (int l = 0; l < config.num_hidden_layers; ++l) {
    const std::string p = absl::StrCat("encoder.layer.", l, ".");
    LayerWeights& lw = layers[l];
    for (LoraTarget t : kAllTargets) {
      FrozenLinear& lin = lw.lin[static_cast<int>(t)];
      matrix(absl::StrCat(p, LoraTargetPath(t), ".weight"), &lin.w);
      vec(absl::StrCat(p, LoraTargetPath(t), ".bias"), &lin.bias);
    }
    vec(p + "attention.output.LayerNorm.weight", &lw.ln1_gamma);
    vec(p + "attention.output.LayerNorm.bias", &lw.ln1_beta);
    vec(p + "output.LayerNorm.weight", &lw.ln2_gamma);
    vec(p + "output.LayerNorm.bias", &lw.ln2_beta);
  }
  if (!config.is_roberta()) {  // RoBERTa's classification head does not use the pooler
    matrix("pooler.dense.weight", &pooler.w, true);
    vec("pooler.dense.bias", &pooler.bias, true);
  }

  std::vector<std::string> missing, missing_pooler, wrong;
  for (const Slot& s : slots) {
    const std::string full = prefix + s.name;
    if (!file->Contains(full)) {
      (s.is_pooler ? missing_pooler : missing).push_back(full);
      continue;
    }
    FEDLORA_ASSIGN_OR_RETURN(SafetensorsTensor t, file->Get(full));
    if (t.dtype != DType::kF32 && t.dtype != DType::kF16 && t.dtype != DType::kBF16) {
      wrong.push_back(absl::StrCat("'", full, "' has dtype ", std::string(DTypeName(t.dtype)),
                                   ", expected F32, F16 or BF16"));
    } else if (t.shape != s.shape) {
      wrong.push_back(absl::StrCat("'", full, "' has shape ", ShapeString(t.shape), ", expected ",
                                   ShapeString(s.shape), " from config.json"));
    }
  }
  if (missing_pooler.size() == 1) missing.push_back(missing_pooler[0]);  // half a pooler is corrupt
  auto listing = [](const std::vector<std::string>& items) {
    constexpr size_t kMaxListed =
        20;  // a wrong model can miss hundreds; name enough to recognise it
    std::vector<std::string> shown(items.begin(),
                                   items.begin() + std::min(items.size(), kMaxListed));
    std::string text = absl::StrJoin(shown, "; ");
    if (items.size() > kMaxListed)
      absl::StrAppend(&text, "; and ", items.size() - kMaxListed, " more");
    return text;
  };
  if (!missing.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": missing ", missing.size(),
                                                   " tensor(s) (name prefix \"", prefix,
                                                   "\"): ", listing(missing)));
  }
  if (!wrong.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": ", wrong.size(), " tensor(s) do not match the config: ", listing(wrong)));
  }
  for (const Slot& s : slots) {
    const std::string full = prefix + s.name;
    if (!file->Contains(full)) continue;  // the pooler, initialised below
    FEDLORA_ASSIGN_OR_RETURN(SafetensorsTensor t, file->Get(full));
    if (s.matrix != nullptr) {
      FillMatrix(t, bf16, s.matrix);
    } else {
      ToF32(t, s.vec->data());
    }
  }
  if (missing_pooler.size() == 2) {
    // HF initialises a weight missing from the checkpoint with N(0, initializer_range), bias 0.
    std::vector<float> w(pooler.w.rows * pooler.w.cols);
    FillNormal(seed, kStreamPooler, 0.02f, &w);
    *used_seed = true;
    if (bf16) {
      pooler.w.bf16.resize(w.size());
      ConvertF32ToBF16(w.data(), pooler.w.bf16.data(), w.size());
    } else {
      pooler.w.f32 = std::move(w);
    }
    std::fill(pooler.bias.begin(), pooler.bias.end(), 0.0f);
  }
  return absl::OkStatus();
}

void BertBase::Weights::Random(const BertConfig& config, bool bf16, uint64_t seed) {
  uint64_t stream = kStreamRandomBase;
  auto fill = [&](FrozenMatrix* m) {
    std::vector<float> w(m->rows * m->cols);
    FillNormal(seed, stream++, 0.02f, &w);
    if (bf16) {
      m->bf16.resize(w.size());
      ConvertF32ToBF16(w.data(), m->bf16.data(), w.size());
    } else {
      m->f32 = std::move(w);
    }
  };
  fill(&word_emb);
  fill(&pos_emb);
  fill(&type_emb);
  for (LayerWeights& lw : layers) {
    for (FrozenLinear& lin : lw.lin) fill(&lin.w);
  }
  if (!config.is_roberta()) fill(&pooler.w);
}

int64_t BertBase::Weights::Bytes() const {
  auto vec = [](const std::vector<float>& v) {
    return static_cast<int64_t>(v.size() * sizeof(float));
  };
  auto linear = [&](const FrozenLinear& lin) { return lin.w.bytes() + vec(lin.bias); };
  int64_t total = word_emb.bytes() + pos_emb.bytes() + type_emb.bytes() + vec(emb_ln_gamma) +
                  vec(emb_ln_beta) + linear(pooler);
  for (const LayerWeights& lw : layers) {
    for (const FrozenLinear& lin : lw.lin) total += linear(lin);
    total += vec(lw.ln1_gamma) + vec(lw.ln1_beta) + vec(lw.ln2_gamma) + vec(lw.ln2_beta);
  }
  return total;
}

BertBase::BertBase(BertConfig config, bool bf16_weights, bool bf16_math)
    : config_(std::move(config)),
      bf16_weights_(bf16_weights),
      bf16_math_(bf16_math),
      weights_(std::make_unique<Weights>()) {}

BertBase::~BertBase() = default;

int64_t BertBase::weight_bytes() const { return weights_->Bytes(); }

absl::StatusOr<std::shared_ptr<const BertBase>> BertBase::Make(BertConfig config,
                                                               const ModelOptions& options,
                                                               const std::string* weights_path) {
  FEDLORA_RETURN_IF_ERROR(config.Validate());
  if (options.bf16_math && !options.bf16_weights) {
    return absl::InvalidArgumentError("ModelOptions.bf16_math needs bf16_weights: bf16 GEMMs read bf16 weights");
  }
  std::shared_ptr<BertBase> base(new BertBase(std::move(config), options.bf16_weights, options.bf16_math));
  Weights& w = *base->weights_;
  w.Shape(base->config_);
  if (weights_path != nullptr) {
    bool used_seed = false;
    FEDLORA_RETURN_IF_ERROR(
        w.Load(*weights_path, base->config_, options.bf16_weights, options.seed, &used_seed));
    if (used_seed) base->weight_seed_ = options.seed;
  } else {
    w.Random(base->config_, options.bf16_weights, options.seed);
    base->weight_seed_ = options.seed;
  }
  // The encoder's GEMM weights (not the embedding tables, which are gathered, not multiplied).
  for (LayerWeights& lw : w.layers) {
    for (FrozenLinear& lin : lw.lin) lin.w.bf16_math = options.bf16_math;
  }
  w.pooler.w.bf16_math = options.bf16_math;
  return std::shared_ptr<const BertBase>(std::move(base));
}

absl::StatusOr<std::shared_ptr<const BertBase>> BertBase::Load(const std::string& model_dir,
                                                               const ModelOptions& options) {
  FEDLORA_ASSIGN_OR_RETURN(BertConfig config, ReadBertConfig(model_dir + "/config.json"));
  const std::string path = model_dir + "/model.safetensors";
  return Make(std::move(config), options, &path);
}

absl::StatusOr<std::shared_ptr<const BertBase>> BertBase::FromRandom(const BertConfig& config,
                                                                     const ModelOptions& options) {
  return Make(config, options, nullptr);
}

absl::Status BertClassifier::Impl::Plan() {
  const int64_t tokens = static_cast<int64_t>(options.max_batch) * options.max_seq;
  const int64_t h = H(), inter = I(), heads = config.num_attention_heads;
  const int64_t probs =
      static_cast<int64_t>(options.max_batch) * heads * options.max_seq * options.max_seq;
  acts.resize(L());
  for (LayerActs& a : acts) {
    for (auto* v : {&a.q, &a.k, &a.v, &a.ctx, &a.z1, &a.h1, &a.z2}) v->assign(tokens * h, 0.0f);
    for (auto* v : {&a.mean1, &a.rstd1, &a.mean2, &a.rstd2}) v->assign(tokens, 0.0f);
    a.u.assign(tokens * inter, 0.0f);
    a.g.assign(tokens * inter, 0.0f);
    a.probs.assign(probs, 0.0f);
    for (int t = 0; t < kNumLoraTargets; ++t) {
      if (use_target[t]) a.lora_h[t].assign(tokens * r(), 0.0f);
    }
  }
  x.assign(L() + 1, std::vector<float>(tokens * h, 0.0f));
  mask_add.assign(tokens, 0.0f);
  if (config.is_roberta()) position_ids.assign(tokens, 0);
  for (auto* v : {&cls, &pooled, &cls_drop, &dcls, &dpooled})
    v->assign(options.max_batch * h, 0.0f);
  logits.assign(options.max_batch * options.num_labels, 0.0f);
  dlogits.assign(options.max_batch * options.num_labels, 0.0f);
  for (auto* v : {&dx, &dh, &dz, &dctx, &dq, &dk, &dv}) v->assign(tokens * h, 0.0f);
  dg.assign(tokens * inter, 0.0f);

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
  workspace_storage.assign(need / sizeof(float) + 16 + 1, 0.0f);
  uintptr_t p = reinterpret_cast<uintptr_t>(workspace_storage.data());
  p = (p + 63) & ~uintptr_t{63};
  workspace = reinterpret_cast<void*>(p);
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
  const int lp = lora_param[layer][ti];
  if (lp < 0) {
    return kernels::LinearForward(ctx, {.rows = rows,
                                        .in_features = lin.w.cols,
                                        .out_features = lin.w.rows,
                                        .x = in,
                                        .w = lin.w.ptr(),
                                        .bias = lin.bias.data(),
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
            .w = lin.w.ptr(),
            .bias = lin.bias.data(),
            .lora_a = params[lp].value.data(),
            .lora_b = params[lp + 1].value.data(),
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
  const int lp = lora_param[layer][ti];
  if (lp < 0) {
    if (dx_out == nullptr)
      return absl::OkStatus();  // frozen, and nothing below needs its input gradient
    return kernels::LinearBackward(ctx, {.rows = rows,
                                         .in_features = lin.w.cols,
                                         .out_features = lin.w.rows,
                                         .w = lin.w.ptr(),
                                         .dy = dy,
                                         .dx = dx_out,
                                         .accumulate_dx = accumulate_dx,
                                         .workspace = workspace,
                                         .workspace_bytes = workspace_bytes});
  }
  Param& a = params[lp];
  Param& b = params[lp + 1];
  return kernels::LoraLinearBackward(
      ctx, {.rows = rows,
            .in_features = lin.w.cols,
            .out_features = lin.w.rows,
            .rank = r(),
            .x = in,
            .w = lin.w.ptr(),
            .lora_a = a.value.data(),
            .lora_b = b.value.data(),
            .scaling = lora_scaling,
            .dropout = Spec(lora_p, seed, LayerSite(layer, kSiteLora + ti)),
            .h = acts[layer].lora_h[ti].data(),
            .dy = dy,
            .dx = dx_out,
            .accumulate_dx = accumulate_dx,
            .da = a.grad.data(),
            .db = b.grad.data(),
            .accumulate_params = true,
            .workspace = workspace,
            .workspace_bytes = workspace_bytes});
}

absl::Status BertClassifier::Impl::Encode(const Batch& b, bool training, uint64_t seed) {
  const int64_t bsz = b.batch_size, seq = b.seq_len, tokens = bsz * seq, h = H();
  // Padding gets a large negative additive bias, so exp() underflows to exactly 0 (HF uses the
  // dtype's minimum; any value below about -100 times the score scale gives the same result).
  for (int64_t i = 0; i < tokens; ++i) {
    mask_add[i] = b.attention_mask.empty() || b.attention_mask[i] != 0 ? 0.0f : -1e30f;
  }
  const int32_t* positions = nullptr;  // BERT: 0..S-1 per sequence (the kernel's default)
  if (config.is_roberta()) {
    // HF create_position_ids_from_input_ids: pad + cumulative count of non-pad ids; pads get pad.
    const int32_t pad = static_cast<int32_t>(config.pad_token_id);
    for (int64_t s = 0; s < bsz; ++s) {
      int32_t count = 0;
      for (int64_t j = 0; j < seq; ++j) {
        const int64_t t = s * seq + j;
        const bool real = b.input_ids[t] != pad;
        count += real ? 1 : 0;
        position_ids[t] = real ? pad + count : pad;
      }
    }
    positions = position_ids.data();
  }
  float* x0 = x[0].data();
  FEDLORA_RETURN_IF_ERROR(kernels::EmbeddingForward(
      ctx, {.tokens = tokens,
            .hidden = h,
            .seq_len = seq,
            .vocab = word_emb.rows,
            .max_positions = pos_emb.rows,
            .type_vocab = type_emb.rows,
            .input_ids = b.input_ids.data(),
            .position_ids = positions,
            .token_type_ids = b.token_type_ids.empty() ? nullptr : b.token_type_ids.data(),
            .word = word_emb.ptr(),
            .position = pos_emb.ptr(),
            .token_type = type_emb.ptr(),
            .out = x0}));
  // The embeddings are frozen: their LayerNorm needs no saved statistics.
  FEDLORA_RETURN_IF_ERROR(
      kernels::LayerNormForward(ctx, {.rows = tokens,
                                      .cols = h,
                                      .eps = static_cast<float>(config.layer_norm_eps),
                                      .x = x0,
                                      .gamma = emb_ln_gamma.data(),
                                      .beta = emb_ln_beta.data(),
                                      .y = x0}));
  FEDLORA_RETURN_IF_ERROR(
      kernels::Dropout(ctx, {.n = tokens * h,
                             .spec = HiddenDropout(training, seed, kSiteEmbedding),
                             .x = x0,
                             .out = x0}));

  const kernels::AttentionDims dims{.batch = bsz,
                                    .heads = config.num_attention_heads,
                                    .seq = seq,
                                    .head_dim = config.head_dim(),
                                    .layout = kernels::AttentionLayout::kBSHD};
  const float eps = static_cast<float>(config.layer_norm_eps);
  for (int l = 0; l < L(); ++l) {
    LayerActs& a = acts[l];
    const LayerWeights& lw = layers[l];
    const float* in = x[l].data();
    FEDLORA_RETURN_IF_ERROR(
        LinearForward(l, LoraTarget::kQuery, in, tokens, a.q.data(), training, seed));
    FEDLORA_RETURN_IF_ERROR(
        LinearForward(l, LoraTarget::kKey, in, tokens, a.k.data(), training, seed));
    FEDLORA_RETURN_IF_ERROR(
        LinearForward(l, LoraTarget::kValue, in, tokens, a.v.data(), training, seed));
    FEDLORA_RETURN_IF_ERROR(kernels::AttentionForward(
        ctx, {.dims = dims,
              .q = a.q.data(),
              .k = a.k.data(),
              .v = a.v.data(),
              .mask = mask_add.data(),
              .dropout = Spec(training ? attention_p : 0.0f, seed, LayerSite(l, kSiteAttnProbs)),
              .probs = a.probs.data(),
              .out = a.ctx.data(),
              .workspace = workspace,
              .workspace_bytes = workspace_bytes}));
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
                                                            .gamma = lw.ln1_gamma.data(),
                                                            .beta = lw.ln1_beta.data(),
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
                                                            .gamma = lw.ln2_gamma.data(),
                                                            .beta = lw.ln2_beta.data(),
                                                            .y = x[l + 1].data(),
                                                            .mean = a.mean2.data(),
                                                            .rstd = a.rstd2.data()}));
  }
  return absl::OkStatus();
}

absl::Status BertClassifier::Impl::Head(const Batch& b, bool training, uint64_t seed, float* loss) {
  const int64_t bsz = b.batch_size, seq = b.seq_len, h = H();
  const float* last = x[L()].data();
  for (int64_t s = 0; s < bsz; ++s) {  // gather the [CLS] / <s> rows: B*H floats
    std::memcpy(cls.data() + s * h, last + s * seq * h, h * sizeof(float));
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
              .w = kernels::WeightPtr::F32(params[head_dense_param].value.data()),
              .bias = params[head_dense_param + 1].value.data(),
              .y = pooled.data()}));
  } else {
    FEDLORA_RETURN_IF_ERROR(kernels::LinearForward(ctx, {.rows = bsz,
                                                         .in_features = h,
                                                         .out_features = h,
                                                         .x = cls.data(),
                                                         .w = pooler.w.ptr(),
                                                         .bias = pooler.bias.data(),
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
  const Param& w = params[classifier_param];
  const Param& bias = params[classifier_param + 1];
  // Logit adjustment shifts every row's logits by the same per-class offsets, so it is the head's
  // bias plus the offsets; the bias gradient (the column sums of dlogits) is unchanged by it.
  const float* head_bias = bias.value.data();
  if (loss != nullptr && !loss_logit_offsets.empty()) {
    adjusted_bias.resize(loss_logit_offsets.size());
    for (size_t c = 0; c < adjusted_bias.size(); ++c)
      adjusted_bias[c] = bias.value[c] + loss_logit_offsets[c];
    head_bias = adjusted_bias.data();
  }
  FEDLORA_RETURN_IF_ERROR(kernels::LinearForward(ctx, {.rows = bsz,
                                                       .in_features = h,
                                                       .out_features = options.num_labels,
                                                       .x = cls_drop.data(),
                                                       .w = kernels::WeightPtr::F32(w.value.data()),
                                                       .bias = head_bias,
                                                       .y = logits.data()}));
  if (loss != nullptr) {
    FEDLORA_RETURN_IF_ERROR(kernels::SoftmaxCrossEntropy(ctx, {.batch = bsz,
                                                               .classes = options.num_labels,
                                                               .logits = logits.data(),
                                                               .labels = b.labels.data(),
                                                               .loss = loss,
                                                               .dlogits = dlogits.data()}));
  }
  return absl::OkStatus();
}

absl::Status BertClassifier::Impl::Backward(const Batch& b, uint64_t seed) {
  const int64_t bsz = b.batch_size, seq = b.seq_len, tokens = bsz * seq, h = H();
  Param& w = params[classifier_param];
  Param& bias = params[classifier_param + 1];
  // Final linear (trainable): dW += dlogits^T x, db += sum dlogits, dx = dlogits W.
  FEDLORA_RETURN_IF_ERROR(
      kernels::LinearBackward(ctx, {.rows = bsz,
                                    .in_features = h,
                                    .out_features = options.num_labels,
                                    .x = cls_drop.data(),
                                    .w = kernels::WeightPtr::F32(w.value.data()),
                                    .dy = dlogits.data(),
                                    .dx = dcls.data(),
                                    .dw = w.grad.data(),
                                    .dbias = bias.grad.data(),
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
    Param& dw = params[head_dense_param];
    Param& db = params[head_dense_param + 1];
    FEDLORA_RETURN_IF_ERROR(
        kernels::LinearBackward(ctx, {.rows = bsz,
                                      .in_features = h,
                                      .out_features = h,
                                      .x = cls.data(),
                                      .w = kernels::WeightPtr::F32(dw.value.data()),
                                      .dy = dpooled.data(),
                                      .dx = encoder_trainable ? dcls.data() : nullptr,
                                      .dw = dw.grad.data(),
                                      .dbias = db.grad.data(),
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
                                                          .w = pooler.w.ptr(),
                                                          .dy = dpooled.data(),
                                                          .dx = dcls.data(),
                                                          .workspace = workspace,
                                                          .workspace_bytes = workspace_bytes}));
  }
  // Only the [CLS] rows of the last hidden state receive a gradient.
  std::fill(dx.begin(), dx.begin() + tokens * h, 0.0f);
  for (int64_t s = 0; s < bsz; ++s)
    std::memcpy(dx.data() + s * seq * h, dcls.data() + s * h, h * sizeof(float));

  const kernels::AttentionDims dims{.batch = bsz,
                                    .heads = config.num_attention_heads,
                                    .seq = seq,
                                    .head_dim = config.head_dim(),
                                    .layout = kernels::AttentionLayout::kBSHD};
  const int64_t n = tokens * h;
  for (int l = static_cast<int>(L()) - 1; l >= 0; --l) {
    LayerActs& a = acts[l];
    const LayerWeights& lw = layers[l];
    const float* in = x[l].data();
    // dx holds d(loss)/d(layer output). LN2: dh = d/dz2; it is also the residual gradient to h1.
    FEDLORA_RETURN_IF_ERROR(kernels::LayerNormBackward(ctx, {.rows = tokens,
                                                             .cols = h,
                                                             .x = a.z2.data(),
                                                             .gamma = lw.ln2_gamma.data(),
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
                                                             .gamma = lw.ln1_gamma.data(),
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
    FEDLORA_RETURN_IF_ERROR(kernels::AttentionBackward(
        ctx, {.dims = dims,
              .q = a.q.data(),
              .k = a.k.data(),
              .v = a.v.data(),
              .probs = a.probs.data(),
              .dropout = Spec(attention_p, seed, LayerSite(l, kSiteAttnProbs)),
              .dout = dctx.data(),
              .dq = dq.data(),
              .dk = dk.data(),
              .dv = dv.data(),
              .workspace = workspace,
              .workspace_bytes = workspace_bytes}));
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
  if (base->weight_seed().has_value() && *base->weight_seed() != options.seed) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ModelOptions.seed is ", options.seed, " but the shared base drew some of its weights (",
        "FromRandom's, or a pooler missing from the checkpoint) from seed ", *base->weight_seed(),
        "; a classifier on this base must use that seed"));
  }
  std::unique_ptr<BertClassifier> model(new BertClassifier(std::move(base), options));
  FEDLORA_RETURN_IF_ERROR(model->impl_->InitStructure(&model->targets_));
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
  FEDLORA_RETURN_IF_ERROR(impl_->Encode(batch, /*training=*/true, dropout_seed));
  float loss = 0.0f;
  FEDLORA_RETURN_IF_ERROR(impl_->Head(batch, /*training=*/true, dropout_seed, &loss));
  FEDLORA_RETURN_IF_ERROR(impl_->Backward(batch, dropout_seed));
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
  FEDLORA_RETURN_IF_ERROR(impl_->Encode(batch, /*training=*/false, 0));
  FEDLORA_RETURN_IF_ERROR(impl_->Head(batch, /*training=*/false, 0, nullptr));
  return std::vector<float>(
      impl_->logits.begin(),
      impl_->logits.begin() + static_cast<int64_t>(batch.batch_size) * options_.num_labels);
}

absl::StatusOr<std::vector<float>> BertClassifier::PooledEmbeddings(const Batch& batch,
                                                                    Pooling pooling) {
  FEDLORA_RETURN_IF_ERROR(impl_->CheckBatch(batch, /*need_labels=*/false));
  FEDLORA_RETURN_IF_ERROR(impl_->Encode(batch, /*training=*/false, 0));
  const int64_t h = config().hidden_size, seq = batch.seq_len;
  const float* last = impl_->x[config().num_hidden_layers].data();
  std::vector<float> out(static_cast<size_t>(batch.batch_size) * h, 0.0f);
  std::vector<double> sum(h);
  for (int64_t s = 0; s < batch.batch_size; ++s) {
    float* o = out.data() + s * h;
    if (pooling == Pooling::kCls) {
      std::memcpy(o, last + s * seq * h, h * sizeof(float));
      continue;
    }
    // Mean over unpadded tokens, accumulated in double (seq up to 512 terms).
    std::fill(sum.begin(), sum.end(), 0.0);
    int64_t count = 0;
    for (int64_t j = 0; j < seq; ++j) {
      if (!batch.attention_mask.empty() && batch.attention_mask[s * seq + j] == 0) continue;
      const float* row = last + (s * seq + j) * h;
      for (int64_t c = 0; c < h; ++c) sum[c] += row[c];
      ++count;
    }
    for (int64_t c = 0; c < h; ++c) o[c] = static_cast<float>(sum[c] / static_cast<double>(count));
  }
  return out;
}

}  // namespace fedlora
