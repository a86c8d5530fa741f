// The downlink's adapter deltas (compression/downlink.h): a client applying the server's deltas holds
// the server's broadcast adapter bit for bit, the codec's error is carried into later deltas, and a
// delta that does not fit the adapter is refused without touching it.
#include "compression/downlink.h"

#include <cmath>
#include <cstring>
#include <random>

#include "compression/update_io.h"
#include "core/sha256.h"
#include "fedlora/v1/common.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fedlora {
namespace {

using ::testing::HasSubstr;

std::vector<UpdateTensor> Adapter(uint32_t seed, float scale) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<UpdateTensor> a = {{"a.lora_A.weight", {8, 300}, {}},
                                 {"a.lora_B.weight", {300, 8}, {}}};
  for (UpdateTensor& t : a) {
    t.values.resize(2400);
    for (float& v : t.values) v = dist(gen);
  }
  return a;
}

void AddTo(std::vector<UpdateTensor>& a, const std::vector<UpdateTensor>& b) {
  for (size_t t = 0; t < a.size(); ++t) {
    for (size_t i = 0; i < a[t].values.size(); ++i) a[t].values[i] += b[t].values[i];
  }
}

double Distance(const std::vector<UpdateTensor>& a, const std::vector<UpdateTensor>& b) {
  double s = 0;
  for (size_t t = 0; t < a.size(); ++t) {
    for (size_t i = 0; i < a[t].values.size(); ++i) {
      const double d = static_cast<double>(a[t].values[i]) - b[t].values[i];
      s += d * d;
    }
  }
  return std::sqrt(s);
}

CodecOptions Quant(int bits, bool stochastic, bool zstd) {
  CodecOptions o;
  o.codec = CodecId::kQuant;
  o.quant_bits = bits;
  o.quant_block_size = 64;
  o.quant_stochastic = stochastic;
  o.zstd = zstd;
  return o;
}

TEST(DownlinkTest, AClientApplyingEveryDeltaHoldsTheServersAdapterBitForBit) {
  // Each codec with how far (relative to the adapter's norm) the broadcast adapter may stray.
  for (const auto& [base_options, tolerance] :
       {std::pair{Quant(8, false, true), 0.005}, std::pair{Quant(4, false, false), 0.05},
        std::pair{Quant(2, true, false), 0.15}}) {
    std::vector<UpdateTensor> global = Adapter(1, 0.1f);
    std::vector<UpdateTensor> broadcast = global;  // round 0: everyone starts from the full adapter
    std::vector<UpdateTensor> client = global;
    for (int round = 1; round <= 6; ++round) {
      AddTo(global, Adapter(100 + round, 0.01f));  // the round's aggregated step
      CodecOptions o = base_options;
      o.seed = static_cast<uint64_t>(round);
      auto d = EncodeDownlinkDelta(broadcast, global, o);
      ASSERT_TRUE(d.ok()) << d.status();
      ASSERT_TRUE(ApplyDownlinkDelta(client, d->blob, DecodeLimits{}).ok());
      broadcast = d->rebuilt;
      for (size_t t = 0; t < client.size(); ++t) {
        ASSERT_EQ(std::memcmp(client[t].values.data(), broadcast[t].values.data(),
                              client[t].values.size() * 4),
                  0)
            << base_options.Describe() << " round " << round << " tensor " << t;
      }
      EXPECT_EQ(Sha256Hex(*AdapterToSafetensors(client)),
                Sha256Hex(*AdapterToSafetensors(broadcast)));
      // Lossy but close, and the error does not pile up over rounds.
      EXPECT_LT(Distance(broadcast, global), tolerance * Distance(global, Adapter(1, 0.0f)))
          << base_options.Describe() << " round " << round;
    }
  }
}

v1::CodecStage Stage(v1::CodecStage::Id id) {
  v1::CodecStage s;
  s.set_id(id);
  s.set_version(1);
  return s;
}

