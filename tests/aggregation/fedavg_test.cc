#include "aggregation/fedavg.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/base/device.h"

// Built twice: aggregation_fedavg_test runs every case on the CPU accumulator;
// aggregation_fedavg_gpu_test (FEDLORA_FEDAVG_GPU_TEST, label gpu) runs the same cases with the
// sums in GPU memory, plus CPU-against-GPU bit identity, and skips itself without a GPU.
namespace fedlora {
namespace {

using ::testing::HasSubstr;

// Opens each case that accumulates on kDevice.
#if defined(FEDLORA_FEDAVG_GPU_TEST)
constexpr Device kDevice = Device::kCuda;
#define REQUIRE_DEVICE()         \
  if (!kernels::CudaAvailable()) \
  GTEST_SKIP() << "no CUDA device: " << kernels::CudaDeviceDescription()
#else
constexpr Device kDevice = Device::kCpu;
#define REQUIRE_DEVICE() (void)0
#endif

std::vector<TensorSpec> Spec() {
  return {{"lora_A", {4, 8}}, {"lora_B", {8, 4}}, {"head.bias", {3}}};
}

// An update with values spread over many binades (1e-6 .. 1e2, both signs), so that float
// summation in different orders rounds differently.
std::vector<UpdateTensor> RandomUpdate(uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exp10(-6, 2);
  std::vector<UpdateTensor> u;
  for (const TensorSpec& s : Spec()) {
    UpdateTensor t{s.name, s.shape, {}};
    int64_t n = 1;
    for (int64_t d : s.shape) n *= d;
    for (int64_t i = 0; i < n; ++i)
      t.values.push_back(mant(gen) * std::pow(10.0f, static_cast<float>(exp10(gen))));
    u.push_back(std::move(t));
  }
  return u;
}

std::string Bytes(const std::vector<UpdateTensor>& u) {
  std::string out;
  for (const UpdateTensor& t : u) {
    out += t.name;
    out.append(reinterpret_cast<const char*>(t.values.data()), t.values.size() * sizeof(float));
  }
  return out;
}

StreamingFedAvg NewAvg() {
  auto avg = StreamingFedAvg::Create(Spec(), kDevice);
  EXPECT_TRUE(avg.ok()) << avg.status();
  return *std::move(avg);
}

const int64_t kWeights[5] = {3, 17, 1, 250, 42};

TEST(StreamingFedAvgTest, BitIdenticalForAllPermutationsMergesAndRestarts) {
  REQUIRE_DEVICE();
  std::vector<std::vector<UpdateTensor>> updates;
  for (uint32_t i = 0; i < 5; ++i) updates.push_back(RandomUpdate(100 + i));

  std::vector<int> order = {0, 1, 2, 3, 4};
  std::string reference;
  int permutations = 0;
  bool naive_float_sum_varies = false;
  std::vector<float> first_naive;
  do {
    StreamingFedAvg avg = NewAvg();
    std::vector<float> naive(32, 0.0f);  // what an order-dependent float accumulator would give
    for (int i : order) {
      ASSERT_TRUE(avg.Add(updates[i], kWeights[i]).ok());
      for (int j = 0; j < 32; ++j)
        naive[j] += static_cast<float>(kWeights[i]) * updates[i][0].values[j];
    }
    auto mean = avg.Finish();
    ASSERT_TRUE(mean.ok()) << mean.status();
    if (reference.empty()) {
      reference = Bytes(*mean);
      first_naive = naive;
    } else {
      ASSERT_EQ(Bytes(*mean), reference) << "permutation " << permutations;
      if (naive != first_naive) naive_float_sum_varies = true;
    }
    ++permutations;
  } while (std::next_permutation(order.begin(), order.end()));
  EXPECT_EQ(permutations, 120);
  // The data is discriminating: a plain float accumulator would have failed this test.
  EXPECT_TRUE(naive_float_sum_varies);

  // Two aggregators each take a share of the clients; merged in either direction: same bits.
  StreamingFedAvg a = NewAvg(), b = NewAvg();
  for (int i : {3, 0}) ASSERT_TRUE(a.Add(updates[i], kWeights[i]).ok());
  for (int i : {4, 1, 2}) ASSERT_TRUE(b.Add(updates[i], kWeights[i]).ok());
  StreamingFedAvg b_copy = NewAvg();
  ASSERT_TRUE(b_copy.Merge(b).ok());
  ASSERT_TRUE(b_copy.Merge(a).ok());
  ASSERT_TRUE(a.Merge(b).ok());
  EXPECT_EQ(Bytes(a.Finish().value()), reference);
  EXPECT_EQ(Bytes(b_copy.Finish().value()), reference);
  EXPECT_EQ(a.num_updates(), 5);
  EXPECT_EQ(a.total_weight(), 313u);

  // Restart: a server that crashed after 2 arrivals rebuilds from the durably stored updates (any
  // order) and then receives the remaining ones.
  StreamingFedAvg restarted = NewAvg();
  for (int i : {2, 4}) ASSERT_TRUE(restarted.Add(updates[i], kWeights[i]).ok());
  for (int i : {1, 0, 3}) ASSERT_TRUE(restarted.Add(updates[i], kWeights[i]).ok());
  EXPECT_EQ(Bytes(restarted.Finish().value()), reference);
}

TEST(StreamingFedAvgTest, MatchesDoublePrecisionReference) {
  REQUIRE_DEVICE();
  std::vector<std::vector<UpdateTensor>> updates;
  for (uint32_t i = 0; i < 5; ++i) updates.push_back(RandomUpdate(200 + i));
  StreamingFedAvg avg = NewAvg();
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(avg.Add(updates[i], kWeights[i]).ok());
  auto mean = avg.Finish();
  ASSERT_TRUE(mean.ok());
  const double total = 313.0;
  for (size_t t = 0; t < mean->size(); ++t) {
    for (size_t j = 0; j < (*mean)[t].values.size(); ++j) {
      double sum = 0.0, abs_sum = 0.0;
      for (int i = 0; i < 5; ++i) {
        sum += static_cast<double>(kWeights[i]) * updates[i][t].values[j];
        abs_sum += std::fabs(static_cast<double>(kWeights[i]) * updates[i][t].values[j]);
      }
      const double ref = sum / total;
      // Bound: our result is ref rounded to fp32 (<= 0.5 ulp) plus the reference's own double
      // rounding (<= 6 * 2^-53 * sum|w x| / W for 5 terms and a division) plus the fixed-point
      // term rounding (5 * 2^-65 / W); one fp32 ulp of ref plus 2^-48 * sum|w x| / W covers all.
      const float ref_f = static_cast<float>(ref);
      const double ulp = std::nextafter(std::fabs(ref_f), std::numeric_limits<float>::infinity()) -
                         std::fabs(ref_f);
      const double bound = ulp + std::ldexp(abs_sum / total, -48);
      EXPECT_LE(std::fabs((*mean)[t].values[j] - ref), bound) << (*mean)[t].name << "[" << j << "]";
    }
  }
}

TEST(StreamingFedAvgTest, WeightingByExamplesIsExactOnSmallIntegers) {
  REQUIRE_DEVICE();
  const std::vector<TensorSpec> spec = {{"w", {4}}};
  auto avg = StreamingFedAvg::Create(spec, kDevice);
  ASSERT_TRUE(avg.ok());
  // (1*2 + 3*6) / 4 = 5;  (1*1 + 3*(-3)) / 4 = -2;  (1*0.5 + 3*0.5) / 4 = 0.5;  (1*7 + 3*0) / 4 = 1.75.
  ASSERT_TRUE(avg->Add({{"w", {4}, {2.0f, 1.0f, 0.5f, 7.0f}}}, 1).ok());
  ASSERT_TRUE(avg->Add({{"w", {4}, {6.0f, -3.0f, 0.5f, 0.0f}}}, 3).ok());
  auto mean = avg->Finish();
  ASSERT_TRUE(mean.ok());
  EXPECT_EQ((*mean)[0].values, (std::vector<float>{5.0f, -2.0f, 0.5f, 1.75f}));
  EXPECT_EQ((*mean)[0].name, "w");
  EXPECT_EQ((*mean)[0].shape, (std::vector<int64_t>{4}));

  // A non-representable mean is correctly rounded: (1*1 + 2*1 + 3*4) / 6 = 2.5; 17/6 rounds to nearest.
  auto avg2 = StreamingFedAvg::Create({{"w", {2}}}, kDevice);
  ASSERT_TRUE(avg2->Add({{"w", {2}, {1.0f, 1.0f}}}, 1).ok());
  ASSERT_TRUE(avg2->Add({{"w", {2}, {1.0f, 2.0f}}}, 2).ok());
  ASSERT_TRUE(avg2->Add({{"w", {2}, {4.0f, 4.0f}}}, 3).ok());
  auto m2 = avg2->Finish();
  ASSERT_TRUE(m2.ok());
  EXPECT_EQ((*m2)[0].values[0], 2.5f);
  EXPECT_EQ((*m2)[0].values[1], static_cast<float>(17.0 / 6.0));
}

TEST(StreamingFedAvgTest, FixedPointRangeAndResolution) {
  REQUIRE_DEVICE();
  auto avg = StreamingFedAvg::Create({{"w", {5}}}, kDevice);
  ASSERT_TRUE(avg.ok());
  // 2^-64 is exactly one fixed-point unit; 1e-30 is far below it and is flushed to 0 (the
  // documented resolution); 2^42 is inside the range; subnormal fp32 flushes too.
  const float tiny = std::ldexp(1.0f, -64);
  ASSERT_TRUE(
      avg->Add({{"w", {5}, {tiny, 1e-30f, std::ldexp(1.0f, 42), -std::ldexp(1.0f, 42), 1e-45f}}}, 1)
          .ok());
  auto mean = avg->Finish();
  ASSERT_TRUE(mean.ok());
  EXPECT_EQ((*mean)[0].values,
            (std::vector<float>{tiny, 0.0f, std::ldexp(1.0f, 42), -std::ldexp(1.0f, 42), 0.0f}));

  // |w * x| >= 2^43 is refused: 2^43 itself with weight 1, and 2^22 with weight 2^21.
  auto big = avg->Add({{"w", {5}, {0, 0, std::ldexp(1.0f, 43), 0, 0}}}, 1);
  EXPECT_EQ(big.code(), absl::StatusCode::kInvalidArgument) << big;
  EXPECT_THAT(std::string(big.message()), HasSubstr("exceeds the accumulator range 2^43"));
  EXPECT_EQ(avg->Add({{"w", {5}, {0, 0, std::ldexp(1.0f, 22), 0, 0}}}, int64_t{1} << 21).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(avg->Add({{"w", {5}, {0, 0, std::ldexp(1.0f, 21), 0, 0}}}, int64_t{1} << 21).ok());
  EXPECT_EQ(avg->accumulator_bytes(), 5 * 16);
}

TEST(StreamingFedAvgTest, MismatchesAreRefusedAndLeaveTheAccumulatorUnchanged) {
  REQUIRE_DEVICE();
  StreamingFedAvg avg = NewAvg();
  const auto good = RandomUpdate(1);
  ASSERT_TRUE(avg.Add(good, 5).ok());
  const std::string before = Bytes(avg.Finish().value());

  auto expect_refused = [&](std::vector<UpdateTensor> u, int64_t w, const char* needle) {
    absl::Status s = avg.Add(u, w);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(needle));
  };
  auto u = good;
  u.pop_back();
  expect_refused(u, 1, "update has 2 tensors, the global adapter has 3");
  u = good;
  u[1].name = "lora_C";
  expect_refused(u, 1, "'lora_C' is not in the global adapter");
  u = good;
  u[2].name = "lora_A";
  expect_refused(u, 1, "repeats tensor 'lora_A'");
  u = good;
  u[0].shape = {8, 4};
  expect_refused(u, 1, "'lora_A' has shape [8, 4], the global adapter has [4, 8]");
  u = good;
  u[2].values.push_back(1.0f);
  expect_refused(u, 1, "'head.bias' has 4 values for shape [3]");
  u = good;
  u[1].values[31] =
      std::numeric_limits<float>::quiet_NaN();  // last tensor checked after the others
  expect_refused(u, 1, "'lora_B' value 31 is not finite");
  u = good;
  u[2].values[0] = -std::numeric_limits<float>::infinity();
  expect_refused(u, 1, "not finite");
  expect_refused(good, 0, "num_examples 0 is not in [1, 4294967296]");
  expect_refused(good, -3, "num_examples -3");
  expect_refused(good, (int64_t{1} << 32) + 1, "num_examples 4294967297");

  EXPECT_EQ(avg.num_updates(), 1);
  EXPECT_EQ(avg.total_weight(), 5u);
  EXPECT_EQ(Bytes(avg.Finish().value()), before);

  // Tensor order within an update does not matter (matched by name).
  auto reordered = good;
  std::reverse(reordered.begin(), reordered.end());
  StreamingFedAvg avg2 = NewAvg();
  ASSERT_TRUE(avg2.Add(reordered, 5).ok());
  EXPECT_EQ(Bytes(avg2.Finish().value()), before);
}

// Add checks values while it accumulates them, and rolls back what a refused update added. A bad
// value near the end of the last tensor it visits (the update's tensors in reverse spec order, so
// the roll-back must also follow the name -> slot mapping) must leave no trace: Finish() is
// bit-identical to before, and adding the negation of the accepted update afterwards brings every
// sum back to exactly 0 (any leftover fixed-point unit, 2^-64, would show as a nonzero mean).
TEST(StreamingFedAvgTest, RefusedUpdateIsRolledBackExactly) {
  REQUIRE_DEVICE();
  const auto good = RandomUpdate(11);
  auto negated = good;
  for (UpdateTensor& t : negated) {
    for (float& x : t.values) x = -x;
  }
  for (const bool nan : {true, false}) {
    SCOPED_TRACE(nan ? "NaN" : "out of range");
    StreamingFedAvg avg = NewAvg();
    ASSERT_TRUE(avg.Add(good, 7).ok());
    const std::string before = Bytes(avg.Finish().value());

    auto bad = RandomUpdate(12);  // values up to 1e2 in magnitude
    std::reverse(bad.begin(), bad.end());
    ASSERT_EQ(bad.back().name, "lora_A");
    // Value 30 of 32: NaN, or 2^36 which times 2^7 examples is 2^43, the first product out of range.
    bad.back().values[30] = nan ? std::numeric_limits<float>::quiet_NaN() : std::ldexp(1.0f, 36);
    const absl::Status s = avg.Add(bad, 128);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()),
                HasSubstr(nan ? "'lora_A' value 30 is not finite"
                              : "'lora_A' value 30 (6.87195e+10) times num_examples 128"));
    EXPECT_EQ(avg.num_updates(), 1);
    EXPECT_EQ(avg.total_weight(), 7u);
    EXPECT_EQ(Bytes(avg.Finish().value()), before);

