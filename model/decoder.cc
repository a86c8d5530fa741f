// Decoder: target names, the frozen base, CausalLm construction and planning. The step is in
// decoder_step.cc, generation in decoder_generate.cc, checkpoint loading in decoder_load.cc.
// Just over 600 lines: construction and planning share the option checks; planning (the
// activation and workspace sizes) is what would move out next.
#include "model/decoder.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"
#include "kernels/attention.h"
#include "kernels/decode_attention.h"
#include "kernels/linear.h"
#include "kernels/lora_linear.h"
#include "model/decoder_impl.h"

namespace fedlora {
namespace {

constexpr DecoderTarget kAllTargets[kNumDecoderTargets] = {
    DecoderTarget::kQProj,   DecoderTarget::kKProj,    DecoderTarget::kVProj,
    DecoderTarget::kOProj,   DecoderTarget::kGateProj, DecoderTarget::kUpProj,
    DecoderTarget::kDownProj};

// Initialisation streams of options.seed (core/rng.h).
constexpr uint64_t kStreamRandomBase = 3;      // FromRandom: + tensor index
constexpr uint64_t kStreamLoraBase = 1 << 20;  // + layer * kNumDecoderTargets + target

}  // namespace

// --- Names ---------------------------------------------------------------------------------------

const char* DecoderTargetName(DecoderTarget t) {
  static constexpr const char* kNames[] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                           "gate_proj", "up_proj", "down_proj"};
  return kNames[static_cast<int>(t)];
}

const char* DecoderTargetPath(DecoderTarget t) {
  static constexpr const char* kPaths[] = {
      "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
      "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
  return kPaths[static_cast<int>(t)];
}

absl::StatusOr<DecoderTarget> ParseDecoderTarget(const std::string& name) {
  for (DecoderTarget t : kAllTargets) {
    if (name == DecoderTargetName(t) || name == DecoderTargetPath(t)) return t;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown LoRA target module \"", name,
                   "\" for a decoder (accepted: q_proj, k_proj, v_proj, o_proj, gate_proj, "
                   "up_proj, down_proj, or their paths "
                   "such as self_attn.q_proj)"));
}

// --- The frozen base -----------------------------------------------------------------------------

void DecoderBase::Weights::Shape(const DecoderConfig& c, DecoderTarget t, int64_t* out,
                                 int64_t* in) {
  switch (t) {
    case DecoderTarget::kQProj:
      *out = c.q_dim(), *in = c.hidden_size;
      return;
    case DecoderTarget::kKProj:
    case DecoderTarget::kVProj:
      *out = c.kv_dim(), *in = c.hidden_size;
      return;
    case DecoderTarget::kOProj:
      *out = c.hidden_size, *in = c.q_dim();
      return;
    case DecoderTarget::kGateProj:
    case DecoderTarget::kUpProj:
      *out = c.intermediate_size, *in = c.hidden_size;
      return;
    case DecoderTarget::kDownProj:
      *out = c.hidden_size, *in = c.intermediate_size;
      return;
  }
}

absl::Status DecoderBase::Weights::Check(const DecoderConfig& c) const {
  auto matrix = [](const FrozenMatrix& m, int64_t rows, int64_t cols,
                   const std::string& what) -> absl::Status {
    if (m.rows != rows || m.cols != cols || m.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(what, " is [", m.rows, ", ", m.cols,
                                                     "], expected [", rows, ", ", cols,
                                                     "] from the config"));
    }
    return absl::OkStatus();
  };
  auto vec = [](const std::vector<float>& v, int64_t n, const std::string& what) -> absl::Status {
    if (static_cast<int64_t>(v.size()) != n) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " has ", v.size(), " values, expected ", n));
    }
    return absl::OkStatus();
  };
  FEDLORA_RETURN_IF_ERROR(matrix(embed, c.vocab_size, c.hidden_size, "the token embeddings"));
  if (!lm_head.empty())
    FEDLORA_RETURN_IF_ERROR(matrix(lm_head, c.vocab_size, c.hidden_size, "the output head"));
  if (lm_head.empty() && !c.tie_word_embeddings) {
    return absl::InvalidArgumentError(
        "the checkpoint has no output head and the config does not tie it");
  }
  FEDLORA_RETURN_IF_ERROR(vec(final_norm, c.hidden_size, "the final norm"));
  if (static_cast<int64_t>(layers.size()) != c.num_hidden_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat(layers.size(), " layers, expected ", c.num_hidden_layers));
  }
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const DecoderLayerWeights& lw = layers[l];
    FEDLORA_RETURN_IF_ERROR(
        vec(lw.input_norm, c.hidden_size, absl::StrCat("layer ", l, " input norm")));
    FEDLORA_RETURN_IF_ERROR(vec(lw.post_attention_norm, c.hidden_size,
                                absl::StrCat("layer ", l, " post-attention norm")));
    for (DecoderTarget t : kAllTargets) {
      int64_t out, in;
      Shape(c, t, &out, &in);
      const FrozenLinear& lin = lw.proj[static_cast<int>(t)];
      const std::string what = absl::StrCat("layer ", l, " ", DecoderTargetName(t));
      FEDLORA_RETURN_IF_ERROR(matrix(lin.w, out, in, what));
      const bool want_bias =
          c.qkv_bias && static_cast<int>(t) <= static_cast<int>(DecoderTarget::kVProj);
      FEDLORA_RETURN_IF_ERROR(vec(lin.bias, want_bias ? out : 0, what + " bias"));
    }
  }
  return absl::OkStatus();
}

