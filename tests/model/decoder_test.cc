// The decoder's contract beyond what decoder_reference_test.py compares with transformers:
// config parsing and refusals, batch validation, gradients against finite differences,
// activation recomputation, generation with and without the KV cache, and the memory of a
// quantized base.
#include "model/decoder.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/gemm.h"
#include "model/decoder_config.h"
#include "model/decoder_weights.h"

namespace fedlora {
namespace {

DecoderConfig Tiny() {
  DecoderConfig c;
  c.vocab_size = 96;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.max_position_embeddings = 64;
  c.rms_norm_eps = 1e-5;
  c.tie_word_embeddings = true;
  return c;
}

DecoderOptions Opts() {
  DecoderOptions o;
  o.lora.rank = 2;
  o.max_batch = 2;
  o.max_seq = 10;
  o.seed = 3;
  return o;
}

CausalLm::Batch TwoRows() {
  CausalLm::Batch b;
  b.batch_size = 2;
  b.seq_len = 6;
  b.input_ids = {5, 17, 3, 44, 90, 12, 7, 8, 9, 0, 0, 0};
  b.attention_mask = {1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0};
  b.labels = {-100, -100, 3, 44, 90, 12, 7, 8, 9, -100, -100, -100};
  return b;
}

std::unique_ptr<CausalLm> Make(const DecoderOptions& o, DecoderConfig c = Tiny()) {
  auto base = DecoderBase::FromRandom(c, o);
  EXPECT_TRUE(base.ok()) << base.status();
  auto lm = CausalLm::Create(*base, o);
  EXPECT_TRUE(lm.ok()) << lm.status();
  // Nonzero B, so that the A gradients are not all zero.
  for (Param& p : (*lm)->trainable_params()) {
    if (p.name.find("lora_B") != std::string::npos) {
      for (size_t i = 0; i < p.value.size(); ++i)
        p.value[i] = 0.05f * std::sin(static_cast<float>(i) + 1.0f);
    }
  }
  return std::move(*lm);
}

TEST(DecoderConfig, ParsesLlamaAndRefusesWhatItDoesNotCompute) {
  nlohmann::json j = {{"model_type", "llama"},    {"vocab_size", 100},
                      {"hidden_size", 64},        {"intermediate_size", 128},
                      {"num_hidden_layers", 2},   {"num_attention_heads", 4},
                      {"num_key_value_heads", 2}, {"eos_token_id", {2, 3}},
                      {"rope_theta", 100000.0},   {"tie_word_embeddings", true}};
  auto c = ParseDecoderConfig(j, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->kv_dim(), 32);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int64_t>{2, 3}));
  EXPECT_FALSE(c->qkv_bias);
  struct Bad {
    const char* key;
    nlohmann::json value;
    const char* message;
  };
  for (const Bad& bad :
       {Bad{"rope_scaling", {{"type", "linear"}, {"factor", 2.0}}, "rope_scaling"},
        Bad{"attention_bias", true, "attention_bias"}, Bad{"mlp_bias", true, "mlp_bias"},
        Bad{"hidden_act", "gelu", "hidden_act"}, Bad{"num_key_value_heads", 3, "multiple"},
        Bad{"model_type", "gpt2", "unknown decoder architecture"},
        Bad{"pretraining_tp", 2, "pretraining_tp"}}) {
    nlohmann::json b = j;
    b[bad.key] = bad.value;
    auto st = ParseDecoderConfig(b, "config.json").status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << bad.key;
    EXPECT_NE(std::string(st.message()).find(bad.message), std::string::npos) << st;
  }
  nlohmann::json q = j;
  q["model_type"] = "qwen2";
  q["use_sliding_window"] = true;
  EXPECT_FALSE(ParseDecoderConfig(q, "config.json").ok());
  q["use_sliding_window"] = false;
  auto qc = ParseDecoderConfig(q, "config.json");
  ASSERT_TRUE(qc.ok()) << qc.status();
  EXPECT_TRUE(qc->qkv_bias);
}

