// Offline check and repair of a damaged store (server/store_check.h), the rewind of a run
// (Store::RewindRun) and what it does to the privacy accounting: a store with two committed rounds
// (result adapter, broadcast adapter + delta, optimizer state) and an open round with accepted
// updates, one byte flipped in each kind of blob in turn.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "compression/downlink.h"
#include "compression/update_io.h"
#include "config/config_io.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/differential_privacy.h"
#include "server/store_check.h"
#include "tests/server/federation_test_util.h"

namespace fedlora {
namespace {

using ::testing::HasSubstr;
using testing::InitialAdapter;
using testing::TempDir;

constexpr char kRun[] = "run";

std::vector<UpdateTensor> Shifted(std::vector<UpdateTensor> a, float by) {
  for (UpdateTensor& t : a) {
    for (size_t i = 0; i < t.values.size(); ++i) t.values[i] += by * static_cast<float>(i % 7);
  }
  return a;
}

class StoreRecoveryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = Store::Open(dir_.path() + "/fedlora.db");
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
    auto blobs = BlobStore::Open(dir_.path());
    ASSERT_TRUE(blobs.ok()) << blobs.status();
    blobs_ = *std::move(blobs);
  }

  std::string Put(const std::string& bytes) {
    auto h = blobs_->Put(bytes);
    EXPECT_TRUE(h.ok()) << h.status();
    return h.value_or("");
  }

  // Rounds 1 and 2 committed with a quantizing downlink (so broadcast != result) and an optimizer
  // state; round 3 open with two accepted updates. `dp_z` > 0 adds a DP record to each round.
  void Build(double dp_z = 0) {
    std::vector<UpdateTensor> broadcast = InitialAdapter();
    initial_ = Put(*AdapterToSafetensors(broadcast));
    nlohmann::json meta;
    meta["initial_adapter_sha256"] = initial_;
    ASSERT_TRUE(store_->CreateRun(kRun, meta.dump()).ok());
    for (int r = 1; r <= 2; ++r) {
      ASSERT_TRUE(
          store_->BeginRound(kRun, r, broadcast_.empty() ? initial_ : broadcast_.back(), 0).ok());
      ASSERT_TRUE(store_->SetRoundState(kRun, r, RoundState::kTraining).ok());
      ASSERT_TRUE(store_->SetRoundState(kRun, r, RoundState::kAggregating).ok());
      const std::vector<UpdateTensor> result = Shifted(InitialAdapter(), 0.001f * r);
      CodecOptions o;
      o.codec = CodecId::kQuant;
      o.quant_stochastic = false;
      auto d = EncodeDownlinkDelta(broadcast, result, o);
      ASSERT_TRUE(d.ok()) << d.status();
      BroadcastHashes b{Put(*AdapterToSafetensors(d->rebuilt)), Put(d->blob)};
      broadcast = d->rebuilt;
      result_.push_back(Put(*AdapterToSafetensors(result)));
      broadcast_.push_back(b.adapter_hash);
      delta_.push_back(b.delta_hash);
      state_.push_back(Put("optimizer state of round " + std::to_string(r)));
      ASSERT_NE(b.adapter_hash, result_.back());
      nlohmann::json metrics = nlohmann::json::object();
      if (dp_z > 0) {
        DpRound dp;
        dp.noise_multiplier = dp_z;
        dp.clip_norm = dp.next_clip_norm = 1;
        dp.AddTo(metrics);
      }
      ASSERT_TRUE(
          store_->CommitRound(kRun, r, result_.back(), metrics.dump(), {}, state_.back(), b).ok());
    }
    ASSERT_TRUE(store_->BeginRound(kRun, 3, broadcast_.back(), 0).ok());
    for (const char* c : {"a", "b"}) {
      UploadRecord u;
      u.upload_id = std::string("up-") + c;
      u.run_id = kRun;
      u.round = 3;
      u.client_id = c;
      u.task_id = "t";
      u.num_examples = 1;
      u.blob_hash = Put(std::string("sealed update of ") + c);
      u.bytes = 10;
      ASSERT_TRUE(store_->RecordAccepted(u).ok());
      update_.push_back(u.blob_hash);
    }
  }

  void Flip(const std::string& hash) {
    const std::string path = blobs_->PathFor(hash);
    std::filesystem::permissions(path, std::filesystem::perms::owner_write,
                                 std::filesystem::perm_options::add);
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(3);
    const char c = static_cast<char>(f.get());
    f.seekp(3);
    f.put(static_cast<char>(c ^ 0x01));
  }

