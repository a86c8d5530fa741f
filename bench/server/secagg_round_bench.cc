// One federated round with secure aggregation against the same round in plaintext, through the real
// server (in process, loopback gRPC), in the same run.
//
//   server_secagg_round_bench [clients=100] [elements=1000000] [reps=3]
//
// Every client joins, takes its task and sends the same kind of update: `elements` fp32 values
// clipped to L2 norm 1 (aggregation.max_update_norm), weighted equally.
//   plain:  the update in the raw codec (4 bytes a value), sealed and uploaded; the server opens,
//           validates and averages the updates exactly.
//   secagg: SecAgg+ (privacy.secure_aggregation): key advertisement and sharing through the
//           SecureAggregation RPC, the masked fixed-point update (32-bit elements) sealed and
//           uploaded, the unmasking step; the server sums the masked inputs and removes the masks.
// Reported per mode (medians over the reps): the round's wall time from the first task request to
// the commit, with every client running on this machine's cores (on a real federation each client
// computes on its own machine; bench/crypto/secagg_bench.cc times one client's steps); the server's
// aggregation (from the round's last accepted upload to its commit, which for secagg includes the
// unmasking step's round trip); and the bytes one client sends and receives through the server's
// upload and SecureAggregation calls (the sealed update plus every protocol message).
// Before timing anything each round's committed adapter is checked against the mean of the
// clipped updates (exact for plain, within the fixed-point step for secagg).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "aggregation/fedavg.h"
#include "compression/codec.h"
#include "core/logging.h"
#include "server/server.h"
#include "tests/server/federation_test_util.h"
#include "tests/server/secagg_test_client.h"

namespace fedlora {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct BenchRound {
  double round_s = 0;
  double aggregation_s = 0;
  double bytes_per_client = 0;  // mean
  bool valid = false;
};

// Client k's update: a deterministic pattern with norm above 1, so that clipping is exercised.
std::vector<NamedTensor> DeltaOf(int k, int64_t elements) {
  NamedTensor t{
      "adapter.lora_A.weight", {elements}, std::vector<float>(static_cast<size_t>(elements))};
  for (int64_t i = 0; i < elements; ++i) {
    t.values[static_cast<size_t>(i)] =
        static_cast<float>(((i * 7919 + k * 104729) % 2001) - 1000) * 4e-6f;
  }
  return {std::move(t)};
}

BenchRound RunRound(bool secagg, int clients, int64_t elements) {
  testing::TempDir dir;
  v1::RunConfig config = testing::TestRunConfig(1, clients, 3);
  config.mutable_aggregation()->set_max_update_norm(1.0);
  config.mutable_aggregation()->set_weight_by_examples(false);
  config.mutable_privacy()->set_secure_aggregation(secagg);
  ServerOptions o = testing::TestServerOptions(dir.path());
  o.chunk_bytes = 1 << 20;
  o.max_upload_chunk_bytes = 1 << 20;
  o.upload_sync_bytes = 8 << 20;
  o.round_deadline_ms = 600'000;
  o.heartbeat_timeout_ms = 600'000;
  o.selection_window_ms = 600'000;
  o.expected_clients = clients;
  std::vector<UpdateTensor> initial = {
      {"adapter.lora_A.weight", {elements}, std::vector<float>(static_cast<size_t>(elements))}};
  auto server = Server::Create(o, config, initial, nullptr);
  if (!server.ok()) {
    std::fprintf(stderr, "server: %s\n", server.status().ToString().c_str());
    return {};
  }
  std::vector<std::unique_ptr<testing::RawClient>> raw;
  for (int k = 0; k < clients; ++k) {
    raw.push_back(
        std::make_unique<testing::RawClient>((*server)->address(), absl::StrCat("site-", k)));
    if (!raw.back()->Join().ok()) return {};
  }
  std::atomic<int64_t> bytes{0};
  std::atomic<int64_t> last_ack_ns{0};
  const Clock::time_point t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int k = 0; k < clients; ++k) {
    threads.emplace_back([&, k] {
      testing::RawClient& c = *raw[k];
      v1::TrainTask task;
      if (!c.GetTask(&task, 600)) return;
      const std::vector<NamedTensor> delta = DeltaOf(k, elements);
      const std::string upload_id = absl::StrCat("u", k);
      if (secagg) {
        testing::SecAggTraffic traffic;
        testing::RunSecAggClient(c, task, delta, upload_id, testing::SecAggDrop::kNone, true,
                                 &traffic);
        bytes += traffic.sent + traffic.received;
      } else {
        std::vector<UpdateTensor> update = {{delta[0].name, delta[0].shape, delta[0].values}};
        absl::StatusOr<std::string> plain = EncodeUpdate(update, CodecOptions{});
        v1::UploadAck ack;
        if (!plain.ok() || !c.UploadAll(c.Header(task, *plain, upload_id), *plain, &ack).ok() ||
            ack.state() != v1::UPLOAD_STATE_ACCEPTED) {
          return;
        }
      }
      last_ack_ns = std::max<int64_t>(
          last_ack_ns.load(),
          std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
              .count());
    });
  }
  for (std::thread& t : threads) t.join();
  while ((*server)->coordinator().rounds_committed() < 1 && Seconds(t0, Clock::now()) < 900) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const Clock::time_point t1 = Clock::now();
  BenchRound r;
  r.round_s = Seconds(t0, t1);
  r.aggregation_s = Seconds(Clock::time_point(std::chrono::nanoseconds(last_ack_ns.load())), t1);
  const int64_t up = (*server)->metrics().upload_bytes.load();
  r.bytes_per_client = static_cast<double>(up + bytes.load()) / clients;
  // Validity: the committed adapter is the mean of the clipped updates.
  if ((*server)->coordinator().rounds_committed() == 1) {
    std::vector<double> mean(static_cast<size_t>(elements), 0.0);
    for (int k = 0; k < clients; ++k) {
      std::vector<NamedTensor> d = DeltaOf(k, elements);
      std::vector<UpdateTensor> u = {{d[0].name, d[0].shape, d[0].values}};
      ClipUpdateNorm(u, 1.0);
      for (size_t i = 0; i < mean.size(); ++i)
        mean[i] += u[0].values[i] / static_cast<double>(clients);
    }
    const std::vector<UpdateTensor> global = (*server)->coordinator().global_adapter();
    double worst = 0;
    for (size_t i = 0; i < mean.size(); ++i)
      worst = std::max(worst, std::abs(global[0].values[i] - mean[i]));
    r.valid = worst < (secagg ? 1e-6 : 1e-9);
    if (!r.valid)
      std::fprintf(stderr, "%s: the committed adapter is off by %g\n", secagg ? "secagg" : "plain",
                   worst);
  }
  (*server)->Shutdown();
  return r;
}

}  // namespace
}  // namespace fedlora

