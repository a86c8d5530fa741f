// The client SDK's adapter download against a real server whose chunks are damaged on the way: a
// loopback proxy forwards every Federation RPC to the server and alters DownloadAdapter chunks, so
// the SDK under test is the real one end to end. What is checked: a chunk that fails its SHA-256
// is fetched again from that chunk on, keeping the chunks already verified; a chunk that stays
// corrupt makes the client give the download up after RetryPolicy.max_attempts, naming the chunk,
// and nothing is trained from it; bytes that pass every chunk's digest but not the manifest's, or
// that outgrow the manifest, are DataLoss.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/sha256.h"
#include "fedlora/client.h"
#include "fedlora/v1/federation.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "tests/server/federation_test_util.h"

namespace fedlora {
namespace {

using testing::DeterministicTrainer;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::TempDir;

// One DownloadAdapter request as the proxy saw it.
struct DownloadCall {
  std::string adapter_sha256;
  uint32_t start_chunk = 0;
  bool final_adapter = false;  // the adapter a RunFinished answer named (else a task's)
  int nth = 0;                 // requests for the same adapter before this one
};

// May alter (or replace) each chunk the server streams for `call` before the client sees it.
using ChunkHook = std::function<void(const DownloadCall& call, v1::DownloadChunk* chunk)>;

// Forwards every Federation RPC to `upstream`, with the caller's identity and session metadata,
// deadline and cancellation; runs each DownloadAdapter chunk through the hook on the way back.
//
// Bounds a client that would loop (say, one that gives up every task and takes it again): past
// kMaxDownloads DownloadAdapter requests or kMaxRunTime, WaitForTask answers FailedPrecondition,
// which ends RunUntilDone with that error.
class CorruptingFederation final : public v1::Federation::Service {
 public:
  // A correct client makes at most 5 requests in these tests (a given-up download's 3, the task's
  // again, the final adapter's).
  static constexpr int kMaxDownloads = 10;
  // A correct run takes well under a second.
  static constexpr std::chrono::seconds kMaxRunTime{20};

  CorruptingFederation(const std::string& upstream, ChunkHook hook)
      : stub_(v1::Federation::NewStub(
            grpc::CreateChannel(upstream, grpc::InsecureChannelCredentials()))),
        hook_(std::move(hook)),
        started_(std::chrono::steady_clock::now()) {}

  grpc::Status Join(grpc::ServerContext* c, const v1::JoinRequest* r,
                    v1::JoinResponse* out) override {
    return stub_->Join(Upstream(c).get(), *r, out);
  }
  grpc::Status WaitForTask(grpc::ServerContext* c, const v1::WaitForTaskRequest* r,
                           v1::WaitForTaskResponse* out) override {
    if (downloads().size() > kMaxDownloads ||
        std::chrono::steady_clock::now() - started_ > kMaxRunTime) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "test proxy: the client is looping");
    }
    grpc::Status s = stub_->WaitForTask(Upstream(c).get(), *r, out);
    if (s.ok() && out->has_run_finished()) {
      std::lock_guard<std::mutex> lock(mu_);
      final_sha256_ = out->run_finished().final_adapter().sha256();
    }
    return s;
  }
  grpc::Status Heartbeat(grpc::ServerContext* c, const v1::HeartbeatRequest* r,
                         v1::HeartbeatResponse* out) override {
    return stub_->Heartbeat(Upstream(c).get(), *r, out);
  }
  grpc::Status GetUploadStatus(grpc::ServerContext* c, const v1::UploadStatusRequest* r,
                               v1::UploadStatusResponse* out) override {
    return stub_->GetUploadStatus(Upstream(c).get(), *r, out);
  }
  grpc::Status ReportMetrics(grpc::ServerContext* c, const v1::MetricsReport* r,
                             v1::MetricsAck* out) override {
    return stub_->ReportMetrics(Upstream(c).get(), *r, out);
  }
  grpc::Status Leave(grpc::ServerContext* c, const v1::LeaveRequest* r,
                     v1::LeaveResponse* out) override {
    return stub_->Leave(Upstream(c).get(), *r, out);
  }