DecoderBase::DecoderBase(DecoderConfig config, std::unique_ptr<Weights> weights, bool bf16_math,
                         bool int8_math)
    : config_(std::move(config)),
      weights_(std::move(weights)),
      bf16_math_(bf16_math),
      int8_math_(int8_math) {}
DecoderBase::~DecoderBase() = default;

absl::StatusOr<std::shared_ptr<const DecoderBase>> MakeDecoderBase(
    DecoderConfig config, std::unique_ptr<DecoderBase::Weights> weights, bool bf16_math,
    bool int8_math) {
  FEDLORA_RETURN_IF_ERROR(config.Validate());
  FEDLORA_RETURN_IF_ERROR(weights->Check(config));
  if (bf16_math && int8_math)
    return absl::InvalidArgumentError("DecoderOptions: bf16_math and int8_math exclude each other");
  // The GEMM weights: every projection and the head (the tied embedding too, which the gather
  // reads as it is).
  FrozenMatrix& head = weights->lm_head.empty() ? weights->embed : weights->lm_head;
  std::vector<FrozenMatrix*> matrices = {&head};
  for (DecoderLayerWeights& lw : weights->layers) {
    for (FrozenLinear& lin : lw.proj) matrices.push_back(&lin.w);
  }
  if (int8_math) {
    int marked = 0;
    for (FrozenMatrix* m : matrices) {
      m->int8_math = !m->quant.empty() && m->quant_type == GgmlType::kQ8_0;
      marked += m->int8_math;
    }
    if (marked == 0) {
      return absl::InvalidArgumentError(
          "DecoderOptions.int8_math needs frozen matrices held as Q8_0 (weights = "
          "WeightStorage::kQ8_0)");
    }
  }
  if (bf16_math) {
    for (FrozenMatrix* m : matrices) {
      if (m->bf16.empty()) {
        return absl::InvalidArgumentError(
            "DecoderOptions.bf16_math needs the frozen matrices held as bf16 (weights = "
            "WeightStorage::kBF16)");
      }
      m->bf16_math = true;
    }
  }
  return std::shared_ptr<const DecoderBase>(
      new DecoderBase(std::move(config), std::move(weights), bf16_math, int8_math));
}

