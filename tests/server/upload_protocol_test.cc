// The upload protocol at the wire level: idempotent replays, resumed uploads, hostile input,
// deadlines and abandoned rounds. Clients here are RawClients that speak the protocol directly, so
// that they can misbehave on purpose.
#include <zstd.h>

#include <cstring>
#include <map>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/server.h"
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

struct Participant {
  std::unique_ptr<RawClient> client;
  v1::TrainTask task;
};

class UploadProtocolTest : public ::testing::Test {
 protected:
  void StartServer(int rounds, int target, int min_clients, double over_selection,
                   int64_t deadline_ms, int64_t heartbeat_timeout_ms = 30'000) {
    v1::RunConfig config = testing::TestRunConfig(rounds, target, min_clients);
    config.mutable_selection()->set_over_selection(over_selection);
    ServerOptions options = testing::TestServerOptions(dir_.path());
    options.upload_sync_bytes = upload_sync_bytes_;
    // Back-to-back downloads here can start before the server has seen the previous stream end;
    // the per-client cap is floods_test's subject, not this file's.
    options.max_client_downloads_in_flight = 8;
    options.round_deadline_ms = deadline_ms;
    options.heartbeat_timeout_ms = heartbeat_timeout_ms;
    // The hostile test begins dozens of uploads to reach each validation; the quota on new uploads
    // per round is abuse_test's.
    options.max_client_uploads_per_round = 1000;
    auto server = Server::Create(options, config, InitialAdapter());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  // Joins every id first (so that all count as live), then asks for tasks concurrently: the
  // selection closes once all of them wait.
  std::map<std::string, Participant> JoinAndGetTasks(const std::vector<std::string>& ids) {
    std::map<std::string, Participant> out;
    for (const std::string& id : ids) {
      out[id].client = std::make_unique<RawClient>(server_->address(), id);
      EXPECT_TRUE(out[id].client->Join().ok());
    }
    std::vector<std::thread> threads;
    for (const std::string& id : ids) {
      threads.emplace_back(
          [&out, id] { EXPECT_TRUE(out[id].client->GetTask(&out[id].task)) << id; });
    }
    for (auto& t : threads) t.join();
    return out;
  }

  bool WaitForCommits(int64_t n, int64_t timeout_ms = 20'000) {
    for (int64_t waited = 0; waited < timeout_ms; waited += 20) {
      if (server_->coordinator().rounds_committed() >= n) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  uint32_t AcceptedThisRound() {
    RawClient admin(server_->address(), "operator");
    v1::GetStatusRequest req;
    v1::GetStatusResponse resp;
    auto ctx = admin.Context();
    EXPECT_TRUE(admin.admin()->GetStatus(ctx.get(), req, &resp).ok());
    return resp.updates_accepted_this_round();
  }

  TempDir dir_;
  std::unique_ptr<Server> server_;
  int64_t upload_sync_bytes_ = 1024;  // every (1 KiB) chunk a checkpoint, as TestServerOptions
};

TEST_F(UploadProtocolTest, ReplayedUploadIsAcknowledgedAgainAndCountedOnce) {
  StartServer(/*rounds=*/1, /*target=*/2, /*min_clients=*/2, /*over_selection=*/1.0,
              /*deadline_ms=*/30'000);
  auto p = JoinAndGetTasks({"site-a", "site-b"});
  RawClient& a = *p["site-a"].client;
  const std::string blob = EncodedDeltaFor(0, p["site-a"].task, InitialAdapter());
  const v1::UploadHeader header =
      a.Header(p["site-a"].task, blob, "upload-a-1", testing::ExamplesOf(0));

  v1::UploadAck first;
  ASSERT_TRUE(a.UploadAll(header, blob, &first).ok());
  EXPECT_EQ(first.state(), v1::UPLOAD_STATE_ACCEPTED);
  EXPECT_FALSE(first.duplicate());
  EXPECT_EQ(first.chunks_acknowledged(), header.manifest().num_chunks());
  EXPECT_GT(header.manifest().num_chunks(), 4u);  // the test update really spans several chunks

  v1::UploadAck replay;  // e.g. the first ack was lost and the client sends everything again
  ASSERT_TRUE(a.UploadAll(header, blob, &replay).ok());
  EXPECT_EQ(replay.state(), v1::UPLOAD_STATE_ACCEPTED);
  EXPECT_TRUE(replay.duplicate());
  EXPECT_EQ(AcceptedThisRound(), 1u);

  v1::UploadStatusResponse status;
  ASSERT_TRUE(a.Status("upload-a-1", &status).ok());
  EXPECT_EQ(status.state(), v1::UPLOAD_STATE_ACCEPTED);

  // The same update under a new upload_id is a second update from the same task: refused.
  v1::UploadAck again;
  grpc::Status s = a.UploadAll(a.Header(p["site-a"].task, blob, "upload-a-2", 10), blob, &again);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ALREADY_EXISTS) << s.error_message();
  // The same upload_id for different bytes: refused.
  std::string other = EncodedDeltaFor(1, p["site-a"].task, InitialAdapter());
  s = a.UploadAll(a.Header(p["site-a"].task, other, "upload-a-1", 10), other, &again);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ALREADY_EXISTS) << s.error_message();
  EXPECT_EQ(AcceptedThisRound(), 1u);

  RawClient& b = *p["site-b"].client;
  const std::string blob_b = EncodedDeltaFor(1, p["site-b"].task, InitialAdapter());
  v1::UploadAck ack_b;
  ASSERT_TRUE(b.UploadAll(b.Header(p["site-b"].task, blob_b, "upload-b-1", testing::ExamplesOf(1)),
                          blob_b, &ack_b)
                  .ok());
  ASSERT_TRUE(WaitForCommits(1));
  EXPECT_TRUE(SameBits(server_->coordinator().global_adapter(), ExpectedAdapter({0, 1}, 1)));
  EXPECT_EQ(server_->metrics().updates_accepted.load(), 2);

  // A replay after the round closed still gets its original ack (not a "stale" error).
  v1::UploadAck late_replay;
  ASSERT_TRUE(a.UploadAll(header, blob, &late_replay).ok());
  EXPECT_TRUE(late_replay.duplicate());
  EXPECT_TRUE(SameBits(server_->coordinator().global_adapter(), ExpectedAdapter({0, 1}, 1)));
}

TEST_F(UploadProtocolTest, UploadCutOffHalfwayResumesFromTheLastDurableChunk) {
  StartServer(1, 1, 1, 1.0, 30'000);
  auto p = JoinAndGetTasks({"site-a"});
  RawClient& a = *p["site-a"].client;
  const std::string blob = EncodedDeltaFor(0, p["site-a"].task, InitialAdapter());
  const v1::UploadHeader header =
      a.Header(p["site-a"].task, blob, "upload-cut", testing::ExamplesOf(0));
  const uint32_t n = header.manifest().num_chunks();
  const uint32_t half = n / 2;

  v1::UploadAck partial;
  ASSERT_TRUE(a.Upload(header, blob, 0, half, &partial).ok());
  EXPECT_EQ(partial.state(), v1::UPLOAD_STATE_IN_PROGRESS);
  EXPECT_EQ(partial.chunks_acknowledged(), half);

  v1::UploadStatusResponse status;
  ASSERT_TRUE(a.Status("upload-cut", &status).ok());
  EXPECT_EQ(status.state(), v1::UPLOAD_STATE_IN_PROGRESS);
  EXPECT_EQ(status.chunks_acknowledged(), half);
  EXPECT_EQ(status.bytes_acknowledged(), uint64_t{half} * header.manifest().chunk_size_bytes());
  EXPECT_EQ(server_->coordinator().rounds_committed(), 0);

  // Resuming past what the server holds is refused; resuming at it completes the upload.
  v1::UploadAck ack;
  grpc::Status s = a.Upload(header, blob, half + 1, n, &ack);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  ASSERT_TRUE(a.Upload(header, blob, half, n, &ack).ok());
  EXPECT_EQ(ack.state(), v1::UPLOAD_STATE_ACCEPTED);
  ASSERT_TRUE(WaitForCommits(1));
  EXPECT_TRUE(SameBits(server_->coordinator().global_adapter(), ExpectedAdapter({0}, 1)));
}

TEST_F(UploadProtocolTest, CheckpointsBesideTheStreamAreWaitedForAtEveryEnd) {
  // A checkpoint every 3 chunks, run beside the stream: when the stream ends (cut off by the
  // client, or refused at a corrupt chunk while the next ones are already on their way), the server
  // waits for the checkpoint in flight and makes every verified chunk durable before it answers.
  upload_sync_bytes_ = 3 * 1024;
  StartServer(1, 1, 1, 1.0, 30'000);
  auto p = JoinAndGetTasks({"site-a"});
  RawClient& a = *p["site-a"].client;
  const std::string blob = EncodedDeltaFor(0, p["site-a"].task, InitialAdapter());
  const v1::UploadHeader header =
      a.Header(p["site-a"].task, blob, "upload-beside", testing::ExamplesOf(0));
  const uint32_t n = header.manifest().num_chunks();
  ASSERT_GE(n, 8u);

  v1::UploadAck partial;  // cut after 4 chunks: one checkpoint (3 chunks) started, 1 chunk after it
  ASSERT_TRUE(a.Upload(header, blob, 0, 4, &partial).ok());
  EXPECT_EQ(partial.state(), v1::UPLOAD_STATE_IN_PROGRESS);
  EXPECT_EQ(partial.chunks_acknowledged(), 4u);
  v1::UploadStatusResponse status;
  ASSERT_TRUE(a.Status("upload-beside", &status).ok());
  EXPECT_EQ(status.chunks_acknowledged(), 4u);

  // Resume, and corrupt chunk 7: chunks 4..6 (one more checkpoint) are verified and stay durable.
  auto corrupt = [](v1::UploadData* d) {
    if (d->chunk_index() == 7) d->set_sha256(Sha256Hex("not the data"));
  };
  v1::UploadAck refused;
  grpc::Status s = a.Upload(header, blob, 4, n, &refused, corrupt);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DATA_LOSS) << s.error_message();
  ASSERT_TRUE(a.Status("upload-beside", &status).ok());
  EXPECT_EQ(status.state(), v1::UPLOAD_STATE_IN_PROGRESS);
  EXPECT_EQ(status.chunks_acknowledged(), 7u);

  v1::UploadAck ack;
  ASSERT_TRUE(a.Upload(header, blob, 7, n, &ack).ok());
  EXPECT_EQ(ack.state(), v1::UPLOAD_STATE_ACCEPTED);
  ASSERT_TRUE(WaitForCommits(1));
  EXPECT_TRUE(SameBits(server_->coordinator().global_adapter(), ExpectedAdapter({0}, 1)));
}

TEST_F(UploadProtocolTest, DownloadResumesFromAChunkAndEveryChunkCarriesItsHash) {
  StartServer(1, 1, 1, 1.0, 30'000);
  auto p = JoinAndGetTasks({"site-a"});
  RawClient& a = *p["site-a"].client;
  const v1::AdapterManifest& m = p["site-a"].task.global_adapter();
  ASSERT_GT(m.num_chunks(), 3u);
  std::vector<v1::DownloadChunk> all;
  ASSERT_TRUE(a.Download(m.sha256(), 0, &all).ok());
  ASSERT_EQ(all.size(), m.num_chunks());
  std::string joined;
  for (const auto& c : all) {
    EXPECT_EQ(Sha256Hex(c.data()), c.sha256());
    joined += c.data();
  }
  EXPECT_EQ(Sha256Hex(joined), m.sha256());
  std::vector<v1::DownloadChunk> tail;
  ASSERT_TRUE(a.Download(m.sha256(), 2, &tail).ok());
  ASSERT_EQ(tail.size(), m.num_chunks() - 2);
  EXPECT_EQ(tail[0].chunk_index(), 2u);
  EXPECT_EQ(tail[0].data(), all[2].data());
  // Only global adapters are downloadable: an unknown hash (or another client's update) is not.
  std::vector<v1::DownloadChunk> none;
  grpc::Status s = a.Download(std::string(64, 'a'), 0, &none);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  s = a.Download(m.sha256(), m.num_chunks() + 1, &none);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::OUT_OF_RANGE);
}

// Builds a codec blob by hand: a raw-fp32 update whose zstd payload claims `raw_bytes` of body.
std::string BombBlob(int64_t elements, size_t raw_bytes) {
  std::string zeros(raw_bytes, '\0');
  std::string frame(ZSTD_compressBound(zeros.size()), '\0');
  frame.resize(ZSTD_compress(frame.data(), frame.size(), zeros.data(), zeros.size(), 19));
  std::string out(kUpdateHeaderSize, '\0');
  std::memcpy(out.data(), kUpdateMagic, 4);
  const uint16_t version = kUpdateFormatVersion;
  std::memcpy(out.data() + 4, &version, 2);
  out[6] = static_cast<char>(CodecId::kRawF32);
  out[7] = static_cast<char>(kCodecVersion);
  const uint32_t flags = kUpdateFlagZstd;
  std::memcpy(out.data() + 8, &flags, 4);
  const uint64_t count = static_cast<uint64_t>(elements), raw = raw_bytes, payload = frame.size();
  std::memcpy(out.data() + 16, &count, 8);
  std::memcpy(out.data() + 24, &raw, 8);
  std::memcpy(out.data() + 32, &payload, 8);
  return out + frame;
}

TEST_F(UploadProtocolTest, HostileUploadsAreRefusedAndHonestClientsStillFinish) {
  // Target 2 with 1.5x over-selection: the honest pair and the hostile client are all selected, so
  // the hostile one's updates reach validation instead of stopping at "not selected".
  StartServer(1, 2, 2, 1.5, 30'000);
  auto p = JoinAndGetTasks({"site-a", "site-b", "mallory"});
  RawClient& h = *p["mallory"].client;
  const v1::TrainTask& task = p["mallory"].task;
  const std::vector<UpdateTensor> global = InitialAdapter();
  const std::string initial_hash = server_->coordinator().global_adapter_sha256();
  const std::string good = EncodedDeltaFor(2, task, global);
  int next_id = 0;
  auto id = [&] { return "hostile-" + std::to_string(next_id++); };

  struct Case {
    std::string name;
    grpc::StatusCode code;
    std::string message_part;
  };
  auto expect = [&](const grpc::Status& s, const Case& c) {
    EXPECT_EQ(s.error_code(), c.code) << c.name << ": " << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(c.message_part)) << c.name;
    EXPECT_EQ(server_->coordinator().global_adapter_sha256(), initial_hash) << c.name;
    EXPECT_EQ(server_->coordinator().rounds_committed(), 0) << c.name;
  };
  v1::UploadAck ack;

  {  // NaN and Inf values inside an otherwise well-formed blob (the last value of the body).
    for (uint32_t bits : {0x7fc00000u, 0x7f800000u}) {
      std::string blob = good;
      std::memcpy(blob.data() + blob.size() - 4, &bits, 4);
      const std::string upload = id();
      expect(h.UploadAll(h.Header(task, blob, upload), blob, &ack),
             {"non-finite", grpc::StatusCode::INVALID_ARGUMENT, "finite"});
      v1::UploadStatusResponse st;
      ASSERT_TRUE(h.Status(upload, &st).ok());
      EXPECT_EQ(st.state(), v1::UPLOAD_STATE_REJECTED);
    }
  }
  {  // Manifest with a wrong shape, and with a wrong dtype.
    v1::UploadHeader hd = h.Header(task, good, id());
    hd.mutable_manifest()->mutable_tensors(0)->set_shape(0, 5);
    expect(h.UploadAll(hd, good, &ack),
           {"manifest shape", grpc::StatusCode::INVALID_ARGUMENT, "shape"});
    hd = h.Header(task, good, id());
    hd.mutable_manifest()->mutable_tensors(1)->set_dtype("F16");
    expect(h.UploadAll(hd, good, &ack),
           {"manifest dtype", grpc::StatusCode::INVALID_ARGUMENT, "F16"});
  }
  {  // A blob whose tensors have other shapes than the manifest claims.
    std::vector<UpdateTensor> wrong = global;
    std::swap(wrong[1].shape[0], wrong[1].shape[1]);
    auto blob = EncodeUpdate(wrong, CodecOptions{});
    ASSERT_TRUE(blob.ok());
    expect(h.UploadAll(h.Header(task, *blob, id()), *blob, &ack),
           {"blob shape", grpc::StatusCode::INVALID_ARGUMENT, "shape"});
  }
  const uint32_t n = h.Header(task, good, "x").manifest().num_chunks();
  {  // Chunks: oversized, truncated, hash mismatch, out of order, data before the header.
    auto oversize = [](v1::UploadData* d) {
      if (d->chunk_index() == 1) {
        d->mutable_data()->append(4096, 'x');
        d->set_sha256(Sha256Hex(d->data()));
      }
    };
    expect(h.Upload(h.Header(task, good, id()), good, 0, n, &ack, oversize),
           {"oversized chunk", grpc::StatusCode::RESOURCE_EXHAUSTED, "limit"});
    auto truncate = [](v1::UploadData* d) {
      if (d->chunk_index() == 2) {
        d->mutable_data()->resize(d->data().size() - 10);
        d->set_sha256(Sha256Hex(d->data()));
      }
    };
    expect(h.Upload(h.Header(task, good, id()), good, 0, n, &ack, truncate),
           {"truncated chunk", grpc::StatusCode::INVALID_ARGUMENT, "expected"});
    auto bad_hash = [](v1::UploadData* d) {
      if (d->chunk_index() == 3) d->set_sha256(Sha256Hex("something else"));
    };
    const std::string resumable = id();
    expect(h.Upload(h.Header(task, good, resumable), good, 0, n, &ack, bad_hash),
           {"chunk hash", grpc::StatusCode::DATA_LOSS, "SHA-256"});
    // The chunks before the corrupt one stay durable: the upload can resume after them.
    v1::UploadStatusResponse st;
    ASSERT_TRUE(h.Status(resumable, &st).ok());
    EXPECT_EQ(st.state(), v1::UPLOAD_STATE_IN_PROGRESS);
    EXPECT_EQ(st.chunks_acknowledged(), 3u);
    auto skip = [](v1::UploadData* d) { d->set_chunk_index(d->chunk_index() + 1); };
    expect(h.Upload(h.Header(task, good, id()), good, 0, n, &ack, skip),
           {"out of order", grpc::StatusCode::INVALID_ARGUMENT, "out of order"});
    // A stream whose first message is data.
    auto ctx = h.Context();
    v1::UploadAck a2;
    auto writer = h.stub()->UploadUpdate(ctx.get(), &a2);
    v1::UploadChunk msg;
    msg.mutable_data()->set_data("x");
    writer->Write(msg);
    writer->WritesDone();
    expect(writer->Finish(), {"data first", grpc::StatusCode::INVALID_ARGUMENT, "header"});
  }
  {  // Whole-blob hash differs from the manifest (every chunk is self-consistent).
    v1::UploadHeader hd = h.Header(task, good, id());
    hd.mutable_manifest()->set_sha256(Sha256Hex("not the blob"));
    expect(h.UploadAll(hd, good, &ack), {"blob hash", grpc::StatusCode::DATA_LOSS, ""});
  }
  {  // Decompression bomb: a 64 MiB body of zeros in a few KB of zstd, declared honestly.
    const std::string bomb = BombBlob(2240, size_t{64} << 20);
    ASSERT_LT(bomb.size(), size_t{64} << 10);
    v1::UploadHeader hd = h.Header(task, bomb, id());
    v1::CodecStage* z = hd.mutable_codec()->add_stages();
    z->set_id(v1::CodecStage::ZSTD);
    expect(h.UploadAll(hd, bomb, &ack), {"bomb", grpc::StatusCode::INVALID_ARGUMENT, ""});
  }
  {  // Declared size over the server's limit.
    v1::UploadHeader hd = h.Header(task, good, id());
    hd.mutable_manifest()->set_total_bytes(uint64_t{1} << 40);
    expect(h.UploadAll(hd, good, &ack), {"too big", grpc::StatusCode::RESOURCE_EXHAUSTED, "limit"});
  }
  {  // num_examples 0, a round that is not current.
    expect(h.UploadAll(h.Header(task, good, id(), /*num_examples=*/0), good, &ack),
           {"zero examples", grpc::StatusCode::INVALID_ARGUMENT, "num_examples"});
    v1::UploadHeader hd = h.Header(task, good, id());
    hd.set_round(7);
    expect(h.UploadAll(hd, good, &ack),
           {"wrong round", grpc::StatusCode::FAILED_PRECONDITION, "round"});
  }
  {  // Forged identities. Mallory names site-a's task in the body: the task is bound to site-a.
    expect(h.UploadAll(h.Header(p["site-a"].task, good, id()), good, &ack),
           {"foreign task", grpc::StatusCode::PERMISSION_DENIED, "not assigned"});
    // Mallory claims to be site-a in metadata, with her own session token.
    RawClient as_a(server_->address(), "site-a");
    as_a.set_session(h.session());
    expect(as_a.UploadAll(h.Header(p["site-a"].task, good, id()), good, &ack),
           {"forged id", grpc::StatusCode::UNAUTHENTICATED, "session"});
    // No identity at all.
    RawClient nobody(server_->address(), "");
    expect(nobody.UploadAll(h.Header(task, good, id()), good, &ack),
           {"no identity", grpc::StatusCode::UNAUTHENTICATED, "fedlora-client-id"});
    // A client that joined after the selection was not selected.
    RawClient late(server_->address(), "late-comer");
    ASSERT_TRUE(late.Join().ok());
    expect(late.UploadAll(late.Header(task, good, id()), good, &ack),
           {"not selected", grpc::StatusCode::PERMISSION_DENIED, "not selected"});
  }
  EXPECT_GE(server_->metrics().updates_rejected.load(), 15);

  // The honest clients are still served and their round commits without any hostile update.
  for (const auto& [name, client_index] :
       std::vector<std::pair<std::string, int>>{{"site-a", 0}, {"site-b", 1}}) {
    Participant& part = p[name];
    const std::string blob = EncodedDeltaFor(client_index, part.task, global);
    v1::UploadAck ok_ack;
    grpc::Status s = part.client->UploadAll(
        part.client->Header(part.task, blob, "honest-" + name, testing::ExamplesOf(client_index)),
        blob, &ok_ack);
    ASSERT_TRUE(s.ok()) << name << ": " << s.error_message();
    EXPECT_EQ(ok_ack.state(), v1::UPLOAD_STATE_ACCEPTED);
  }
  ASSERT_TRUE(WaitForCommits(1));
  EXPECT_TRUE(SameBits(server_->coordinator().global_adapter(), ExpectedAdapter({0, 1}, 1)));
}

TEST_F(UploadProtocolTest, StragglerIsRefusedAsStaleAfterTheRoundClosesAtItsDeadline) {
  StartServer(/*rounds=*/2, /*target=*/3, /*min_clients=*/2, 1.0, /*deadline_ms=*/1500);
  auto p = JoinAndGetTasks({"site-a", "site-b", "site-c"});
  const std::vector<UpdateTensor> global = InitialAdapter();
  for (const auto& [name, c] :
       std::vector<std::pair<std::string, int>>{{"site-a", 0}, {"site-b", 1}}) {
    const std::string blob = EncodedDeltaFor(c, p[name].task, global);
    v1::UploadAck ack;
    ASSERT_TRUE(p[name]
                    .client
                    ->UploadAll(p[name].client->Header(p[name].task, blob, "up-" + name,
                                                       testing::ExamplesOf(c)),
                                blob, &ack)
                    .ok());
  }
  // Two of three arrived: the round waits for its deadline, then closes with min_clients = 2.
  EXPECT_EQ(server_->coordinator().rounds_committed(), 0);
  ASSERT_TRUE(WaitForCommits(1, 10'000));
  EXPECT_TRUE(SameBits(server_->coordinator().global_adapter(), ExpectedAdapter({0, 1}, 1)));

  RawClient& c = *p["site-c"].client;
  const std::string late = EncodedDeltaFor(2, p["site-c"].task, global);
  v1::UploadAck ack;
  grpc::Status s = c.UploadAll(c.Header(p["site-c"].task, late, "up-late"), late, &ack);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("stale"));
  // Its heartbeat for the old task says to drop it.
  v1::HeartbeatRequest hb;
  hb.set_task_id(p["site-c"].task.task_id());
  hb.set_state(v1::CLIENT_STATE_TRAINING);
  v1::HeartbeatResponse hb_resp;
  auto ctx = c.Context();
  ASSERT_TRUE(c.stub()->Heartbeat(ctx.get(), hb, &hb_resp).ok());
  EXPECT_EQ(hb_resp.action(), v1::HeartbeatResponse::CANCEL_TASK);
  EXPECT_TRUE(SameBits(server_->coordinator().global_adapter(), ExpectedAdapter({0, 1}, 1)));
}

TEST_F(UploadProtocolTest, RoundBelowMinClientsAtItsDeadlineIsAbandonedAndRetried) {
  StartServer(/*rounds=*/1, /*target=*/2, /*min_clients=*/2, 1.0, /*deadline_ms=*/1000);
  auto p = JoinAndGetTasks({"site-a", "site-b"});
  const std::vector<UpdateTensor> global = InitialAdapter();
  const std::string initial_hash = server_->coordinator().global_adapter_sha256();
  {
    const std::string blob = EncodedDeltaFor(0, p["site-a"].task, global);
    v1::UploadAck ack;
    ASSERT_TRUE(
        p["site-a"]
            .client
            ->UploadAll(p["site-a"].client->Header(p["site-a"].task, blob, "r1-a", 10), blob, &ack)
            .ok());
  }
  // Only one of the two minimum arrives: after the deadline round 1 is abandoned, round 2 opens
  // from the same adapter, and both clients get tasks for it.
  for (int i = 0; i < 500 && server_->metrics().rounds_abandoned.load() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  auto retry = JoinAndGetTasks({"site-a", "site-b"});
  EXPECT_EQ(retry["site-a"].task.round(), 2u);
  EXPECT_EQ(retry["site-a"].task.global_adapter().sha256(), initial_hash);
  EXPECT_EQ(server_->metrics().rounds_abandoned.load(), 1);
  for (const auto& [name, c] :
       std::vector<std::pair<std::string, int>>{{"site-a", 0}, {"site-b", 1}}) {
    const std::string blob = EncodedDeltaFor(c, retry[name].task, global);
    v1::UploadAck ack;
    ASSERT_TRUE(retry[name]
                    .client
                    ->UploadAll(retry[name].client->Header(retry[name].task, blob, "r2-" + name,
                                                           testing::ExamplesOf(c)),
                                blob, &ack)
                    .ok());
  }
  ASSERT_TRUE(WaitForCommits(1));
  EXPECT_TRUE(server_->coordinator().finished());
  EXPECT_TRUE(SameBits(server_->coordinator().global_adapter(),
                       ExpectedAdapter({0, 1}, std::vector<int>{2})));
}

TEST_F(UploadProtocolTest, OverSelectsAndTellsTheOthersToComeBack) {
  // Target 4 with 1.3x over-selection: ceil(5.2) = 6 of the 7 waiting clients get a task.
  StartServer(/*rounds=*/1, /*target=*/4, /*min_clients=*/4, 1.3, 30'000);
  std::vector<std::string> ids;
  for (int i = 0; i < 7; ++i) ids.push_back("site-" + std::to_string(i));
  std::map<std::string, Participant> p;
  for (const std::string& id : ids) {
    p[id].client = std::make_unique<RawClient>(server_->address(), id);
    ASSERT_TRUE(p[id].client->Join().ok());
  }
  std::map<std::string, v1::WaitForTaskResponse> answers;
  std::mutex mu;
  std::vector<std::thread> threads;
  for (const std::string& id : ids) {
    threads.emplace_back([&, id] {
      v1::WaitForTaskResponse r;
      EXPECT_TRUE(p[id].client->WaitForTask(&r, 5).ok());
      std::lock_guard<std::mutex> lock(mu);
      answers[id] = r;
    });
  }
  for (auto& t : threads) t.join();
  std::vector<std::string> selected;
  for (const auto& [id, r] : answers) {
    if (r.has_task()) {
      selected.push_back(id);
      p[id].task = r.task();
    } else {
      ASSERT_TRUE(r.has_retry_later()) << id;
      EXPECT_GE(r.retry_later().retry_after_seconds(), 1u);
      EXPECT_THAT(r.retry_later().reason(), HasSubstr("not selected for round 1"));
    }
  }
  ASSERT_EQ(selected.size(), 6u);
  // The round closes at the target (4 updates); the two extra tasks then arrive too late.
  const std::vector<UpdateTensor> global = InitialAdapter();
  std::vector<int> counted;
  for (size_t i = 0; i < selected.size(); ++i) {
    const std::string& id = selected[i];
    const int c = std::stoi(id.substr(5));
    const std::string blob = EncodedDeltaFor(c, p[id].task, global);
    v1::UploadAck ack;
    grpc::Status s = p[id].client->UploadAll(
        p[id].client->Header(p[id].task, blob, "up-" + id, testing::ExamplesOf(c)), blob, &ack);
    if (i < 4) {
      ASSERT_TRUE(s.ok()) << id << ": " << s.error_message();
      counted.push_back(c);
    } else {
      EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
          << id << ": " << s.error_message();
    }
  }
  ASSERT_TRUE(WaitForCommits(1));
  EXPECT_TRUE(SameBits(server_->coordinator().global_adapter(), ExpectedAdapter(counted, 1)));
}

TEST_F(UploadProtocolTest, SelectionWaitsForTheExpectedClientsToJoin) {
  // One client per round among two expected ones (the simulator's case): the first to join must not
  // be selected merely because it is, so far, every live client. The window is long enough that
  // only the second client's arrival can close the selection.
  v1::RunConfig config = testing::TestRunConfig(/*rounds=*/1, /*clients=*/1, /*min_clients=*/1);
  ServerOptions options = testing::TestServerOptions(dir_.path());
  options.select_when_quota_reached = false;
  options.selection_window_ms = 20'000;
  options.expected_clients = 2;
  auto server = Server::Create(options, config, InitialAdapter());
  ASSERT_TRUE(server.ok()) << server.status();
  server_ = *std::move(server);

  RawClient a(server_->address(), "site-a");
  ASSERT_TRUE(a.Join().ok());
  v1::WaitForTaskResponse early;
  ASSERT_TRUE(a.WaitForTask(&early, 1).ok());
  EXPECT_FALSE(early.has_task()) << "selected before the second expected client joined";
  RawClient b(server_->address(), "site-b");
  ASSERT_TRUE(b.Join().ok());
  v1::WaitForTaskResponse answer_a, answer_b;
  std::thread ta([&] { EXPECT_TRUE(a.WaitForTask(&answer_a, 5).ok()); });
  std::thread tb([&] { EXPECT_TRUE(b.WaitForTask(&answer_b, 5).ok()); });
  ta.join();
  tb.join();
  EXPECT_EQ(answer_a.has_task() + answer_b.has_task(), 1)
      << "one of the two waiting clients is selected";
}

TEST_F(UploadProtocolTest, NegativeExpectedClientsIsRefused) {
  ServerOptions options = testing::TestServerOptions(dir_.path());
  options.expected_clients = -1;
  auto server = Server::Create(options, testing::TestRunConfig(1, 1, 1), InitialAdapter());
  ASSERT_FALSE(server.ok());
  EXPECT_THAT(server.status().message(), HasSubstr("expected_clients"));
}

TEST_F(UploadProtocolTest, BulkWorkNiceOutsideZeroToNineteenIsRefused) {
  for (int nice : {-1, 20}) {
    ServerOptions options = testing::TestServerOptions(dir_.path());
    options.bulk_work_nice = nice;
    auto server = Server::Create(options, testing::TestRunConfig(1, 1, 1), InitialAdapter());
    ASSERT_FALSE(server.ok()) << nice;
    EXPECT_THAT(server.status().message(), HasSubstr("bulk_work_nice is " + std::to_string(nice)));
  }
}

TEST_F(UploadProtocolTest, SilentSelectedClientIsReplacedByALiveOne) {
  StartServer(/*rounds=*/1, /*target=*/2, /*min_clients=*/2, 1.0, 30'000,
              /*heartbeat_timeout_ms=*/500);
  auto p = JoinAndGetTasks({"site-a", "site-b"});
  const std::vector<UpdateTensor> global = InitialAdapter();
  {
    const std::string blob = EncodedDeltaFor(0, p["site-a"].task, global);
    v1::UploadAck ack;
    ASSERT_TRUE(p["site-a"]
                    .client
                    ->UploadAll(p["site-a"].client->Header(p["site-a"].task, blob, "a",
                                                           testing::ExamplesOf(0)),
                                blob, &ack)
                    .ok());
  }
  // site-b goes silent. A newcomer asking before the timeout is told to come back; after it, it
  // takes site-b's place.
  RawClient c(server_->address(), "site-c");
  ASSERT_TRUE(c.Join().ok());
  v1::WaitForTaskResponse early;
  ASSERT_TRUE(c.WaitForTask(&early, 0).ok());
  EXPECT_TRUE(early.has_retry_later());
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  v1::WaitForTaskResponse late;
  EXPECT_EQ(c.WaitForTask(&late, 0).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);  // its session expired too
  ASSERT_TRUE(c.Join().ok());
  ASSERT_TRUE(c.WaitForTask(&late, 0).ok());
  ASSERT_TRUE(late.has_task());
  EXPECT_EQ(late.task().round(), 1u);
  const std::string blob = EncodedDeltaFor(2, late.task(), global);
  v1::UploadAck ack;
  ASSERT_TRUE(
      c.UploadAll(c.Header(late.task(), blob, "c", testing::ExamplesOf(2)), blob, &ack).ok());
  ASSERT_TRUE(WaitForCommits(1));
  EXPECT_TRUE(SameBits(server_->coordinator().global_adapter(), ExpectedAdapter({0, 2}, 1)));
}

}  // namespace
}  // namespace fedlora
