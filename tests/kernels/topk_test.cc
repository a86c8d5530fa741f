#include "kernels/base/topk.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/kernels/test_util.h"

namespace fedlora::kernels {
namespace {

using testing::Cpu;

std::vector<int64_t> RunTopK(const std::vector<float>& x, int64_t k) {
  std::vector<int64_t> out(static_cast<size_t>(k), -7);
  TopKArgs a{.n = static_cast<int64_t>(x.size()), .k = k, .x = x.data(), .indices = out.data()};
  auto bytes = TopKWorkspaceBytes(Cpu(), a);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  std::vector<uint8_t> ws(*bytes);
  a.workspace = ws.data();
  a.workspace_bytes = ws.size();
  const absl::Status s = TopK(Cpu(), a);
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

// The definition: order by |x| descending, then index ascending; keep k; list them ascending.
std::vector<int64_t> BySort(const std::vector<float>& x, int64_t k) {
  std::vector<int64_t> order(x.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&x](int64_t a, int64_t b) {
    const double ma = std::abs(static_cast<double>(x[a])), mb = std::abs(static_cast<double>(x[b]));
    return ma != mb ? ma > mb : a < b;
  });
  order.resize(static_cast<size_t>(k));
  std::sort(order.begin(), order.end());
  return order;
}

TEST(TopK, KnownCase) {
  const std::vector<float> x = {0.5f, -2.0f, 2.0f, 1.0f, -0.0f, 2.0f, 0.0f};
  EXPECT_EQ(RunTopK(x, 1), (std::vector<int64_t>{1}));
  EXPECT_EQ(RunTopK(x, 3), (std::vector<int64_t>{1, 2, 5}));  // three |2| entries
  EXPECT_EQ(RunTopK(x, 4), (std::vector<int64_t>{1, 2, 3, 5}));
  EXPECT_EQ(RunTopK(x, 6), (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));  // -0 == +0: the lower index
  EXPECT_EQ(RunTopK(x, 7), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6}));
}

TEST(TopK, MatchesASortOnTiedRandomData) {
  std::mt19937 rng(5);
  for (int64_t n : {1, 2, 17, 1000, 40001}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) {
      const uint32_t r = rng();
      // Few distinct magnitudes (many ties, zeros of both signs) or a spread of them.
      v = (r & 1) ? static_cast<float>(static_cast<int>(r >> 1) % 7 - 3) * 0.5f
                  : std::ldexp(static_cast<float>(r >> 8), -30) * ((r & 2) ? -1.0f : 1.0f);
      if ((r & 0xF0) == 0) v = (r & 0x100) ? -0.0f : 0.0f;
    }
    for (int64_t k : {int64_t{1}, n / 10, n / 2, n - 1, n}) {
      if (k < 1) continue;
      EXPECT_EQ(RunTopK(x, k), BySort(x, k)) << "n " << n << " k " << k;
    }
  }
}

TEST(TopK, KeyOrdersByMagnitudeThenIndex) {
  auto bits = [](float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
  };
  EXPECT_LT(TopKKey(bits(-3.0f), 9), TopKKey(bits(2.0f), 0));
  EXPECT_LT(TopKKey(bits(2.0f), 3), TopKKey(bits(-2.0f), 4));
  EXPECT_EQ(TopKKey(bits(-0.0f), 5), TopKKey(bits(0.0f), 5));
  EXPECT_LT(TopKKey(bits(1e-45f), 0), TopKKey(bits(0.0f), 0));  // a subnormal beats zero
}

TEST(TopK, RefusesBadArguments) {
  const std::vector<float> x(10, 1.0f);
  std::vector<int64_t> out(10);
  std::vector<float> ws(10);
  TopKArgs a{.n = 10,
             .k = 11,
             .x = x.data(),
             .indices = out.data(),
             .workspace = ws.data(),
             .workspace_bytes = 40};
  EXPECT_NE(CanRun(Cpu(), a).message().find("k 11"), std::string::npos) << CanRun(Cpu(), a);
  a.k = 3;
  a.workspace_bytes = 39;
  EXPECT_NE(CanRun(Cpu(), a).message().find("workspace_bytes"), std::string::npos);
  a.workspace_bytes = 40;
  a.indices = nullptr;
  EXPECT_NE(CanRun(Cpu(), a).message().find("indices"), std::string::npos);
  EXPECT_TRUE(CanRun(Cpu(), TopKArgs{.n = 5, .k = 0}).ok());  // nothing to select, nothing read
  const absl::Status big = CanRun(Cpu(), TopKArgs{.n = kTopKMaxN + 1, .k = 1});
  EXPECT_EQ(big.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(big.message().find("n "), std::string::npos) << big;
}

}  // namespace
}  // namespace fedlora::kernels
