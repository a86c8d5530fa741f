// Upload ingest of the aggregation server against a raw gRPC loopback stream of the same bytes.
//
//   server_upload_ingest_bench [clients=8] [reps=3] [rank=8]
//   server_upload_ingest_bench 1gb [reps=2]     one client, one ~1 GB update (rank 6782, fp32)
//
// N clients upload a BERT-base-sized LoRA update each, concurrently, to
//   (a) the fedlora server: per-chunk and whole-blob SHA-256 (one pass over the bytes for both),
//       partial-file writes with an fsync every 8 MiB (run beside the stream, which reads one
//       message ahead of its processing), opening the sealed update (AES-256-GCM) in memory and
//       validating it there (ValidateUpdate: table, shapes, finite values, without decoding it
//       into tensors), the move into blobs/, a durable SQLite row, and
//   (b) a sink: the same Federation service, but UploadUpdate only reads and drops the chunks,
// both in one child process (so that the server's peak RSS is its own), over 127.0.0.1, and
//   (c) the disk: the same bytes written to files in the store's directory and fdatasync'ed, which
//       the server must do before it acknowledges, so (a) can beat neither (b) nor (c).
// Each rep times (b), (c), then (a); the report is the median over the reps after the first
// (warm-up), with the per-rep ratios against (b) and against the slower of (b) and (c).
//
// Napkin math: BERT-base with LoRA r=8 on query and value has 12 layers x 2 targets x (8x768 +
// 768x8) = 294,912 values plus a 2x768 classifier: 1.19 MB in fp32. Eight of them are 9.5 MB: on
// loopback a raw stream moves that in a few ms, so the fedlora side is dominated by fsync (~1-5 ms
// each on an SSD), hashing (~1.8 GB/s per core with SHA-NI: 5 ms for 9.5 MB) and decoding.
//
// The 1 GB case: 12 x 2 x 2 x 768 x 6782 values x 4 bytes = 1.000 GB; it crosses ~120 fsync
// checkpoints (every 8 MiB) on the way. On the 2-core development machine it is CPU-bound: the
// client's hashing and sending take one core, the server's receive, hash and copy the other.
//
// Validation before timing: every ack is ACCEPTED, each round commits, and the committed adapter is
// bit-identical to StreamingFedAvg run directly on the same updates.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "aggregation/fedavg.h"
#include "aggregation/server_optimizer.h"
#include "core/process_memory.h"
#include "core/safetensors.h"
#include "server/server.h"
#include "tests/server/federation_test_util.h"

