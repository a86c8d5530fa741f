#include "kernels/base/context.h"

#include <cblas.h>

#include <atomic>
#include <cmath>
#include <limits>

#include "gtest/gtest.h"
#include "kernels/base/device.h"
#include "kernels/cpu_math.h"
#include "kernels/gemm.h"
#include "kernels/threads.h"
#include "tests/kernels/test_util.h"

namespace fedlora::kernels {
namespace {

TEST(Context, SetNumThreadsSizesPoolAndOpenBlas) {
  SetNumThreads(3);
  EXPECT_EQ(NumThreads(), 3);
  EXPECT_EQ(DefaultPool().NumThreads(), 3);
  EXPECT_EQ(&ExecContext{}.Pool(), &DefaultPool());
  EXPECT_EQ(openblas_get_num_threads(), 3);
  // A pool handed out earlier stays usable after the next SetNumThreads.
  ThreadPool* earlier = &DefaultPool();
  SetNumThreads(2);
  EXPECT_EQ(NumThreads(), 2);
  EXPECT_EQ(openblas_get_num_threads(), 2);
  std::atomic<int64_t> sum{0};
  earlier->ParallelFor(0, 100, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) sum += i;
  });
  EXPECT_EQ(sum.load(), 4950);
  ThreadPool mine(1);
  EXPECT_EQ(&ExecContext{.pool = &mine}.Pool(), &mine);
}

TEST(Device, NoGpuIsAnAnswerNotACrash) {
  EXPECT_EQ(CudaAvailable(), CheckCudaAvailable().ok());
  EXPECT_TRUE(Synchronize(ExecContext{}).ok());
  EXPECT_TRUE(DeviceFree(nullptr).ok());
  if (!CudaAvailable()) {
    EXPECT_EQ(CudaDeviceDescription().rfind("none: ", 0), 0u) << CudaDeviceDescription();
    EXPECT_EQ(DeviceAlloc(16).status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(Synchronize(testing::Gpu()).code(), absl::StatusCode::kFailedPrecondition);
    // Every kernel refuses CUDA with FailedPrecondition naming itself.
    const absl::Status s = Gemm(testing::Gpu(), GemmArgs{});
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(std::string(s.message()).find("Gemm"), std::string::npos) << s;
  } else {
    auto p = DeviceAlloc(16);
    ASSERT_TRUE(p.ok());
    EXPECT_TRUE(DeviceFree(*p).ok());
  }
}

TEST(Validation, OverflowingShapesAreRejected) {
  std::vector<float> a(4), b(4), c(4);
  const int64_t huge = int64_t{1} << 40;
  EXPECT_EQ(
      Gemm(ExecContext{},
           GemmArgs{.m = huge, .n = huge, .k = 1, .a = a.data(), .b = b.data(), .c = c.data()})
          .code(),
      absl::StatusCode::kInvalidArgument);
  // Beyond the 32-bit BLAS interface.
  EXPECT_EQ(
      Gemm(ExecContext{},
           GemmArgs{
               .m = 1, .n = 1, .k = int64_t{1} << 32, .a = a.data(), .b = b.data(), .c = c.data()})
          .code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(CpuMath, FastExpAndErfAccuracy) {
  double worst_exp = 0, worst_erf = 0;
  for (double x = -80.0; x <= 80.0; x += 0.001) {
    const float xf = static_cast<float>(x);
    const double e = std::exp(static_cast<double>(xf));
    worst_exp = std::max(worst_exp, std::abs(internal::FastExp(xf) - e) / e);
  }
  for (double x = -6.0; x <= 6.0; x += 0.0001) {
    const float xf = static_cast<float>(x);
    worst_erf =
        std::max(worst_erf, std::abs(internal::FastErf(xf) - std::erf(static_cast<double>(xf))));
  }
  // Degree-6 Taylor on |r| <= ln2/2: 1.2e-7 truncation plus a few fp32 roundings.
  EXPECT_LT(worst_exp, 4e-7);
  // Abramowitz & Stegun 7.1.26: 1.5e-7 in exact arithmetic, plus fp32 rounding of the polynomial
  // and of 1 - p e^{-x^2} (measured 4.6e-7 in all). GELU's 0.5 x (1 + erf) keeps it below 1e-6.
  EXPECT_LT(worst_erf, 6e-7);
  EXPECT_EQ(internal::FastExp(-88.0f), 0.0f);  // flushed below e^-87
  EXPECT_EQ(internal::FastExp(-std::numeric_limits<float>::max()), 0.0f);
  EXPECT_EQ(internal::FastErf(0.0f), 0.0f);
  EXPECT_EQ(internal::FastErf(10.0f), 1.0f);
  EXPECT_EQ(internal::FastErf(-10.0f), -1.0f);
}

}  // namespace
}  // namespace fedlora::kernels
