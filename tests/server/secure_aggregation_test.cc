// Secure aggregation through the real server: clients (driven here step by step with the SecAgg+
// library, as the SDK does) mask their clipped fixed-point updates; the server commits the mean of
// the survivors' updates without opening any one of them, survives clients that drop after sharing
// their keys or after uploading, abandons a round it cannot unmask, and abandons an open round
// after a restart instead of resuming it.
#include <cmath>
#include <functional>
#include <thread>

#include "aggregation/fedavg.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "server/store.h"
#include "tests/server/federation_test_util.h"
#include "tests/server/secagg_test_client.h"

namespace fedlora {
namespace {

using testing::DeltaValue;
using testing::InitialAdapter;
using testing::RawClient;
using testing::TempDir;
using testing::WaitFor;

constexpr double kClip = 0.1;

v1::RunConfig SecAggConfig(int clients, uint32_t quant_bits = 0) {
  v1::RunConfig c = testing::TestRunConfig(1, clients, 3);
  c.mutable_privacy()->set_secure_aggregation(true);
  if (quant_bits > 0) {
    v1::CodecStage* s = c.mutable_codec()->add_stages();
    s->set_id(v1::CodecStage::QUANT);
    s->mutable_quant()->set_bits(quant_bits);
  }
  c.mutable_aggregation()->set_max_update_norm(kClip);
  c.mutable_aggregation()->clear_weight_by_examples();
  ApplyRunConfigDefaults(&c);
  return c;
}

ServerOptions Options(const std::string& dir) {
  ServerOptions o = testing::TestServerOptions(dir);
  o.round_deadline_ms = 6000;  // key and unmasking steps wait 1.5 s for a missing client
  return o;
}

// Client `k`'s delta for `task`, as the trainer would return it.
std::vector<NamedTensor> Delta(int k, const v1::TrainTask& task) {
  std::vector<NamedTensor> d;
  for (const v1::TensorSpec& t : task.global_adapter().tensors()) {
    NamedTensor n{t.name(), {t.shape().begin(), t.shape().end()}, {}};
    int64_t count = 1;
    for (int64_t s : n.shape) count *= s;
    for (int64_t i = 0; i < count; ++i)
      n.values.push_back(DeltaValue(k, task.round(), t.name(), i));
    d.push_back(std::move(n));
  }
  return d;
}

// The largest difference between the adapter's move (`after` - `initial`) and the plaintext mean
// of the sites' updates (`sites`: each its Delta for its task, clipped to kClip).
double ErrorAgainstClippedMean(const std::vector<UpdateTensor>& initial,
                               const std::vector<UpdateTensor>& after,
                               const std::vector<v1::TrainTask>& tasks,
                               const std::vector<int>& sites) {
  std::vector<std::vector<UpdateTensor>> clipped;
  for (int k : sites) {
    std::vector<UpdateTensor> u = Delta(k, tasks[k]);
    std::sort(u.begin(), u.end(),
              [](const UpdateTensor& a, const UpdateTensor& b) { return a.name < b.name; });
    ClipUpdateNorm(u, kClip);
    clipped.push_back(std::move(u));
  }
  double max_error = 0;
  for (size_t t = 0; t < after.size(); ++t) {
    for (size_t i = 0; i < after[t].values.size(); ++i) {
      double mean = 0;
      for (const auto& u : clipped) mean += u[t].values[i];
      mean /= static_cast<double>(clipped.size());
      max_error = std::max(max_error, std::abs(after[t].values[i] - initial[t].values[i] - mean));
    }
  }
  return max_error;
}

using Drop = testing::SecAggDrop;

v1::SecureAggregationResponse Call(RawClient& c, const v1::SecureAggregationRequest& req) {
  return testing::SecAggCall(c, req);
}

// One client's whole round; returns the task it got.
v1::TrainTask RunClient(const std::string& address, int k, Drop drop,
                        bool answer_unmasking = true) {
  RawClient c(address, absl::StrCat("site-", k));
  EXPECT_TRUE(c.Join().ok());
  v1::TrainTask task;
  EXPECT_TRUE(c.GetTask(&task));
  testing::RunSecAggClient(c, task, Delta(k, task), absl::StrCat("u", k), drop, answer_unmasking);
  return task;
}

// Without a codec (32-bit elements), and with QUANT 8 bits (8-bit levels of one power-of-two step,
// summed in 8 + ceil(log2 6) = 11-bit elements, 2 bytes each on the wire).
class SecureAggregationTest : public ::testing::TestWithParam<uint32_t> {};

TEST_P(SecureAggregationTest, TheServerCommitsTheSurvivorsMeanThroughDropouts) {
  TempDir dir;
  auto server =
      Server::Create(Options(dir.path()), SecAggConfig(6, GetParam()), InitialAdapter(), nullptr);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::vector<UpdateTensor> initial = (*server)->coordinator().global_adapter();
  // Site 4 drops after sharing its keys (no upload); site 5 uploads and never answers step 3.
  std::vector<std::thread> sites;
  std::vector<v1::TrainTask> tasks(6);
  for (int k = 0; k < 6; ++k) {
    const Drop drop = k == 4 ? Drop::kAfterShareKeys : k == 5 ? Drop::kAfterUpload : Drop::kNone;
    sites.emplace_back([&, k, drop] { tasks[k] = RunClient((*server)->address(), k, drop); });
  }
  for (std::thread& t : sites) t.join();
  ASSERT_TRUE(WaitFor([&] { return (*server)->coordinator().rounds_committed() == 1; }, 20'000));

  // The plaintext mean of the five uploaded updates, each clipped to kClip.
  const std::vector<UpdateTensor> after = (*server)->coordinator().global_adapter();
  // Fixed point with frac_bits f: each value is off by < 2^-f, the mean too.
  const v1::SecureAggregationTask& sa = tasks[0].secure_aggregation();
  const double tolerance = std::ldexp(1.0, -static_cast<int>(sa.frac_bits())) + 1e-7;
  if (GetParam() == 0) {
    EXPECT_EQ(sa.params().modulus_bits(), 32u);
    EXPECT_GE(sa.frac_bits(), 20u);
  } else {
    EXPECT_EQ(sa.params().modulus_bits(), 11u);
    EXPECT_EQ(sa.frac_bits(), 10u);  // 127 levels over +-0.1: a step of 2^-10
  }
  ASSERT_EQ(after.size(), initial.size());
  EXPECT_LT(ErrorAgainstClippedMean(initial, after, tasks, {0, 1, 2, 3, 5}), tolerance);
  RawClient op((*server)->address(), "operator");
  const v1::GetStatusResponse status = op.RunStatus();
  ASSERT_EQ(status.history_size(), 1);
  EXPECT_EQ(status.history(0).updates_accepted(), 5u);
  // Each sealed masked update: 2240 elements of ceil(m / 8) bytes, plus the seal.
  const uint64_t element_bytes = (sa.params().modulus_bits() + 7) / 8;
  EXPECT_GT(status.history(0).upload_bytes(), 5 * 2240 * element_bytes);
  EXPECT_LT(status.history(0).upload_bytes(), 5 * (2240 * element_bytes + 200));
  (*server)->Shutdown();
}

INSTANTIATE_TEST_SUITE_P(Codecs, SecureAggregationTest, ::testing::Values(0u, 8u),
                         [](const ::testing::TestParamInfo<uint32_t>& i) {
                           return i.param == 0 ? std::string("NoCodec")
                                               : absl::StrCat("Quant", i.param);
                         });

TEST(SecureAggregationRoundTest, AnEncodingThatCouldOverflowIsRefusedAtStart) {
  // QUANT 2 bits has one level each side: values up to 2.0 cannot be encoded at a step <= 1.
  TempDir dir;
  v1::RunConfig config = SecAggConfig(4, 2);
  config.mutable_aggregation()->set_max_update_norm(2.0);
  auto server = Server::Create(Options(dir.path()), config, InitialAdapter(), nullptr);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(server.status().message().find("QUANT 2 bits"), std::string::npos) << server.status();
}

TEST(SecureAggregationRoundTest, ARoundThatCannotBeUnmaskedIsAbandonedWithoutAResult) {
  // Four clients upload, one answers the unmasking step: no survivor's self-mask seed has the
  // threshold's shares, so the sum stays masked and the round is given up.
  TempDir dir;
  v1::RunConfig config = SecAggConfig(4);
  config.set_rounds(2);
  auto server = Server::Create(Options(dir.path()), config, InitialAdapter(), nullptr);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string initial_hash = (*server)->coordinator().global_adapter_sha256();
  std::vector<std::thread> sites;
  for (int k = 0; k < 4; ++k) {
    sites.emplace_back(
        [&, k] { RunClient((*server)->address(), k, Drop::kNone, /*answer_unmasking=*/k == 0); });
  }
  for (std::thread& t : sites) t.join();
  ASSERT_TRUE(WaitFor([&] { return (*server)->metrics().rounds_abandoned.load() == 1; }, 20'000));
  EXPECT_EQ((*server)->coordinator().rounds_committed(), 0);
  EXPECT_EQ((*server)->coordinator().global_adapter_sha256(), initial_hash);
  (*server)->Shutdown();
  server->reset();
  auto store = Store::Open(dir.path() + "/fedlora.db");
  ASSERT_TRUE(store.ok());
  auto rounds = (*store)->ListRounds("test-run");
  ASSERT_TRUE(rounds.ok());
  ASSERT_GE(rounds->size(), 1u);
  EXPECT_EQ((*rounds)[0].state, RoundState::kAbandoned);
}

TEST(SecureAggregationRoundTest, WrongSharesDoNotCommitARandomisedSum) {
  // Two of four survivors answer the unmasking step with a byte of every share flipped. Each seed
  // then has 4 shares, 2 of them wrong, at threshold 3: no polynomial gathers a majority, so the
  // shares are found inconsistent (without them, the unmasked sum would be noise over the whole
  // modulus, which CheckUnmaskedSum refuses). Nothing is committed and the round is abandoned.
  TempDir dir;
  v1::RunConfig config = SecAggConfig(4);
  auto server = Server::Create(Options(dir.path()), config, InitialAdapter(), nullptr);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string initial_hash = (*server)->coordinator().global_adapter_sha256();
  auto flip = [](v1::SecAggUnmaskingResponse* r) {
    for (v1::SecAggRevealedShare& s : *r->mutable_shares()) {
      if (!s.share().empty())
        s.mutable_share()->back() ^= 0x5a;  // a well-formed share of another value
    }
  };
  std::vector<std::thread> sites;
  for (int k = 0; k < 4; ++k) {
    sites.emplace_back([&, k] {
      RawClient c((*server)->address(), absl::StrCat("site-", k));
      ASSERT_TRUE(c.Join().ok());
      v1::TrainTask task;
      ASSERT_TRUE(c.GetTask(&task));
      testing::RunSecAggClient(
          c, task, Delta(k, task), absl::StrCat("u", k), Drop::kNone, true, nullptr,
          k < 2 ? std::function<void(v1::SecAggUnmaskingResponse*)>(flip) : nullptr);
    });
  }
  for (std::thread& t : sites) t.join();
  ASSERT_TRUE(WaitFor([&] { return (*server)->metrics().rounds_abandoned.load() >= 1; }, 20'000));
  EXPECT_EQ((*server)->coordinator().rounds_committed(), 0);
  EXPECT_EQ((*server)->coordinator().global_adapter_sha256(), initial_hash);
}

TEST(SecureAggregationRoundTest, OneWrongShareIsOutvotedAndItsSenderSitsOutTheNextRound) {
  // Six sites, threshold 3: each survivor's seed has five shares. Site 0 flips a byte of every share
  // it reveals; the other four shares of each seed outvote it, the round commits the exact mean of
  // the six updates, and site 0 is named and left out of round 2's selection.
  TempDir dir;
  v1::RunConfig config = SecAggConfig(6);
  config.set_rounds(2);
  auto server = Server::Create(Options(dir.path()), config, InitialAdapter(), nullptr);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::vector<UpdateTensor> initial = (*server)->coordinator().global_adapter();
  auto flip = [](v1::SecAggUnmaskingResponse* r) {
    for (v1::SecAggRevealedShare& s : *r->mutable_shares()) {
      if (!s.share().empty()) s.mutable_share()->back() ^= 0x5a;
    }
  };
  std::vector<v1::TrainTask> tasks(6);
  std::vector<std::thread> sites;
  for (int k = 0; k < 6; ++k) {
    sites.emplace_back([&, k] {
      RawClient c((*server)->address(), absl::StrCat("site-", k));
      ASSERT_TRUE(c.Join().ok());
      ASSERT_TRUE(c.GetTask(&tasks[k]));
      testing::RunSecAggClient(
          c, tasks[k], Delta(k, tasks[k]), absl::StrCat("u", k), Drop::kNone, true, nullptr,
          k == 0 ? std::function<void(v1::SecAggUnmaskingResponse*)>(flip) : nullptr);
    });
  }
  for (std::thread& t : sites) t.join();
  ASSERT_TRUE(WaitFor([&] { return (*server)->coordinator().rounds_committed() == 1; }, 20'000));
  EXPECT_EQ((*server)->metrics().secagg_misbehaving_clients.load(), 1);
  EXPECT_EQ((*server)->metrics().secagg_implausible_sums.load(), 0);

  const std::vector<UpdateTensor> after = (*server)->coordinator().global_adapter();
  const double tolerance =
      std::ldexp(1.0, -static_cast<int>(tasks[0].secure_aggregation().frac_bits())) + 1e-7;
  ASSERT_EQ(after.size(), initial.size());
  EXPECT_LT(ErrorAgainstClippedMean(initial, after, tasks, {0, 1, 2, 3, 4, 5}), tolerance);

  // Round 2: site 0 is told to sit it out; an honest site is a candidate as usual.
  RawClient liar((*server)->address(), "site-0");
  ASSERT_TRUE(liar.Join().ok());
  v1::WaitForTaskResponse poll;
  ASSERT_TRUE(liar.WaitForTask(&poll, 0).ok());
  ASSERT_TRUE(poll.has_retry_later());
  EXPECT_THAT(poll.retry_later().reason(), ::testing::HasSubstr("sitting out round 2"));
  (*server)->Shutdown();
}

TEST(SecureAggregationRoundTest, ARestartAbandonsTheOpenRoundAndTheNextOneHasFreshParameters) {
  TempDir dir;
  v1::RunConfig config = SecAggConfig(3);
  config.set_rounds(2);
  v1::TrainTask first;
  {
    auto server = Server::Create(Options(dir.path()), config, InitialAdapter(), nullptr);
    ASSERT_TRUE(server.ok()) << server.status();
    // Every client uploads; none answers step 3, and the server stops while it waits for them.
    std::vector<std::thread> sites;
    std::vector<v1::TrainTask> tasks(3);
    for (int k = 0; k < 3; ++k) {
      sites.emplace_back(
          [&, k] { tasks[k] = RunClient((*server)->address(), k, Drop::kAfterUpload); });
    }
    for (std::thread& t : sites) t.join();
    first = tasks[0];
    (*server)->Shutdown();
  }
  auto server = Server::Create(Options(dir.path()), config, InitialAdapter(), nullptr);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ((*server)->coordinator().rounds_committed(), 0);
  EXPECT_EQ((*server)->metrics().rounds_abandoned.load(), 1)
      << "the restart did not abandon the open round";
  RawClient c((*server)->address(), "site-0");
  ASSERT_TRUE(c.Join().ok());
  RawClient c1((*server)->address(), "site-1");
  ASSERT_TRUE(c1.Join().ok());
  RawClient c2((*server)->address(), "site-2");
  ASSERT_TRUE(c2.Join().ok());
  v1::TrainTask next;
  std::thread t1([&] {
    v1::TrainTask t;
    c1.GetTask(&t);
  });
  std::thread t2([&] {
    v1::TrainTask t;
    c2.GetTask(&t);
  });
  ASSERT_TRUE(c.GetTask(&next));
  t1.join();
  t2.join();
  EXPECT_EQ(next.round(), first.round() + 1);
  ASSERT_TRUE(next.has_secure_aggregation());
  EXPECT_NE(next.secure_aggregation().params().round_nonce(),
            first.secure_aggregation().params().round_nonce());
  // The old round's masked uploads are not counted in the new one.
  v1::SecureAggregationRequest stale;
  stale.set_round(first.round());
  stale.set_task_id(first.task_id());
  stale.set_poll(true);
  EXPECT_FALSE(Call(c, stale).done().empty());
  (*server)->Shutdown();
}

}  // namespace
}  // namespace fedlora
