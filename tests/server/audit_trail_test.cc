// The audit trail (server.audit_public_key_file, server/audit_trail.h): every update that counted
// is kept sealed to an offline key. A 2-client, 2-round federation with a restart between the rounds
// and retention of one round leaves one audit copy per accepted update of every round; each opens
// with the offline private key to exactly the bytes its client uploaded, for the round, client and
// weight it was sent with, while the sealed uploads themselves are gone; no other key opens one, and
// a tampered or moved copy is refused. The setting is refused with secure aggregation, and a
// missing or malformed key file is refused naming the file. The copies are recorded before the round
// commits (seen from a second connection while the round waits in evaluation).
#include "server/audit_trail.h"

#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include "config/config_io.h"
#include "core/file.h"
#include "crypto/envelope.h"
#include "crypto/sealed_update.h"
#include "crypto/x25519_pem.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/evaluator.h"
#include "server/server.h"
#include "server/store.h"
#include "server/store_check.h"
#include "tests/server/federation_test_util.h"

namespace fedlora {
namespace {

using testing::EncodedDeltaFor;
using testing::GateEvaluator;
using ::testing::HasSubstr;
using testing::InitialAdapter;
using testing::RawClient;
using testing::TempDir;
using testing::WaitFor;

// What one client uploaded: its encoded update and the place it was sent for.
struct Sent {
  std::string plain, client_id, upload_id;
  int64_t round = 0, num_examples = 0;
};

class AuditTrailTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto pair = crypto::GenerateX25519KeyPair();
    ASSERT_TRUE(pair.ok()) << pair.status();
    audit_ = *pair;
    pub_file_ = keys_.path() + "/audit.pub";
    ASSERT_TRUE(
        WriteFileAtomically(pub_file_, *crypto::X25519PublicKeyToPem(audit_.public_key)).ok());
  }

  absl::Status Start(int rounds, int64_t retain, Evaluator* evaluator = nullptr) {
    v1::RunConfig config = testing::TestRunConfig(rounds, 2, 2);
    config.mutable_server()->set_audit_public_key_file(pub_file_);
    ServerOptions o = testing::TestServerOptions(dir_.path());
    o.audit_public_key_file = ServerOptionsFromRunConfig(config).audit_public_key_file;
    o.retain_rounds = retain;
    auto server = Server::Create(o, config, InitialAdapter(), evaluator);
    if (!server.ok()) return server.status();
    server_ = *std::move(server);
    return absl::OkStatus();
  }
  void Stop() {
    server_->Shutdown();
    server_.reset();
  }

  // Both sites join, get the round's task and upload their honest update; returns what they sent.
  std::vector<Sent> PlayRound(int64_t round) {
    std::map<std::string, std::unique_ptr<RawClient>> clients;
    std::map<std::string, v1::TrainTask> tasks;
    const std::vector<std::string> ids = {"site-0", "site-1"};
    for (const std::string& id : ids) {
      clients[id] = std::make_unique<RawClient>(server_->address(), id);
      EXPECT_TRUE(clients[id]->Join().ok()) << id;
    }
    std::vector<std::thread> threads;
    for (const std::string& id : ids) {
      RawClient* c = clients[id].get();
      v1::TrainTask* t = &tasks[id];
      threads.emplace_back([c, t, id] { EXPECT_TRUE(c->GetTask(t)) << id; });
    }
    for (auto& t : threads) t.join();
    std::vector<Sent> sent;
    for (int c = 0; c < 2; ++c) {
      const std::string& id = ids[static_cast<size_t>(c)];
      EXPECT_EQ(tasks[id].round(), static_cast<uint64_t>(round));
      Sent s{EncodedDeltaFor(c, tasks[id], InitialAdapter()), id, absl::StrCat(id, "-r", round),
             round, testing::ExamplesOf(c)};
      const v1::UploadHeader h =
          clients[id]->Header(tasks[id], s.plain, s.upload_id, s.num_examples);
      v1::UploadAck ack;
      const grpc::Status st = clients[id]->UploadAll(h, s.plain, &ack);
      EXPECT_TRUE(st.ok()) << id << ": " << st.error_message();
      EXPECT_EQ(ack.state(), v1::UPLOAD_STATE_ACCEPTED);
      sent.push_back(std::move(s));
    }
    return sent;
  }

  TempDir dir_, keys_;
  crypto::X25519KeyPair audit_;
  std::string pub_file_;
  std::unique_ptr<Server> server_;
};