  // The check's verdict on `hash`'s entry (the first one naming it).
  BlobCheck Entry(const RunCheck& check, const std::string& hash) {
    for (const BlobCheck& b : check.blobs) {
      if (b.hash == hash) return b;
    }
    ADD_FAILURE() << "no entry for " << hash;
    return {};
  }

  RunCheck Check() {
    auto c = CheckRun(*store_, *blobs_, kRun);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.value_or(RunCheck{});
  }

  TempDir dir_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<BlobStore> blobs_;
  std::string initial_;
  std::vector<std::string> result_, broadcast_, delta_, state_, update_;
};

TEST_F(StoreRecoveryTest, AnIntactStoreChecksIntactAndNeedsNoRepair) {
  Build();
  const RunCheck c = Check();
  EXPECT_TRUE(c.intact());
  EXPECT_EQ(c.latest_committed, 2);
  EXPECT_EQ(c.blobs.size(), 1u + 2 * 4 + 2);  // initial; 4 per round; 2 accepted updates
  auto o = RepairRun(*store_, *blobs_, kRun, /*rewind=*/false);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->rebuilt.empty());
  EXPECT_EQ(o->rewind_needed_to, -1);
  EXPECT_EQ(o->rewound_to, -1);
}

TEST_F(StoreRecoveryTest, ACorruptBroadcastAdapterIsRebuiltFromItsPredecessorAndDelta) {
  Build();
  for (int r : {0, 1}) Flip(broadcast_[r]);
  RunCheck c = Check();
  EXPECT_EQ(Entry(c, broadcast_[1]).health, BlobHealth::kCorrupt);
  EXPECT_THAT(Entry(c, broadcast_[1]).cost, HasSubstr("will not start"));
  EXPECT_THAT(Entry(c, broadcast_[0]).cost, HasSubstr("downloads"));
  auto o = RepairRun(*store_, *blobs_, kRun, /*rewind=*/false);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->rebuilt.size(), 2u);  // round 2's from round 1's, rebuilt first
  EXPECT_EQ(o->rewind_needed_to, -1);
  EXPECT_TRUE(Check().intact());
}

TEST_F(StoreRecoveryTest, ACorruptLatestResultAdapterNeedsARewindThatKeepsTheEarlierRound) {
  Build();
  Flip(result_[1]);
  RunCheck c = Check();
  EXPECT_FALSE(c.intact());
  EXPECT_EQ(Entry(c, result_[1]).round, 2);
  EXPECT_EQ(Entry(c, result_[1]).health, BlobHealth::kCorrupt);
  EXPECT_THAT(Entry(c, result_[1]).cost, HasSubstr("will not start"));

  auto o = RepairRun(*store_, *blobs_, kRun, /*rewind=*/false);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->rewind_needed_to, 1);
  EXPECT_EQ(store_->GetRound(kRun, 2)->state,
            RoundState::kCommitted);  // nothing changed without --rewind

  o = RepairRun(*store_, *blobs_, kRun, /*rewind=*/true);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->rewound_to, 1);
  EXPECT_EQ(o->rounds_lost, 1);
  auto st = store_->LoadLatestState(kRun);
  ASSERT_TRUE(st.ok());
  ASSERT_TRUE(st->last_committed.has_value());
  EXPECT_EQ(st->last_committed->round, 1);
  EXPECT_FALSE(st->open_round.has_value());  // round 3 trained from round 2's adapter: abandoned
  const RoundRecord lost = *store_->GetRound(kRun, 2);
  EXPECT_TRUE(IsRewound(lost));
  EXPECT_EQ(lost.result_adapter_hash, result_[1]);
  EXPECT_THAT(lost.metrics_json, HasSubstr("rewound"));
  EXPECT_FALSE(IsRewound(*store_->GetRound(kRun, 3)));
  EXPECT_TRUE(Check().intact());  // round 1 is now the latest, and intact
}

// Rounds older than server.retain_rounds have no blobs on purpose: the check skips them, and a
// rewind never lands on one (it has nothing to resume from).
TEST_F(StoreRecoveryTest, RoundsPrunedByRetentionAreNeitherDamageNorARewindTarget) {
  Build();
  auto pruned = store_->PruneRoundBlobs(kRun, /*before_round=*/2);
  ASSERT_TRUE(pruned.ok()) << pruned.status();
  ASSERT_EQ(*pruned, 1);
  RunCheck c = Check();
  EXPECT_TRUE(c.intact());
  EXPECT_EQ(c.blobs.size(), 1u + 4 + 2);  // initial; round 2's four; 2 accepted updates
  Flip(result_[1]);
  auto o = RepairRun(*store_, *blobs_, kRun, /*rewind=*/false);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->rewind_needed_to, 0);  // round 1's adapter is gone: back to the initial one
}