  grpc::Status UploadUpdate(grpc::ServerContext* c, grpc::ServerReader<v1::UploadChunk>* in,
                            v1::UploadAck* ack) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++uploads_;
    }
    auto ctx = Upstream(c);
    std::unique_ptr<grpc::ClientWriter<v1::UploadChunk>> writer =
        stub_->UploadUpdate(ctx.get(), ack);
    v1::UploadChunk message;
    bool ok = true;
    while (ok && in->Read(&message)) ok = writer->Write(message);
    if (ok) writer->WritesDone();
    return writer->Finish();
  }

  grpc::Status DownloadAdapter(grpc::ServerContext* c, const v1::DownloadRequest* r,
                               grpc::ServerWriter<v1::DownloadChunk>* out) override {
    DownloadCall call;
    call.adapter_sha256 = r->adapter_sha256();
    call.start_chunk = r->start_chunk();
    {
      std::lock_guard<std::mutex> lock(mu_);
      call.final_adapter = call.adapter_sha256 == final_sha256_;
      for (const DownloadCall& earlier : downloads_)
        call.nth += earlier.adapter_sha256 == call.adapter_sha256;
      downloads_.push_back(call);
    }
    if (refuse_ && refuse_(call)) {
      return grpc::Status(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          "client 'site-0' already has 2 downloads open (server.max_client_downloads_in_flight)");
    }
    auto ctx = Upstream(c);
    std::unique_ptr<grpc::ClientReader<v1::DownloadChunk>> in =
        stub_->DownloadAdapter(ctx.get(), *r);
    v1::DownloadChunk chunk;
    while (in->Read(&chunk)) {
      if (hook_) hook_(call, &chunk);
      if (!out->Write(chunk)) {
        ctx->TryCancel();  // the client hung up (it does on a chunk it refuses)
        break;
      }
    }
    return in->Finish();
  }

  // Answers the DownloadAdapter requests `refuse` picks as the server does past its per-client cap
  // of open downloads. Set before the client starts.
  void RefuseWhen(std::function<bool(const DownloadCall&)> refuse) { refuse_ = std::move(refuse); }

  // Every DownloadAdapter request so far, in arrival order.
  std::vector<DownloadCall> downloads() {
    std::lock_guard<std::mutex> lock(mu_);
    return downloads_;
  }
  // The start_chunk of each request for a task's adapter (final = false) or the final adapter.
  std::vector<uint32_t> StartChunks(bool final_adapter) {
    std::vector<uint32_t> out;
    for (const DownloadCall& d : downloads()) {
      if (d.final_adapter == final_adapter) out.push_back(d.start_chunk);
    }
    return out;
  }
  int uploads() {
    std::lock_guard<std::mutex> lock(mu_);
    return uploads_;
  }

 private:
  // A context for the upstream call: the caller's deadline and cancellation, and the metadata the
  // server authenticates by.
  static std::unique_ptr<grpc::ClientContext> Upstream(grpc::ServerContext* c) {
    std::unique_ptr<grpc::ClientContext> ctx = grpc::ClientContext::FromServerContext(*c);
    for (const char* key : {kClientIdMetadataKey, kSessionMetadataKey}) {
      auto it = c->client_metadata().find(key);
      if (it != c->client_metadata().end())
        ctx->AddMetadata(key, std::string(it->second.data(), it->second.size()));
    }
    return ctx;
  }

  std::unique_ptr<v1::Federation::Stub> stub_;
  ChunkHook hook_;
  std::function<bool(const DownloadCall&)> refuse_;
  const std::chrono::steady_clock::time_point started_;
  std::mutex mu_;
  std::string final_sha256_;
  std::vector<DownloadCall> downloads_;
  int uploads_ = 0;
};

// A real one-client, one-round server, reached through a CorruptingFederation on 127.0.0.1.
class CorruptedDownloadTest : public ::testing::Test {
 protected:
  // Retry budget of the client under test: three attempts a few milliseconds apart.
  static constexpr int kMaxAttempts = 3;