TEST(CausalLm, NamesItsAdaptersAsPeft) {
  auto lm = Make(Opts());
  const auto& params = lm->trainable_params();
  ASSERT_EQ(params.size(), 2u * 7 * 2);
  EXPECT_EQ(params[0].name, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
  EXPECT_EQ(params[0].shape, (std::vector<int64_t>{2, 32}));
  EXPECT_EQ(params[3].name, "base_model.model.model.layers.0.self_attn.k_proj.lora_B.weight");
  EXPECT_EQ(params[3].shape, (std::vector<int64_t>{16, 2}));
  EXPECT_EQ(params.back().name, "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight");
}

TEST(CausalLm, GradientsMatchFiniteDifferences) {
  auto lm = Make(Opts());
  const CausalLm::Batch b = TwoRows();
  lm->ZeroGrad();
  auto loss = lm->ForwardBackward(b, 1);
  ASSERT_TRUE(loss.ok()) << loss.status();
  // A sample of entries of every adapter: central differences of the mean loss in double.
  for (Param& p : lm->trainable_params()) {
    for (size_t i = 0; i < p.value.size(); i += 7) {
      const float saved = p.value[i];
      const float eps = 1e-2f;
      p.value[i] = saved + eps;
      auto up = lm->Evaluate(b);
      p.value[i] = saved - eps;
      auto down = lm->Evaluate(b);
      p.value[i] = saved;
      ASSERT_TRUE(up.ok() && down.ok());
      const double numeric = (up->nll / up->tokens - down->nll / down->tokens) / (2.0 * eps);
      EXPECT_NEAR(p.grad[i], numeric, 2e-3 + 2e-2 * std::abs(numeric)) << p.name << "[" << i << "]";
    }
  }
}

TEST(CausalLm, RecomputingActivationsGivesTheSameGradients) {
  DecoderOptions o = Opts();
  o.lora.dropout = 0.1f;  // the recomputed forward must redraw the same masks
  auto a = Make(o);
  o.recompute_activations = true;
  auto b = Make(o);
  a->ZeroGrad();
  b->ZeroGrad();
  auto la = a->ForwardBackward(TwoRows(), 42);
  auto lb = b->ForwardBackward(TwoRows(), 42);
  ASSERT_TRUE(la.ok() && lb.ok());
  EXPECT_EQ(*la, *lb);
  for (size_t i = 0; i < a->trainable_params().size(); ++i) {
    EXPECT_EQ(a->trainable_params()[i].grad, b->trainable_params()[i].grad)
        << a->trainable_params()[i].name;
  }
}

// Fused attention (kernels/fused_attention.h), on the CPU here as it runs by default on CUDA:
// the same loss and gradients as the materialising attention, with attention dropout, a
// right-padded row and recomputed activations; and the same greedy tokens.
TEST(CausalLm, FusedAttentionGivesTheMaterialisingAttentionsResults) {
  DecoderConfig c = Tiny();
  c.attention_dropout = 0.1;
  for (bool recompute : {false, true}) {
    DecoderOptions o = Opts();
    o.recompute_activations = recompute;
    o.fused_attention = false;
    auto plain = Make(o, c);
    o.fused_attention = true;
    auto fused = Make(o, c);
    plain->ZeroGrad();
    fused->ZeroGrad();
    auto lp = plain->ForwardBackward(TwoRows(), 42);
    auto lf = fused->ForwardBackward(TwoRows(), 42);
    ASSERT_TRUE(lp.ok() && lf.ok()) << lp.status() << lf.status();
    EXPECT_NEAR(*lf, *lp, 1e-5f * std::fabs(*lp));
    for (size_t i = 0; i < plain->trainable_params().size(); ++i) {
      const Param &p = plain->trainable_params()[i], &f = fused->trainable_params()[i];
      float largest = 0.0f;
      for (float g : p.grad) largest = std::max(largest, std::fabs(g));
      ASSERT_GT(largest, 0.0f) << p.name;
      for (size_t j = 0; j < p.grad.size(); ++j)
        ASSERT_NEAR(f.grad[j], p.grad[j], 1e-4f * largest) << p.name;
    }
  }
  DecoderOptions o = Opts();
  o.fused_attention = false;
  auto plain = Make(o);
  o.fused_attention = true;
  auto fused = Make(o);
  for (bool cache : {false, true}) {
    const CausalLm::GenerateOptions go{.max_new_tokens = 4, .stop_ids = {}, .use_cache = cache};
    auto a = plain->Generate({5, 17, 3}, go);
    auto b = fused->Generate({5, 17, 3}, go);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(*b, *a) << "cache " << cache;
  }
}

TEST(CausalLm, GreedyDecodingWithTheCacheEqualsDecodingWithout) {
  for (bool tied : {true, false}) {
    DecoderConfig c = Tiny();
    c.tie_word_embeddings = tied;
    DecoderOptions o = Opts();
    o.max_seq = 20;
    auto lm = Make(o, c);
    CausalLm::GenerateOptions g;
    g.max_new_tokens = 12;
    auto cached = lm->Generate({5, 17, 3}, g);
    g.use_cache = false;
    auto uncached = lm->Generate({5, 17, 3}, g);
    ASSERT_TRUE(cached.ok() && uncached.ok()) << cached.status() << uncached.status();
    EXPECT_EQ(cached->size(), 12u);
    EXPECT_EQ(*cached, *uncached);
    // A stop token ends generation after emitting it.
    g.use_cache = true;
    g.stop_ids = {(*cached)[3]};
    auto stopped = lm->Generate({5, 17, 3}, g);
    ASSERT_TRUE(stopped.ok());
    const auto first = std::find(cached->begin(), cached->end(), (*cached)[3]) - cached->begin();
    EXPECT_EQ(stopped->size(), static_cast<size_t>(first + 1));
    g.max_new_tokens = 18;  // 3 + 18 > max_seq 20
    EXPECT_EQ(lm->Generate({5, 17, 3}, g).status().code(), absl::StatusCode::kInvalidArgument);
  }
}

// Sampling: the same seed gives the same tokens, each streamed as it is chosen; top_k 1 is greedy
// whatever the temperature; seeds differ, outputs differ.
TEST(CausalLm, SampledDecodingIsSeededAndStreamed) {
  DecoderOptions o = Opts();
  o.max_seq = 20;
  auto lm = Make(o, Tiny());
  CausalLm::GenerateOptions g;
  g.max_new_tokens = 12;
  auto greedy = lm->Generate({5, 17, 3}, g);
  ASSERT_TRUE(greedy.ok()) << greedy.status();
  g.sampling = {.temperature = 1.5f, .seed = 9};
  std::vector<int32_t> streamed;
  g.on_token = [&](int32_t t) { streamed.push_back(t); };
  auto a = lm->Generate({5, 17, 3}, g);
  g.on_token = nullptr;
  auto b = lm->Generate({5, 17, 3}, g);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
  EXPECT_EQ(streamed, *a);
  std::set<std::vector<int32_t>> outputs;
  for (uint64_t seed = 0; seed < 8; ++seed) {
    g.sampling.seed = seed;
    auto s = lm->Generate({5, 17, 3}, g);
    ASSERT_TRUE(s.ok());
    outputs.insert(*s);
  }
  EXPECT_GE(outputs.size(), 2u);  // a random tiny model is far from certain of its next token
  g.sampling.top_k = 1;
  auto top1 = lm->Generate({5, 17, 3}, g);
  ASSERT_TRUE(top1.ok());
  EXPECT_EQ(*top1, *greedy);
  g.sampling = {.temperature = -1};
  EXPECT_EQ(lm->Generate({5, 17, 3}, g).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CausalLm, RefusesMalformedBatches) {
  auto lm = Make(Opts());
  CausalLm::Batch b = TwoRows();
  b.attention_mask = {0, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0};  // left padding
  EXPECT_NE(std::string(lm->ForwardBackward(b, 0).status().message()).find("right-padded"),
            std::string::npos);
  b = TwoRows();
  b.labels[4] = 96;  // outside the vocabulary
  EXPECT_EQ(lm->ForwardBackward(b, 0).status().code(), absl::StatusCode::kInvalidArgument);
  b = TwoRows();
  b.labels.assign(12, -100);
  b.labels[0] = 5;  // the first position is never a target
  EXPECT_NE(std::string(lm->ForwardBackward(b, 0).status().message()).find("no target"),
            std::string::npos);
  b = TwoRows();
  b.input_ids[2] = -1;
  EXPECT_EQ(lm->Logits(b).status().code(), absl::StatusCode::kInvalidArgument);
  b = TwoRows();
  b.seq_len = 11;  // over max_seq
  EXPECT_EQ(lm->Logits(b).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CausalLm, RefusesBadOptions) {
  auto base = DecoderBase::FromRandom(Tiny(), Opts());
  ASSERT_TRUE(base.ok());
  DecoderOptions o = Opts();
  o.lora.target_modules = {"q_proj", "query"};
  EXPECT_NE(std::string(CausalLm::Create(*base, o).status().message())
                .find("unknown LoRA target module \"query\""),
            std::string::npos);
  o = Opts();
  o.lora.rank = 17;  // above kv_dim 16
  EXPECT_EQ(CausalLm::Create(*base, o).status().code(), absl::StatusCode::kInvalidArgument);
  o = Opts();
  o.max_seq = 65;  // above max_position_embeddings
  EXPECT_EQ(CausalLm::Create(*base, o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(DecoderBase, Bf16HalvesTheWeights) {
  DecoderOptions o = Opts();
  o.weights = WeightStorage::kF32;
  auto f32 = DecoderBase::FromRandom(Tiny(), o);
  o.weights = WeightStorage::kBF16;
  auto bf16 = DecoderBase::FromRandom(Tiny(), o);
  ASSERT_TRUE(f32.ok() && bf16.ok());
  const int64_t norms = (2 * 2 + 1) * 32 * 4;  // fp32 in both
  EXPECT_EQ((*bf16)->weight_bytes() - norms, ((*f32)->weight_bytes() - norms) / 2);
}

// The largest |gradient difference| between two models' trainable parameters, and the largest
// |gradient| of the first.
std::pair<double, double> MaxGradDiff(const CausalLm& a, const CausalLm& b) {
  double diff = 0.0, scale = 0.0;
  for (size_t i = 0; i < a.trainable_params().size(); ++i) {
    const Param& p0 = a.trainable_params()[i];
    const Param& p1 = b.trainable_params()[i];
    for (size_t j = 0; j < p0.grad.size(); ++j) {
      diff = std::max(diff, static_cast<double>(std::abs(p1.grad[j] - p0.grad[j])));
      scale = std::max(scale, static_cast<double>(std::abs(p0.grad[j])));
    }
  }
  return {diff, scale};
}

// bf16 math rounds the activations that meet a frozen matrix to bf16: the loss and gradients stay
// within bf16 rounding of fp32 math on the same bf16 weights, and where the CPU has bf16 dot
// products they differ from it (the bf16 path ran).
TEST(CausalLm, Bf16MathStaysWithinBf16RoundingOfFp32Math) {
  DecoderOptions o = Opts();
  o.weights = WeightStorage::kBF16;
  auto exact = Make(o);
  o.bf16_math = true;
  auto bf16 = Make(o);
  ASSERT_TRUE(exact && bf16);
  EXPECT_TRUE(bf16->base()->bf16_math());
  const CausalLm::Batch b = TwoRows();
  auto l0 = exact->ForwardBackward(b, 0);
  auto l1 = bf16->ForwardBackward(b, 0);
  ASSERT_TRUE(l0.ok() && l1.ok()) << l0.status() << l1.status();
  EXPECT_NEAR(*l1, *l0, 2e-2 * std::abs(*l0));
  const auto [diff, scale] = MaxGradDiff(*exact, *bf16);
  EXPECT_GT(scale, 0.0);
  EXPECT_LE(diff, 2e-2 * scale);
  if (kernels::Bf16MathAvailable()) {
    EXPECT_GT(diff, 1e-6 * scale)
        << "bf16 math gave fp32 math's gradients: the bf16 path did not run";
  }
}

TEST(CausalLm, Bf16MathNeedsBf16Weights) {
  DecoderOptions o = Opts();
  o.bf16_math = true;
  o.weights = WeightStorage::kF32;
  auto base = DecoderBase::FromRandom(Tiny(), o);
  EXPECT_EQ(base.status().code(), absl::StatusCode::kInvalidArgument) << base.status();
  o.weights = WeightStorage::kBF16;
  auto math = DecoderBase::FromRandom(Tiny(), o);
  ASSERT_TRUE(math.ok()) << math.status();
  o.bf16_math = false;
  const absl::Status st = CausalLm::Create(*math, o).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(std::string(st.message()).find("bf16_math"), std::string::npos) << st;
}

TEST(DecoderBase, Q8_0StorageQuantizesWholeBlockMatrices) {
  DecoderOptions o = Opts();
  o.weights = WeightStorage::kF32;
  auto f32 = DecoderBase::FromRandom(Tiny(), o);
  o.weights = WeightStorage::kQ8_0;
  auto q8 = DecoderBase::FromRandom(Tiny(), o);
  ASSERT_TRUE(f32.ok() && q8.ok()) << f32.status() << q8.status();
  const auto& w0 = (*f32)->weights().layers[0].proj[0].w;
  const auto& w1 = (*q8)->weights().layers[0].proj[0].w;
  ASSERT_EQ(w1.quant_type, GgmlType::kQ8_0);
  ASSERT_FALSE(w1.quant.empty());
  // 34 bytes per 32 values, and each value within half a step of the fp32 one.
  EXPECT_EQ(static_cast<int64_t>(w1.quant.size()), w0.rows * w0.cols / 32 * 34);
  const std::vector<float> a = w0.ToF32(), b = w1.ToF32();
  float amax = 0.0f;
  for (float v : a) amax = std::max(amax, std::abs(v));
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(b[i], a[i], amax / 254.0f * 1.01f) << i;
}

// int8 math quantizes the activations that meet a Q8_0 matrix in a forward product: the loss and
// gradients stay within int8 rounding of exact math on the same Q8_0 weights, and where the CPU
// has VNNI they differ from it (the int8 path ran).
TEST(CausalLm, Int8MathStaysWithinInt8RoundingOfExactMath) {
  DecoderOptions o = Opts();
  o.max_batch = 4;
  o.max_seq = 10;  // 40 tokens: at least kernels::kGemmInt8MinRows rows per product
  o.weights = WeightStorage::kQ8_0;
  auto exact = Make(o);
  o.int8_math = true;
  auto int8 = Make(o);
  ASSERT_TRUE(exact && int8);
  EXPECT_TRUE(int8->base()->int8_math());
  CausalLm::Batch b;
  b.batch_size = 4;
  b.seq_len = 10;
  for (int i = 0; i < 40; ++i) b.input_ids.push_back((i * 37 + 11) % 96);
  b.attention_mask.assign(40, 1);
  b.labels = b.input_ids;
  auto l0 = exact->ForwardBackward(b, 0);
  auto l1 = int8->ForwardBackward(b, 0);
  ASSERT_TRUE(l0.ok() && l1.ok()) << l0.status() << l1.status();
  EXPECT_NEAR(*l1, *l0, 2e-2 * std::abs(*l0));
  const auto [diff, scale] = MaxGradDiff(*exact, *int8);
  EXPECT_GT(scale, 0.0);
  EXPECT_LE(diff, 5e-2 * scale);
  if (kernels::Int8MathAvailable()) {
    EXPECT_GT(diff, 1e-6 * scale)
        << "int8 math gave exact math's gradients: the int8 path did not run";
  }
}

TEST(CausalLm, Int8MathNeedsQ8_0Weights) {
  DecoderOptions o = Opts();
  o.int8_math = true;
  o.weights = WeightStorage::kBF16;
  auto base = DecoderBase::FromRandom(Tiny(), o);
  EXPECT_EQ(base.status().code(), absl::StatusCode::kInvalidArgument) << base.status();
  EXPECT_NE(
      std::string(base.status().message()).find("int8_math needs frozen matrices held as Q8_0"),
      std::string::npos)
      << base.status();
  o.weights = WeightStorage::kQ8_0;
  o.bf16_math = true;
  EXPECT_EQ(DecoderBase::FromRandom(Tiny(), o).status().code(), absl::StatusCode::kInvalidArgument);
  o.bf16_math = false;
  auto math = DecoderBase::FromRandom(Tiny(), o);
  ASSERT_TRUE(math.ok()) << math.status();
  o.int8_math = false;
  const absl::Status st = CausalLm::Create(*math, o).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(std::string(st.message()).find("int8_math"), std::string::npos) << st;
  o.int8_math = true;
  o.weights = WeightStorage::kF32;
  EXPECT_EQ(DecoderBase::Load("/nonexistent.gguf", o).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fedlora
