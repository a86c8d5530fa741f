// SecAgg+ in process, one thread: each client's time per step, the server's unmasking (Finish) with 0%
// and 10% of clients dropped before upload, and the bytes each client sends and receives, against a
// baseline measured in the same run: the plain sum of the n uint32 vectors (the server's work
// without secure aggregation) and the 4 L plaintext bytes of one upload.
//
//   crypto_secagg_bench           # 100 clients, L = 1,000,000, m = 32, recommended degree (k = 20)
//   crypto_secagg_bench --quick   # 20 clients, L = 100,000
//
// Napkin math: a client expands k + 1 masks of L words (4 bytes each for m <= 32) with AES-256-CTR,
// (k + 1) 4 L bytes = 84 MB for k = 20, L = 10^6: ~20 ms at ~4 GB/s with AES-NI, plus one add per
// word; everything else (2k X25519, 2 Shamir splits of degree t - 1 for k neighbours) is ~1-2 ms.
// The server's Finish expands one mask per survivor plus one per (dropped, surviving neighbour)
// pair, so its cost grows with dropouts; the plain sum reads each of the n L words once.
//
// Validation before the figures are printed: both rounds' unmasked sums equal the plaintext sums
// bit for bit; the bench exits 1 otherwise.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "crypto/secagg.h"

namespace fedlora::crypto {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point a) {
  return std::chrono::duration<double>(Clock::now() - a).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct Options {
  uint32_t clients = 100;
  uint64_t length = 1000000;
  uint32_t modulus_bits = 32;
};

struct ClientTimes {
  std::vector<double> advertise, share, masked, unmask;
};

struct RoundResult {
  bool ok = false;
  double receive_masked_s = 0;  // the server's unpack + add of every masked input
  double finish_s = 0;
  uint32_t survivors = 0, dropped = 0;
  ClientTimes times;
  std::vector<double> up_bytes, down_bytes;  // per client that finished the round
};

#define BENCH_CHECK(expr)                                                             \
  do {                                                                                \
    auto _s = (expr);                                                                 \
    if (!_s.ok()) {                                                                   \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, _s.ToString().c_str()); \
      return r;                                                                       \
    }                                                                                 \
  } while (0)

RoundResult RunRound(const Options& o, const std::vector<std::vector<uint32_t>>& plain,
                     const std::set<uint32_t>& drop, uint64_t round_id) {
  RoundResult r;
  SecAggConfig config;
  config.round_id = round_id;
  config.num_clients = o.clients;
  config.vector_length = o.length;
  config.modulus_bits = o.modulus_bits;
  auto params = NewSecAggParams(config);
  BENCH_CHECK(params.status());
  auto server = SecAggServer::Create(*params);
  BENCH_CHECK(server.status());
  std::vector<std::optional<SecAggClient>> clients;
  std::vector<double> up(o.clients, 0), down(o.clients, 0);
  for (uint32_t i = 0; i < o.clients; ++i) {
    auto c = SecAggClient::Create(*params, i);
    BENCH_CHECK(c.status());
    clients.emplace_back(*std::move(c));
  }
  for (uint32_t i = 0; i < o.clients; ++i) {
    const auto a = Clock::now();
    auto m = clients[i]->AdvertiseKeys();
    r.times.advertise.push_back(Since(a));
    BENCH_CHECK(m.status());
    up[i] += m->ByteSizeLong();
    BENCH_CHECK(server->ReceiveAdvertiseKeys(*m));
  }
  BENCH_CHECK(server->CloseAdvertiseKeys());
  for (uint32_t i = 0; i < o.clients; ++i) {
    auto req = server->ShareKeysRequest(i);
    BENCH_CHECK(req.status());
    down[i] += req->ByteSizeLong() + params->ByteSizeLong();
    const auto a = Clock::now();
    auto m = clients[i]->ShareKeys(*req);
    r.times.share.push_back(Since(a));
    BENCH_CHECK(m.status());
    up[i] += m->ByteSizeLong();
    BENCH_CHECK(server->ReceiveShareKeys(*m));
  }
  BENCH_CHECK(server->CloseShareKeys());
  std::vector<uint64_t> input(o.length);
  std::vector<uint64_t> expected(o.length, 0);
  for (uint32_t i = 0; i < o.clients; ++i) {
    if (drop.contains(i)) continue;
    auto req = server->MaskedInputRequest(i);
    BENCH_CHECK(req.status());
    down[i] += req->ByteSizeLong();
    for (uint64_t q = 0; q < o.length; ++q) {
      input[q] = plain[i][q];
      expected[q] += plain[i][q];
    }
    const auto a = Clock::now();
    auto m = clients[i]->MaskedInput(*req, input);
    r.times.masked.push_back(Since(a));
    BENCH_CHECK(m.status());
    up[i] += m->ByteSizeLong();
    const auto b = Clock::now();
    BENCH_CHECK(server->ReceiveMaskedInput(*m));
    r.receive_masked_s += Since(b);
  }
  BENCH_CHECK(server->CloseMaskedInput());
  auto unmask = server->UnmaskingRequest();
  BENCH_CHECK(unmask.status());
  for (uint32_t i : server->survivors()) {
    down[i] += unmask->ByteSizeLong();
    const auto a = Clock::now();
    auto m = clients[i]->Unmask(*unmask);
    r.times.unmask.push_back(Since(a));
    BENCH_CHECK(m.status());
    up[i] += m->ByteSizeLong();
    BENCH_CHECK(server->ReceiveUnmasking(*m));
  }
  const auto a = Clock::now();
  auto sum = server->Finish();
  r.finish_s = Since(a);
  BENCH_CHECK(sum.status());
  const uint64_t mask = o.modulus_bits == 64 ? ~uint64_t{0} : (uint64_t{1} << o.modulus_bits) - 1;
  for (uint64_t q = 0; q < o.length; ++q) {
    if ((*sum)[q] != (expected[q] & mask)) {
      std::fprintf(stderr, "round %llu: unmasked sum differs from the plaintext sum at %llu\n",
                   static_cast<unsigned long long>(round_id), static_cast<unsigned long long>(q));
      return r;
    }
  }
  for (uint32_t i : server->survivors()) {
    r.up_bytes.push_back(up[i]);
    r.down_bytes.push_back(down[i]);
  }
  r.survivors = static_cast<uint32_t>(server->survivors().size());
  r.dropped = static_cast<uint32_t>(drop.size());
  r.ok = true;
  return r;
}