  void StartWith(ChunkHook hook) {
    auto server = Server::Create(testing::TestServerOptions(dir_.path()),
                                 testing::TestRunConfig(1, 1, 1), testing::InitialAdapter());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    proxy_ = std::make_unique<CorruptingFederation>(server_->address(), std::move(hook));
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(proxy_.get());
    proxy_server_ = builder.BuildAndStart();
    ASSERT_NE(proxy_server_, nullptr);
    ASSERT_NE(port, 0);
    address_ = "127.0.0.1:" + std::to_string(port);
  }

  void TearDown() override {
    if (proxy_server_)
      proxy_server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    if (server_) server_->Shutdown();
  }

  absl::StatusOr<RunSummary> RunClient(ClientTrainer* trainer) {
    ClientOptions o = testing::TestClientOptions(address_, "site-0");
    o.retry.max_attempts = kMaxAttempts;
    o.retry.initial_backoff_ms = 10;
    o.retry.max_backoff_ms = 20;
    auto client = Client::Create(o, trainer);
    if (!client.ok()) return client.status();
    return (*client)->RunUntilDone();
  }

  TempDir dir_;
  std::unique_ptr<Server> server_;
  std::unique_ptr<CorruptingFederation> proxy_;
  std::unique_ptr<grpc::Server> proxy_server_;
  std::string address_;
};

// DeterministicTrainer that also keeps every global adapter it was given.
class RecordingTrainer : public ClientTrainer {
 public:
  absl::StatusOr<TrainResult> Train(const TrainTask& task,
                                    const std::vector<NamedTensor>& global) override {
    globals_.push_back(global);
    return inner_.Train(task, global);
  }
  std::vector<std::vector<UpdateTensor>> globals_;
  DeterministicTrainer inner_{0};
};

// The run trained once, on the server's initial adapter as it holds it, uploaded once, and ended
// with the adapter that one update gives.
void ExpectOneTrainingOnIntactBytes(const RecordingTrainer& trainer, const RunSummary& result) {
  ASSERT_EQ(trainer.globals_.size(), 1u);
  EXPECT_TRUE(testing::SameBits(trainer.globals_[0], testing::InitialAdapter()));
  EXPECT_TRUE(testing::SameBits(result.final_adapter, testing::ExpectedAdapter({0}, 1)));
}

void FlipAByte(v1::DownloadChunk* chunk) { (*chunk->mutable_data())[0] ^= 0x01; }

TEST_F(CorruptedDownloadTest, ChunkCorruptedOnceIsFetchedAgainFromThatChunk) {
  // Chunk 1 of the round's adapter (~9 chunks of 1 KiB) is damaged in the first request only.
  StartWith([](const DownloadCall& call, v1::DownloadChunk* chunk) {
    if (!call.final_adapter && call.nth == 0 && chunk->chunk_index() == 1) FlipAByte(chunk);
  });
  RecordingTrainer trainer;
  auto result = RunClient(&trainer);
  ASSERT_TRUE(result.ok()) << result.status();
  // The second request resumes at the damaged chunk, for the same adapter: chunk 0 is kept.
  EXPECT_THAT(proxy_->StartChunks(/*final_adapter=*/false), ElementsAre(0u, 1u));
  const std::vector<DownloadCall> calls = proxy_->downloads();
  ASSERT_GE(calls.size(), 2u);
  EXPECT_EQ(calls[1].adapter_sha256, calls[0].adapter_sha256);
  // The task was not given up: trained once, on the adapter as the server holds it.
  EXPECT_EQ(result->tasks_failed, 0);
  EXPECT_EQ(result->tasks_completed, 1);
  ExpectOneTrainingOnIntactBytes(trainer, *result);
  EXPECT_EQ(proxy_->uploads(), 1);
}

