#include "model/bert.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "core/tensor.h"
#include "kernels/attention.h"
#include "kernels/base/backend.h"
#include "kernels/base/context.h"
#include "kernels/linear.h"
#include "kernels/lora_linear.h"
#include "model/bert_impl.h"
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

// --- Construction ----------------------------------------------------------------------------------

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
      a.frozen = o.lora.freeze_a;
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
  fused_attention = options.fused_attention.value_or(!on_host());
  const int64_t probs = fused_attention ? 1
                                        : static_cast<int64_t>(options.max_batch) * heads *
                                              options.max_seq * options.max_seq;
  kernels::Backend& be = *backend;
  auto zeros = [&](auto* array, int64_t count) -> absl::Status {
    using A = std::remove_pointer_t<decltype(array)>;
    FEDLORA_ASSIGN_OR_RETURN(*array, A::Zeros(be, static_cast<size_t>(count)));
    return absl::OkStatus();
  };
  acts.resize(L());
  for (LayerActs& a : acts) {
    for (Array* v : {&a.q, &a.k, &a.v, &a.ctx, &a.z1, &a.h1, &a.z2})
      FEDLORA_RETURN_IF_ERROR(zeros(v, tokens * h));
    for (Array* v : {&a.mean1, &a.rstd1, &a.mean2, &a.rstd2})
      FEDLORA_RETURN_IF_ERROR(zeros(v, tokens));
    FEDLORA_RETURN_IF_ERROR(zeros(&a.u, tokens * inter));
    FEDLORA_RETURN_IF_ERROR(zeros(&a.g, tokens * inter));
    FEDLORA_RETURN_IF_ERROR(zeros(&a.probs, probs));
    if (fused_attention) FEDLORA_RETURN_IF_ERROR(zeros(&a.lse, tokens * heads));
    for (int t = 0; t < kNumLoraTargets; ++t) {
      if (use_target[t]) FEDLORA_RETURN_IF_ERROR(zeros(&a.lora_h[t], tokens * r()));
    }
  }
  x.resize(L() + 1);
  for (Array& xl : x) FEDLORA_RETURN_IF_ERROR(zeros(&xl, tokens * h));
  mask_host.assign(tokens, 0.0f);
  seq_start_host.assign(options.max_batch + 1, 0);
  FEDLORA_RETURN_IF_ERROR(zeros(&dev_seq_start, options.max_batch + 1));
  for (auto* v : {&row_ids, &row_types, &row_positions}) v->assign(tokens, 0);
  for (Array* v : {&cls, &pooled, &cls_drop, &dcls, &dpooled})
    FEDLORA_RETURN_IF_ERROR(zeros(v, options.max_batch * h));
  FEDLORA_RETURN_IF_ERROR(zeros(&logits, options.max_batch * options.num_labels));
  FEDLORA_RETURN_IF_ERROR(zeros(&dlogits, options.max_batch * options.num_labels));
  FEDLORA_RETURN_IF_ERROR(zeros(&loss_value, 1));
  for (Array* v : {&dx, &dh, &dz, &dctx, &dq, &dk, &dv})
    FEDLORA_RETURN_IF_ERROR(zeros(v, tokens * h));
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
        {need, kernels::AttentionWorkspaceBytes(af), kernels::AttentionWorkspaceBytes(ab),
         kernels::FusedAttentionBackwardWorkspaceBytes({.tokens = tokens, .heads = heads})});
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

absl::Status BertClassifier::Impl::BindWeights(
    std::shared_ptr<const kernels::DeviceMirror> weights) {
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
    for (int t = 0; t < kNumLoraTargets; ++t)
      FEDLORA_RETURN_IF_ERROR(linear(lw.lin[t], &dl.lin[t]));
    FEDLORA_ASSIGN_OR_RETURN(dl.ln1_gamma, m.Get(lw.ln1_gamma.data()));
    FEDLORA_ASSIGN_OR_RETURN(dl.ln1_beta, m.Get(lw.ln1_beta.data()));
    FEDLORA_ASSIGN_OR_RETURN(dl.ln2_gamma, m.Get(lw.ln2_gamma.data()));
    FEDLORA_ASSIGN_OR_RETURN(dl.ln2_beta, m.Get(lw.ln2_beta.data()));
  }
  return linear(pooler, &dev_pooler);
}

// --- Public API ------------------------------------------------------------------------------------

BertClassifier::BertClassifier(std::shared_ptr<const BertBase> base, ModelOptions options)
    : base_(std::move(base)),
      options_(std::move(options)),
      impl_(std::make_unique<Impl>(base_->config(), options_, params_, *base_->weights_)) {}

BertClassifier::~BertClassifier() = default;

void BertClassifier::ZeroGrad() {
  for (Param& p : params_) std::fill(p.grad.begin(), p.grad.end(), 0.0f);
}

DeviceParams& BertClassifier::device_params() { return impl_->dev_params; }

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
    return absl::InvalidArgumentError(
        absl::StrCat("ModelOptions.bf16_math is ", options.bf16_math ? "true" : "false",
                     " but the shared base's is ", base->bf16_math() ? "true" : "false"));
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
  FEDLORA_RETURN_IF_ERROR(
      impl_->backend->Download(out.data(), impl_->logits.data(), out.size() * sizeof(float)));
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
    FEDLORA_RETURN_IF_ERROR(
        impl_->backend->Download(last_host.data(), last, last_host.size() * sizeof(float)));
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