int Main(const Options& o) {
  std::printf("SecAgg+ bench: %u clients, L = %llu, m = %u, degree %u, threshold %u, 1 thread\n",
              o.clients, static_cast<unsigned long long>(o.length), o.modulus_bits,
              RecommendedSecAggDegree(o.clients),
              RecommendedSecAggThreshold(RecommendedSecAggDegree(o.clients)));
  std::vector<std::vector<uint32_t>> plain(o.clients, std::vector<uint32_t>(o.length));
  std::mt19937 gen(7);
  for (auto& v : plain) {
    for (uint32_t& x : v) x = gen();
  }

  // Baseline: the plain sum of n vectors of L uint32 (median of 3).
  std::vector<double> base;
  std::vector<uint32_t> acc(o.length);
  for (int rep = 0; rep < 3; ++rep) {
    std::fill(acc.begin(), acc.end(), 0);
    const auto a = Clock::now();
    for (const auto& v : plain) {
      for (uint64_t q = 0; q < o.length; ++q) acc[q] += v[q];
    }
    base.push_back(Since(a));
  }
  const double baseline_s = Median(base);
  volatile uint32_t sink = acc[o.length / 2];
  (void)sink;

  RoundResult full = RunRound(o, plain, {}, 1);
  if (!full.ok) return 1;
  const uint32_t drop_count = o.clients / 10;
  // Retry with other dropout sets if one leaves a survivor short of neighbours (rare at 10%).
  RoundResult partial;
  std::mt19937 pick(3);
  for (int attempt = 0; attempt < 5 && !partial.ok; ++attempt) {
    std::vector<uint32_t> all(o.clients);
    for (uint32_t i = 0; i < o.clients; ++i) all[i] = i;
    std::shuffle(all.begin(), all.end(), pick);
    partial =
        RunRound(o, plain, std::set<uint32_t>(all.begin(), all.begin() + drop_count), 2 + attempt);
  }
  if (!partial.ok) return 1;
  std::printf("validated: both unmasked sums equal the plaintext sums bit for bit\n\n");

  auto ms = [](double s) { return s * 1e3; };
  std::printf("| client step (no dropouts) | median ms | max ms |\n| --- | --- | --- |\n");
  auto row = [&](const char* name, const std::vector<double>& v) {
    std::printf("| %s | %.2f | %.2f |\n", name, ms(Median(v)),
                ms(*std::max_element(v.begin(), v.end())));
  };
  std::vector<double> share_masked;
  for (size_t i = 0; i < full.times.share.size(); ++i) {
    share_masked.push_back(full.times.share[i] + full.times.masked[i]);
  }
  row("AdvertiseKeys", full.times.advertise);
  row("ShareKeys", full.times.share);
  row("MaskedInput", full.times.masked);
  row("ShareKeys + MaskedInput", share_masked);
  row("Unmask", full.times.unmask);

  std::printf("\n| server work | ms | / plain sum |\n| --- | --- | --- |\n");
  std::printf("| plain sum of %u x L uint32 (baseline) | %.1f | 1.00 |\n", o.clients,
              ms(baseline_s));
  std::printf("| receive %u masked inputs (unpack + add) | %.1f | %.2f |\n", full.survivors,
              ms(full.receive_masked_s), full.receive_masked_s / baseline_s);
  std::printf("| Finish, 0%% dropped (%u survivors) | %.1f | %.2f |\n", full.survivors,
              ms(full.finish_s), full.finish_s / baseline_s);
  std::printf("| Finish, %u%% dropped before upload (%u survivors) | %.1f | %.2f |\n",
              100 * partial.dropped / o.clients, partial.survivors, ms(partial.finish_s),
              partial.finish_s / baseline_s);

  const double plain_bytes = 4.0 * static_cast<double>(o.length);
  const double up = Median(full.up_bytes), down = Median(full.down_bytes);
  std::printf(
      "\n| bytes per client (median, no dropouts) | bytes | / plaintext 4 L |\n| --- | --- | --- "
      "|\n");
  std::printf("| plaintext upload (baseline) | %.0f | 1.0000 |\n", plain_bytes);
  std::printf("| sent (keys, shares, masked input, unmask) | %.0f | %.4f |\n", up,
              up / plain_bytes);
  std::printf("| received (params, keys, shares, lists) | %.0f | %.4f |\n", down,
              down / plain_bytes);
  std::printf("| all messages | %.0f | %.4f |\n", up + down, (up + down) / plain_bytes);
  return 0;
}

}  // namespace
}  // namespace fedlora::crypto

int main(int argc, char** argv) {
  fedlora::crypto::Options o;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      o.clients = 20;
      o.length = 100000;
    } else {
      std::fprintf(stderr, "usage: %s [--quick]\n", argv[0]);
      return 2;
    }
  }
  return fedlora::crypto::Main(o);
}