    ASSERT_TRUE(avg.Add(negated, 7).ok());
    auto mean = avg.Finish();
    ASSERT_TRUE(mean.ok());
    for (const UpdateTensor& t : *mean) {
      for (size_t i = 0; i < t.values.size(); ++i) {
        EXPECT_EQ(std::bit_cast<uint32_t>(t.values[i]), 0u) << t.name << "[" << i << "]";
      }
    }
  }
}

// The kept form of `u`: lora_A and lora_B keep every third entry from `first` on, head.bias stays
// dense; `expanded` gets the same update with the entries not kept set to 0.
std::vector<KeptTensor> Keep(const std::vector<UpdateTensor>& u, int first,
                             std::vector<UpdateTensor>& expanded) {
  std::vector<KeptTensor> kept;
  expanded = u;
  for (size_t t = 0; t < u.size(); ++t) {
    KeptTensor k{u[t].name, u[t].shape, u[t].name == "head.bias", {}, {}};
    if (k.dense) {
      k.values = u[t].values;
    } else {
      for (size_t i = 0; i < u[t].values.size(); ++i) {
        if ((static_cast<int>(i) - first) % 3 == 0 && static_cast<int>(i) >= first) {
          k.indices.push_back(static_cast<int64_t>(i));
          k.values.push_back(u[t].values[i]);
        } else {
          expanded[t].values[i] = 0.0f;
        }
      }
    }
    kept.push_back(std::move(k));
  }
  return kept;
}

