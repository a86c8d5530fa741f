// Floods of calls that cost the server memory and the peer almost nothing: streams opened and never
// read, Watch streams on the health port. Each is bounded (per-client download streams, the health
// port's streams per connection); the server's RSS growth under the flood stays within a stated
// bound, and an honest client still finishes its round beside it. Server and clients run in this
// process, so the RSS measured is the server's plus the flooding clients' own buffers.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/process_memory.h"
#include "core/sha256.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "tests/server/federation_test_util.h"

namespace fedlora {
namespace {

using testing::DeterministicTrainer;
using testing::RawClient;
using testing::TempDir;

// An adapter of ~2 MiB (two 16 x 16384 LoRA matrices): far more than one stream's HTTP/2 window
// (64 KiB), so that a download nobody reads stays open on the server, a chunk waiting to be sent.
std::vector<UpdateTensor> BigAdapter() {
  std::vector<UpdateTensor> a = {{"layer.0.query.lora_A.weight", {16, 16384}, {}},
                                 {"layer.0.query.lora_B.weight", {16384, 16}, {}}};
  for (UpdateTensor& t : a) {
    t.values.resize(16 * 16384);
    for (size_t i = 0; i < t.values.size(); ++i) t.values[i] = 0.001f * static_cast<float>(i % 97);
  }
  return a;
}

int64_t RssMib() { return ResidentKib() / 1024; }

// Opens `n` DownloadAdapter streams of `sha` as `flooder` and reads none of them (gRPC's client
// still takes in what the server sends). Waits until all but two have ended, or all but 20 were
// refused (at most 20 s), and returns how many ended RESOURCE_EXHAUSTED; the others stay open
// until Cancel.
class DownloadFlood {
 public:
  int Start(RawClient& flooder, const std::string& sha, int n) {
    v1::DownloadRequest req;
    req.set_adapter_sha256(sha);
    calls_.resize(n);
    for (int i = 0; i < n; ++i) {
      Call& c = calls_[i];
      c.ctx = flooder.Context(120'000);
      c.reader = flooder.stub()->PrepareAsyncDownloadAdapter(c.ctx.get(), req, &cq_);
      c.reader->StartCall(Tag(i, false));
      c.reader->Finish(&c.status, Tag(i, true));
    }
    int exhausted = 0, finished = 0;
    const auto until = std::chrono::system_clock::now() + std::chrono::seconds(20);
    while (finished < n - 2 && exhausted < n - 20) {  // all but two ended, or nearly all refused
      void* tag = nullptr;
      bool ok = false;
      if (cq_.AsyncNext(&tag, &ok, until) != grpc::CompletionQueue::GOT_EVENT) break;
      const auto v = reinterpret_cast<uintptr_t>(tag);
      if ((v & 1) == 0) continue;
      Call& c = calls_[v >> 1];
      ++finished;
      if (c.status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) ++exhausted;
    }
    return exhausted;
  }

  void Cancel() {
    for (Call& c : calls_) c.ctx->TryCancel();
    cq_.Shutdown();
    void* tag;
    bool ok;
    while (cq_.Next(&tag, &ok)) {
    }
  }

 private:
  struct Call {
    std::unique_ptr<grpc::ClientContext> ctx;
    std::unique_ptr<grpc::ClientAsyncReader<v1::DownloadChunk>> reader;
    grpc::Status status;
  };
  static void* Tag(int i, bool finish) {
    return reinterpret_cast<void*>((uintptr_t(i) << 1) | (finish ? 1 : 0));
  }

  grpc::CompletionQueue cq_;
  std::vector<Call> calls_;
};

// 1000 downloads opened and never read by one client: two at a time are admitted
// (max_client_downloads_in_flight), the rest refused at once; RSS grows by under 96 MiB (gRPC's state for the 1000 calls at once) (without
// the cap all 1000 are served, and RSS grew by 2158 MiB: the server's chunks and gRPC buffers,
// and the adapter piling up in the flooder's own buffers), and an honest client finishes its round.
// One honest client (site-0) runs to the end of the run on `server`.
void AnHonestClientFinishes(Server& server) {
  std::vector<std::unique_ptr<DeterministicTrainer>> trainers;
  trainers.push_back(std::make_unique<DeterministicTrainer>(0));
  auto results = testing::RunClientsUntilDone(server.address(), trainers);
  ASSERT_TRUE(results[0].ok()) << results[0].status();
}

TEST(FloodsTest, UnreadDownloadsAreCappedPerClient) {
  TempDir dir;
  ServerOptions o = testing::TestServerOptions(dir.path());
  o.chunk_bytes = 64 << 10;
  o.max_upload_chunk_bytes = 1 << 20;
  o.upload_sync_bytes = 8 << 20;
  auto server = Server::Create(o, testing::TestRunConfig(1, 1, 1), BigAdapter());
  ASSERT_TRUE(server.ok()) << server.status();
  RawClient flooder((*server)->address(), "flooder");
  ASSERT_TRUE(flooder.Join().ok());
  const std::string sha = flooder.RunStatus().global_adapter().sha256();
  ASSERT_FALSE(sha.empty());

  const int64_t before = RssMib();
  constexpr int kStreams = 1000;
  DownloadFlood flood;
  const int exhausted = flood.Start(flooder, sha, kStreams);
  const int64_t grown = RssMib() - before;
  // Nearly all refused: a stream admitted may end (its client took the whole adapter in) and free
  // its slot for a later one, so a few more than two may be served.
  EXPECT_GE(exhausted, kStreams - 20);
  EXPECT_LT(grown, 96) << "RSS grew " << grown << " MiB under " << kStreams << " unread downloads";
  ::testing::Test::RecordProperty("rss_growth_mib", static_cast<int>(grown));

  // The flooder's two admitted streams are still open; an honest client runs its round.
  ASSERT_NO_FATAL_FAILURE(AnHonestClientFinishes(**server));
  EXPECT_TRUE((*server)->WaitUntilFinished(10'000));
  flood.Cancel();
}

// Opens `connections` x `streams_each` grpc.health.v1 Watch streams to `target`, each connection
// its own, and counts those the server answers (its first message) within 3 s. Cancels them all
// before returning; *grown_mib is the RSS growth while they were open.
int WatchFlood(const std::string& target, int connections, int streams_each, int64_t* grown_mib) {
  grpc::CompletionQueue cq;
  struct Watch {
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call;
    grpc::ByteBuffer answer;
  };
  std::vector<std::unique_ptr<grpc::GenericStub>> stubs;
  std::vector<std::unique_ptr<Watch>> watches;
  const int64_t before = RssMib();
  for (int c = 0; c < connections; ++c) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own
    stubs.push_back(std::make_unique<grpc::GenericStub>(
        grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args)));
    for (int s = 0; s < streams_each; ++s) {
      auto w = std::make_unique<Watch>();
      w->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
      w->call = stubs.back()->PrepareCall(&w->ctx, "/grpc.health.v1.Health/Watch", &cq);
      w->call->StartCall(reinterpret_cast<void*>(watches.size() * 4));
      watches.push_back(std::move(w));
    }
  }
  int answered = 0;
  const auto until = std::chrono::system_clock::now() + std::chrono::seconds(3);
  for (;;) {
    void* tag = nullptr;
    bool ok = false;
    if (cq.AsyncNext(&tag, &ok, until) != grpc::CompletionQueue::GOT_EVENT) break;
    const uintptr_t v = reinterpret_cast<uintptr_t>(tag);
    Watch& w = *watches[v / 4];
    if (!ok) continue;
    if (v % 4 == 0) {         // started: send the request
      grpc::Slice empty("");  // HealthCheckRequest{service: ""} encodes to no bytes
      grpc::ByteBuffer request(&empty, 1);
      w.call->WriteLast(request, grpc::WriteOptions(), reinterpret_cast<void*>(v + 1));
    } else if (v % 4 == 1) {  // sent: wait for the first status
      w.call->Read(&w.answer, reinterpret_cast<void*>(v + 1));
    } else {
      ++answered;
    }
  }
  *grown_mib = RssMib() - before;
  for (auto& w : watches) w->ctx.TryCancel();
  cq.Shutdown();
  void* tag;
  bool ok;
  while (cq.Next(&tag, &ok)) {
  }
  return answered;
}

// Watch streams on the plaintext health port, 2000 of them over 20 connections: each connection
// gets health_max_concurrent_streams (4) served, the rest wait on the client's side and cost the
// server nothing. RSS grows by under 64 MiB, most of it the flooding client's own 2000 calls
// (measured: 42 MiB; without the cap all 2000 are served and it grew by 79 MiB).
TEST(FloodsTest, HealthWatchStreamsAreCappedPerConnection) {
  TempDir dir;
  ServerOptions o = testing::TestServerOptions(dir.path());
  o.health_address = "127.0.0.1:0";
  auto server = Server::Create(o, testing::TestRunConfig(1, 1, 1), testing::InitialAdapter());
  ASSERT_TRUE(server.ok()) << server.status();
  constexpr int kConnections = 20;
  int64_t grown = 0;
  const int answered = WatchFlood("127.0.0.1:" + std::to_string((*server)->health_port()),
                                  kConnections, 100, &grown);
  EXPECT_GT(answered, 0);
  EXPECT_LE(answered, kConnections * o.health_max_concurrent_streams);
  EXPECT_LT(grown, 64) << "RSS grew " << grown << " MiB under 2000 Watch streams";
  ::testing::Test::RecordProperty("health_watches_answered", answered);
  ::testing::Test::RecordProperty("rss_growth_mib", static_cast<int>(grown));

  // The main port serves an honest client's round.
  ASSERT_NO_FATAL_FAILURE(AnHonestClientFinishes(**server));
}

// The run config's bounds reach the main port: server.max_concurrent_streams 4 lets one connection
// have 4 calls open (here Watch streams) and no more; grpc_memory_bytes and grpc_max_threads are
// taken (the server starts with them) and an honest client runs its round under them.
TEST(FloodsTest, RunConfigBoundsTheMainPort) {
  TempDir dir;
  v1::RunConfig config = testing::TestRunConfig(1, 1, 1);
  config.mutable_server()->set_max_concurrent_streams(4);
  config.mutable_server()->set_grpc_memory_bytes(uint64_t{64} << 20);
  config.mutable_server()->set_grpc_max_threads(16);
  ServerOptions from_config = ServerOptionsFromRunConfig(config);
  EXPECT_EQ(from_config.max_concurrent_streams, 4);
  EXPECT_EQ(from_config.grpc_memory_bytes, int64_t{64} << 20);
  EXPECT_EQ(from_config.grpc_max_threads, 16);
  ServerOptions o = testing::TestServerOptions(dir.path());
  o.max_concurrent_streams = from_config.max_concurrent_streams;
  o.grpc_memory_bytes = from_config.grpc_memory_bytes;
  o.grpc_max_threads = from_config.grpc_max_threads;
  auto server = Server::Create(o, config, testing::InitialAdapter());
  ASSERT_TRUE(server.ok()) << server.status();
  int64_t grown = 0;
  EXPECT_EQ(WatchFlood((*server)->address(), 2, 10, &grown), 2 * 4);

  ASSERT_NO_FATAL_FAILURE(AnHonestClientFinishes(**server));
}

// 2000 WaitForTask polls from one client at once: two are held (max_client_held_polls), the rest
// answered at once with "retry later"; RSS grows by under 96 MiB, and an honest client selected
// beside the flooder commits the round. RSS does not tell the cap apart here (measured 65-71 MiB
// with it, 65 MiB without: the flooder's own 2000 calls dominate, a held poll costs the server
// little); the count of polls answered at once does (0 without the cap).
TEST(FloodsTest, HeldPollsAreCappedPerClient) {
  TempDir dir;
  ServerOptions o = testing::TestServerOptions(dir.path());
  o.round_deadline_ms =
      3000;  // the flooder, selected too, never uploads: the round closes without it
  // No selection until the honest client polls too (the quota, 2): the flooder's polls are held.
  o.expected_clients = 2;
  o.selection_window_ms = 60'000;
  auto server = Server::Create(o, testing::TestRunConfig(1, 2, 1), testing::InitialAdapter());
  ASSERT_TRUE(server.ok()) << server.status();
  RawClient flooder((*server)->address(), "flooder");
  ASSERT_TRUE(flooder.Join().ok());

  constexpr int kPolls = 2000;
  grpc::CompletionQueue cq;
  struct Poll {
    std::unique_ptr<grpc::ClientContext> ctx;
    std::unique_ptr<grpc::ClientAsyncResponseReader<v1::WaitForTaskResponse>> reader;
    v1::WaitForTaskResponse response;
    grpc::Status status;
  };
  std::vector<Poll> polls(kPolls);
  const int64_t before = RssMib();
  v1::WaitForTaskRequest req;
  req.set_max_wait_seconds(20);
  for (int i = 0; i < kPolls; ++i) {
    Poll& p = polls[i];
    p.ctx = flooder.Context(25'000);
    p.reader = flooder.stub()->AsyncWaitForTask(p.ctx.get(), req, &cq);
    p.reader->Finish(&p.response, &p.status, reinterpret_cast<void*>(static_cast<uintptr_t>(i)));
  }
  int retry_later = 0, answered = 0;
  const auto until = std::chrono::system_clock::now() + std::chrono::seconds(10);
  while (answered < kPolls - 2) {
    void* tag = nullptr;
    bool ok = false;
    if (cq.AsyncNext(&tag, &ok, until) != grpc::CompletionQueue::GOT_EVENT) break;
    Poll& p = polls[reinterpret_cast<uintptr_t>(tag)];
    ++answered;
    if (p.status.ok() && p.response.has_retry_later()) ++retry_later;
    p.reader.reset();
    p.ctx.reset();
  }
  const int64_t grown = RssMib() - before;
  EXPECT_GE(retry_later, kPolls - 2);
  EXPECT_LT(grown, 96) << "RSS grew " << grown << " MiB under " << kPolls << " held polls";
  ::testing::Test::RecordProperty("rss_growth_mib", static_cast<int>(grown));

  ASSERT_NO_FATAL_FAILURE(AnHonestClientFinishes(**server));
  EXPECT_TRUE((*server)->WaitUntilFinished(10'000));
  for (Poll& p : polls) {
    if (p.ctx != nullptr) p.ctx->TryCancel();
  }
  cq.Shutdown();
  void* tag;
  bool ok;
  while (cq.Next(&tag, &ok)) {
  }
}

// 1,600 uploads of 1 MiB each (4 threads x 400) from a joined client that holds no task, sent
// while an honest client runs its round: each is refused at its header (none of its bytes reach a
// file or an update), and the honest client finishes. RSS grows by under 128 MiB, a twelfth of
// the 1.6 GB sent (measured 25-27 MiB alone, 56-77 MiB after the floods above in the same
// process). More flooding threads cost the test's own client more (16 threads: 99-198 MiB, 64:
// 58-73 MiB, noisy: their buffers and malloc arenas): they would measure the flooder, not the server.
TEST(FloodsTest, RefusedUploadsCostLittleMemory) {
  TempDir dir;
  auto server = Server::Create(testing::TestServerOptions(dir.path()),
                               testing::TestRunConfig(1, 1, 1), testing::InitialAdapter());
  ASSERT_TRUE(server.ok()) << server.status();
  RawClient flooder((*server)->address(), "flooder");
  ASSERT_TRUE(flooder.Join().ok());
  const std::string body(1 << 20, 'x');
  constexpr uint32_t kChunk = 64 << 10;
  auto header = [&](int n) {
    v1::UploadHeader h;
    h.set_upload_id("flood-" + std::to_string(n));
    h.set_round(1);
    h.set_task_id("no-such-task");
    h.set_num_examples(1);
    h.mutable_encryption()->set_scheme(v1::EncryptionSpec::X25519_HKDF_AES256GCM);
    v1::AdapterManifest* m = h.mutable_manifest();
    m->set_total_bytes(body.size());
    m->set_sha256(Sha256Hex(body));
    m->set_chunk_size_bytes(kChunk);
    m->set_num_chunks(static_cast<uint32_t>(body.size() / kChunk));
    return h;
  };
  constexpr int kThreads = 4, kEach = 400;
  std::atomic<int> refused{0}, accepted{0};
  std::atomic<bool> flooding{true};
  std::atomic<int64_t> peak{0};
  const int64_t before = RssMib();
  std::thread sampler([&] {
    while (flooding.load()) {
      peak.store(std::max(peak.load(), RssMib()));
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        v1::UploadAck ack;
        (flooder.UploadAll(header(t * kEach + i), body, &ack).ok() ? accepted : refused)
            .fetch_add(1);
      }
    });
  }
  ASSERT_NO_FATAL_FAILURE(AnHonestClientFinishes(**server));
  for (std::thread& t : threads) t.join();
  flooding.store(false);
  sampler.join();
  const int64_t grown = peak.load() - before;
  EXPECT_EQ(accepted.load(), 0);
  EXPECT_EQ(refused.load(), kThreads * kEach);
  EXPECT_LT(grown, 128) << "RSS grew " << grown << " MiB under " << kThreads * kEach
                        << " refused uploads";
  ::testing::Test::RecordProperty("rss_growth_mib", static_cast<int>(grown));
  EXPECT_TRUE((*server)->WaitUntilFinished(10'000));
}

}  // namespace
}  // namespace fedlora