absl::Status DecoderBase::Weights::AddTo(kernels::DeviceMirror& mirror) const {
  FEDLORA_RETURN_IF_ERROR(embed.AddTo(mirror));
  FEDLORA_RETURN_IF_ERROR(lm_head.AddTo(mirror));
  FEDLORA_RETURN_IF_ERROR(fedlora::AddTo(final_norm, mirror));
  for (const DecoderLayerWeights& lw : layers) {
    FEDLORA_RETURN_IF_ERROR(fedlora::AddTo(lw.input_norm, mirror));
    FEDLORA_RETURN_IF_ERROR(fedlora::AddTo(lw.post_attention_norm, mirror));
    for (const FrozenLinear& lin : lw.proj) FEDLORA_RETURN_IF_ERROR(lin.AddTo(mirror));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const kernels::DeviceMirror>> DecoderBase::WeightsOn(
    Device device) const {
  return mirrors_.Get(device, [this](kernels::DeviceMirror& m) { return weights_->AddTo(m); });
}

int64_t DecoderBase::weight_bytes() const {
  auto vec = [](const std::vector<float>& v) {
    return static_cast<int64_t>(v.size() * sizeof(float));
  };
  int64_t total = weights_->embed.bytes() + weights_->lm_head.bytes() + vec(weights_->final_norm);
  for (const DecoderLayerWeights& lw : weights_->layers) {
    total += vec(lw.input_norm) + vec(lw.post_attention_norm);
    for (const FrozenLinear& lin : lw.proj) total += lin.w.bytes() + vec(lin.bias);
  }
  return total;
}

std::string DecoderBase::storage_summary() const {
  std::map<std::string, int> count;
  auto add = [&](const FrozenMatrix& m) {
    if (m.empty()) return;
    count[!m.quant.empty()  ? std::string(GgmlTypeName(m.quant_type))
          : !m.bf16.empty() ? "BF16"
                            : "F32"]++;
  };
  add(weights_->embed);
  add(weights_->lm_head);
  for (const DecoderLayerWeights& lw : weights_->layers) {
    for (const FrozenLinear& lin : lw.proj) add(lin.w);
  }
  std::vector<std::string> parts;
  for (const auto& [name, n] : count) parts.push_back(absl::StrCat(name, " x ", n));
  return absl::StrCat(absl::StrJoin(parts, ", "), " matrices");
}

absl::StatusOr<std::shared_ptr<const DecoderBase>> DecoderBase::FromRandom(
    const DecoderConfig& config, const DecoderOptions& options) {
  FEDLORA_RETURN_IF_ERROR(config.Validate());
  auto w = std::make_unique<Weights>();
  uint64_t stream = kStreamRandomBase;
  auto matrix = [&](FrozenMatrix* m, int64_t rows, int64_t cols) {
    std::vector<float> v(static_cast<size_t>(rows * cols));
    FillNormal(options.seed, stream++, 0.02f, &v);
    const bool keep =
        options.weights == WeightStorage::kBF16 || options.weights == WeightStorage::kQ8_0;
    m->SetF32(rows, cols, std::move(v), keep ? options.weights : WeightStorage::kF32);
  };
  const int64_t h = config.hidden_size;
  matrix(&w->embed, config.vocab_size, h);
  if (!config.tie_word_embeddings) matrix(&w->lm_head, config.vocab_size, h);
  w->final_norm.assign(h, 1.0f);
  w->layers.resize(config.num_hidden_layers);
  for (DecoderLayerWeights& lw : w->layers) {
    lw.input_norm.assign(h, 1.0f);
    lw.post_attention_norm.assign(h, 1.0f);
    for (DecoderTarget t : kAllTargets) {
      int64_t out, in;
      Weights::Shape(config, t, &out, &in);
      FrozenLinear& lin = lw.proj[static_cast<int>(t)];
      matrix(&lin.w, out, in);
      if (config.qkv_bias && static_cast<int>(t) <= static_cast<int>(DecoderTarget::kVProj))
        lin.bias.assign(out, 0.0f);
    }
  }
  return MakeDecoderBase(config, std::move(w), options.bf16_math, options.int8_math);
}

absl::StatusOr<std::shared_ptr<const DecoderBase>> DecoderBase::Load(
    const std::string& path, const DecoderOptions& options) {
  if (options.bf16_math && options.weights != WeightStorage::kBF16) {
    return absl::InvalidArgumentError(
        "DecoderOptions.bf16_math needs weights = WeightStorage::kBF16");
  }
  if (options.int8_math && options.weights != WeightStorage::kQ8_0) {
    return absl::InvalidArgumentError(
        "DecoderOptions.int8_math needs weights = WeightStorage::kQ8_0");
  }
  if (IsGgufPath(path)) return LoadDecoderGguf(path, options);
  return LoadDecoderSafetensors(path, options);
}

// --- CausalLm construction -------------------------------------------------------------------------

namespace {

absl::Status ValidateOptions(const DecoderConfig& c, const DecoderOptions& o) {
  if (o.max_batch < 1 || o.max_seq < 1) {
    return absl::InvalidArgumentError(absl::StrCat("max_batch and max_seq must be positive, got ",
                                                   o.max_batch, " and ", o.max_seq));
  }
  if (o.max_seq > c.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat("max_seq ", o.max_seq, " exceeds the model's ",
                                                   c.max_position_embeddings,
                                                   " positions (max_position_embeddings)"));
  }
  if (static_cast<int64_t>(o.max_batch) * o.max_seq > (int64_t{1} << 24)) {
    return absl::InvalidArgumentError("max_batch x max_seq above 2^24 tokens");
  }
  const int64_t min_dim = std::min({c.hidden_size, c.kv_dim(), c.intermediate_size, c.q_dim()});
  if (o.lora.rank < 1 || o.lora.rank > min_dim) {
    return absl::InvalidArgumentError(
        absl::StrCat("LoRA rank must be in [1, ", min_dim, "] for this model, got ", o.lora.rank));
  }
  if (!std::isfinite(o.lora.alpha)) return absl::InvalidArgumentError("LoRA alpha must be finite");
  if (!(o.lora.dropout >= 0.0f && o.lora.dropout < 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("LoRA dropout must be in [0, 1), got ", o.lora.dropout));
  }
  if (o.lora.target_modules.empty()) return absl::InvalidArgumentError("no LoRA target modules");
  for (const std::string& name : o.lora.target_modules)
    FEDLORA_RETURN_IF_ERROR(ParseDecoderTarget(name).status());
  return absl::OkStatus();
}

}  // namespace

CausalLm::CausalLm(std::shared_ptr<const DecoderBase> base, DecoderOptions options)
    : base_(std::move(base)), options_(std::move(options)) {}
CausalLm::~CausalLm() = default;

absl::StatusOr<std::unique_ptr<CausalLm>> CausalLm::Load(const std::string& path,
                                                         const DecoderOptions& options) {
  FEDLORA_ASSIGN_OR_RETURN(auto base, DecoderBase::Load(path, options));
  return Create(std::move(base), options);
}

absl::StatusOr<std::unique_ptr<CausalLm>> CausalLm::Create(std::shared_ptr<const DecoderBase> base,
                                                           const DecoderOptions& options) {
  if (base == nullptr) return absl::InvalidArgumentError("CausalLm::Create: null base");
  const DecoderConfig& c = base->config();
  FEDLORA_RETURN_IF_ERROR(ValidateOptions(c, options));
  if (options.bf16_math != base->bf16_math()) {
    return absl::InvalidArgumentError(
        absl::StrCat("DecoderOptions.bf16_math is ", options.bf16_math ? "true" : "false",
                     " but the shared base's is ", base->bf16_math() ? "true" : "false"));
  }
  if (options.int8_math != base->int8_math()) {
    return absl::InvalidArgumentError(
        absl::StrCat("DecoderOptions.int8_math is ", options.int8_math ? "true" : "false",
                     " but the shared base's is ", base->int8_math() ? "true" : "false"));
  }
  if (options.device == Device::kCuda && options.int8_math) {
    return absl::UnimplementedError(
        "DecoderOptions.int8_math runs on the CPU only: on CUDA the GEMMs are fp32 or bf16");
  }
  FEDLORA_ASSIGN_OR_RETURN(auto on_device, base->WeightsOn(options.device));
  std::unique_ptr<CausalLm> lm(new CausalLm(std::move(base), options));
  const DecoderOptions& o = lm->options_;
  lm->impl_ = std::make_unique<Impl>(c, lm->base_->weights(), o, lm->params_);
  Impl& im = *lm->impl_;
  for (const std::string& name : o.lora.target_modules) {
    im.use_target[static_cast<int>(*ParseDecoderTarget(name))] = true;
  }
  for (DecoderTarget t : kAllTargets) {
    if (im.use_target[static_cast<int>(t)]) lm->targets_.push_back(t);
  }
  im.lora_scaling = o.lora.alpha / static_cast<float>(o.lora.rank);
  im.lora_p = o.lora.dropout;
  im.attention_p = static_cast<float>(c.attention_dropout);
  im.lora_param.assign(c.num_hidden_layers, {});
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    im.lora_param[l].fill(-1);
    for (DecoderTarget t : lm->targets_) {
      const int ti = static_cast<int>(t);
      int64_t out, in;
      DecoderBase::Weights::Shape(c, t, &out, &in);
      im.lora_param[l][ti] = static_cast<int>(lm->params_.size());
      const std::string name =
          absl::StrCat("base_model.model.model.layers.", l, ".", DecoderTargetPath(t));
      Param a{name + ".lora_A.weight",
              {o.lora.rank, in},
              std::vector<float>(o.lora.rank * in),
              std::vector<float>(o.lora.rank * in, 0.0f),
              true};
      a.frozen = o.lora.freeze_a;
      // PEFT: kaiming_uniform_(A, a=sqrt(5)) -> bound 1 / sqrt(fan_in); B starts at zero.
      FillUniform(o.seed, kStreamLoraBase + l * kNumDecoderTargets + ti,
                  1.0f / std::sqrt(static_cast<float>(in)), &a.value);
      Param b{name + ".lora_B.weight",
              {out, o.lora.rank},
              std::vector<float>(out * o.lora.rank, 0.0f),
              std::vector<float>(out * o.lora.rank, 0.0f),
              true};
      lm->params_.push_back(std::move(a));
      lm->params_.push_back(std::move(b));
    }
  }
  FEDLORA_RETURN_IF_ERROR(im.BindWeights(std::move(on_device)));
  FEDLORA_RETURN_IF_ERROR(im.Plan());
  return lm;
}

