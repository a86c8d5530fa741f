// kernels/base/backend.h and kernels/mirror.h: memory, copies and weight mirrors. Built twice: kernels_backend_test runs the
// cases on the CPU backend; kernels_backend_cuda_test (FEDLORA_BACKEND_TEST_CUDA, label gpu) runs
// them on the CUDA backend and skips itself without a GPU.
#include "kernels/base/backend.h"

#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/base/device.h"
#include "kernels/mirror.h"

namespace fedlora::kernels {
namespace {

#if defined(FEDLORA_BACKEND_TEST_CUDA)
constexpr Device kDevice = Device::kCuda;
#define SKIP_WITHOUT_DEVICE() \
  if (!CudaAvailable()) GTEST_SKIP() << "no CUDA device"
#else
constexpr Device kDevice = Device::kCpu;
#define SKIP_WITHOUT_DEVICE()
#endif

#if !defined(FEDLORA_BACKEND_TEST_CUDA)
TEST(Backend, CudaIsRefusedWithItsReasonWhereThereIsNone) {
  if (CudaAvailable()) GTEST_SKIP() << "a CUDA device is present";
  auto b = Backend::Create(Device::kCuda);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(b.status().message().find("CUDA"), std::string::npos) << b.status();
}

#endif

TEST(Backend, AllocatesZeroedAlignedMemoryAndCountsIt) {
  SKIP_WITHOUT_DEVICE();
  const Device d = kDevice;
  {
    auto b = *Backend::Create(d);
    EXPECT_EQ(b->device(), d);
    EXPECT_EQ(b->ctx().device, d);
    {
      auto a = *DeviceArray<float>::Zeros(*b, 1000);
      auto c = *DeviceArray<int32_t>::Zeros(*b, 3);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % 256, 0u);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(c.data()) % 256, 0u);
      EXPECT_EQ(b->allocated_bytes(), 4000u + 12u);
      std::vector<float> host(1000, 1.0f);
      ASSERT_TRUE(b->Download(host.data(), a.data(), a.bytes()).ok());
      for (float v : host) ASSERT_EQ(v, 0.0f);
      DeviceArray<float> moved = std::move(a);
      EXPECT_EQ(a.data(), nullptr);
      EXPECT_EQ(moved.size(), 1000u);
      EXPECT_EQ(b->allocated_bytes(), 4012u);
    }
    EXPECT_EQ(b->allocated_bytes(), 0u);
    auto empty = *DeviceArray<float>::Zeros(*b, 0);
    EXPECT_EQ(empty.data(), nullptr);
    EXPECT_TRUE(empty.empty());
  }
}

TEST(Backend, UploadDownloadCopyRowsAndZero) {
  SKIP_WITHOUT_DEVICE();
  {
    auto b = *Backend::Create(kDevice);
    std::vector<float> host(4 * 6);
    std::iota(host.begin(), host.end(), 1.0f);
    auto src = *DeviceArray<float>::Zeros(*b, host.size());
    ASSERT_TRUE(b->Upload(src.data(), host.data(), src.bytes()).ok());
    // Rows 0..3, columns 2..4 of the [4, 6] matrix into a packed [4, 3].
    auto dst = *DeviceArray<float>::Zeros(*b, 12);
    ASSERT_TRUE(b->CopyRows(dst.data(), 3 * sizeof(float), src.data() + 2, 6 * sizeof(float),
                            3 * sizeof(float), 4)
                    .ok());
    std::vector<float> got(12, -1.0f);
    ASSERT_TRUE(b->Download(got.data(), dst.data(), dst.bytes()).ok());
    for (int r = 0; r < 4; ++r) {
      for (int c = 0; c < 3; ++c) EXPECT_EQ(got[r * 3 + c], host[r * 6 + 2 + c]) << r << "," << c;
    }
    // Zero a middle range only.
    ASSERT_TRUE(b->Zero(src.data() + 5, 7 * sizeof(float)).ok());
    std::vector<float> after(host.size());
    ASSERT_TRUE(b->Download(after.data(), src.data(), src.bytes()).ok());
    for (size_t i = 0; i < host.size(); ++i)
      EXPECT_EQ(after[i], i >= 5 && i < 12 ? 0.0f : host[i]) << i;
    ASSERT_TRUE(b->Synchronize().ok());
  }
}

TEST(Backend, CopyRowsRefusesRowsWiderThanThePitch) {
  SKIP_WITHOUT_DEVICE();
  auto b = *Backend::Create(kDevice);
  float a[8] = {}, c[8] = {};
  const absl::Status s = b->CopyRows(c, 8, a, 16, 12, 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("12 bytes"), std::string::npos) << s;
}

#if !defined(FEDLORA_BACKEND_TEST_CUDA)
TEST(DeviceMirror, CpuAnswersTheHostPointersThemselves) {
  auto mirror = DeviceMirror(*Backend::Create(Device::kCpu));
  std::vector<float> w(16, 2.0f);
  std::vector<uint8_t> q(34 * 2, 7);
  ASSERT_TRUE(mirror.Add(w.data(), w.size() * sizeof(float)).ok());
  EXPECT_EQ(*mirror.Get(w.data()), w.data());
  // Nothing is copied on the CPU, so even an array never added answers itself.
  float other = 0.0f;
  EXPECT_EQ(*mirror.Get(&other), &other);
  EXPECT_EQ(mirror.bytes(), 0u);
  const WeightPtr p = WeightPtr::Quant(q.data(), GgmlType::kQ8_0).WithInt8Math(true);
  const WeightPtr got = *mirror.Get(p);
  EXPECT_EQ(got.quant, q.data());
  EXPECT_TRUE(got.int8_math);
  EXPECT_EQ(got.quant_type, GgmlType::kQ8_0);
  EXPECT_EQ(*mirror.Get(static_cast<const float*>(nullptr)), nullptr);
}

#else
TEST(DeviceMirror, CudaHoldsACopyOfEachArrayAndRefusesUnknownOnes) {
  SKIP_WITHOUT_DEVICE();
  auto backend = *Backend::Create(Device::kCuda);
  DeviceMirror mirror(backend);
  std::vector<float> w(1000);
  std::iota(w.begin(), w.end(), -3.0f);
  std::vector<uint16_t> bits(64, 0x3f80);
  ASSERT_TRUE(mirror.Add(w.data(), w.size() * sizeof(float)).ok());
  ASSERT_TRUE(mirror.Add(bits.data(), bits.size() * sizeof(uint16_t)).ok());
  EXPECT_EQ(mirror.bytes(), 4000u + 128u);
  const float* dev = *mirror.Get(w.data());
  ASSERT_NE(dev, w.data());
  std::vector<float> back(w.size());
  ASSERT_TRUE(backend->Download(back.data(), dev, back.size() * sizeof(float)).ok());
  EXPECT_EQ(back, w);
  const WeightPtr p = *mirror.Get(WeightPtr::BF16(bits.data()).WithBf16Math(true));
  EXPECT_NE(p.bf16, bits.data());
  EXPECT_TRUE(p.bf16_math);
  float unknown = 0.0f;
  auto missing = mirror.Get(&unknown);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInternal);
}

TEST(Backend, CudaOutOfMemoryNamesTheSize) {
  SKIP_WITHOUT_DEVICE();
  auto b = *Backend::Create(Device::kCuda);
  const size_t huge = size_t{1} << 50;  // 1 PiB
  auto p = b->Allocate(huge);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(p.status().message().find(std::to_string(huge)), std::string::npos) << p.status();
  EXPECT_EQ(b->allocated_bytes(), 0u);
}
#endif

}  // namespace
}  // namespace fedlora::kernels