// Adding only the kept entries gives the bits of adding the expanded update (on the CPU
// accumulator), in any tensor order, a kept -0 included, mixed with a wholly dense update.
TEST(StreamingFedAvgTest, KeptUpdatesGiveTheExpandedUpdatesBits) {
  REQUIRE_DEVICE();
  StreamingFedAvg kept_avg = NewAvg();
  auto reference = StreamingFedAvg::Create(Spec(), Device::kCpu);
  ASSERT_TRUE(reference.ok());
  for (uint32_t i = 0; i < 5; ++i) {
    std::vector<UpdateTensor> expanded;
    std::vector<KeptTensor> kept = Keep(RandomUpdate(400 + i), static_cast<int>(i % 3), expanded);
    if (i == 1) kept[0].values[2] = expanded[0].values[kept[0].indices[2]] = -0.0f;
    if (i % 2 == 1) std::reverse(kept.begin(), kept.end());
    if (i == 3) {  // a wholly dense update in kept form
      kept.clear();
      expanded = RandomUpdate(400 + i);
      for (const UpdateTensor& t : expanded) kept.push_back({t.name, t.shape, true, {}, t.values});
    }
    ASSERT_TRUE(kept_avg.Add(kept, kWeights[i]).ok()) << i;
    ASSERT_TRUE(reference->Add(expanded, kWeights[i]).ok()) << i;
  }
  EXPECT_EQ(Bytes(kept_avg.Finish().value()), Bytes(reference->Finish().value()));
}