int main(int argc, char** argv) {
  int clients = 100, reps = 3;
  int64_t elements = 1'000'000;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    int64_t n = 0;
    if (eq == std::string::npos || !absl::SimpleAtoi(arg.substr(eq + 1), &n) || n < 1) {
      std::fprintf(stderr, "usage: %s [clients=100] [elements=1000000] [reps=3]\n", argv[0]);
      return 1;
    }
    const std::string key = arg.substr(0, eq);
    if (key == "clients")
      clients = static_cast<int>(n);
    else if (key == "elements")
      elements = n;
    else if (key == "reps")
      reps = static_cast<int>(n);
    else {
      std::fprintf(stderr, "unknown argument %s\n", arg.c_str());
      return 1;
    }
  }
  fedlora::SetLogLevel(fedlora::LogLevel::kWarning);
  std::vector<double> round[2], agg[2], bytes[2];
  for (int rep = 0; rep < reps; ++rep) {
    for (int mode = 0; mode < 2; ++mode) {  // alternating, so both see the same machine load
      const fedlora::BenchRound r = fedlora::RunRound(mode == 1, clients, elements);
      if (!r.valid) {
        std::fprintf(stderr, "rep %d %s: invalid round\n", rep, mode == 1 ? "secagg" : "plain");
        return 2;
      }
      round[mode].push_back(r.round_s);
      agg[mode].push_back(r.aggregation_s);
      bytes[mode].push_back(r.bytes_per_client);
      std::fprintf(stderr, "rep %d %-6s round %.2f s, aggregation %.2f s, %.0f bytes per client\n",
                   rep, mode == 1 ? "secagg" : "plain", r.round_s, r.aggregation_s,
                   r.bytes_per_client);
    }
  }
  using fedlora::Median;
  std::printf("secure aggregation round: %d clients, %lld-element updates, median of %d reps\n",
              clients, static_cast<long long>(elements), reps);
  std::printf("| mode | round s | aggregation s | bytes per client |\n| --- | --- | --- | --- |\n");
  std::printf("| plain | %.2f | %.2f | %.0f |\n", Median(round[0]), Median(agg[0]),
              Median(bytes[0]));
  std::printf("| secagg | %.2f | %.2f | %.0f |\n", Median(round[1]), Median(agg[1]),
              Median(bytes[1]));
  std::printf("| secagg / plain | %.2fx | %.2fx | %.3fx |\n", Median(round[1]) / Median(round[0]),
              Median(agg[1]) / Median(agg[0]), Median(bytes[1]) / Median(bytes[0]));
  return 0;
}
