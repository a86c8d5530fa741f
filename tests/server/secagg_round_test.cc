// SecAggRound alone: one round's SecAgg+ phases driven in memory with crypto::SecAggClient, no
// coordinator, no RPC. The unmasked sum is checked against the sum of the clients' inputs.
#include "server/secagg_round.h"

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fedlora {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kElements = 6;
constexpr int64_t kStepMs = 1000;

v1::RunConfig Config() {
  v1::RunConfig config;
  config.mutable_privacy()->set_secure_aggregation(true);
  config.mutable_aggregation()->set_max_update_norm(1.0);
  return config;
}

struct Round {
  SecAggEncoding encoding;
  std::unique_ptr<SecAggRound> round;
};

Round StartRound(const std::set<std::string>& cohort, int64_t now) {
  Round r;
  r.encoding = SecAggEncoding::For(Config(), /*min_clients=*/2, /*max_cohort=*/4).value();
  const v1::SecAggParams params =
      SecAggRound::Params(7, static_cast<uint32_t>(cohort.size()), kElements, r.encoding, 2)
          .value();
  absl::StatusOr<std::unique_ptr<SecAggRound>> s =
      SecAggRound::Start(7, cohort, params, r.encoding, {}, kStepMs, now);
  EXPECT_TRUE(s.ok()) << s.status();
  if (s.ok()) r.round = *std::move(s);
  return r;
}

v1::SecureAggregationRequest Request() {
  v1::SecureAggregationRequest req;
  req.set_round(7);
  return req;
}

TEST(SecAggRoundTest, ThreeClientsThroughEveryPhaseGiveTheSumOfTheirInputs) {
  const std::set<std::string> ids = {"carol", "alice", "bob"};
  Round r = StartRound(ids, /*now=*/0);
  ASSERT_NE(r.round, nullptr);
  SecAggRound& s = *r.round;
  // Index order is client id order.
  EXPECT_EQ(*s.IndexOf("alice"), 0u);
  EXPECT_EQ(*s.IndexOf("carol"), 2u);
  EXPECT_FALSE(s.IndexOf("mallory").has_value());
  EXPECT_EQ(s.TaskFor("bob").client_index(), 1u);
  EXPECT_EQ(s.TaskFor("bob").clip_norm(), 1.0);
  const v1::SecAggParams params = s.TaskFor("alice").params();
  std::vector<crypto::SecAggClient> clients;
  for (uint32_t i = 0; i < 3; ++i)
    clients.push_back(crypto::SecAggClient::Create(params, i).value());

  // Step 0: each advertises; the step closes once all three did, before its time.
  for (uint32_t i = 0; i < 3; ++i) {
    v1::SecureAggregationRequest req = Request();
    *req.mutable_advertise_keys() = clients[i].AdvertiseKeys().value();
    ASSERT_FALSE(s.Receive(i, req).value().has_value());
  }
  EXPECT_EQ(s.phase(), SecAggRound::Phase::kAdvertise);
  EXPECT_FALSE(s.MayUpload("alice"));
  ASSERT_TRUE(s.Advance(/*now=*/10).ok());
  EXPECT_EQ(s.phase(), SecAggRound::Phase::kShareKeys);
  // Step 1.
  for (uint32_t i = 0; i < 3; ++i) {
    const v1::SecureAggregationResponse a = s.Answer(i, false).value();
    ASSERT_TRUE(a.has_share_keys()) << a.done();
    v1::SecureAggregationRequest req = Request();
    *req.mutable_share_keys() = clients[i].ShareKeys(a.share_keys()).value();
    ASSERT_FALSE(s.Receive(i, req).value().has_value());
  }
  ASSERT_TRUE(s.Advance(/*now=*/20).ok());
  EXPECT_EQ(s.phase(), SecAggRound::Phase::kMaskedInput);
  EXPECT_TRUE(s.MayUpload("bob"));
  EXPECT_FALSE(s.MayUpload("mallory"));
  EXPECT_EQ(s.UploadCap(), 3);
  // Step 2: the masked inputs, fed to the protocol server the aggregation thread takes out.
  const std::vector<std::vector<uint64_t>> inputs = {
      {1, 2, 3, 4, 5, 6}, {10, 20, 30, 40, 50, 60}, {100, 200, 300, 400, 500, 600}};
  std::vector<v1::SecAggMaskedInputResponse> masked;
  for (uint32_t i = 0; i < 3; ++i) {
    const v1::SecureAggregationResponse a = s.Answer(i, false).value();
    ASSERT_TRUE(a.has_masked_input()) << a.done();
    masked.push_back(clients[i].MaskedInput(a.masked_input(), inputs[i]).value());
  }
  // An uploaded client waits for step 3.
  EXPECT_TRUE(s.Answer(0, /*uploaded=*/true).value().has_retry_after_ms());
  std::unique_ptr<crypto::SecAggServer> server = s.TakeServer();
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(s.TakeServer(), nullptr);  // once: its keys are spent
  for (const auto& m : masked) ASSERT_TRUE(server->ReceiveMaskedInput(m).ok());
  ASSERT_TRUE(server->CloseMaskedInput().ok());
  // Step 3.
  const v1::SecAggUnmaskingRequest unmasking = server->UnmaskingRequest().value();
  s.OpenUnmasking(unmasking);
  EXPECT_EQ(s.phase(), SecAggRound::Phase::kUnmasking);
  EXPECT_FALSE(s.CollectUnmasking(3, /*time_up=*/false).has_value());
  for (uint32_t i = 0; i < 3; ++i) {
    const v1::SecureAggregationResponse a = s.Answer(i, true).value();
    ASSERT_TRUE(a.has_unmasking()) << a.done();
    v1::SecureAggregationRequest req = Request();
    *req.mutable_unmasking() = clients[i].Unmask(a.unmasking()).value();
    const std::optional<v1::SecureAggregationResponse> got = s.Receive(i, req).value();
    ASSERT_TRUE(got.has_value());
    EXPECT_EQ(got->done(), "unmasking shares received");
  }
  std::optional<std::map<uint32_t, v1::SecAggUnmaskingResponse>> responses =
      s.CollectUnmasking(3, /*time_up=*/false);
  ASSERT_TRUE(responses.has_value());
  EXPECT_EQ(responses->size(), 3u);
  EXPECT_EQ(s.phase(), SecAggRound::Phase::kDone);
  EXPECT_EQ(s.Answer(1, true).value().done(), "the round's unmasking is over");
  for (const auto& [i, response] : *responses) ASSERT_TRUE(server->ReceiveUnmasking(response).ok());
  const std::vector<uint64_t> sum = server->Finish().value();
  ASSERT_EQ(sum.size(), static_cast<size_t>(kElements));
  for (size_t k = 0; k < sum.size(); ++k) {
    EXPECT_EQ(sum[k], inputs[0][k] + inputs[1][k] + inputs[2][k]) << k;
  }
}

TEST(SecAggRoundTest, AKeyStepClosesAtItsTimeAndTooFewClientsEndTheRound) {
  Round r = StartRound({"alice", "bob", "carol"}, /*now=*/0);
  ASSERT_NE(r.round, nullptr);
  SecAggRound& s = *r.round;
  // Nobody advertised: before the step's time nothing closes; at it, the step fails.
  ASSERT_TRUE(s.Advance(kStepMs - 1).ok());
  EXPECT_EQ(s.phase(), SecAggRound::Phase::kAdvertise);
  EXPECT_TRUE(s.Answer(0, false).value().has_retry_after_ms());
  const absl::Status st = s.Advance(kStepMs);
  EXPECT_FALSE(st.ok());
  EXPECT_THAT(st.message(), HasSubstr("secure aggregation, key advertisement: "));
}

TEST(SecAggRoundTest, MessagesOutsideTheProtocolAreRefused) {
  Round r = StartRound({"alice", "bob", "carol"}, /*now=*/0);
  ASSERT_NE(r.round, nullptr);
  SecAggRound& s = *r.round;
  // Another client's index.
  v1::SecureAggregationRequest req = Request();
  req.mutable_advertise_keys()->set_client_index(1);
  EXPECT_EQ(s.Receive(0, req).status().code(), absl::StatusCode::kPermissionDenied);
  // No message at all.
  EXPECT_EQ(s.Receive(0, Request()).status().code(), absl::StatusCode::kInvalidArgument);
  // Unmasking before step 3.
  req = Request();
  req.mutable_unmasking()->set_client_index(0);
  EXPECT_EQ(s.Receive(0, req).value()->done(), "the unmasking step is not open to this client");
  // A masked upload is refused before the key sharing closed.
  EXPECT_FALSE(s.MayUpload("alice"));
  EXPECT_FALSE(s.UploadCap().has_value());
}

TEST(SecAggEncodingTest, AMaskedUploadHasTheEncodingsSizeExactly) {
  const SecAggEncoding e = SecAggEncoding::For(Config(), 2, 4).value();
  const size_t bytes = static_cast<size_t>(kElements) * ((e.modulus_bits + 7) / 8);
  EXPECT_TRUE(e.ValidateMasked(std::string(bytes, '\0'), kElements).ok());
  const absl::Status st = e.ValidateMasked(std::string(bytes - 1, '\0'), kElements);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("a masked update is"));
  // Three clipped updates of norm <= 1 sum to at most about 3; a sum of norm 100 is implausible.
  std::vector<double> total(kElements, 0.0);
  total[0] = 2.5;
  EXPECT_TRUE(e.CheckUnmaskedSum(7, total, 3, {}).ok());
  total[0] = 100;
  EXPECT_EQ(e.CheckUnmaskedSum(7, total, 3, {}).code(), absl::StatusCode::kDataLoss);
}

TEST(UnmaskedMeanTest, DividesTheSumIntoTheAdaptersTensors) {
  const std::vector<TensorSpec> spec = {{"a", {2}}, {"b", {1, 2}}};
  const std::vector<UpdateTensor> mean = UnmaskedMean({1.0, 2.0, -4.0, 0.5}, 2, spec);
  ASSERT_EQ(mean.size(), 2u);
  EXPECT_EQ(mean[0].name, "a");
  EXPECT_EQ(mean[0].values, (std::vector<float>{0.5f, 1.0f}));
  EXPECT_EQ(mean[1].shape, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(mean[1].values, (std::vector<float>{-2.0f, 0.25f}));
}

}  // namespace
}  // namespace fedlora