// The server's path: an encoded top-k + 8-bit update, decoded kept and added, against the same
// update decoded dense and added on the CPU.
TEST(StreamingFedAvgTest, DecodedKeptUpdatesAddUpAsTheirDenseDecoding) {
  REQUIRE_DEVICE();
  StreamingFedAvg kept_avg = NewAvg();
  auto reference = StreamingFedAvg::Create(Spec(), Device::kCpu);
  ASSERT_TRUE(reference.ok());
  for (uint32_t i = 0; i < 4; ++i) {
    const CodecOptions o{.sparsifier = i % 2 == 0 ? Sparsifier::kTopK : Sparsifier::kRandomK,
                         .fraction = 0.3,
                         .codec = CodecId::kQuant,
                         .quant_block_size = 16,
                         .seed = i};
    const absl::StatusOr<std::string> wire = EncodeUpdate(RandomUpdate(500 + i), o);
    ASSERT_TRUE(wire.ok()) << wire.status();
    absl::StatusOr<std::vector<KeptTensor>> kept = DecodeUpdateKept(*wire, {});
    absl::StatusOr<std::vector<UpdateTensor>> dense = DecodeUpdate(*wire, {});
    ASSERT_TRUE(kept.ok() && dense.ok());
    ASSERT_FALSE((*kept)[0].dense);
    ClipUpdateNorm(*kept, 0.5);
    ClipUpdateNorm(*dense, 0.5);
    ASSERT_TRUE(kept_avg.Add(*kept, kWeights[i]).ok());
    ASSERT_TRUE(reference->Add(*dense, kWeights[i]).ok());
  }
  EXPECT_EQ(Bytes(kept_avg.Finish().value()), Bytes(reference->Finish().value()));
}