TEST(DownlinkTest, EveryStageOfADownlinkCodecSpecRebuildsBitForBit) {
  // Each spec as config.downlink_codec would hold it, through CodecOptionsFromSpec as the server
  // reads it: three rounds of deltas, applied by a client, give the server's adapter exactly.
  std::vector<v1::CodecSpec> specs;
  for (v1::CodecStage::Id id : {v1::CodecStage::NONE, v1::CodecStage::FP16, v1::CodecStage::BF16}) {
    specs.emplace_back();
    *specs.back().add_stages() = Stage(id);
  }
  {
    v1::CodecSpec spec;  // top-k 10% per tensor, zstd level 5
    v1::CodecStage topk = Stage(v1::CodecStage::TOPK);
    topk.mutable_top_k()->set_fraction(0.1);
    topk.mutable_top_k()->set_global(false);
    *spec.add_stages() = topk;
    v1::CodecStage zstd = Stage(v1::CodecStage::ZSTD);
    zstd.mutable_zstd()->set_level(5);
    *spec.add_stages() = zstd;
    specs.push_back(spec);
    spec.mutable_stages(0)->mutable_top_k()->set_global(true);  // global top-k
    specs.push_back(spec);
  }
  {
    v1::CodecSpec spec;  // random-k 20%, then 4-bit nearest quantization in blocks of 32
    v1::CodecStage randomk = Stage(v1::CodecStage::RANDOMK);
    randomk.mutable_random_k()->set_fraction(0.2);
    *spec.add_stages() = randomk;
    v1::CodecStage quant = Stage(v1::CodecStage::QUANT);
    quant.mutable_quant()->set_bits(4);
    quant.mutable_quant()->set_block_size(32);
    quant.mutable_quant()->set_stochastic(false);
    *spec.add_stages() = quant;
    specs.push_back(spec);
  }
  {
    v1::CodecSpec spec;  // rank-2 factors in bf16
    v1::CodecStage lowrank = Stage(v1::CodecStage::LOWRANK);
    lowrank.mutable_low_rank()->set_rank(2);
    *spec.add_stages() = lowrank;
    *spec.add_stages() = Stage(v1::CodecStage::BF16);
    specs.push_back(spec);
  }
  for (const v1::CodecSpec& spec : specs) {
    absl::StatusOr<CodecOptions> options = CodecOptionsFromSpec(spec);
    ASSERT_TRUE(options.ok()) << spec.ShortDebugString() << ": " << options.status();
    std::vector<UpdateTensor> global = Adapter(2, 0.1f);
    std::vector<UpdateTensor> broadcast = global, client = global;
    for (int round = 1; round <= 3; ++round) {
      AddTo(global, Adapter(200 + round, 0.01f));
      CodecOptions o = *options;
      o.seed = static_cast<uint64_t>(round);
      auto d = EncodeDownlinkDelta(broadcast, global, o);
      ASSERT_TRUE(d.ok()) << spec.ShortDebugString() << ": " << d.status();
      ASSERT_TRUE(ApplyDownlinkDelta(client, d->blob, DecodeLimits{}).ok());
      broadcast = d->rebuilt;
      EXPECT_EQ(Sha256Hex(*AdapterToSafetensors(client)),
                Sha256Hex(*AdapterToSafetensors(broadcast)))
          << spec.ShortDebugString() << " round " << round;
    }
    // Never further from the target than the three steps the clients would otherwise have missed.
    EXPECT_LT(Distance(broadcast, global), 3 * 0.01 * std::sqrt(4800.0)) << spec.ShortDebugString();
  }
}

TEST(DownlinkTest, WhatTheCodecDropsIsCarriedIntoTheNextDelta) {
  // The target stops moving after round 1: each later delta is the remaining error, so the
  // broadcast adapter converges to it even at 2 bits with nearest rounding.
  const std::vector<UpdateTensor> global = Adapter(7, 0.1f);
  std::vector<UpdateTensor> broadcast = Adapter(7, 0.0f);
  std::vector<double> error;
  for (int round = 1; round <= 12; ++round) {
    auto d = EncodeDownlinkDelta(broadcast, global, Quant(2, false, false));
    ASSERT_TRUE(d.ok()) << d.status();
    broadcast = d->rebuilt;
    error.push_back(Distance(broadcast, global));
  }
  EXPECT_GT(error[0], 0.0);
  for (size_t i = 1; i < error.size(); ++i) EXPECT_LE(error[i], error[i - 1]) << "round " << i + 1;
  EXPECT_LT(error.back(), error[0] / 100) << "first " << error[0] << ", last " << error.back();
}

TEST(DownlinkTest, ADeltaThatDoesNotFitIsRefusedAndTheAdapterKept) {
  const std::vector<UpdateTensor> base = Adapter(3, 0.1f);
  std::vector<UpdateTensor> other = base;
  other[1].name = "b.lora_B.weight";
  EXPECT_THAT(EncodeDownlinkDelta(base, other, Quant(8, false, false)).status().message(),
              HasSubstr("does not match"));

  CodecOptions raw;  // fp32: a delta that overflows the adapter travels as it is
  std::vector<UpdateTensor> huge = base;
  for (float& v : huge[0].values) v = 3e38f;
  auto overflow = EncodeUpdate(huge, raw);
  ASSERT_TRUE(overflow.ok());
  std::vector<UpdateTensor> held = base;
  for (float& v : held[0].values) v = 3e38f;
  const std::vector<UpdateTensor> before = held;
  absl::Status s = ApplyDownlinkDelta(held, *overflow, DecodeLimits{});
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("overflows tensor 'a.lora_A.weight'"));
  EXPECT_EQ(Distance(held, before), 0.0);

  auto renamed = EncodeUpdate(other, raw);
  ASSERT_TRUE(renamed.ok());
  s = ApplyDownlinkDelta(held, *renamed, DecodeLimits{});
  EXPECT_THAT(s.message(), HasSubstr("does not match the adapter's"));
  EXPECT_EQ(Distance(held, before), 0.0);
}

}  // namespace
}  // namespace fedlora
