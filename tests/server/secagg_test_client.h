// A client's side of a secure-aggregation round driven step by step with the SecAgg+ library and a
// RawClient, as the SDK does it (client/client.cc): for the server's secure-aggregation tests and
// the round benchmark (bench/server/secagg_round_bench.cc).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/secure_update.h"
#include "crypto/secagg.h"
#include "gtest/gtest.h"
#include "tests/server/federation_test_util.h"

namespace fedlora::testing {

enum class SecAggDrop { kNone, kAfterShareKeys, kAfterUpload };

// What a client sent and received through SecureAggregation, in serialized bytes.
struct SecAggTraffic {
  int64_t sent = 0, received = 0;
};

inline v1::SecureAggregationResponse SecAggCall(RawClient& c,
                                                const v1::SecureAggregationRequest& req,
                                                SecAggTraffic* traffic = nullptr) {
  v1::SecureAggregationResponse resp;
  auto ctx = c.Context(30'000);
  grpc::Status s = c.stub()->SecureAggregation(ctx.get(), req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  if (traffic != nullptr) {
    traffic->sent += static_cast<int64_t>(req.ByteSizeLong());
    traffic->received += static_cast<int64_t>(resp.ByteSizeLong());
  }
  return resp;
}

// Sends `req`, then polls until the answer is more than "ask again" (at most about 60 s).
inline v1::SecureAggregationResponse SecAggStep(RawClient& c, v1::SecureAggregationRequest req,
                                                SecAggTraffic* traffic = nullptr) {
  for (int i = 0; i < 1200; ++i) {
    v1::SecureAggregationResponse resp = SecAggCall(c, req, traffic);
    if (!resp.has_retry_after_ms()) return resp;
    req.set_poll(true);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ADD_FAILURE() << "secure aggregation did not move on";
  return {};
}

// Client `c`'s round for `task` with update `delta`: the key steps, the masked upload (upload id
// `upload_id`), and step 3 unless it drops out first or `answer_unmasking` is false.
inline void RunSecAggClient(
    RawClient& c, const v1::TrainTask& task, const std::vector<NamedTensor>& delta,
    const std::string& upload_id, SecAggDrop drop = SecAggDrop::kNone, bool answer_unmasking = true,
    SecAggTraffic* traffic = nullptr,
    const std::function<void(v1::SecAggUnmaskingResponse*)>& tamper = nullptr) {
  ASSERT_TRUE(task.has_secure_aggregation());
  const v1::SecureAggregationTask& sa = task.secure_aggregation();
  auto client = crypto::SecAggClient::Create(sa.params(), sa.client_index());
  ASSERT_TRUE(client.ok()) << client.status();
  v1::SecureAggregationRequest base;
  base.set_round(task.round());
  base.set_task_id(task.task_id());
  v1::SecureAggregationRequest req = base;
  *req.mutable_advertise_keys() = client->AdvertiseKeys().value();
  v1::SecureAggregationResponse resp = SecAggStep(c, req, traffic);
  ASSERT_TRUE(resp.has_share_keys()) << resp.done();
  req = base;
  *req.mutable_share_keys() = client->ShareKeys(resp.share_keys()).value();
  resp = SecAggStep(c, req, traffic);
  ASSERT_TRUE(resp.has_masked_input()) << resp.done();
  if (drop == SecAggDrop::kAfterShareKeys) return;
  absl::StatusOr<std::vector<uint64_t>> input = EncodeSecureUpdate(delta, sa);
  ASSERT_TRUE(input.ok()) << input.status();
  const std::string masked =
      client->MaskedInput(resp.masked_input(), *input).value().masked_input();
  v1::UploadHeader header = c.Header(task, masked, upload_id);
  *header.mutable_codec() =
      task.codec();  // the run's codec: empty, or the QUANT stage setting the precision
  v1::UploadAck ack;
  grpc::Status up = c.UploadAll(header, masked, &ack);
  ASSERT_TRUE(up.ok()) << up.error_message();
  ASSERT_EQ(ack.state(), v1::UPLOAD_STATE_ACCEPTED) << ack.reason();
  if (drop == SecAggDrop::kAfterUpload || !answer_unmasking) return;
  req = base;
  req.set_poll(true);
  resp = SecAggStep(c, req, traffic);
  if (!resp.has_unmasking()) return;  // the round went on without this client
  req = base;
  *req.mutable_unmasking() = client->Unmask(resp.unmasking()).value();
  if (tamper) tamper(req.mutable_unmasking());
  EXPECT_FALSE(SecAggCall(c, req, traffic).done().empty());
}

}  // namespace fedlora::testing
