// BertBase: the frozen weights of a BERT-family encoder, read from a checkpoint or drawn at random.
#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/safetensors.h"
#include "core/status.h"
#include "core/tensor.h"
#include "kernels/base/backend.h"
#include "model/bert.h"
#include "model/bert_internal.h"

namespace fedlora {

using bert_internal::InOut;
using bert_internal::kAllTargets;
using bert_internal::kStreamPooler;
using bert_internal::kStreamRandomBase;
using bert_internal::LayerWeights;

namespace {

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::Status FillMatrix(const SafetensorsTensor& t, bool want_bf16, FrozenMatrix* m) {
  const size_t n = static_cast<size_t>(t.numel());
  if (want_bf16 && t.dtype == DType::kBF16) {
    m->bf16.resize(n);
    std::memcpy(m->bf16.data(), t.data, n * sizeof(uint16_t));
    return absl::OkStatus();
  }
  std::vector<float> f(n);
  FEDLORA_RETURN_IF_ERROR(t.CopyToF32(f.data()));
  if (want_bf16) {
    m->bf16.resize(n);
    ConvertF32ToBF16(f.data(), m->bf16.data(), n);
  } else {
    m->f32 = std::move(f);
  }
  return absl::OkStatus();
}

}  // namespace

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
    FEDLORA_RETURN_IF_ERROR(s.matrix != nullptr ? FillMatrix(t, bf16, s.matrix)
                                                : t.CopyToF32(s.vec->data()));
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

absl::Status BertBase::Weights::AddTo(kernels::DeviceMirror& mirror) const {
  for (const FrozenMatrix* m : {&word_emb, &pos_emb, &type_emb})
    FEDLORA_RETURN_IF_ERROR(m->AddTo(mirror));
  FEDLORA_RETURN_IF_ERROR(fedlora::AddTo(emb_ln_gamma, mirror));
  FEDLORA_RETURN_IF_ERROR(fedlora::AddTo(emb_ln_beta, mirror));
  for (const LayerWeights& lw : layers) {
    for (const FrozenLinear& lin : lw.lin) FEDLORA_RETURN_IF_ERROR(lin.AddTo(mirror));
    for (const std::vector<float>* v : {&lw.ln1_gamma, &lw.ln1_beta, &lw.ln2_gamma, &lw.ln2_beta}) {
      FEDLORA_RETURN_IF_ERROR(fedlora::AddTo(*v, mirror));
    }
  }
  return pooler.AddTo(mirror);
}

absl::StatusOr<std::shared_ptr<const kernels::DeviceMirror>> BertBase::WeightsOn(
    Device device) const {
  return mirrors_.Get(device, [this](kernels::DeviceMirror& m) { return weights_->AddTo(m); });
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
    return absl::InvalidArgumentError(
        "ModelOptions.bf16_math needs bf16_weights: bf16 GEMMs read bf16 weights");
  }
  std::shared_ptr<BertBase> base(
      new BertBase(std::move(config), options.bf16_weights, options.bf16_math));
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

}  // namespace fedlora