TEST(StreamingFedAvgTest, MalformedKeptUpdatesAreRefusedAndLeaveNoTrace) {
  REQUIRE_DEVICE();
  StreamingFedAvg avg = NewAvg();
  std::vector<UpdateTensor> expanded;
  const std::vector<KeptTensor> good = Keep(RandomUpdate(21), 1, expanded);
  ASSERT_TRUE(avg.Add(good, 5).ok());
  const std::string before = Bytes(avg.Finish().value());
  struct Case {
    std::string what;
    std::function<void(std::vector<KeptTensor>&)> edit;
  };
  const std::vector<Case> cases = {
      {"'lora_A' has 10 indices for 11 kept values", [](auto& u) { u[0].indices.pop_back(); }},
      {"'lora_A' kept index 2 (4) is not in [5, 32)", [](auto& u) { u[0].indices[2] = 4; }},
      {"'lora_A' kept index 1 (1) is not in [2, 32)",
       [](auto& u) { u[0].indices[1] = 1; }},  // a repeat
      {"'lora_B' kept index 10 (32) is not in [29, 32)", [](auto& u) { u[1].indices[10] = 32; }},
      {"'lora_A' kept index 0 (-1) is not in [0, 32)", [](auto& u) { u[0].indices[0] = -1; }},
      {"'head.bias' has 2 values for shape [3] (3)", [](auto& u) { u[2].values.pop_back(); }},
      // A late bad value: everything added before it is rolled back.
      {"'lora_B' value 31 is not finite", [](auto& u) { u[1].values.back() = std::nanf(""); }},
      {"'lora_B' value 31 (1e+15) times num_examples 5",
       [](auto& u) { u[1].values.back() = 1e15f; }},
  };
  for (const Case& c : cases) {
    std::vector<KeptTensor> bad = good;
    c.edit(bad);
    const absl::Status s = avg.Add(bad, 5);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.what;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.what));
    EXPECT_EQ(avg.num_updates(), 1);
    EXPECT_EQ(Bytes(avg.Finish().value()), before) << c.what;
  }
}

