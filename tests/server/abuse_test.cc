// A server that is safe to expose: sealed updates that cannot be replayed, moved or tampered with,
// per-client quotas, a free-disk watermark, partial uploads that do not outlive their round, and
// metrics bound to the task a client was given. Clients here are RawClients (hostile on purpose)
// beside honest ones; every test ends with the honest result, bit for bit.
#include <sys/stat.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "server/store.h"
#include "tests/server/federation_test_util.h"

namespace fedlora {
namespace {

using testing::EncodedDeltaFor;
using testing::ExpectedAdapter;
using ::testing::HasSubstr;
using testing::InitialAdapter;
using testing::RawClient;
using testing::SameBits;
using testing::TempDir;

int64_t FilesBytes(const std::string& dir, int64_t* count = nullptr) {
  int64_t total = 0, n = 0;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_regular_file()) {
      total += static_cast<int64_t>(it->file_size());
      ++n;
    }
  }
  if (count != nullptr) *count = n;
  return total;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

class AbuseTest : public ::testing::Test {
 protected:
  void Start(int rounds, int target, double over_selection,
             const std::function<void(ServerOptions&)>& tweak = {}) {
    v1::RunConfig config = testing::TestRunConfig(rounds, target, target);
    config.mutable_selection()->set_over_selection(over_selection);
    *config.mutable_codec() = codec_;
    ServerOptions o = testing::TestServerOptions(dir_.path());
    if (tweak) tweak(o);
    auto server = Server::Create(o, config, InitialAdapter());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  // Joins every id, then waits for the tasks of one round concurrently.
  void JoinAndGetTasks(const std::vector<std::string>& ids) {
    for (const std::string& id : ids) {
      clients_[id] = std::make_unique<RawClient>(server_->address(), id);
      ASSERT_TRUE(clients_[id]->Join().ok()) << id;
    }
    NextTasks(ids);
  }
  void NextTasks(const std::vector<std::string>& ids) {
    std::vector<std::thread> threads;
    for (const std::string& id : ids) {
      // Entries made before the thread: two threads inserting into one std::map is a data race.
      RawClient* client = clients_[id].get();
      v1::TrainTask* task = &tasks_[id];
      threads.emplace_back([client, task, id] { EXPECT_TRUE(client->GetTask(task)) << id; });
    }
    for (auto& t : threads) t.join();
  }

  // The honest update of client `c` (site index), accepted.
  void UploadHonest(const std::string& id, int c, const std::string& upload_id) {
    RawClient& rc = *clients_[id];
    const std::string blob = EncodedDeltaFor(c, tasks_[id], InitialAdapter());
    v1::UploadAck ack;
    grpc::Status s =
        rc.UploadAll(rc.Header(tasks_[id], blob, upload_id, testing::ExamplesOf(c)), blob, &ack);
    ASSERT_TRUE(s.ok()) << id << ": " << s.error_message();
    EXPECT_EQ(ack.state(), v1::UPLOAD_STATE_ACCEPTED);
  }

  bool WaitForCommits(int64_t n) {
    for (int waited = 0; waited < 20'000; waited += 20) {
      if (server_->coordinator().rounds_committed() >= n) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  v1::CodecSpec codec_;  // the run's codec (empty: raw fp32)
  TempDir dir_;
  std::unique_ptr<Server> server_;
  std::map<std::string, std::unique_ptr<RawClient>> clients_;
  std::map<std::string, v1::TrainTask> tasks_;
};

TEST_F(AbuseTest, SealedUpdatesCannotBeReplayedMovedOrTampered) {
  // Two rounds of site-a and site-b; mallory is selected too (over-selection), so that her uploads
  // reach the envelope check rather than stopping at "not selected".
  Start(/*rounds=*/2, /*target=*/2, /*over_selection=*/1.5);
  JoinAndGetTasks({"site-a", "site-b", "mallory"});
  RawClient& a = *clients_["site-a"];
  RawClient& m = *clients_["mallory"];
  EXPECT_EQ(tasks_["site-a"].aggregation_key().public_key().size(), 32u);
  EXPECT_THAT(tasks_["site-a"].aggregation_key().key_id(), HasSubstr("x25519-"));
  EXPECT_EQ(tasks_["site-a"].encryption_scheme(), v1::EncryptionSpec::X25519_HKDF_AES256GCM);
  {
    // The open round's key is the owner's alone, from the moment it was written.
    struct stat st;
    ASSERT_EQ(::stat((dir_.path() + "/keys/test-run.round-1.x25519").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
  }

  const std::string plain_a = EncodedDeltaFor(0, tasks_["site-a"], InitialAdapter());
  const v1::UploadHeader header_a =
      a.Header(tasks_["site-a"], plain_a, "a-r1", testing::ExamplesOf(0));
  const std::string sealed_a = a.Wire("a-r1", plain_a);  // what a proxy on the way would record
  // site-a also seals an update for round 1 under another id, and holds it back for later.
  const v1::UploadHeader header_held =
      a.Header(tasks_["site-a"], plain_a, "a-held", testing::ExamplesOf(0));
  const std::string held_sealed = a.Wire("a-held", plain_a);
  ASSERT_NE(sealed_a, plain_a);

  auto expect_refused = [&](grpc::Status s, grpc::StatusCode code, const std::string& part,
                            const char* what) {
    EXPECT_EQ(s.error_code(), code) << what << ": " << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(part)) << what;
    EXPECT_EQ(server_->coordinator().rounds_committed(), 0) << what;
  };
  v1::UploadAck ack;
  {  // site-a's recorded upload, replayed by mallory as her own (her task, her upload id).
    v1::UploadHeader h = m.Header(tasks_["mallory"], plain_a, "m-replay", testing::ExamplesOf(0));
    *h.mutable_encryption() = header_a.encryption();
    RawClient::Reframe(&h, sealed_a);
    expect_refused(m.Upload(h, sealed_a, 0, h.manifest().num_chunks(), &ack),
                   grpc::StatusCode::PERMISSION_DENIED, "does not authenticate",
                   "replayed by another client");
  }
  {  // site-a's bytes under site-a's own identity but another upload id.
    v1::UploadHeader h = header_a;
    h.set_upload_id("a-other-id");
    expect_refused(a.Upload(h, sealed_a, 0, h.manifest().num_chunks(), &ack),
                   grpc::StatusCode::PERMISSION_DENIED, "does not authenticate", "other upload id");
  }
  {  // One flipped ciphertext byte, every transport hash recomputed to match.
    std::string flipped = sealed_a;
    flipped[flipped.size() / 2] ^= 0x20;
    v1::UploadHeader h = header_a;
    h.set_upload_id("a-flipped");
    RawClient::Reframe(&h, flipped);
    expect_refused(a.Upload(h, flipped, 0, h.manifest().num_chunks(), &ack),
                   grpc::StatusCode::PERMISSION_DENIED, "does not authenticate", "flipped byte");
  }
  {  // A truncated tag.
    const std::string cut = sealed_a.substr(0, sealed_a.size() - 1);
    v1::UploadHeader h = header_a;
    h.set_upload_id("a-cut");
    RawClient::Reframe(&h, cut);
    grpc::Status s = a.Upload(h, cut, 0, h.manifest().num_chunks(), &ack);
    EXPECT_TRUE(s.error_code() == grpc::StatusCode::PERMISSION_DENIED ||
                s.error_code() == grpc::StatusCode::INVALID_ARGUMENT)
        << s.error_message();
    EXPECT_EQ(server_->coordinator().rounds_committed(), 0);
  }
  {  // An unsealed update, and one sealed to another key id.
    v1::UploadHeader h = a.Header(tasks_["site-a"], plain_a, "a-plain", testing::ExamplesOf(0));
    h.mutable_encryption()->set_scheme(v1::EncryptionSpec::NONE);
    RawClient::Reframe(&h, plain_a);
    expect_refused(a.Upload(h, plain_a, 0, h.manifest().num_chunks(), &ack),
                   grpc::StatusCode::INVALID_ARGUMENT, "not sealed", "unsealed");
    h = a.Header(tasks_["site-a"], plain_a, "a-key", testing::ExamplesOf(0));
    h.mutable_encryption()->set_server_key_id("x25519-0000000000000000");
    expect_refused(a.UploadAll(h, plain_a, &ack), grpc::StatusCode::INVALID_ARGUMENT,
                   "aggregation key", "other key id");
  }
  // The refused uploads left nothing behind: no partial files, no blobs beyond the initial adapter.
  int64_t partials = 0;
  FilesBytes(dir_.path() + "/partial", &partials);
  EXPECT_EQ(partials, 0);

  // The honest round: site-a's original upload goes through untouched, then site-b's.
  ASSERT_TRUE(a.Upload(header_a, plain_a, 0, header_a.manifest().num_chunks(), &ack).ok());
  EXPECT_EQ(ack.state(), v1::UPLOAD_STATE_ACCEPTED);
  UploadHonest("site-b", 1, "b-r1");
  ASSERT_TRUE(WaitForCommits(1));

  // Round 2: the round-1 update site-a held back, now sent for round 2 under its original upload
  // id (the header says round 2, and names round 2's key): sealed for round 1, it does not open.
  NextTasks({"site-a", "site-b"});
  {
    v1::UploadHeader h = header_held;
    h.set_round(tasks_["site-a"].round());
    h.set_task_id(tasks_["site-a"].task_id());
    h.set_base_adapter_sha256(tasks_["site-a"].global_adapter().sha256());
    h.mutable_encryption()->set_server_key_id(tasks_["site-a"].aggregation_key().key_id());
    grpc::Status s = a.Upload(h, held_sealed, 0, h.manifest().num_chunks(), &ack);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("does not authenticate"));
  }
  UploadHonest("site-a", 0, "a-r2");
  UploadHonest("site-b", 1, "b-r2");
  ASSERT_TRUE(WaitForCommits(2));
  // Bit-identical to the run without any attack.
  EXPECT_TRUE(SameBits(server_->coordinator().global_adapter(), ExpectedAdapter({0, 1}, 2)));

  // The store holds sealed updates only: no blob file contains the plaintext's tensor bytes.
  const std::string probe = plain_a.substr(plain_a.size() - 256);
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir_.path() + "/blobs")) {
    if (!entry.is_regular_file()) continue;
    EXPECT_EQ(ReadAll(entry.path().string()).find(probe), std::string::npos) << entry.path();
  }
  // Both rounds closed: their keys are destroyed, and the key directory is the owner's alone.
  for (const char* closed : {"/keys/test-run.round-1.x25519", "/keys/test-run.round-2.x25519"}) {
    EXPECT_FALSE(std::filesystem::exists(dir_.path() + closed)) << closed;
  }
  struct stat st;
  ASSERT_EQ(::stat((dir_.path() + "/keys").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
}

TEST_F(AbuseTest, InvalidUpdatesInALoopHitTheByteQuotaAndLeaveTheDiskAsItWas) {
  // Each sealed test update is about 9 KB; mallory may stream 64 KiB in a round.
  Start(1, 2, 1.5, [](ServerOptions& o) {
    o.max_upload_bytes = 32 << 10;
    o.max_client_bytes_per_round = 64 << 10;
    o.max_client_uploads_per_round = 100;  // the byte quota is under test here
  });
  JoinAndGetTasks({"site-a", "site-b", "mallory"});
  RawClient& m = *clients_["mallory"];
  const int64_t before = FilesBytes(dir_.path() + "/blobs") + FilesBytes(dir_.path() + "/partial");
  std::string bad = EncodedDeltaFor(2, tasks_["mallory"], InitialAdapter());
  const uint32_t nan = 0x7fc00000u;
  std::memcpy(bad.data() + bad.size() - 4, &nan, 4);
  int refused_invalid = 0, refused_quota = 0, attempts = 0;
  for (; attempts < 40 && refused_quota == 0; ++attempts) {
    v1::UploadAck ack;
    const std::string id = "garbage-" + std::to_string(attempts);
    grpc::Status s = m.UploadAll(m.Header(tasks_["mallory"], bad, id), bad, &ack);
    if (s.error_code() == grpc::StatusCode::INVALID_ARGUMENT) ++refused_invalid;
    if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      ++refused_quota;
      EXPECT_THAT(s.error_message(), HasSubstr("limit"));
    }
    // Measured after every attempt: nothing of a refused update stays on disk.
    const int64_t now = FilesBytes(dir_.path() + "/blobs") + FilesBytes(dir_.path() + "/partial");
    EXPECT_EQ(now, before) << "after attempt " << attempts;
  }
  EXPECT_GE(refused_invalid, 5);
  EXPECT_EQ(refused_quota, 1);
  EXPECT_LE(attempts, 9);  // 64 KiB / ~9 KB, then the quota
  EXPECT_GE(server_->metrics().quota_refusals.load(), 1);

  UploadHonest("site-a", 0, "a");
  UploadHonest("site-b", 1, "b");
  ASSERT_TRUE(WaitForCommits(1));
  EXPECT_TRUE(SameBits(server_->coordinator().global_adapter(), ExpectedAdapter({0, 1}, 1)));
}

TEST_F(AbuseTest, PartialUploadsAreDeletedWhenTheirRoundCloses) {
  Start(1, 2, 1.5);
  JoinAndGetTasks({"site-a", "site-b", "mallory"});
  RawClient& m = *clients_["mallory"];
  const std::string blob = EncodedDeltaFor(2, tasks_["mallory"], InitialAdapter());
  const v1::UploadHeader h = m.Header(tasks_["mallory"], blob, "half");
  v1::UploadAck ack;
  ASSERT_TRUE(
      m.Upload(h, blob, 0, h.manifest().num_chunks() / 2, &ack).ok());  // then she goes silent
  int64_t partials = 0;
  FilesBytes(dir_.path() + "/partial", &partials);
  ASSERT_EQ(partials, 1);
  UploadHonest("site-a", 0, "a");
  UploadHonest("site-b", 1, "b");
  ASSERT_TRUE(WaitForCommits(1));
  for (int i = 0; i < 200; ++i) {  // the driver sweeps on its next tick
    FilesBytes(dir_.path() + "/partial", &partials);
    if (partials == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(partials, 0);
  EXPECT_GE(server_->metrics().partial_uploads_discarded.load(), 1);
  EXPECT_THAT(server_->metrics().ToPrometheusText(), HasSubstr("fedlora_store_bytes "));
  EXPECT_GT(server_->metrics().store_bytes.load(), 0);
}

TEST_F(AbuseTest, HeaderOnlyStreamsAreChargedAtTheHeader) {
  Start(1, 2, 1.5, [](ServerOptions& o) {
    o.max_client_uploads_per_round = 3;
    // A closed stream may still count as in flight for a moment: only the per-round cap is tested.
    o.max_client_uploads_in_flight = 64;
  });
  JoinAndGetTasks({"site-a", "site-b", "mallory"});
  RawClient& m = *clients_["mallory"];
  const std::string blob = EncodedDeltaFor(2, tasks_["mallory"], InitialAdapter());
  // Three streams that send a header and close: each begins an upload (a resumable row and a
  // partial file), and each counts.
  for (int i = 0; i < 3; ++i) {
    const v1::UploadHeader h =
        m.Header(tasks_["mallory"], blob, "header-only-" + std::to_string(i));
    v1::UploadAck ack;
    const grpc::Status s = m.Upload(h, blob, 0, 0, &ack);
    EXPECT_NE(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
        << i << ": " << s.error_message();
  }
  int64_t partials = 0;
  FilesBytes(dir_.path() + "/partial", &partials);
  const int64_t quota_before = server_->metrics().quota_refusals.load();
  // The fourth, and a flood after it, are refused at the header: no row, no file.
  for (int i = 3; i < 50; ++i) {
    const std::string id = "header-only-" + std::to_string(i);
    v1::UploadAck ack;
    const grpc::Status s = m.Upload(m.Header(tasks_["mallory"], blob, id), blob, 0, 0, &ack);
    ASSERT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
        << i << ": " << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("began 3 uploads in round 1; the limit is 3"));
  }
  {
    auto store = Store::Open(dir_.path() + "/fedlora.db");  // a second reader of the server's store
    ASSERT_TRUE(store.ok()) << store.status();
    EXPECT_TRUE((*store)->GetUpload("header-only-2").ok());
    for (int i = 3; i < 50; ++i) {
      const std::string id = "header-only-" + std::to_string(i);
      EXPECT_TRUE(absl::IsNotFound((*store)->GetUpload(id).status())) << id;
    }
  }
  int64_t partials_after = 0;
  FilesBytes(dir_.path() + "/partial", &partials_after);
  EXPECT_EQ(partials_after, partials);
  EXPECT_EQ(server_->metrics().quota_refusals.load(), quota_before + 47);
  // A resume of an upload already begun is not a new one.
  {
    const v1::UploadHeader h = m.Header(tasks_["mallory"], blob, "header-only-0");
    v1::UploadAck ack;
    const grpc::Status s = m.Upload(h, blob, 0, 0, &ack);
    EXPECT_NE(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  }
  UploadHonest("site-a", 0, "a");
  UploadHonest("site-b", 1, "b");
  ASSERT_TRUE(WaitForCommits(1));
  EXPECT_TRUE(SameBits(server_->coordinator().global_adapter(), ExpectedAdapter({0, 1}, 1)));
}

TEST_F(AbuseTest, HeldPollsPerClientAreCapped) {
  // Target 3: two waiting clients never complete the selection, so every poll would be held.
  Start(1, 3, 1.0, [](ServerOptions& o) { o.max_client_held_polls = 2; });
  clients_["mallory"] = std::make_unique<RawClient>(server_->address(), "mallory");
  ASSERT_TRUE(clients_["mallory"]->Join().ok());
  RawClient& m = *clients_["mallory"];
  constexpr int kPolls = 40;
  std::atomic<int> quick{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kPolls; ++i) {
    threads.emplace_back([&] {
      const auto t0 = std::chrono::steady_clock::now();
      v1::WaitForTaskResponse resp;
      const grpc::Status s = m.WaitForTask(&resp, /*max_wait_s=*/6);
      EXPECT_TRUE(s.ok()) << s.error_message();
      if (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(3)) {
        EXPECT_TRUE(resp.has_retry_later());
        ++quick;
      }
    });
  }
  for (auto& t : threads) t.join();
  // Two were held for their whole wait; the rest were answered at once.
  EXPECT_EQ(quick.load(), kPolls - 2);
}

grpc::Status SetBlocked(RawClient& operator_client, const std::string& id, bool blocked,
                        v1::BlockClientResponse* response) {
  v1::BlockClientRequest req;
  req.set_client_id(id);
  req.set_blocked(blocked);
  req.set_reason("sent a poisoned update");
  grpc::ClientContext ctx;
  return operator_client.admin()->BlockClient(&ctx, req, response);
}

TEST_F(AbuseTest, AnOperatorBlocksASiteEverywhereAndTheBlockSurvivesARestart) {
  Start(2, 2, 1.0);
  JoinAndGetTasks({"alice", "mallory"});
  v1::BlockClientResponse blocked;
  // (Plaintext: loopback callers are operators; under TLS only server.tls.operator_ids, mtls_test.)
  ASSERT_TRUE(SetBlocked(*clients_["alice"], "mallory", true, &blocked).ok());
  EXPECT_EQ(blocked.client().client_id(), "mallory");
  EXPECT_TRUE(blocked.client().blocked());

  // Refused everywhere, with the reason.
  RawClient& m = *clients_["mallory"];
  v1::WaitForTaskResponse poll;
  grpc::Status s = m.WaitForTask(&poll, 1);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("blocked by the operator"));
  const std::string blob = EncodedDeltaFor(1, tasks_["mallory"], InitialAdapter());
  v1::UploadAck ack;
  s = m.UploadAll(m.Header(tasks_["mallory"], blob, "u-mallory", testing::ExamplesOf(1)), blob,
                  &ack);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  s = m.Join();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();

  // Its task goes to a live site, and the round commits without it.
  clients_["carol"] = std::make_unique<RawClient>(server_->address(), "carol");
  ASSERT_TRUE(clients_["carol"]->Join().ok());
  NextTasks({"carol"});
  EXPECT_EQ(tasks_["carol"].round(), 1u);
  UploadHonest("alice", 0, "u-alice");
  UploadHonest("carol", 2, "u-carol");
  ASSERT_TRUE(WaitForCommits(1));

  v1::ListClientsRequest list_req;
  list_req.set_include_inactive(true);
  v1::ListClientsResponse list;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(clients_["alice"]->admin()->ListClients(&ctx, list_req, &list).ok());
  }
  std::map<std::string, bool> shown;
  for (const v1::ClientInfo& c : list.clients()) shown[c.client_id()] = c.blocked();
  EXPECT_EQ(shown,
            (std::map<std::string, bool>{{"alice", false}, {"carol", false}, {"mallory", true}}));

  // Durable: a restarted server refuses it too, until the block is lifted.
  server_.reset();
  clients_.clear();
  Start(2, 2, 1.0);
  clients_["mallory"] = std::make_unique<RawClient>(server_->address(), "mallory");
  s = clients_["mallory"]->Join();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  clients_["ops"] = std::make_unique<RawClient>(server_->address(), "ops");
  v1::BlockClientResponse lifted;
  ASSERT_TRUE(SetBlocked(*clients_["ops"], "mallory", false, &lifted).ok());
  EXPECT_FALSE(lifted.client().blocked());
  EXPECT_TRUE(clients_["mallory"]->Join().ok());
}

TEST_F(AbuseTest, BlockClientRefusesAMalformedId) {
  Start(1, 2, 1.0);
  clients_["ops"] = std::make_unique<RawClient>(server_->address(), "ops");
  v1::BlockClientResponse r;
  const grpc::Status s = SetBlocked(*clients_["ops"], "bad id/../x", true, &r);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
}

TEST_F(AbuseTest, UploadsInFlightPerClientAreCapped) {
  Start(1, 1, 1.0, [](ServerOptions& o) { o.max_client_uploads_in_flight = 2; });
  JoinAndGetTasks({"mallory"});
  RawClient& m = *clients_["mallory"];
  const std::string blob = EncodedDeltaFor(0, tasks_["mallory"], InitialAdapter());
  // Two streams that send their header and then hold the call open; each is admitted (the server
  // counts it as streaming) before the next is opened, so the two held are the two in flight.
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientWriter<v1::UploadChunk>>> writers;
  v1::UploadAck acks[2];
  for (int i = 0; i < 2; ++i) {
    contexts.push_back(m.Context(30'000));
    writers.push_back(m.stub()->UploadUpdate(contexts.back().get(), &acks[i]));
    v1::UploadChunk msg;
    *msg.mutable_header() = m.Header(tasks_["mallory"], blob, "held-" + std::to_string(i));
    ASSERT_TRUE(writers.back()->Write(msg));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (server_->metrics().uploads_streaming.load() < i + 1 &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ASSERT_EQ(server_->metrics().uploads_streaming.load(), i + 1)
        << "held-" << i << " was not admitted";
  }
  // A third stream, while the two are held, is refused before its content is looked at.
  v1::UploadAck ack;
  const grpc::Status third = m.UploadAll(m.Header(tasks_["mallory"], blob, "third"), blob, &ack);
  EXPECT_EQ(third.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << third.error_message();
  EXPECT_THAT(third.error_message(), HasSubstr("already streams 2 uploads"));
  EXPECT_EQ(server_->metrics().uploads_streaming.load(), 2);
  for (auto& c : contexts) c->TryCancel();
  for (auto& w : writers) (void)w->Finish();
}

TEST_F(AbuseTest, NewUploadsAreRefusedBelowTheFreeDiskWatermark) {
  Start(1, 1, 1.0,
        [](ServerOptions& o) { o.min_free_disk_bytes = int64_t{1} << 60; });  // more than any disk
  JoinAndGetTasks({"site-a"});
  RawClient& a = *clients_["site-a"];
  const std::string blob = EncodedDeltaFor(0, tasks_["site-a"], InitialAdapter());
  v1::UploadAck ack;
  grpc::Status s = a.UploadAll(a.Header(tasks_["site-a"], blob, "a"), blob, &ack);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("watermark"));
  int64_t partials = 0;
  FilesBytes(dir_.path() + "/partial", &partials);
  EXPECT_EQ(partials, 0);
  EXPECT_EQ(server_->coordinator().rounds_committed(), 0);
}

TEST_F(AbuseTest, ConcurrentUploadsCannotTogetherPassTheFreeDiskWatermark) {
  // The disk (as the server sees it) has room above the watermark for one update and a half. Two
  // streams are admitted one after the other, each before any byte is written: the second must
  // count the first's reservation, or together they would write past the watermark.
  const std::string blob_probe = EncodedDeltaFor(0, v1::TrainTask(), InitialAdapter());
  const int64_t sealed =
      static_cast<int64_t>(blob_probe.size() + crypto::SealedBlobOverheadBytes());
  Start(1, 2, 1.0, [sealed](ServerOptions& o) {
    o.min_free_disk_bytes = int64_t{1} << 30;
    o.free_disk_bytes_for_test = [sealed] { return (int64_t{1} << 30) + sealed * 3 / 2; };
  });
  JoinAndGetTasks({"site-a", "site-b"});
  RawClient& a = *clients_["site-a"];
  const std::string blob = EncodedDeltaFor(0, tasks_["site-a"], InitialAdapter());
  auto ctx = a.Context(30'000);
  v1::UploadAck held_ack;
  auto writer = a.stub()->UploadUpdate(ctx.get(), &held_ack);
  v1::UploadChunk msg;
  *msg.mutable_header() = a.Header(tasks_["site-a"], blob, "a-held");
  ASSERT_TRUE(writer->Write(msg));
  ASSERT_TRUE(
      testing::WaitFor([&] { return server_->metrics().uploads_streaming.load() == 1; }, 10'000));

  RawClient& b = *clients_["site-b"];
  const std::string blob_b = EncodedDeltaFor(1, tasks_["site-b"], InitialAdapter());
  v1::UploadAck ack;
  const grpc::Status s = b.UploadAll(b.Header(tasks_["site-b"], blob_b, "b"), blob_b, &ack);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("reserved for uploads streaming"));
  ctx->TryCancel();
  (void)writer->Finish();
  // Once the first stream ends its reservation is released, and b's upload fits.
  ASSERT_TRUE(
      testing::WaitFor([&] { return server_->metrics().uploads_streaming.load() == 0; }, 10'000));
  const grpc::Status again = b.UploadAll(b.Header(tasks_["site-b"], blob_b, "b2"), blob_b, &ack);
  EXPECT_TRUE(again.ok()) << again.error_message();
}

TEST_F(AbuseTest, MetricsAreBoundToTheClientsOwnTaskAndBounded) {
  Start(1, 2, 1.0, [](ServerOptions& o) {
    o.max_metrics_per_report = 4;
    o.max_client_reports_per_round = 3;
  });
  JoinAndGetTasks({"site-a", "site-b"});
  RawClient& a = *clients_["site-a"];
  v1::MetricsReport report;
  report.set_round(tasks_["site-a"].round());
  report.set_task_id(tasks_["site-a"].task_id());
  report.set_train_loss_first(1.0);
  (*report.mutable_extra())["peak_memory_bytes"] = 1e6;

  // site-b's task named by site-a: refused. So is a round site-a was never given a task in.
  v1::MetricsReport foreign = report;
  foreign.set_task_id(tasks_["site-b"].task_id());
  EXPECT_EQ(a.ReportMetrics(foreign).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  v1::MetricsReport future = report;
  future.set_round(5);
  EXPECT_EQ(a.ReportMetrics(future).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  // Too many entries in one report.
  v1::MetricsReport flood = report;
  for (int i = 0; i < 5; ++i) (*flood.mutable_extra())["k" + std::to_string(i)] = i;
  grpc::Status s = a.ReportMetrics(flood);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("the limit is 4"));
  // Reports per round: the two refused for their task count too (a flood of foreign reports is
  // bounded as well), so one more is accepted and the next refused.
  EXPECT_TRUE(a.ReportMetrics(report).ok());
  s = a.ReportMetrics(report);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("metrics reports this round"));

  // What reached the store: the one accepted report's rows (eight standard ones and its extra).
  server_->Shutdown();
  server_.reset();
  auto store = Store::Open(dir_.path() + "/fedlora.db");
  ASSERT_TRUE(store.ok()) << store.status();
  auto rows = (*store)->ListMetrics("test-run", static_cast<int64_t>(tasks_["site-a"].round()));
  ASSERT_TRUE(rows.ok());
  EXPECT_EQ(rows->size(), 9u);
  for (const MetricRecord& r : *rows) EXPECT_EQ(r.client_id, "site-a");
}

TEST_F(AbuseTest, UploadStatusAndIdsOfOtherClientsRevealNothing) {
  Start(1, 2, 1.5);
  JoinAndGetTasks({"site-a", "site-b", "mallory"});
  RawClient& m = *clients_["mallory"];
  RawClient& a = *clients_["site-a"];
  std::string bad = EncodedDeltaFor(2, tasks_["mallory"], InitialAdapter());
  const uint32_t nan = 0x7fc00000u;
  std::memcpy(bad.data() + bad.size() - 4, &nan, 4);
  v1::UploadAck ack;
  ASSERT_EQ(m.UploadAll(m.Header(tasks_["mallory"], bad, "m-1"), bad, &ack).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  v1::UploadStatusResponse own, other;
  ASSERT_TRUE(m.Status("m-1", &own).ok());
  EXPECT_EQ(own.state(), v1::UPLOAD_STATE_REJECTED);
  EXPECT_FALSE(own.reason().empty());
  ASSERT_TRUE(a.Status("m-1", &other).ok());
  EXPECT_EQ(other.state(), v1::UPLOAD_STATE_UNKNOWN);
  EXPECT_EQ(other.reason(), "");
  // site-a cannot take over mallory's upload id either.
  const std::string blob = EncodedDeltaFor(0, tasks_["site-a"], InitialAdapter());
  grpc::Status s = a.UploadAll(a.Header(tasks_["site-a"], blob, "m-1"), blob, &ack);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
}

TEST_F(AbuseTest, MessagesOverTheMessageLimitAreRefusedByTheTransport) {
  Start(1, 1, 1.0, [](ServerOptions& o) { o.max_message_bytes = (1 << 10) + (64 << 10); });
  JoinAndGetTasks({"mallory"});
  RawClient& m = *clients_["mallory"];
  const std::string blob = EncodedDeltaFor(0, tasks_["mallory"], InitialAdapter());
  auto huge = [](v1::UploadData* d) { d->mutable_data()->append(128 << 10, 'x'); };
  v1::UploadAck ack;
  grpc::Status s = m.Upload(m.Header(tasks_["mallory"], blob, "huge"), blob, 0, 1, &ack, huge);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  // The stream broke before any chunk arrived: nothing of it was written (the empty partial stays
  // resumable until its round closes).
  EXPECT_EQ(FilesBytes(dir_.path() + "/partial"), 0);
  v1::UploadStatusResponse st;
  ASSERT_TRUE(m.Status("huge", &st).ok());
  EXPECT_EQ(st.chunks_acknowledged(), 0u);
}

TEST_F(AbuseTest, UpdatesInAnotherCodecThanTheRunsAreRefused) {
  Start(1, 1, 1.0);  // the run's codec: none (raw fp32)
  JoinAndGetTasks({"site-a"});
  RawClient& a = *clients_["site-a"];
  std::vector<UpdateTensor> u = InitialAdapter();
  CodecOptions fp16;
  fp16.codec = CodecId::kF16;
  auto blob = EncodeUpdate(u, fp16);
  ASSERT_TRUE(blob.ok()) << blob.status();
  v1::UploadHeader h = a.Header(tasks_["site-a"], *blob, "fp16");
  h.mutable_codec()->add_stages()->set_id(v1::CodecStage::FP16);  // the header tells the truth
  v1::UploadAck ack;
  grpc::Status s = a.UploadAll(h, *blob, &ack);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("the run's codec"));
  UploadHonest("site-a", 0, "a");
  ASSERT_TRUE(WaitForCommits(1));
  EXPECT_TRUE(SameBits(server_->coordinator().global_adapter(), ExpectedAdapter({0}, 1)));
}

TEST_F(AbuseTest, SparseUpdatesMustKeepTheRunsFraction) {
  v1::CodecStage* topk = codec_.add_stages();
  topk->set_id(v1::CodecStage::TOPK);
  topk->set_version(1);
  topk->mutable_top_k()->set_fraction(0.25);
  topk->mutable_top_k()->set_error_feedback(true);
  Start(1, 1, 1.0);
  JoinAndGetTasks({"site-a"});
  RawClient& a = *clients_["site-a"];
  const auto delta =
      DecodeUpdate(EncodedDeltaFor(0, tasks_["site-a"], InitialAdapter()), DecodeLimits{});
  ASSERT_TRUE(delta.ok()) << delta.status();
  CodecOptions o{.sparsifier = Sparsifier::kTopK, .fraction = 0.5};
  // Half of every tensor under a header that declares the run's 25%: the kept counts give it away.
  auto more = EncodeUpdate(*delta, o);
  ASSERT_TRUE(more.ok()) << more.status();
  v1::UploadHeader h = a.Header(tasks_["site-a"], *more, "half");
  *h.mutable_codec() = codec_;
  v1::UploadAck ack;
  grpc::Status s = a.UploadAll(h, *more, &ack);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("entries; the run's top-k 25% + fp32 keeps"));
  // Dense fp32 under the same header: another format than it declares.
  const std::string dense = EncodedDeltaFor(0, tasks_["site-a"], InitialAdapter());
  h = a.Header(tasks_["site-a"], dense, "dense");
  *h.mutable_codec() = codec_;
  s = a.UploadAll(h, dense, &ack);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(),
              HasSubstr("update is encoded as fp32 but the header declares top-k 25% + fp32"));
  // The run's own format is accepted and aggregated.
  o.fraction = 0.25;
  auto quarter = EncodeUpdate(*delta, o);
  ASSERT_TRUE(quarter.ok());
  h = a.Header(tasks_["site-a"], *quarter, "quarter");
  *h.mutable_codec() = codec_;
  s = a.UploadAll(h, *quarter, &ack);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(ack.state(), v1::UPLOAD_STATE_ACCEPTED);
  EXPECT_TRUE(WaitForCommits(1));
}

}  // namespace
}  // namespace fedlora