TEST_F(StoreRecoveryTest, ACorruptLatestOptimizerStateRewindsToo) {
  Build();
  Flip(state_[1]);
  Flip(state_[0]);  // and round 1's: back to the initial adapter
  auto o = RepairRun(*store_, *blobs_, kRun, /*rewind=*/true);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->rewound_to, 0);
  EXPECT_EQ(o->rounds_lost, 2);
  EXPECT_FALSE(store_->LoadLatestState(kRun)->last_committed.has_value());
}

TEST_F(StoreRecoveryTest, DamageThatCostsNoRestartIsReportedWithItsCost) {
  Build();
  Flip(delta_[0]);
  Flip(update_[0]);
  ASSERT_TRUE(blobs_->Delete(update_[1]).ok());
  Flip(initial_);
  const RunCheck c = Check();
  EXPECT_EQ(Entry(c, delta_[0]).health, BlobHealth::kCorrupt);
  EXPECT_THAT(Entry(c, delta_[0]).cost, HasSubstr("catch up by deltas"));
  EXPECT_EQ(Entry(c, update_[0]).health, BlobHealth::kCorrupt);
  EXPECT_EQ(Entry(c, update_[0]).upload_id, "up-a");
  EXPECT_EQ(Entry(c, update_[0]).client_id, "a");
  EXPECT_THAT(Entry(c, update_[0]).cost, HasSubstr("left out of the open round's aggregate"));
  EXPECT_EQ(Entry(c, update_[1]).health, BlobHealth::kMissing);
  EXPECT_EQ(Entry(c, initial_).health, BlobHealth::kCorrupt);
  EXPECT_THAT(Entry(c, initial_).cost, HasSubstr("downloads of the initial adapter"));
  auto o = RepairRun(*store_, *blobs_, kRun, /*rewind=*/false);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->rewind_needed_to, -1);  // the run resumes; the damage stays reported
  EXPECT_FALSE(Check().intact());
}

TEST_F(StoreRecoveryTest, NothingToRewindToIsDataLoss) {
  Build();
  Flip(result_[1]);
  Flip(result_[0]);
  Flip(initial_);
  auto o = RepairRun(*store_, *blobs_, kRun, /*rewind=*/true);
  EXPECT_TRUE(absl::IsDataLoss(o.status())) << o.status();
  EXPECT_EQ(store_->GetRound(kRun, 2)->state, RoundState::kCommitted);
}

TEST_F(StoreRecoveryTest, RewindOnlyToACommittedRound) {
  Build();
  EXPECT_TRUE(absl::IsFailedPrecondition(store_->RewindRun(kRun, 3, "x").status()));
  EXPECT_TRUE(absl::IsNotFound(store_->RewindRun("nope", 0, "x").status()));
}

TEST_F(StoreRecoveryTest, EpsilonNeverGoesDownAfterARewind) {
  Build(/*dp_z=*/1.0);
  v1::RunConfig config = testing::TestRunConfig(5, 2, 1);
  auto* dp = config.mutable_privacy()->mutable_dp();
  dp->set_enabled(true);
  dp->set_mode(v1::DifferentialPrivacyConfig::CENTRAL);
  dp->set_noise_multiplier(1.0);
  dp->set_clip_norm(1.0);
  ApplyRunConfigDefaults(&config);
  auto before = ServerDp::Create(config, *store_->ListRounds(kRun));
  ASSERT_TRUE(before.ok()) << before.status();
  ASSERT_TRUE(before->has_value());
  ASSERT_TRUE(store_->RewindRun(kRun, 1, "test").ok());
  auto after = ServerDp::Create(config, *store_->ListRounds(kRun));
  ASSERT_TRUE(after.ok()) << after.status();
  ASSERT_TRUE(after->has_value());
  // Round 2's noised adapter was released before the rewind: it keeps counting.
  EXPECT_DOUBLE_EQ((*after)->epsilon(), (*before)->epsilon());
  // and it costs more than round 1 alone.
  std::vector<RoundRecord> one = {*store_->GetRound(kRun, 1)};
  auto round1 = ServerDp::Create(config, one);
  ASSERT_TRUE(round1.ok());
  EXPECT_GT((*after)->epsilon(), (*round1)->epsilon());
  // Turning DP off is still refused while a rewound round carried it.
  config.mutable_privacy()->mutable_dp()->set_enabled(false);
  std::vector<RoundRecord> rewound = {*store_->GetRound(kRun, 2)};
  EXPECT_TRUE(absl::IsFailedPrecondition(ServerDp::Create(config, rewound).status()));
}

}  // namespace
}  // namespace fedlora
