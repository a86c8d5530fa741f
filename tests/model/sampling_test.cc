// SampleToken against probabilities worked out by hand: greedy, the softmax at a temperature, and
// the top-k and top-p cuts (as transformers applies them), over many seeded draws.
#include "model/sampling.h"

#include <cmath>
#include <limits>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fedlora {
namespace {

// Frequencies of each id over `n` draws.
std::vector<double> Frequencies(const std::vector<float>& logits, const SamplingOptions& o, int n) {
  Rng rng(o.seed);
  std::vector<double> f(logits.size());
  for (int i = 0; i < n; ++i) {
    absl::StatusOr<int32_t> t = SampleToken(logits, o, rng);
    EXPECT_TRUE(t.ok()) << t.status();
    if (t.ok()) f[*t] += 1.0 / n;
  }
  return f;
}

// Within 0.012 of the expected probabilities: 60,000 draws have a standard error under 0.0021.
void ExpectNear(const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 0.012) << "id " << i;
}

const std::vector<float> kLogits = {0.0f, std::log(2.0f),
                                    std::log(4.0f)};  // softmax: 1/7, 2/7, 4/7

TEST(SampleToken, GreedyTakesTheFirstMaximumAndNeverANaN) {
  Rng rng(1);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(*SampleToken(std::vector<float>{1, 3, 3, 2}, {}, rng), 1);
  EXPECT_EQ(*SampleToken(std::vector<float>{nan, -5, nan}, {}, rng), 1);
  EXPECT_EQ(SampleToken(std::vector<float>{nan, nan}, {}, rng).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SampleToken(std::vector<float>{}, {}, rng).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Sampling never draws a NaN either.
  ExpectNear(Frequencies({nan, 0.0f, nan}, {.temperature = 1, .seed = 3}, 2000), {0, 1, 0});
}

TEST(SampleToken, DrawsFromTheSoftmaxAtTheTemperature) {
  ExpectNear(Frequencies(kLogits, {.temperature = 1, .seed = 11}, 60000),
             {1 / 7.0, 2 / 7.0, 4 / 7.0});
  // Temperature 2 halves the logits: weights 1, sqrt 2, 2.
  const double s = 1 + std::sqrt(2.0) + 2;
  ExpectNear(Frequencies(kLogits, {.temperature = 2, .seed = 12}, 60000),
             {1 / s, std::sqrt(2.0) / s, 2 / s});
}

TEST(SampleToken, TopKAndTopPCutTheLeastLikely) {
  // top_k 2: id 0 is out; 2 : 4.
  ExpectNear(Frequencies(kLogits, {.temperature = 1, .top_k = 2, .seed = 13}, 60000),
             {0, 1 / 3.0, 2 / 3.0});
  // top_p 0.6: 4/7 = 0.571 falls short, so id 1 joins; 4/7 + 2/7 reaches it, id 0 stays out.
  ExpectNear(Frequencies(kLogits, {.temperature = 1, .top_p = 0.6f, .seed = 14}, 60000),
             {0, 1 / 3.0, 2 / 3.0});
  // top_p 0.5: the most likely alone.
  ExpectNear(Frequencies(kLogits, {.temperature = 1, .top_p = 0.5f, .seed = 15}, 2000), {0, 0, 1});
  // top_k 1 is greedy at any temperature.
  ExpectNear(Frequencies(kLogits, {.temperature = 5, .top_k = 1, .seed = 16}, 2000), {0, 0, 1});
}

TEST(SampleToken, TheSameSeedGivesTheSameDraws) {
  auto draws = [](uint64_t seed) {
    Rng rng(seed);
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i)
      out.push_back(*SampleToken(kLogits, {.temperature = 1, .seed = seed}, rng));
    return out;
  };
  EXPECT_EQ(draws(5), draws(5));
  EXPECT_NE(draws(5), draws(6));
}

TEST(SampleToken, RefusesSettingsOutOfRange) {
  Rng rng(1);
  for (const SamplingOptions& o :
       {SamplingOptions{.temperature = -1}, SamplingOptions{.temperature = NAN},
        SamplingOptions{.temperature = 1, .top_k = -1},
        SamplingOptions{.temperature = 1, .top_p = 0},
        SamplingOptions{.temperature = 1, .top_p = 1.5f}}) {
    EXPECT_EQ(SampleToken(kLogits, o, rng).status().code(), absl::StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace fedlora