namespace fedlora {
namespace {

std::vector<UpdateTensor> BertBaseAdapter(int rank) {
  std::vector<UpdateTensor> a;
  for (int layer = 0; layer < 12; ++layer) {
    for (const char* target : {"query", "value"}) {
      const std::string base = "base_model.model.bert.encoder.layer." + std::to_string(layer) +
                               ".attention.self." + target;
      a.push_back(
          {base + ".lora_A.weight", {rank, 768}, std::vector<float>(size_t(rank) * 768, 0.01f)});
      a.push_back(
          {base + ".lora_B.weight", {768, rank}, std::vector<float>(size_t(rank) * 768, 0.0f)});
    }
  }
  a.push_back({"base_model.model.classifier.weight", {2, 768}, std::vector<float>(2 * 768, 0.02f)});
  std::sort(a.begin(), a.end(),
            [](const UpdateTensor& x, const UpdateTensor& y) { return x.name < y.name; });
  return a;
}

// Client c's delta: small dyadic values, exact in fp32.
std::vector<UpdateTensor> DeltaOf(const std::vector<UpdateTensor>& adapter, int c, uint64_t round) {
  std::vector<UpdateTensor> d = adapter;
  for (UpdateTensor& t : d) {
    for (size_t i = 0; i < t.values.size(); ++i)
      t.values[i] = static_cast<float>(int64_t((i * 7 + c * 13 + round) % 9) - 4) / 256.0f;
  }
  return d;
}

// The sink: Federation with an UploadUpdate that only reads.
class SinkService final : public v1::Federation::CallbackService {
  grpc::ServerReadReactor<v1::UploadChunk>* UploadUpdate(grpc::CallbackServerContext*,
                                                         v1::UploadAck* ack) override {
    class Reader final : public grpc::ServerReadReactor<v1::UploadChunk> {
     public:
      explicit Reader(v1::UploadAck* ack) : ack_(ack) { StartRead(&msg_); }
      void OnReadDone(bool ok) override {
        if (!ok) {
          ack_->set_state(v1::UPLOAD_STATE_ACCEPTED);
          Finish(grpc::Status::OK);
          return;
        }
        StartRead(&msg_);
      }
      void OnDone() override { delete this; }

     private:
      v1::UploadAck* ack_;
      v1::UploadChunk msg_;
    };
    return new Reader(ack);
  }
};

// Child: both servers; writes "<fedlora port> <sink port>\n" to `fd`, then waits for SIGTERM.
[[noreturn]] void RunServers(int fd, int clients, int reps, int rank, const std::string& dir) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  ServerOptions o;
  o.listen_address = "127.0.0.1:0";
  o.insecure = true;
  o.metrics_address = "";
  o.data_dir = dir;
  o.tick_ms = 5;
  o.selection_window_ms = 100;
  // The bench's clients never heartbeat; computing the expected FedAvg of a 1 GB update between
  // rounds takes longer than the default 30 s after which a silent client is dropped.
  o.heartbeat_timeout_ms = 600'000;
  // Room for the encoded update (the default cap is 256 MiB) plus its header.
  const int64_t adapter_bytes = (int64_t{48} * 768 * rank + 2 * 768) * 4;
  o.max_upload_bytes = std::max(o.max_upload_bytes, adapter_bytes + (int64_t{1} << 20));
  o.max_client_bytes_per_round = 4 * o.max_upload_bytes;
  v1::RunConfig config = fedlora::testing::TestRunConfig(reps, clients, clients);
  auto server = Server::Create(o, config, BertBaseAdapter(rank));
  if (!server.ok()) {
    std::fprintf(stderr, "server: %s\n", server.status().ToString().c_str());
    _exit(1);
  }
  SinkService sink;
  grpc::ServerBuilder builder;
  int sink_port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &sink_port);
  builder.RegisterService(&sink);
  builder.SetMaxReceiveMessageSize(o.max_message_bytes);
  auto sink_server = builder.BuildAndStart();
  const std::string ports =
      std::to_string((*server)->port()) + " " + std::to_string(sink_port) + "\n";
  (void)!write(fd, ports.data(), ports.size());
  int sig = 0;
  sigwait(&set, &sig);
  _exit(0);
}

// Samples the child's RssAnon and RssFile (KiB, /proc/<pid>/status) every 2 ms until stopped and
// keeps the largest of each: VmHWM says how high RSS went, this says whether heap (decoded copies,
// accumulators) or mapped file pages (the blob being validated) put it there.
class RssSampler {
 public:
  explicit RssSampler(pid_t pid)
      : thread_([this, pid] {
          while (!stop_.load()) {
            std::ifstream in("/proc/" + std::to_string(pid) + "/status");
            std::string line;
            while (std::getline(in, line)) {
              if (line.rfind("RssAnon:", 0) == 0)
                anon_kb_ = std::max<int64_t>(anon_kb_, std::atoll(line.c_str() + 8));
              if (line.rfind("RssFile:", 0) == 0)
                file_kb_ = std::max<int64_t>(file_kb_, std::atoll(line.c_str() + 8));
            }
            if (start_anon_kb_ < 0) start_anon_kb_ = anon_kb_;
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
          }
        }) {}
  // Stops sampling; returns {peak RssAnon, peak RssFile} in KiB.
  std::pair<int64_t, int64_t> Stop() {
    stop_.store(true);
    thread_.join();
    return {anon_kb_, file_kb_};
  }
  // RssAnon at the first sample (KiB): what the server held before these uploads.
  int64_t start_anon_kb() const { return start_anon_kb_; }