void CausalLm::ZeroGrad() {
  for (Param& p : params_) std::fill(p.grad.begin(), p.grad.end(), 0.0f);
}

DeviceParams& CausalLm::device_params() { return impl_->dev_params; }

void CausalLm::SetThreadPool(ThreadPool* pool) { impl_->ctx.pool = pool; }

absl::Status CausalLm::Impl::Plan() {
  const int64_t tokens = static_cast<int64_t>(options.max_batch) * options.max_seq;
  const int64_t h = H(), qd = config.q_dim(), kvd = config.kv_dim(),
                inter = config.intermediate_size;
  fused_attention = options.fused_attention.value_or(!on_host());
  const int64_t probs_elems = fused_attention ? 1
                                              : static_cast<int64_t>(options.max_batch) *
                                                    config.num_attention_heads * options.max_seq *
                                                    options.max_seq;
  kernels::Backend& be = *backend;
  auto zeros = [&](auto* array, int64_t count) -> absl::Status {
    using A = std::remove_pointer_t<decltype(array)>;
    FEDLORA_ASSIGN_OR_RETURN(*array, A::Zeros(be, static_cast<size_t>(count)));
    return absl::OkStatus();
  };
  rope = kernels::MakeRopeTables(config.rope_theta, config.head_dim, options.max_seq);
  acts.resize(options.recompute_activations ? 1 : L());
  for (DecoderLayerActs& a : acts) {
    FEDLORA_RETURN_IF_ERROR(zeros(&a.z, tokens * h));
    for (Array* v : {&a.q, &a.ctx}) FEDLORA_RETURN_IF_ERROR(zeros(v, tokens * qd));
    for (Array* v : {&a.k, &a.v}) FEDLORA_RETURN_IF_ERROR(zeros(v, tokens * kvd));
    for (Array* v : {&a.gate, &a.up}) FEDLORA_RETURN_IF_ERROR(zeros(v, tokens * inter));
    if (fused_attention)
      FEDLORA_RETURN_IF_ERROR(zeros(&a.lse, tokens * config.num_attention_heads));
    for (int t = 0; t < kNumDecoderTargets; ++t) {
      if (use_target[t]) FEDLORA_RETURN_IF_ERROR(zeros(&a.lora_h[t], tokens * r()));
    }
  }
  x.resize(L() + 1);
  for (Array& xl : x) FEDLORA_RETURN_IF_ERROR(zeros(&xl, tokens * h));
  FEDLORA_RETURN_IF_ERROR(zeros(&nf, tokens * h));
  FEDLORA_RETURN_IF_ERROR(zeros(&rstd_f, tokens));
  mask_host.assign(tokens, 0.0f);
  positions_host.assign(tokens, 0);
  seq_start_host.assign(options.max_batch + 1, 0);
  FEDLORA_RETURN_IF_ERROR(zeros(&dev_seq_start, options.max_batch + 1));
  FEDLORA_RETURN_IF_ERROR(zeros(&tmp, tokens * h));
  FEDLORA_RETURN_IF_ERROR(zeros(&norm, tokens * h));
  FEDLORA_RETURN_IF_ERROR(zeros(&rstd, tokens));
  FEDLORA_RETURN_IF_ERROR(zeros(&act, tokens * inter));
  FEDLORA_RETURN_IF_ERROR(zeros(&probs, probs_elems));
  for (Array* v : {&dx, &dn}) FEDLORA_RETURN_IF_ERROR(zeros(v, tokens * h));
  for (Array* v : {&dq, &dctx}) FEDLORA_RETURN_IF_ERROR(zeros(v, tokens * qd));
  for (Array* v : {&dk, &dv}) FEDLORA_RETURN_IF_ERROR(zeros(v, tokens * kvd));
  for (Array* v : {&dgate, &dup, &dact}) FEDLORA_RETURN_IF_ERROR(zeros(v, tokens * inter));
  const int64_t chunk = std::min<int64_t>(kLmHeadChunkRows, tokens);
  FEDLORA_RETURN_IF_ERROR(zeros(&head_in, chunk * h));
  FEDLORA_RETURN_IF_ERROR(zeros(&dhead_in, chunk * h));
  FEDLORA_RETURN_IF_ERROR(zeros(&head_logits, chunk * config.vocab_size));
  FEDLORA_RETURN_IF_ERROR(zeros(&head_loss, (tokens + chunk - 1) / chunk));
  head_labels_host.assign(chunk, 0);
  if (!on_host()) {
    FEDLORA_RETURN_IF_ERROR(zeros(&rope_cos, static_cast<int64_t>(rope.cos.size())));
    FEDLORA_RETURN_IF_ERROR(zeros(&rope_sin, static_cast<int64_t>(rope.sin.size())));
    FEDLORA_ASSIGN_OR_RETURN(rope_cos_ptr, Stage(be, rope.cos, rope.cos.size(), rope_cos));
    FEDLORA_ASSIGN_OR_RETURN(rope_sin_ptr, Stage(be, rope.sin, rope.sin.size(), rope_sin));
    FEDLORA_RETURN_IF_ERROR(zeros(&dev_mask, tokens));
    FEDLORA_RETURN_IF_ERROR(zeros(&dev_positions, tokens));
    FEDLORA_RETURN_IF_ERROR(zeros(&head_labels, chunk));
    embed_host.assign(tokens * h, 0.0f);
  } else {
    rope_cos_ptr = rope.cos.data();
    rope_sin_ptr = rope.sin.data();
  }
  FEDLORA_RETURN_IF_ERROR(dev_params.Bind(be));

  // Workspace: the largest any kernel of a step asks for at the planned sizes.
  size_t need = 0;
  for (DecoderTarget t : kAllTargets) {
    const int ti = static_cast<int>(t);
    int64_t out, in;
    DecoderBase::Weights::Shape(config, t, &out, &in);
    const kernels::WeightPtr w =
        weights.layers[0].proj[ti].w.ptr();  // the host's: shapes and format only
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
    kernels::LinearForwardArgs lf{.rows = tokens, .in_features = in, .out_features = out, .w = w};
    kernels::LinearBackwardArgs lb{
        .rows = tokens, .in_features = in, .out_features = out, .w = w, .dx = dx.data()};
    need =
        std::max({need, kernels::LoraLinearWorkspaceBytes(f), kernels::LoraLinearWorkspaceBytes(b),
                  kernels::LinearWorkspaceBytes(lf), kernels::LinearWorkspaceBytes(lb)});
  }
  {
    kernels::LinearForwardArgs f{.rows = chunk,
                                 .in_features = h,
                                 .out_features = config.vocab_size,
                                 .w = weights.head().ptr()};
    kernels::LinearBackwardArgs b{.rows = chunk,
                                  .in_features = h,
                                  .out_features = config.vocab_size,
                                  .w = weights.head().ptr(),
                                  .dx = dx.data()};
    need = std::max({need, kernels::LinearWorkspaceBytes(f), kernels::LinearWorkspaceBytes(b)});
  }
  {
    kernels::AttentionDims dims{.batch = options.max_batch,
                                .heads = config.num_attention_heads,
                                .seq = options.max_seq,
                                .head_dim = config.head_dim,
                                .kv_heads = config.num_key_value_heads,
                                .causal = true};
    kernels::AttentionForwardArgs af{.dims = dims, .dropout = {attention_p, 0, 0}};
    kernels::AttentionBackwardArgs ab{.dims = dims, .dropout = {attention_p, 0, 0}};
    need =
        std::max({need, kernels::AttentionWorkspaceBytes(af), kernels::AttentionWorkspaceBytes(ab),
                  kernels::FusedAttentionBackwardWorkspaceBytes(
                      {.tokens = tokens, .heads = config.num_attention_heads})});
  }
  need =
      std::max(need, kernels::DecodeAttentionWorkspaceBytes({.heads = config.num_attention_heads,
                                                             .kv_heads = config.num_key_value_heads,
                                                             .head_dim = config.head_dim,
                                                             .len = options.max_seq}));
  FEDLORA_RETURN_IF_ERROR(zeros(&workspace_storage, static_cast<int64_t>(need)));
  workspace = workspace_storage.data();
  workspace_bytes = need;
  return absl::OkStatus();
}