TEST(ClipUpdateNormTest, KeptEntriesClipAsTheirExpansion) {
  for (uint32_t seed = 0; seed < 50; ++seed) {
    std::vector<UpdateTensor> expanded;
    std::vector<KeptTensor> kept =
        Keep(RandomUpdate(600 + seed), static_cast<int>(seed % 3), expanded);
    ASSERT_EQ(UpdateNorm(kept), UpdateNorm(expanded));
    const double bound = UpdateNorm(kept) * (0.2 + 0.03 * seed);
    ASSERT_EQ(ClipUpdateNorm(kept, bound), ClipUpdateNorm(expanded, bound));
    for (size_t t = 0; t < kept.size(); ++t) {
      for (size_t j = 0; j < kept[t].values.size(); ++j) {
        const size_t i = kept[t].dense ? j : static_cast<size_t>(kept[t].indices[j]);
        ASSERT_EQ(std::bit_cast<uint32_t>(kept[t].values[j]),
                  std::bit_cast<uint32_t>(expanded[t].values[i]));
      }
    }
  }
}

TEST(StreamingFedAvgTest, CreateFinishAndMergeErrors) {
  REQUIRE_DEVICE();
  EXPECT_EQ(StreamingFedAvg::Create({}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(StreamingFedAvg::Create({{"a", {1}}, {"a", {2}}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(StreamingFedAvg::Create({{"a", {-1}}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(StreamingFedAvg::Create({{"", {1}}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  StreamingFedAvg avg = NewAvg();
  EXPECT_EQ(avg.Finish().status().code(), absl::StatusCode::kFailedPrecondition);
  auto other = StreamingFedAvg::Create({{"lora_A", {4, 8}}});
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(avg.Merge(*other).code(), absl::StatusCode::kInvalidArgument);
}

#if defined(FEDLORA_FEDAVG_GPU_TEST)
// The same updates on both devices, in different orders and through a cross-device merge: the
// same bits, and the device the sums live on is the one asked for.
TEST(StreamingFedAvgTest, CudaSumsAreTheCpuSumsBitForBit) {
  REQUIRE_DEVICE();
  std::vector<std::vector<UpdateTensor>> updates;
  for (uint32_t i = 0; i < 5; ++i) updates.push_back(RandomUpdate(300 + i));
  auto cpu = StreamingFedAvg::Create(Spec(), Device::kCpu);
  auto gpu = StreamingFedAvg::Create(Spec(), Device::kCuda);
  auto half = StreamingFedAvg::Create(Spec(), Device::kCpu);
  ASSERT_TRUE(cpu.ok() && gpu.ok() && half.ok());
  EXPECT_EQ(gpu->device(), Device::kCuda);
  for (int i : {0, 1, 2, 3, 4}) ASSERT_TRUE(cpu->Add(updates[i], kWeights[i]).ok());
  for (int i : {4, 2}) ASSERT_TRUE(gpu->Add(updates[i], kWeights[i]).ok());
  for (int i : {3, 1, 0}) ASSERT_TRUE(half->Add(updates[i], kWeights[i]).ok());
  ASSERT_TRUE(gpu->Merge(*half).ok());
  EXPECT_EQ(Bytes(gpu->Finish().value()), Bytes(cpu->Finish().value()));
  auto cpu_merged = StreamingFedAvg::Create(Spec(), Device::kCpu);
  ASSERT_TRUE(cpu_merged->Merge(*gpu).ok());
  EXPECT_EQ(Bytes(cpu_merged->Finish().value()), Bytes(cpu->Finish().value()));
}
#else
TEST(StreamingFedAvgTest, CudaWithoutAGpuIsRefusedWithItsReason) {
  if (kernels::CudaAvailable()) GTEST_SKIP() << "a CUDA device is present";
  auto avg = StreamingFedAvg::Create(Spec(), Device::kCuda);
  ASSERT_FALSE(avg.ok());
  EXPECT_EQ(avg.status().code(), absl::StatusCode::kFailedPrecondition) << avg.status();
  EXPECT_THAT(std::string(avg.status().message()), HasSubstr("CUDA"));
  EXPECT_EQ(NewAvg().device(), Device::kCpu);
}
#endif

TEST(ClipUpdateNormTest, ScalesOnlyUpdatesAboveTheBound) {
  std::vector<UpdateTensor> u = {{"a", {2}, {3.0f, 0.0f}}, {"b", {1}, {4.0f}}};  // norm 5
  ClipUpdateNorm(u, 10.0);
  EXPECT_EQ(u[0].values, (std::vector<float>{3.0f, 0.0f}));
  EXPECT_EQ(u[1].values, (std::vector<float>{4.0f}));
  ClipUpdateNorm(u, 2.5);  // halves every value
  EXPECT_EQ(u[0].values, (std::vector<float>{1.5f, 0.0f}));
  EXPECT_EQ(u[1].values, (std::vector<float>{2.0f}));
}

TEST(ClipUpdateNormTest, ClippedNormsNeverExceedTheBound) {
  std::mt19937_64 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<double> bound(1e-3, 10.0);
  int clipped = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<UpdateTensor> u = {{"a", {37}, {}}, {"b", {3, 5}, {}}};
    const float spread = std::exp2(static_cast<float>(trial % 9) - 4);
    for (UpdateTensor& t : u) {
      t.values.resize(static_cast<size_t>(
          std::accumulate(t.shape.begin(), t.shape.end(), int64_t{1}, std::multiplies<int64_t>())));
      for (float& v : t.values) v = normal(rng) * spread;
    }
    const double c = bound(rng);
    const double before = UpdateNorm(u);
    const std::vector<UpdateTensor> original = u;
    EXPECT_DOUBLE_EQ(ClipUpdateNorm(u, c), before);
    const double after = UpdateNorm(u);
    ASSERT_LE(after, c) << "trial " << trial;
    if (before > c) {
      ++clipped;
      EXPECT_NEAR(after, c, c * 1e-5)
          << "trial " << trial;  // scaled to the bound, not far below it
      for (size_t i = 0; i < u[0].values.size(); ++i) {
        EXPECT_NEAR(u[0].values[i], original[0].values[i] * (c / before),
                    4e-6 * std::abs(original[0].values[i]) + 1e-12);
      }
    } else {
      EXPECT_EQ(u[0].values, original[0].values);
    }
  }
  EXPECT_GT(clipped, 500);
  EXPECT_LT(clipped, 2000);
}

}  // namespace
}  // namespace fedlora