 private:
  std::atomic<bool> stop_{false};
  int64_t anon_kb_ = 0, file_kb_ = 0, start_anon_kb_ = -1;
  std::thread thread_;  // last: starts after the fields above exist
};

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// The disk's side of the bound: the same blobs written concurrently to files in `dir` (1 MiB
// writes, then fdatasync), as the server must before it acknowledges. Seconds, or -1 on an error.
double DurableWriteSeconds(const std::string& dir, const std::vector<std::string>& blobs) {
  std::atomic<bool> ok{true};
  std::barrier start(static_cast<std::ptrdiff_t>(blobs.size()) + 1);
  std::vector<std::thread> t;
  for (size_t c = 0; c < blobs.size(); ++c) {
    t.emplace_back([&, c] {
      const std::string path = dir + "/disk-baseline-" + std::to_string(c);
      const int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0600);
      start.arrive_and_wait();
      if (fd < 0) {
        ok = false;
        return;
      }
      const std::string& b = blobs[c];
      for (size_t off = 0; off < b.size() && ok;) {
        const ssize_t n = ::write(fd, b.data() + off, std::min<size_t>(b.size() - off, 1 << 20));
        if (n <= 0) ok = false;
        off += n > 0 ? static_cast<size_t>(n) : 0;
      }
      if (::fdatasync(fd) != 0) ok = false;
      ::close(fd);
    });
  }
  start.arrive_and_wait();
  const auto t0 = std::chrono::steady_clock::now();
  for (auto& th : t) th.join();
  const double s = Seconds(std::chrono::steady_clock::now() - t0);
  for (size_t c = 0; c < blobs.size(); ++c)
    ::unlink((dir + "/disk-baseline-" + std::to_string(c)).c_str());
  return ok ? s : -1.0;
}

}  // namespace
}  // namespace fedlora