absl::Status CausalLm::Impl::BindWeights(std::shared_ptr<const kernels::DeviceMirror> on_device) {
  FEDLORA_ASSIGN_OR_RETURN(backend, OpenBackend(options.device, &ctx));
  mirror = std::move(on_device);
  const kernels::DeviceMirror& m = *mirror;
  dev_layers.resize(weights.layers.size());
  for (size_t l = 0; l < weights.layers.size(); ++l) {
    const DecoderLayerWeights& lw = weights.layers[l];
    DevLayer& dl = dev_layers[l];
    for (int t = 0; t < kNumDecoderTargets; ++t) {
      FEDLORA_ASSIGN_OR_RETURN(dl.proj[t].w, m.Get(lw.proj[t].w.ptr()));
      FEDLORA_ASSIGN_OR_RETURN(dl.proj[t].bias,
                               m.Get(lw.proj[t].bias.empty() ? nullptr : lw.proj[t].bias.data()));
    }
    FEDLORA_ASSIGN_OR_RETURN(dl.input_norm, m.Get(lw.input_norm.data()));
    FEDLORA_ASSIGN_OR_RETURN(dl.post_attention_norm, m.Get(lw.post_attention_norm.data()));
  }
  FEDLORA_ASSIGN_OR_RETURN(dev_final_norm, m.Get(weights.final_norm.data()));
  FEDLORA_ASSIGN_OR_RETURN(dev_head, m.Get(weights.head().ptr()));
  return absl::OkStatus();
}

