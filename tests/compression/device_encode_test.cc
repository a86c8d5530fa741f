// EncodeUpdate's device overload (compression/codec.h) with a CPU backend, or none: the bytes are
// the plain encoder's and those it wrote before top-k and quantization moved into kernels/ (hashes
// pinned from that encoder). The CUDA cases are device_encode_gpu_test.cc.
#include <string>
#include <vector>

#include "compression/codec.h"
#include "core/sha256.h"
#include "gtest/gtest.h"
#include "kernels/base/backend.h"
#include "tests/compression/lora_update.h"

namespace fedlora {
namespace {

using testing::DeviceCodecs;
using testing::LoraUpdate;

// SHA-256 of EncodeUpdate(LoraUpdate(), DeviceCodecs()[i]) as the encoder wrote them before
// top-k and quantization became kernels::TopK and kernels::BlockQuantize.
const char* const kPinnedSha256[] = {
    "5ae9866f5419a4c09b69b06773285085be5997f334b3237077b6d119ef44d470",  // 8789 bytes
    "a401b17e357cc10b9d4be4bd8d752adebcf6c72c85be3bdf15cc17b9b3930853",  // 3055 bytes
    "35f6acb94a30505bdc3e3520a578ff658bb7461988e2e757ccb5870da2f2bcc8",  // 40069 bytes
    "cdca3ac848f391d9a41c69b651e70968d6ecad27fdc349431c6c68b8d0afb55e",  // 4107 bytes
    "31c57435b92cb4d6b048bd83572a01256012c27ba98772459073ef7a55078d3d",  // 3723 bytes
    "6451fb4b37c689306336dc1285495161c215b9f41a5932592adf195eb44f25e0",  // 4896 bytes
    "c1879fdfe5826344156baf7e04339be5c90121b96b4792f16b878c0f142d3c2a",  // 75783 bytes
};

TEST(DeviceEncode, CpuBackendWritesTodaysBytes) {
  const std::vector<UpdateTensor> update = LoraUpdate();
  const std::vector<CodecOptions> codecs = DeviceCodecs();
  ASSERT_EQ(codecs.size(), std::size(kPinnedSha256));
  auto cpu = kernels::Backend::Create(Device::kCpu);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  for (size_t i = 0; i < codecs.size(); ++i) {
    auto plain = EncodeUpdate(update, codecs[i]);
    auto none = EncodeUpdate(update, codecs[i], nullptr);
    auto on_cpu = EncodeUpdate(update, codecs[i], cpu->get());
    ASSERT_TRUE(plain.ok() && none.ok() && on_cpu.ok()) << codecs[i].Describe();
    EXPECT_EQ(Sha256Hex(*plain), kPinnedSha256[i]) << codecs[i].Describe();
    EXPECT_EQ(*none, *plain) << codecs[i].Describe();
    EXPECT_EQ(*on_cpu, *plain) << codecs[i].Describe();
  }
}

TEST(DeviceEncode, CpuBackendRunsLowRank) {
  auto cpu = kernels::Backend::Create(Device::kCpu);
  ASSERT_TRUE(cpu.ok());
  const CodecOptions o{.sparsifier = Sparsifier::kLowRank, .low_rank = 2, .seed = 5};
  auto plain = EncodeUpdate(LoraUpdate(), o);
  auto on_cpu = EncodeUpdate(LoraUpdate(), o, cpu->get());
  ASSERT_TRUE(plain.ok() && on_cpu.ok());
  EXPECT_EQ(*on_cpu, *plain);
}

}  // namespace
}  // namespace fedlora