// The server releases a download slot when it sees the stream end, which may be just after the
// client does: a download refused for the cap is tried again, not the task given up.
TEST_F(CorruptedDownloadTest, ADownloadRefusedForTheOpenStreamCapIsTriedAgain) {
  StartWith(nullptr);
  proxy_->RefuseWhen([](const DownloadCall& call) { return !call.final_adapter && call.nth == 0; });
  RecordingTrainer trainer;
  auto result = RunClient(&trainer);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_THAT(proxy_->StartChunks(/*final_adapter=*/false), ElementsAre(0u, 0u));
  EXPECT_EQ(result->tasks_failed, 0);
  EXPECT_EQ(result->tasks_completed, 1);
  ExpectOneTrainingOnIntactBytes(trainer, *result);
}

TEST_F(CorruptedDownloadTest, ChunkCorruptOnEveryAttemptGivesTheTaskUpUntrained) {
  // Chunk 1 of the round's adapter is damaged in each of the client's kMaxAttempts requests of its
  // first download, then served intact.
  StartWith([](const DownloadCall& call, v1::DownloadChunk* chunk) {
    if (!call.final_adapter && call.nth < kMaxAttempts && chunk->chunk_index() == 1)
      FlipAByte(chunk);
  });
  RecordingTrainer trainer;
  auto result = RunClient(&trainer);
  ASSERT_TRUE(result.ok()) << result.status();
  // kMaxAttempts requests (the first from chunk 0, each retry from chunk 1), then the download is
  // given up; the task taken again downloads from the start, intact this time.
  EXPECT_THAT(proxy_->StartChunks(/*final_adapter=*/false), ElementsAre(0u, 1u, 1u, 0u));
  EXPECT_EQ(result->tasks_failed, 1);
  EXPECT_EQ(result->tasks_completed, 1);
  // Nothing trained or uploaded from the damaged downloads.
  ExpectOneTrainingOnIntactBytes(trainer, *result);
  EXPECT_EQ(proxy_->uploads(), 1);
}

TEST_F(CorruptedDownloadTest, ChunkAlwaysCorruptIsAnErrorNamingTheChunk) {
  // The final adapter's chunk 1 is damaged in every request: RunUntilDone returns the error.
  StartWith([](const DownloadCall& call, v1::DownloadChunk* chunk) {
    if (call.final_adapter && chunk->chunk_index() == 1) FlipAByte(chunk);
  });
  RecordingTrainer trainer;
  auto result = RunClient(&trainer);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kAborted) << result.status();
  EXPECT_THAT(std::string(result.status().message()),
              HasSubstr("chunk 1 does not match its SHA-256"));
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("gave up after 3 attempts"));
  EXPECT_THAT(proxy_->StartChunks(/*final_adapter=*/true), ElementsAre(0u, 1u, 1u));
}

TEST_F(CorruptedDownloadTest, ChunkThatMatchesItsDigestButNotTheManifestIsDataLoss) {
  // Chunk 1 of the final adapter altered with its sha256 field recomputed: only the blob's digest
  // against the manifest can tell.
  StartWith([](const DownloadCall& call, v1::DownloadChunk* chunk) {
    if (call.final_adapter && chunk->chunk_index() == 1) {
      FlipAByte(chunk);
      chunk->set_sha256(Sha256Hex(chunk->data()));
    }
  });
  RecordingTrainer trainer;
  auto result = RunClient(&trainer);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kDataLoss) << result.status();
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("does not match its manifest"));
  EXPECT_THAT(proxy_->StartChunks(/*final_adapter=*/true), ElementsAre(0u));
}

TEST_F(CorruptedDownloadTest, StreamLongerThanTheManifestIsDataLoss) {
  // Chunk 1 of the final adapter grown past the whole blob's size (~9 KB), with a matching sha256.
  StartWith([](const DownloadCall& call, v1::DownloadChunk* chunk) {
    if (call.final_adapter && chunk->chunk_index() == 1) {
      chunk->mutable_data()->append(64 << 10, 'x');
      chunk->set_sha256(Sha256Hex(chunk->data()));
    }
  });
  RecordingTrainer trainer;
  auto result = RunClient(&trainer);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kDataLoss) << result.status();
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("more than the manifest's"));
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("gave up after 3 attempts"));
  EXPECT_THAT(proxy_->StartChunks(/*final_adapter=*/true), ElementsAre(0u, 1u, 1u));
}

}  // namespace
}  // namespace fedlora