absl::Status CausalLm::Impl::CheckBatch(const Batch& b, bool need_labels) const {
  if (b.batch_size < 1 || b.seq_len < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("empty batch: batch_size ", b.batch_size, ", seq_len ", b.seq_len));
  }
  if (b.batch_size > options.max_batch || b.seq_len > options.max_seq) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch ", b.batch_size, " x ", b.seq_len, " exceeds the planned maximum ",
        options.max_batch, " x ", options.max_seq, " (DecoderOptions max_batch, max_seq)"));
  }
  const size_t n = static_cast<size_t>(b.batch_size) * b.seq_len;
  if (b.input_ids.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat("input_ids has ", b.input_ids.size(),
                                                   " entries, expected ", b.batch_size, " x ",
                                                   b.seq_len));
  }
  if (!b.attention_mask.empty() && b.attention_mask.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat("attention_mask has ", b.attention_mask.size(),
                                                   " entries, expected 0 or ", n));
  }
  if (need_labels && b.labels.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("labels has ", b.labels.size(), " entries, expected ", n));
  }
  for (size_t i = 0; i < n; ++i) {
    if (b.input_ids[i] < 0 || b.input_ids[i] >= config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("input_ids[", i, "] = ", b.input_ids[i],
                                                     " outside the vocabulary [0, ",
                                                     config.vocab_size, ")"));
    }
    if (need_labels && b.labels[i] != -100 &&
        (b.labels[i] < 0 || b.labels[i] >= config.vocab_size)) {
      return absl::InvalidArgumentError(absl::StrCat("labels[", i, "] = ", b.labels[i],
                                                     ": neither -100 nor a token id below ",
                                                     config.vocab_size));
    }
  }
  if (!b.attention_mask.empty()) {
    for (int s = 0; s < b.batch_size; ++s) {
      const int32_t* row = b.attention_mask.data() + static_cast<size_t>(s) * b.seq_len;
      if (row[0] != 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "sequence ", s, " does not start with a token (attention_mask[0] = ", row[0],
            "): decoders take right-padded batches"));
      }
      bool padding = false;
      for (int j = 0; j < b.seq_len; ++j) {
        if (row[j] != 0 && row[j] != 1) {
          return absl::InvalidArgumentError(
              absl::StrCat("attention_mask value ", row[j], ", expected 0 or 1"));
        }
        if (row[j] == 0) padding = true;
        if (row[j] == 1 && padding) {
          return absl::InvalidArgumentError(absl::StrCat(
              "sequence ", s, " has a token after padding: decoders take right-padded batches"));
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace fedlora