TEST_F(AuditTrailTest, EveryCountedUpdateOpensOfflineAfterRestartAndRetention) {
  ASSERT_TRUE(Start(/*rounds=*/2, /*retain=*/1).ok());
  std::vector<Sent> sent = PlayRound(1);
  ASSERT_TRUE(WaitFor([&] { return server_->coordinator().rounds_committed() >= 1; }, 20'000));
  Stop();  // a restart mid-run: Restore collects every blob no row names
  ASSERT_TRUE(Start(2, 1).ok());
  for (Sent& s : PlayRound(2)) sent.push_back(std::move(s));
  ASSERT_TRUE(WaitFor([&] { return server_->coordinator().rounds_committed() >= 2; }, 20'000));
  // Retention of one round has pruned round 1's blobs.
  ASSERT_TRUE(WaitFor([&] { return server_->coordinator().retained_from_round() >= 2; }, 20'000));
  Stop();

  auto store = Store::Open(dir_.path() + "/fedlora.db");
  ASSERT_TRUE(store.ok()) << store.status();
  auto blobs = BlobStore::Open(dir_.path());
  ASSERT_TRUE(blobs.ok()) << blobs.status();
  auto copies = (*store)->ListAuditCopies("test-run", 0);
  ASSERT_TRUE(copies.ok()) << copies.status();
  ASSERT_EQ(copies->size(), sent.size());  // one per accepted update of every round
  auto other = crypto::GenerateX25519KeyPair();
  ASSERT_TRUE(other.ok());
  for (const Sent& s : sent) {
    SCOPED_TRACE(s.upload_id);
    auto it = std::find_if(copies->begin(), copies->end(),
                           [&](const AuditCopyRecord& c) { return c.upload_id == s.upload_id; });
    ASSERT_NE(it, copies->end());
    EXPECT_EQ(it->run_id, "test-run");
    EXPECT_EQ(it->round, s.round);
    EXPECT_EQ(it->client_id, s.client_id);
    EXPECT_EQ(it->num_examples, s.num_examples);
    auto opened = OpenAuditCopy(audit_.private_key, *it, **blobs);
    ASSERT_TRUE(opened.ok()) << opened.status();
    EXPECT_TRUE(*opened == s.plain) << "the audit copy is not the bytes the client uploaded";
    // The associated data binds the round and client: the same blob read for another place, or with
    // another key, does not open.
    AuditCopyRecord moved = *it;
    moved.round = s.round == 1 ? 2 : 1;
    EXPECT_TRUE(
        absl::IsPermissionDenied(OpenAuditCopy(audit_.private_key, moved, **blobs).status()));
    moved = *it;
    moved.client_id = s.client_id == "site-0" ? "site-1" : "site-0";
    EXPECT_TRUE(
        absl::IsPermissionDenied(OpenAuditCopy(audit_.private_key, moved, **blobs).status()));
    EXPECT_TRUE(absl::IsPermissionDenied(OpenAuditCopy(other->private_key, *it, **blobs).status()));
    EXPECT_TRUE(absl::IsPermissionDenied(OpenAuditCopy(audit_.public_key, *it, **blobs).status()));
  }
  // The sealed uploads themselves are gone with their rounds; only the audit copies stay.
  for (int64_t round : {1, 2}) {
    auto uploads = (*store)->ListAcceptedUploads("test-run", round);
    ASSERT_TRUE(uploads.ok()) << uploads.status();
    ASSERT_EQ(uploads->size(), 2u);
    for (const UploadRecord& u : *uploads) {
      EXPECT_FALSE(std::filesystem::exists((*blobs)->PathFor(u.blob_hash))) << u.upload_id;
    }
  }
}

TEST_F(AuditTrailTest, TheCopiesAreDurableBeforeTheRoundCommits) {
  GateEvaluator evaluator;
  ASSERT_TRUE(Start(1, 0, &evaluator).ok());
  const std::vector<Sent> sent = PlayRound(1);
  ASSERT_TRUE(evaluator.WaitEntered());  // aggregated, not committed
  {
    auto store =
        Store::Open(dir_.path() + "/fedlora.db");  // a second connection, as another process
    ASSERT_TRUE(store.ok()) << store.status();
    auto round = (*store)->GetRound("test-run", 1);
    ASSERT_TRUE(round.ok()) << round.status();
    EXPECT_EQ(round->state, RoundState::kAggregating);
    auto copies = (*store)->ListAuditCopies("test-run", 1);
    ASSERT_TRUE(copies.ok()) << copies.status();
    EXPECT_EQ(copies->size(), 2u);
  }
  evaluator.Open();
  ASSERT_TRUE(WaitFor([&] { return server_->coordinator().rounds_committed() >= 1; }, 20'000));
  Stop();
  auto store = Store::Open(dir_.path() + "/fedlora.db");
  ASSERT_TRUE(store.ok()) << store.status();
  auto copies = (*store)->ListAuditCopies("test-run", 0);
  ASSERT_TRUE(copies.ok()) << copies.status();
  EXPECT_EQ(copies->size(), sent.size());
}

TEST_F(AuditTrailTest, ATamperedCopyIsRefused) {
  ASSERT_TRUE(Start(1, 0).ok());
  const std::vector<Sent> sent = PlayRound(1);
  ASSERT_TRUE(WaitFor([&] { return server_->coordinator().rounds_committed() >= 1; }, 20'000));
  Stop();
  auto store = Store::Open(dir_.path() + "/fedlora.db");
  ASSERT_TRUE(store.ok()) << store.status();
  auto blobs = BlobStore::Open(dir_.path());
  ASSERT_TRUE(blobs.ok()) << blobs.status();
  auto copies = (*store)->ListAuditCopies("test-run", 1);
  ASSERT_TRUE(copies.ok()) << copies.status();
  ASSERT_EQ(copies->size(), 2u);
  const AuditCopyRecord& c = (*copies)[0];
  auto sealed = (*blobs)->Get(c.blob_hash);
  ASSERT_TRUE(sealed.ok()) << sealed.status();
  const crypto::UpdatePlace place{c.run_id, static_cast<uint64_t>(c.round), c.client_id,
                                  c.upload_id, static_cast<uint64_t>(c.num_examples)};
  ASSERT_TRUE(crypto::OpenUpdateBlob(audit_.private_key, place, *sealed).ok());
  // One flipped ciphertext bit: the seal does not authenticate.
  std::string flipped = *sealed;
  flipped[flipped.size() / 2] ^= 0x01;
  EXPECT_TRUE(absl::IsPermissionDenied(
      crypto::OpenUpdateBlob(audit_.private_key, place, flipped).status()));
  // The same flip in the stored file: the copy is refused, never opened to altered bytes.
  const std::string path = (*blobs)->PathFor(c.blob_hash);
  std::filesystem::permissions(path, std::filesystem::perms::owner_write,
                               std::filesystem::perm_options::add);
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(sealed->size() / 2));
    f.put(static_cast<char>(flipped[flipped.size() / 2]));
  }
  absl::StatusOr<std::string> opened = OpenAuditCopy(audit_.private_key, c, **blobs);
  EXPECT_FALSE(opened.ok());
  EXPECT_TRUE(absl::IsDataLoss(opened.status()) || absl::IsPermissionDenied(opened.status()))
      << opened.status();
  // `fedlora store verify` sees it: the copy is corrupt, the other intact, and the run can still resume.
  auto check = CheckRun(**store, **blobs, "test-run");
  ASSERT_TRUE(check.ok()) << check.status();
  int audit_checked = 0;
  for (const BlobCheck& b : check->blobs) {
    if (b.kind != "audit copy") continue;
    ++audit_checked;
    EXPECT_EQ(b.health, b.upload_id == c.upload_id ? BlobHealth::kCorrupt : BlobHealth::kIntact)
        << b.upload_id;
    if (b.upload_id == c.upload_id) {
      EXPECT_THAT(b.cost, HasSubstr("the run itself is unaffected"));
    }
  }
  EXPECT_EQ(audit_checked, 2);
}

TEST_F(AuditTrailTest, WithSecureAggregationTheSettingIsRefused) {
  v1::RunConfig config = testing::TestRunConfig(1, 3, 3);
  config.mutable_privacy()->set_secure_aggregation(true);
  config.mutable_aggregation()->set_max_update_norm(0.1);
  config.mutable_aggregation()->clear_weight_by_examples();
  ApplyRunConfigDefaults(&config);
  ASSERT_TRUE(ValidatePrivacySettings(config).ok())
      << ValidatePrivacySettings(config);  // valid without the setting
  config.mutable_server()->set_audit_public_key_file(pub_file_);
  absl::Status v = ValidatePrivacySettings(config);
  EXPECT_TRUE(absl::IsInvalidArgument(v)) << v;
  EXPECT_THAT(std::string(v.message()),
              HasSubstr("audit_public_key_file cannot be used with privacy.secure_aggregation"));
  ServerOptions o = testing::TestServerOptions(dir_.path());
  o.audit_public_key_file = pub_file_;
  auto server = Server::Create(o, config, InitialAdapter());
  ASSERT_FALSE(server.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(server.status())) << server.status();
  EXPECT_THAT(std::string(server.status().message()), HasSubstr("never sees an individual update"));
  EXPECT_FALSE(
      std::filesystem::exists(dir_.path() + "/fedlora.db"));  // refused before the store opened
}

TEST_F(AuditTrailTest, AMissingOrMalformedKeyFileIsRefusedNamingTheFile) {
  const std::string garbage = keys_.path() + "/garbage.pub";
  ASSERT_TRUE(WriteFileAtomically(garbage, "not a key\n").ok());
  const std::string priv =
      keys_.path() + "/audit.key";  // a private key where the public one belongs
  ASSERT_TRUE(
      WriteFileAtomically(priv, *crypto::X25519PrivateKeyToPem(audit_.private_key), 0600).ok());
  const std::string missing = keys_.path() + "/missing.pub";
  for (const std::string& file : {garbage, priv, missing}) {
    SCOPED_TRACE(file);
    pub_file_ = file;
    const absl::Status s = Start(1, 0);
    ASSERT_FALSE(s.ok());
    EXPECT_THAT(std::string(s.message()), HasSubstr(file));
    if (file != missing) {
      EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    }
  }
  EXPECT_FALSE(std::filesystem::exists(dir_.path() + "/fedlora.db"));
  auto loaded = LoadAuditPrivateKey(priv);  // the private half loads where it belongs
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(*loaded == audit_.private_key);
}

}  // namespace
}  // namespace fedlora
