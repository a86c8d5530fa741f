// Wire fields the SDK honours, against the in-memory federation: the heartbeat interval is the
// server's HeartbeatResponse.next_heartbeat_seconds (not the run config's copy), an update over
// ServerLimits.max_update_bytes is refused before any upload, and ClientOptions.has_cuda only
// reports the device (encoding on the GPU is ClientOptions.encode_on_cuda).
#include <chrono>
#include <vector>

#include "crypto/sealed_update.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/client/fake_transport.h"

namespace fedlora {
namespace {

using testing::FakeClientOptions;
using testing::FakeFederation;
using testing::FunctionTrainer;
using ::testing::HasSubstr;

std::vector<UpdateTensor> Adapter(int64_t n) {
  return {{"lora_A.weight", {1, n}, std::vector<float>(static_cast<size_t>(n), 0.5f)}};
}

// Returns a delta of 0.25 everywhere, after `during` has run.
FunctionTrainer DeltaTrainer(std::function<void()> during = nullptr) {
  return FunctionTrainer(
      [during](const TrainTask&,
               const std::vector<NamedTensor>& global) -> absl::StatusOr<TrainResult> {
        if (during) during();
        TrainResult r;
        for (const NamedTensor& t : global)
          r.delta.push_back({t.name, t.shape, std::vector<float>(t.values.size(), 0.25f)});
        r.num_examples = 3;
        return r;
      });
}

TEST(WireFieldsTest, TheServersNextHeartbeatSecondsSetsTheInterval) {
  FakeFederation federation(1, Adapter(8));
  federation.heartbeat_seconds = 1;            // the server asks for one a second
  federation.config_heartbeat_seconds = 3600;  // the run config's copy says an hour
  int heartbeats = 0;
  FunctionTrainer trainer =
      DeltaTrainer([&] { heartbeats = federation.WaitForHeartbeats(3, std::chrono::seconds(10)); });
  auto client = NewClientOverTransport(FakeClientOptions(), &trainer, federation.NewTransport());
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->RunUntilDone().ok());
  EXPECT_GE(heartbeats, 3);  // at once, then every second: within ~2 s
}

TEST(WireFieldsTest, TheRunConfigsHeartbeatIntervalIsNotASecondSource) {
  FakeFederation federation(1, Adapter(8));
  federation.heartbeat_seconds = 3600;      // the server: the next one in an hour
  federation.config_heartbeat_seconds = 1;  // the run config's copy: every second
  int heartbeats = 0;
  FunctionTrainer trainer = DeltaTrainer([&] {
    // Waits for a second heartbeat that must not come (the server's interval is an hour).
    heartbeats = federation.WaitForHeartbeats(2, std::chrono::milliseconds(2500));
  });
  auto client = NewClientOverTransport(FakeClientOptions(), &trainer, federation.NewTransport());
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->RunUntilDone().ok());
  EXPECT_EQ(heartbeats, 1);  // the one when training starts
}

TEST(WireFieldsTest, AnUpdateOverTheServersLimitIsRefusedBeforeUploading) {
  FakeFederation federation(1, Adapter(256));  // 1 KiB of fp32 values
  federation.max_update_bytes = 600;
  FunctionTrainer trainer = DeltaTrainer();
  auto client = NewClientOverTransport(FakeClientOptions(), &trainer, federation.NewTransport());
  ASSERT_TRUE(client.ok()) << client.status();
  absl::StatusOr<RunSummary> result = (*client)->RunUntilDone();
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kResourceExhausted) << result.status();
  // Both sizes: the sealed update's (its encoding plus the sealing's bytes) and the limit.
  CodecOptions raw;
  const size_t sealed = EncodeUpdate(Adapter(256), raw)->size() + crypto::SealedBlobOverheadBytes();
  EXPECT_THAT(std::string(result.status().message()),
              HasSubstr(absl::StrCat("the sealed update of ", sealed,
                                     " bytes exceeds the server's limit of 600 bytes")));
  EXPECT_EQ(federation.upload_calls(), 0);  // nothing sent
  ASSERT_EQ(federation.leave_errors().size(), 1u);
  EXPECT_THAT(federation.leave_errors()[0], HasSubstr("max_update_bytes"));
}

TEST(WireFieldsTest, AnUpdateWithinTheLimitIsUploaded) {
  FakeFederation federation(1, Adapter(256));
  federation.max_update_bytes = 4096;
  FunctionTrainer trainer = DeltaTrainer();
  auto client = NewClientOverTransport(FakeClientOptions(), &trainer, federation.NewTransport());
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->RunUntilDone().ok());
  EXPECT_EQ(federation.uploads().size(), 1u);
}

TEST(WireFieldsTest, HasCudaIsReportedAndLeavesTheEncodingOnTheHost) {
  FakeFederation federation(1, Adapter(8));
  FunctionTrainer trainer = DeltaTrainer();
  ClientOptions o = FakeClientOptions();
  o.has_cuda = true;  // the site trains on a GPU; the update still encodes on the host
  o.device_name = "Test GPU";
  auto client = NewClientOverTransport(o, &trainer, federation.NewTransport());
  ASSERT_TRUE(client.ok()) << client.status();
  absl::StatusOr<RunSummary> result = (*client)->RunUntilDone();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->tasks_completed, 1);
  EXPECT_TRUE(federation.capabilities().has_cuda());
  EXPECT_EQ(federation.capabilities().device_name(), "Test GPU");
  ASSERT_EQ(federation.uploads().size(), 1u);
  EXPECT_EQ(federation.uploads()[0].update[0].values, std::vector<float>(8, 0.25f));
}

}  // namespace
}  // namespace fedlora