int main(int argc, char** argv) {
  using namespace fedlora;
  int clients = 8, reps = 3, rank = 8;
  if (argc > 1 && std::string(argv[1]) == "1gb") {
    clients = 1;
    reps = 2;
    rank = 6782;  // 1.000 GB of fp32 values, see the top of the file
    if (argc > 2) (void)absl::SimpleAtoi(argv[2], &reps);
  } else {
    if (argc > 1) (void)absl::SimpleAtoi(argv[1], &clients);
    if (argc > 2) (void)absl::SimpleAtoi(argv[2], &reps);
    if (argc > 3) (void)absl::SimpleAtoi(argv[3], &rank);
  }
  fedlora::testing::TempDir dir;
  int pipefd[2];
  if (pipe(pipefd) != 0) return 1;
  const pid_t child = fork();  // before any thread exists in this process
  if (child == 0) RunServers(pipefd[1], clients, reps, rank, dir.path());
  char buf[64] = {};
  if (read(pipefd[0], buf, sizeof(buf) - 1) <= 0) return 1;
  int port = 0, sink_port = 0;
  std::sscanf(buf, "%d %d", &port, &sink_port);
  const std::string address = "127.0.0.1:" + std::to_string(port);
  const std::string sink_address = "127.0.0.1:" + std::to_string(sink_port);

  const std::vector<UpdateTensor> initial = BertBaseAdapter(rank);
  std::vector<std::unique_ptr<fedlora::testing::RawClient>> raw;
  for (int c = 0; c < clients; ++c) {
    raw.push_back(
        std::make_unique<fedlora::testing::RawClient>(address, "bench-" + std::to_string(c)));
    if (!raw.back()->Join().ok()) return 1;
  }
  std::vector<double> ours, sink_times, disk_times;
  std::vector<UpdateTensor> expected = initial;
  int64_t blob_bytes = 0;
  int64_t ingest_rss_kb = 0;  // the server's peak RSS while the timed uploads ran
  int64_t ingest_anon_kb = 0, ingest_file_kb = 0;  // its peak heap and mapped-file parts (sampled)
  int64_t start_anon_kb = 0;                       // its heap when the uploads started
  bool valid = true;
  for (int rep = 1; rep <= reps; ++rep) {
    // Tasks for this round (not timed), then the encoded updates.
    std::vector<v1::TrainTask> tasks(clients);
    std::vector<std::string> blobs(clients);
    {
      std::vector<char> got(clients, 0);
      std::vector<std::thread> t;
      for (int c = 0; c < clients; ++c)
        t.emplace_back([&, c] { got[c] = raw[c]->GetTask(&tasks[c], 100); });
      for (auto& th : t) th.join();
      for (char g : got) valid &= g != 0;
    }
    for (int c = 0; c < clients; ++c)
      blobs[c] = *EncodeUpdate(DeltaOf(initial, c, tasks[c].round()), CodecOptions{});
    blob_bytes = static_cast<int64_t>(blobs[0].size());

    auto timed = [&](bool to_sink) {
      std::barrier start(clients + 1);
      std::atomic<int> accepted{0};
      std::vector<std::thread> t;
      std::vector<std::unique_ptr<fedlora::testing::RawClient>> sinks;
      for (int c = 0; c < clients; ++c)
        sinks.push_back(std::make_unique<fedlora::testing::RawClient>(sink_address, "sink"));
      for (int c = 0; c < clients; ++c) {
        t.emplace_back([&, c] {
          fedlora::testing::RawClient& rc = to_sink ? *sinks[c] : *raw[c];
          const std::string id =
              "b" + std::to_string(rep) + "-" + std::to_string(c) + (to_sink ? "s" : "");
          // Sealed as a client seals it, before the clock starts: both sides get the same bytes.
          v1::UploadHeader h = raw[c]->Header(tasks[c], blobs[c], id, 10 + c);
          const std::string wire = raw[c]->Wire(id, blobs[c]);
          raw[c]->ForgetSealed();
          start.arrive_and_wait();
          v1::UploadAck ack;
          if (rc.UploadAll(h, wire, &ack).ok() && ack.state() == v1::UPLOAD_STATE_ACCEPTED)
            ++accepted;
        });
      }
      start.arrive_and_wait();
      const auto t0 = std::chrono::steady_clock::now();
      for (auto& th : t) th.join();
      const double s = Seconds(std::chrono::steady_clock::now() - t0);
      valid &= accepted.load() == clients;
      return s;
    };
    sink_times.push_back(timed(true));
    disk_times.push_back(DurableWriteSeconds(dir.path(), blobs));
    valid &= disk_times.back() > 0;
    ResetPeakResident(child);
    RssSampler sampler(child);
    ours.push_back(timed(false));
    ingest_rss_kb = std::max(ingest_rss_kb, PeakResidentKib(child));
    const auto [anon_kb, file_kb] = sampler.Stop();
    ingest_anon_kb = std::max(ingest_anon_kb, anon_kb);
    ingest_file_kb = std::max(ingest_file_kb, file_kb);
    start_anon_kb = std::max(start_anon_kb, sampler.start_anon_kb());

    // Expected adapter after this round, computed directly.
    std::vector<TensorSpec> spec;
    for (const UpdateTensor& t : expected) spec.push_back({t.name, t.shape});
    auto avg = StreamingFedAvg::Create(spec);
    for (int c = 0; c < clients; ++c) (void)avg->Add(DeltaOf(initial, c, tasks[c].round()), 10 + c);
    auto fedavg = ServerOptimizer::Create({}, spec);  // plain FedAvg: the adapter becomes the mean
    (void)fedavg->Step(*avg->Finish(), expected);
  }
  // Validate: the final global adapter the server serves equals the direct computation.
  v1::WaitForTaskResponse fin;
  for (int i = 0; i < 100 && !fin.has_run_finished(); ++i) {
    fin.Clear();
    (void)raw[0]->WaitForTask(&fin, 1);
  }
  std::vector<v1::DownloadChunk> chunks;
  valid &= fin.has_run_finished() &&
           raw[0]->Download(fin.run_finished().final_adapter().sha256(), 0, &chunks).ok();
  std::string bytes;
  for (const auto& c : chunks) bytes += c.data();
  auto file = SafetensorsFile::FromBytes(bytes, "final");
  if (file.ok()) {
    for (const UpdateTensor& t : expected) {
      auto st = (*file)->Get(t.name);
      valid &= st.ok() && st->size == t.values.size() * 4 &&
               std::memcmp(st->data, t.values.data(), st->size) == 0;
    }
  } else {
    valid = false;
  }
  const int64_t rss_kb = PeakResidentKib(child);
  kill(child, SIGTERM);
  waitpid(child, nullptr, 0);
  if (!valid) {
    std::fprintf(stderr,
                 "VALIDATION FAILED: an upload was refused or the adapter differs from FedAvg\n");
    return 1;
  }
  // Report the median of the repetitions after the first (warm-up) when there is more than one: on
  // a shared, busy machine the best repetition flatters whichever side got a quiet moment, while the
  // median of the same repetitions is what a user sees. The ratio is the median of the per-rep
  // ratios (each rep times both sides back to back, so a load spike tends to hit both).
  const size_t first = ours.size() > 1 ? 1 : 0;
  auto median = [&](std::vector<double> v) {
    v.erase(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(first));
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  };
  std::vector<double> ratios;  // fedlora throughput / raw throughput, per rep
  for (size_t i = 0; i < ours.size(); ++i) ratios.push_back(sink_times[i] / ours[i]);
  // Against the slower of the raw stream and the durable write of the same bytes: a server that
  // acknowledges only durable updates cannot beat either.
  std::vector<double> bound_ratios;
  for (size_t i = 0; i < ours.size(); ++i)
    bound_ratios.push_back(std::max(sink_times[i], disk_times[i]) / ours[i]);
  const double mb = static_cast<double>(blob_bytes) * clients / 1e6;
  const double ours_s = median(ours), sink_s = median(sink_times);
  std::printf("validated: %d rounds x %d clients, final adapter bit-identical to direct FedAvg\n",
              reps, clients);
  std::printf("update: %.2f MB (BERT-base LoRA r=%d, fp32); %d concurrent uploads = %.2f MB\n",
              static_cast<double>(blob_bytes) / 1e6, rank, clients, mb);
  std::printf("median of reps %zu..%zu (rep 1 is warm-up%s):\n", first + 1, ours.size(),
              first == 0 ? " and the only one" : "");
  std::printf("fedlora server ingest: %8.2f ms  %8.1f MB/s  %6.3f GB/s\n", ours_s * 1e3,
              mb / ours_s, mb / ours_s / 1e3);
  std::printf("raw gRPC loopback:     %8.2f ms  %8.1f MB/s  %6.3f GB/s\n", sink_s * 1e3,
              mb / sink_s, mb / sink_s / 1e3);
  const double disk_s = median(disk_times);
  std::printf(
      "disk, write + fdatasync:%7.2f ms  %8.1f MB/s  %6.3f GB/s (the same bytes, as concurrent "
      "files)\n",
      disk_s * 1e3, mb / disk_s, mb / disk_s / 1e3);
  std::printf("per-rep fedlora throughput as %% of raw:");
  for (size_t i = 0; i < ratios.size(); ++i)
    std::printf(" %.0f%s", 100.0 * ratios[i], i < first ? " (warm-up)" : "");
  std::printf("\nratio: fedlora throughput = %.0f%% of raw (median per-rep ratio)\n",
              100.0 * median(ratios));
  std::printf(
      "ratio: fedlora throughput = %.0f%% of the slower of raw and disk (median per-rep ratio)\n",
      100.0 * median(bound_ratios));
  // The goal: peak RSS with the concurrent uploads at most 2x the model (one update) + 256 MiB.
  // Whole run: also start-up and aggregation, which hold several copies of the adapter.
  const double ingest_mib = static_cast<double>(ingest_rss_kb) / 1024.0;
  const double budget_mib = 2.0 * static_cast<double>(blob_bytes) / (1 << 20) + 256.0;
  std::printf(
      "server peak RSS during the uploads: %.1f MiB (budget 2 x update + 256 MiB = %.1f MiB: %s)\n",
      ingest_mib, budget_mib, ingest_mib <= budget_mib ? "within" : "OVER");
  std::printf(
      "  sampled every 2 ms, each its own peak: heap (RssAnon) %.1f MiB (%.1f MiB when the uploads "
      "started), "
      "mapped files (RssFile) %.1f MiB\n",
      static_cast<double>(ingest_anon_kb) / 1024.0, static_cast<double>(start_anon_kb) / 1024.0,
      static_cast<double>(ingest_file_kb) / 1024.0);
  std::printf("server peak RSS over the whole run: %.1f MiB\n",
              static_cast<double>(rss_kb) / 1024.0);
  return 0;
}
