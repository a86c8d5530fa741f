// SecAgg+ end to end: exact sums under dropouts at every step, aborts that reveal nothing, clients that
// refuse a lying server, what a curious server can and cannot compute from a whole transcript, and
// the parameters, graph, derivations and fixed-point helpers. Expected sums are computed here from
// the plaintext inputs; derivations are recomputed from their documented definitions.
#include "crypto/secagg.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "crypto/envelope.h"
#include "crypto/prg.h"
#include "crypto/random.h"
#include "crypto/secagg_fixed_point.h"
#include "crypto/shamir.h"
#include "gtest/gtest.h"

namespace fedlora::crypto {
namespace {

using ::absl::StatusCode;

uint64_t Mask(uint32_t m) { return m == 64 ? ~uint64_t{0} : (uint64_t{1} << m) - 1; }

std::string U64Le(uint64_t v) {
  std::string s;
  for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>(v >> (8 * i)));
  return s;
}
std::string U32Le(uint32_t v) {
  std::string s;
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>(v >> (8 * i)));
  return s;
}

// PRG(seed) as documented in secagg.h: AES-256-CTR keystream (crypto::Prg, stream 0) read as 4-byte
// little-endian words for m <= 32 and 8-byte words otherwise, reduced mod 2^m.
std::vector<uint64_t> ExpandMask(const std::string& seed, size_t length, uint32_t m) {
  auto prg = Prg::Create(seed, 0);
  EXPECT_TRUE(prg.ok());
  const size_t word = m <= 32 ? 4 : 8;
  std::string bytes(length * word, '\0');
  EXPECT_TRUE(prg->Fill(bytes.data(), bytes.size()).ok());
  std::vector<uint64_t> out(length);
  for (size_t i = 0; i < length; ++i) {
    uint64_t w = 0;
    for (size_t b = word; b-- > 0;) w = (w << 8) | static_cast<unsigned char>(bytes[i * word + b]);
    out[i] = w & Mask(m);
  }
  return out;
}

v1::SecAggParams Params(uint32_t n, uint32_t k, uint32_t t, uint32_t min_survivors, uint64_t length,
                        uint32_t m, uint64_t round_id = 1) {
  SecAggConfig c;
  c.round_id = round_id;
  c.num_clients = n;
  c.degree = k;
  c.threshold = t;
  c.min_survivors = min_survivors;
  c.vector_length = length;
  c.modulus_bits = m;
  auto p = NewSecAggParams(c);
  EXPECT_TRUE(p.ok()) << p.status();
  return *p;
}

std::vector<std::vector<uint64_t>> RandomInputs(uint32_t n, uint64_t length, uint32_t m,
                                                uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::vector<std::vector<uint64_t>> x(n, std::vector<uint64_t>(length));
  for (auto& v : x) {
    for (uint64_t& e : v) e = gen() & Mask(m);
  }
  return x;
}

struct Dropouts {
  std::set<uint32_t> no_keys;        // never advertise: not in U1
  std::set<uint32_t> before_share;   // advertise, then vanish: U1 \ U2
  std::set<uint32_t> before_upload;  // share keys, never send the masked input: U2 \ U3
  std::set<uint32_t> silent;         // upload, never answer unmasking: in U3
};

// One round with its whole transcript: everything the server sees.
struct Round {
  v1::SecAggParams params;
  std::vector<std::vector<uint64_t>> inputs;
  std::vector<std::optional<SecAggClient>> clients;
  std::optional<SecAggServer> server;
  std::map<uint32_t, v1::SecAggAdvertiseKeys> advertised;
  std::map<uint32_t, v1::SecAggShareKeysRequest> share_requests;
  std::map<uint32_t, v1::SecAggShareKeysResponse> share_responses;
  std::map<uint32_t, v1::SecAggMaskedInputRequest> masked_requests;
  std::map<uint32_t, v1::SecAggMaskedInputResponse> masked_responses;
  v1::SecAggUnmaskingRequest unmask_request;
  std::map<uint32_t, v1::SecAggUnmaskingResponse> unmask_responses;
  absl::StatusOr<std::vector<uint64_t>> result = absl::UnknownError("not finished");
};

// Steps 0 to 2 and the unmasking request, with every Close; asserts the honest path succeeds.
void RunToUnmasking(Round& r, const Dropouts& d) {
  const uint32_t n = r.params.num_clients();
  auto server = SecAggServer::Create(r.params);
  ASSERT_TRUE(server.ok()) << server.status();
  r.server.emplace(*std::move(server));
  r.clients.clear();
  for (uint32_t i = 0; i < n; ++i) {
    auto c = SecAggClient::Create(r.params, i);
    ASSERT_TRUE(c.ok()) << c.status();
    r.clients.emplace_back(*std::move(c));
  }
  for (uint32_t i = 0; i < n; ++i) {
    if (d.no_keys.contains(i)) continue;
    auto m = r.clients[i]->AdvertiseKeys();
    ASSERT_TRUE(m.ok()) << m.status();
    r.advertised[i] = *m;
    ASSERT_TRUE(r.server->ReceiveAdvertiseKeys(*m).ok());
  }
  ASSERT_TRUE(r.server->CloseAdvertiseKeys().ok());
  for (uint32_t i : r.server->advertised()) {
    if (d.before_share.contains(i)) continue;
    auto req = r.server->ShareKeysRequest(i);
    ASSERT_TRUE(req.ok()) << req.status();
    r.share_requests[i] = *req;
    auto m = r.clients[i]->ShareKeys(*req);
    ASSERT_TRUE(m.ok()) << m.status();
    r.share_responses[i] = *m;
    absl::Status st = r.server->ReceiveShareKeys(*m);
    ASSERT_TRUE(st.ok()) << st;
  }
  ASSERT_TRUE(r.server->CloseShareKeys().ok());
  for (uint32_t i : r.server->shared_keys()) {
    if (d.before_upload.contains(i)) continue;
    auto req = r.server->MaskedInputRequest(i);
    ASSERT_TRUE(req.ok()) << req.status();
    r.masked_requests[i] = *req;
    auto m = r.clients[i]->MaskedInput(*req, r.inputs[i]);
    ASSERT_TRUE(m.ok()) << m.status();
    r.masked_responses[i] = *m;
    absl::Status st = r.server->ReceiveMaskedInput(*m);
    ASSERT_TRUE(st.ok()) << st;
  }
  absl::Status closed = r.server->CloseMaskedInput();
  ASSERT_TRUE(closed.ok()) << closed;
  auto req = r.server->UnmaskingRequest();
  ASSERT_TRUE(req.ok()) << req.status();
  r.unmask_request = *req;
}

// Step 3 from every survivor but the silent ones, then Finish into r.result.
void AnswerAndFinish(Round& r, const Dropouts& d) {
  for (uint32_t i : r.server->survivors()) {
    if (d.silent.contains(i)) continue;
    auto m = r.clients[i]->Unmask(r.unmask_request);
    ASSERT_TRUE(m.ok()) << m.status();
    r.unmask_responses[i] = *m;
    absl::Status st = r.server->ReceiveUnmasking(*m);
    ASSERT_TRUE(st.ok()) << st;
  }
  r.result = r.server->Finish();
}

std::set<uint32_t> ExpectedSurvivors(uint32_t n, const Dropouts& d) {
  std::set<uint32_t> s;
  for (uint32_t i = 0; i < n; ++i) {
    if (!d.no_keys.contains(i) && !d.before_share.contains(i) && !d.before_upload.contains(i))
      s.insert(i);
  }
  return s;
}

std::vector<uint64_t> PlainSum(const std::vector<std::vector<uint64_t>>& x,
                               const std::set<uint32_t>& who, uint32_t m) {
  std::vector<uint64_t> sum(x[0].size(), 0);
  for (uint32_t i : who) {
    for (size_t q = 0; q < sum.size(); ++q) sum[q] = (sum[q] + x[i][q]) & Mask(m);
  }
  return sum;
}

// Runs a whole round and checks the unmasked sum bit for bit against the plaintext sum.
void ExpectExactSum(const v1::SecAggParams& params, const Dropouts& d, uint64_t input_seed) {
  Round r;
  r.params = params;
  r.inputs =
      RandomInputs(params.num_clients(), params.vector_length(), params.modulus_bits(), input_seed);
  ASSERT_NO_FATAL_FAILURE(RunToUnmasking(r, d));
  ASSERT_NO_FATAL_FAILURE(AnswerAndFinish(r, d));
  ASSERT_TRUE(r.result.ok()) << r.result.status();
  const std::set<uint32_t> survivors = ExpectedSurvivors(params.num_clients(), d);
  EXPECT_EQ(r.server->survivors(), std::vector<uint32_t>(survivors.begin(), survivors.end()));
  const std::vector<uint64_t> expected = PlainSum(r.inputs, survivors, params.modulus_bits());
  ASSERT_EQ(r.result->size(), expected.size());
  size_t mismatches = 0;
  for (size_t q = 0; q < expected.size(); ++q) mismatches += (*r.result)[q] != expected[q];
  EXPECT_EQ(mismatches, 0u);
  // The server rebuilt exactly the survivors' seeds and the mask keys of dropped clients.
  EXPECT_EQ(r.server->reconstructed_self_mask_seeds().size(), survivors.size());
  EXPECT_LE(r.server->reconstructed_mask_private_keys().size(), d.before_upload.size());
}

// Nine of 20 clients (45%) evenly spread, at the given ring positions' complement.
std::set<uint32_t> EveryOther(uint32_t n, uint32_t count) {
  std::set<uint32_t> s;
  for (uint32_t q = 0; q < count; ++q) s.insert(2 * q + 1);
  EXPECT_LE(2 * count, n);
  return s;
}

// ---------------------------------------------------------------------------------------------
// Correct sums under dropouts.

class SecAggModulus : public ::testing::TestWithParam<uint32_t> {};

TEST_P(SecAggModulus, CompleteGraph45PercentDropAfterUpload) {
  const uint32_t m = GetParam();
  Dropouts d;
  d.silent = EveryOther(20, 9);  // send masked inputs, never answer unmasking
  ExpectExactSum(Params(20, 19, 10, 10, 10000, m), d, 1);
}

TEST_P(SecAggModulus, CompleteGraph45PercentDropBeforeUpload) {
  const uint32_t m = GetParam();
  Dropouts d;
  d.before_upload = EveryOther(20, 9);  // share keys, never send masked inputs
  ExpectExactSum(Params(20, 19, 10, 10, 10000, m), d, 2);
}

// With t > k/2 each client needs more than half its neighbours to answer, so 45% dropouts on a sparse
// graph need k >= 22: 40 clients, k = 30, t = 16, 18 dropouts (45%) spread evenly around the ring.
std::set<uint32_t> SpreadOnRing(const v1::SecAggParams& params, uint32_t keep) {
  auto graph = SecAggGraph::Create(params);
  EXPECT_TRUE(graph.ok());
  const uint32_t n = params.num_clients();
  std::set<uint32_t> kept_positions;
  for (uint32_t q = 0; q < keep; ++q) kept_positions.insert(q * n / keep);
  std::set<uint32_t> dropped;
  for (uint32_t p = 0; p < n; ++p) {
    if (!kept_positions.contains(p)) dropped.insert(graph->ClientAt(p));
  }
  return dropped;
}

TEST_P(SecAggModulus, SparseGraph45PercentDropAfterUpload) {
  const v1::SecAggParams params = Params(40, 30, 16, 16, 10000, GetParam());
  Dropouts d;
  d.silent = SpreadOnRing(params, 22);
  ASSERT_EQ(d.silent.size(), 18u);
  ExpectExactSum(params, d, 3);
}

TEST_P(SecAggModulus, SparseGraph45PercentDropBeforeUpload) {
  const v1::SecAggParams params = Params(40, 30, 16, 16, 10000, GetParam());
  Dropouts d;
  d.before_upload = SpreadOnRing(params, 22);
  ExpectExactSum(params, d, 4);
}

// Dropouts at every step at once on a 20-client graph of degree 10, t = 6: four clients in all, so
// whatever the graph every client keeps at least k - 4 = t answering neighbours.
TEST_P(SecAggModulus, SparseGraphDropoutsAtEveryStep) {
  Dropouts d;
  d.no_keys = {2};
  d.before_share = {5};
  d.before_upload = {11};
  d.silent = {17};
  ExpectExactSum(Params(20, 10, 6, 6, 10000, GetParam()), d, 5);
}

TEST_P(SecAggModulus, NoDropouts) {
  ExpectExactSum(Params(7, 4, 3, 3, 1000, GetParam()), Dropouts{}, 6);
}

INSTANTIATE_TEST_SUITE_P(Bits, SecAggModulus, ::testing::Values(32u, 64u));

TEST(SecAgg, OddModulusAndTinyRound) {
  for (uint32_t m : {1u, 7u, 13u, 33u, 63u})
    ExpectExactSum(Params(3, 2, 2, 2, 257, m), Dropouts{}, m);
  Dropouts d;
  d.before_upload = {4};
  ExpectExactSum(Params(6, 5, 3, 3, 100, 12), d, 9);
}

// ---------------------------------------------------------------------------------------------
// Aborts reveal nothing.

TEST(SecAgg, TooFewSurvivorsAbortsBeforeUnmasking) {
  const v1::SecAggParams params = Params(20, 19, 10, 10, 1000, 32);
  Round r;
  r.inputs = RandomInputs(20, 1000, 32, 7);
  Dropouts d;
  for (uint32_t i = 0; i < 11; ++i) d.before_upload.insert(i);  // 9 survivors < t = 10
  // Run by hand (RunToUnmasking asserts success): CloseMaskedInput must abort.
  auto server = SecAggServer::Create(params);
  ASSERT_TRUE(server.ok());
  std::vector<std::optional<SecAggClient>> clients;
  for (uint32_t i = 0; i < 20; ++i) clients.emplace_back(*SecAggClient::Create(params, i));
  for (uint32_t i = 0; i < 20; ++i)
    ASSERT_TRUE(server->ReceiveAdvertiseKeys(*clients[i]->AdvertiseKeys()).ok());
  ASSERT_TRUE(server->CloseAdvertiseKeys().ok());
  for (uint32_t i = 0; i < 20; ++i) {
    ASSERT_TRUE(
        server->ReceiveShareKeys(*clients[i]->ShareKeys(*server->ShareKeysRequest(i))).ok());
  }
  ASSERT_TRUE(server->CloseShareKeys().ok());
  for (uint32_t i = 0; i < 20; ++i) {
    if (d.before_upload.contains(i)) continue;
    ASSERT_TRUE(server
                    ->ReceiveMaskedInput(
                        *clients[i]->MaskedInput(*server->MaskedInputRequest(i), r.inputs[i]))
                    .ok());
  }
  absl::Status closed = server->CloseMaskedInput();
  EXPECT_EQ(closed.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(closed.message(), "min_survivors")) << closed;
  EXPECT_TRUE(server->aborted());
  EXPECT_EQ(server->UnmaskingRequest().status().code(), StatusCode::kFailedPrecondition);
  auto finished = server->Finish();
  EXPECT_EQ(finished.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(server->reconstructed_self_mask_seeds().empty());
  EXPECT_TRUE(server->reconstructed_mask_private_keys().empty());
}

TEST(SecAgg, TooFewUnmaskingAnswersAbortsWithNothingReconstructed) {
  Round r;
  r.params = Params(20, 19, 10, 10, 1000, 32);
  r.inputs = RandomInputs(20, 1000, 32, 8);
  Dropouts d;
  d.before_upload = {0, 1};  // two dropped clients whose mask keys would be rebuilt
  for (uint32_t i = 2; i < 11; ++i) d.silent.insert(i);  // 9 of 18 survivors answer: < t = 10
  ASSERT_NO_FATAL_FAILURE(RunToUnmasking(r, d));
  ASSERT_NO_FATAL_FAILURE(AnswerAndFinish(r, d));
  EXPECT_EQ(r.server->unmasking_responders().size(), 9u);  // their shares were accepted...
  ASSERT_FALSE(r.result.ok());
  EXPECT_EQ(r.result.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(r.result.status().message(), "fewer than the threshold"))
      << r.result.status();
  EXPECT_TRUE(r.server->aborted());
  // ...but no b and no s was rebuilt, and the round is over.
  EXPECT_TRUE(r.server->reconstructed_self_mask_seeds().empty());
  EXPECT_TRUE(r.server->reconstructed_mask_private_keys().empty());
  EXPECT_EQ(r.server->Finish().status().code(), StatusCode::kFailedPrecondition);
  // The nine shares of silent survivor 5's b (t = 10) do not give b: too few, as Shamir promises.
  std::vector<ShamirShare> shares;
  for (const auto& [responder, msg] : r.unmask_responses) {
    for (const auto& s : msg.shares()) {
      if (s.owner() == 5) shares.push_back({responder + 1, s.share()});
    }
  }
  ASSERT_EQ(shares.size(), 9u);
  EXPECT_FALSE(ShamirCombine(shares, 10).ok());
}

// ---------------------------------------------------------------------------------------------
// A lying server: honest clients refuse.

TEST(SecAgg, ClientsRefuseInconsistentUnmaskingRequests) {
  Round r;
  r.params = Params(20, 10, 6, 6, 1000, 32);
  r.inputs = RandomInputs(20, 1000, 32, 10);
  Dropouts d;
  d.before_share = {3};      // in U1, not U2
  d.before_upload = {7, 8};  // in U2, not U3
  ASSERT_NO_FATAL_FAILURE(RunToUnmasking(r, d));
  const v1::SecAggUnmaskingRequest honest = r.unmask_request;
  auto graph = SecAggGraph::Create(r.params);
  ASSERT_TRUE(graph.ok());
  std::vector<uint32_t> survivors(honest.survivors().begin(), honest.survivors().end());
  std::vector<uint32_t> dropped(honest.dropped().begin(), honest.dropped().end());
  ASSERT_EQ(dropped, (std::vector<uint32_t>{7, 8}));
  auto make = [](std::vector<uint32_t> s, std::vector<uint32_t> dr) {
    std::sort(s.begin(), s.end());
    std::sort(dr.begin(), dr.end());
    v1::SecAggUnmaskingRequest q;
    for (uint32_t x : s) q.add_survivors(x);
    for (uint32_t x : dr) q.add_dropped(x);
    return q;
  };
  auto expect_refusal = [&](uint32_t client, const v1::SecAggUnmaskingRequest& q,
                            const char* words) {
    auto m = r.clients[client]->Unmask(q);
    ASSERT_FALSE(m.ok()) << "client " << client << " answered: " << words;
    EXPECT_EQ(m.status().code(), StatusCode::kFailedPrecondition) << m.status();
    EXPECT_TRUE(absl::StrContains(m.status().message(), words)) << m.status();
    // A refusal is final: not even the honest request gets an answer now.
    EXPECT_FALSE(r.clients[client]->Unmask(honest).ok());
  };
  // A client listed both as surviving and dropped (the server would get both b_7 and s_7 shares).
  {
    std::vector<uint32_t> s = survivors;
    s.push_back(7);
    expect_refusal(0, make(s, dropped), "both as surviving and as dropped");
  }
  // A client that never completed ShareKeys (3) listed as a survivor.
  {
    std::vector<uint32_t> s = survivors;
    s.push_back(3);
    expect_refusal(1, make(s, dropped), "never completed ShareKeys");
  }
  // Fewer than t of client 2's neighbours surviving: move all but t - 1 of them to "dropped".
  {
    const uint32_t c = 2;
    std::vector<uint32_t> s, dr = dropped;
    uint32_t kept = 0;
    for (uint32_t x : survivors) {
      if (graph->AreNeighbours(c, x)) {
        if (kept < r.params.threshold() - 1) {
          ++kept;
          s.push_back(x);
        } else {
          dr.push_back(x);
        }
      } else {
        s.push_back(x);
      }
    }
    ASSERT_GE(s.size(), r.params.min_survivors());
    expect_refusal(c, make(s, dr), "surviving neighbours, fewer than the threshold");
  }
  // Fewer survivors overall than min_survivors.
  {
    const uint32_t c = 4;
    std::vector<uint32_t> s = {c}, dr;
    for (uint32_t x : survivors) {
      if (x != c) dr.push_back(x);
    }
    for (uint32_t x : dropped) dr.push_back(x);
    expect_refusal(c, make(s, dr), "fewer than min_survivors");
  }
  // The client itself reported as dropped.
  {
    const uint32_t c = 5;
    std::vector<uint32_t> s, dr = dropped;
    for (uint32_t x : survivors) (x == c ? dr : s).push_back(x);
    expect_refusal(c, make(s, dr), "does not list this client as a survivor");
  }
  // A dropped client hidden from both lists.
  {
    std::vector<uint32_t> dr = {7};
    expect_refusal(6, make(survivors, dr), "do not cover U2");
  }
  // A second request after an honest answer.
  {
    auto first = r.clients[9]->Unmask(honest);
    ASSERT_TRUE(first.ok()) << first.status();
    for (const auto& s : first->shares()) {
      // Never both kinds for one neighbour: kind follows the honest lists.
      const bool survived = std::binary_search(survivors.begin(), survivors.end(), s.owner());
      EXPECT_EQ(s.kind(), survived ? v1::SEC_AGG_SHARE_KIND_SELF_MASK_SEED
                                   : v1::SEC_AGG_SHARE_KIND_MASK_PRIVATE_KEY);
    }
    std::vector<uint32_t> s = survivors, dr;
    for (uint32_t x : dropped) s.push_back(x);  // "they all survived": would reveal b_7, b_8 too
    auto second = r.clients[9]->Unmask(make(s, dr));
    EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_TRUE(absl::StrContains(second.status().message(), "already answered"))
        << second.status();
    EXPECT_EQ(r.clients[9]->Unmask(honest).status().code(), StatusCode::kFailedPrecondition);
  }
}

// ---------------------------------------------------------------------------------------------
// What a curious server learns from a whole transcript.

TEST(SecAgg, TranscriptRevealsNoSingleInput) {
  Round r;
  const uint32_t m = 32;
  const uint64_t length = 10000;
  r.params = Params(20, 10, 6, 6, length, m);
  r.inputs = RandomInputs(20, length, m, 11);
  // Inputs a curious server would love to spot: small, structured values.
  for (uint32_t i = 0; i < 20; ++i) {
    for (uint64_t q = 0; q < length; ++q) r.inputs[i][q] = (q % 17) * (i + 1);
  }
  Dropouts d;
  d.before_upload = {4, 9, 13};
  d.silent = {16};
  ASSERT_NO_FATAL_FAILURE(RunToUnmasking(r, d));
  ASSERT_NO_FATAL_FAILURE(AnswerAndFinish(r, d));
  ASSERT_TRUE(r.result.ok()) << r.result.status();
  const auto& seeds = r.server->reconstructed_self_mask_seeds();
  const auto& dropped_keys = r.server->reconstructed_mask_private_keys();
  const std::vector<uint32_t>& u3 = r.server->survivors();

  // Everything the server can strip from survivor i's y: PRG(b_i) and, for each dropped neighbour j
  // (senders of i's step-2 shares that are not in U3), the pairwise mask with j's rebuilt key.
  auto residual = [&](uint32_t i) {
    auto y = UnpackSecAggVector(r.masked_responses.at(i).masked_input(), length, m);
    EXPECT_TRUE(y.ok());
    std::vector<uint64_t> res = *y;
    const std::vector<uint64_t> pb = ExpandMask(seeds.at(i), length, m);
    for (uint64_t q = 0; q < length; ++q) res[q] = (res[q] - pb[q]) & Mask(m);
    for (const auto& sh : r.masked_requests.at(i).shares()) {
      const uint32_t j = sh.sender();
      if (std::binary_search(u3.begin(), u3.end(), j)) continue;
      auto shared = X25519SharedSecret(dropped_keys.at(j), r.advertised.at(i).mask_public_key());
      EXPECT_TRUE(shared.ok());
      std::string info = "fedlora/v1 secagg pairwise mask" + U64Le(r.params.round_id()) +
                         U32Le(std::min(i, j)) + U32Le(std::max(i, j));
      auto seed = HkdfSha256(*shared, r.params.round_nonce(), info, 32);
      EXPECT_TRUE(seed.ok());
      const std::vector<uint64_t> pm = ExpandMask(*seed, length, m);
      for (uint64_t q = 0; q < length; ++q)
        res[q] = (i < j ? res[q] - pm[q] : res[q] + pm[q]) & Mask(m);
    }
    return res;
  };

  // Summed over U3 the residuals are exactly the sum of inputs: the server stripped what it could...
  std::vector<uint64_t> total(length, 0);
  for (uint32_t i : u3) {
    const std::vector<uint64_t> res = residual(i);
    for (uint64_t q = 0; q < length; ++q) total[q] = (total[q] + res[q]) & Mask(m);
  }
  const std::set<uint32_t> u3_set(u3.begin(), u3.end());
  EXPECT_EQ(total, PlainSum(r.inputs, u3_set, m));
  // ...yet each survivor's own residual (x_i plus masks shared with surviving neighbours) looks uniform.
  uint32_t checked = 0;
  for (uint32_t i : u3) {
    const std::vector<uint64_t> res = residual(i);
    size_t equal = 0;
    double top_bit = 0;
    for (uint64_t q = 0; q < length; ++q) {
      equal += res[q] == r.inputs[i][q];
      top_bit += static_cast<double>(res[q] >> (m - 1));
    }
    EXPECT_LT(equal, length / 100) << "client " << i;
    EXPECT_NEAR(top_bit / length, 0.5, 0.03) << "client " << i;  // the inputs' top bits are all 0
    ++checked;
  }
  EXPECT_EQ(checked, 17u);

  // The encrypted shares open with no key the server holds: every rebuilt secret, used as an X25519
  // private key against every advertised public key, through the documented share-key derivation.
  std::vector<std::string> held;
  for (const auto& [j, b] : seeds) held.push_back(b);
  for (const auto& [j, s] : dropped_keys) held.push_back(s);
  std::vector<std::string> publics;
  for (const auto& [j, a] : r.advertised) {
    publics.push_back(a.encryption_public_key());
    publics.push_back(a.mask_public_key());
  }
  std::vector<std::string> shared;
  for (const std::string& priv : held) {
    for (const std::string& pub : publics) {
      auto s = X25519SharedSecret(priv, pub);
      ASSERT_TRUE(s.ok());
      shared.push_back(*s);
    }
  }
  int attempts = 0;
  for (uint32_t sender : {0u, 4u}) {  // a survivor and a dropped client
    for (const auto& c : r.share_responses.at(sender).shares()) {
      const std::string aad = "fedlora/v1 secagg share" + U64Le(r.params.round_id()) +
                              r.params.round_nonce() + U32Le(c.sender()) + U32Le(c.receiver());
      const std::string info = "fedlora/v1 secagg share key" + U64Le(r.params.round_id()) +
                               U32Le(c.sender()) + U32Le(c.receiver());
      const std::string nonce = c.ciphertext().substr(0, 12), body = c.ciphertext().substr(12);
      for (const std::string& z : shared) {
        auto key = HkdfSha256(z, r.params.round_nonce(), info, 32);
        ASSERT_TRUE(key.ok());
        EXPECT_EQ(Aes256GcmOpen(*key, nonce, aad, body).status().code(),
                  StatusCode::kPermissionDenied);
        ++attempts;
      }
      for (const std::string& raw : held) {  // a seed or key used directly as the AES key
        EXPECT_EQ(Aes256GcmOpen(raw, nonce, aad, body).status().code(),
                  StatusCode::kPermissionDenied);
      }
    }
  }
  EXPECT_GT(attempts, 10000);
}

// The documented share-key derivation and AAD are what the library uses: a ciphertext the test seals
// with its own derivation opens in the client (so the failed attempts above used the right recipe).
TEST(SecAgg, ShareKeyDerivationMatchesItsDefinition) {
  const v1::SecAggParams params = Params(5, 4, 3, 3, 10, 16, 77);
  auto a = GenerateX25519KeyPair();
  auto b = GenerateX25519KeyPair();
  ASSERT_TRUE(a.ok() && b.ok());
  auto z = X25519SharedSecret(a->private_key, b->public_key);
  ASSERT_TRUE(z.ok());
  const std::string info = "fedlora/v1 secagg share key" + U64Le(77) + U32Le(1) + U32Le(3);
  auto expected = HkdfSha256(*z, params.round_nonce(), info, 32);
  auto got = SecAggShareKey(params, a->private_key, b->public_key, 1, 3);
  auto other_side = SecAggShareKey(params, b->private_key, a->public_key, 1, 3);
  ASSERT_TRUE(expected.ok() && got.ok() && other_side.ok());
  EXPECT_EQ(*got, *expected);
  EXPECT_EQ(*other_side, *expected);
  EXPECT_NE(*SecAggShareKey(params, a->private_key, b->public_key, 3, 1),
            *expected);  // direction matters
  EXPECT_EQ(SecAggShareAssociatedData(params, 1, 3),
            "fedlora/v1 secagg share" + U64Le(77) + params.round_nonce() + U32Le(1) + U32Le(3));
}

// ---------------------------------------------------------------------------------------------
// Freshness.

TEST(SecAgg, KeysAreFreshPerClientObject) {
  const v1::SecAggParams round1 = Params(5, 4, 3, 3, 10, 32, 1);
  const v1::SecAggParams round2 = Params(5, 4, 3, 3, 10, 32, 2);
  std::set<std::string> keys;
  for (const v1::SecAggParams* p : {&round1, &round2, &round2}) {
    auto c = SecAggClient::Create(*p, 3);
    ASSERT_TRUE(c.ok());
    auto m = c->AdvertiseKeys();
    ASSERT_TRUE(m.ok());
    EXPECT_TRUE(keys.insert(m->encryption_public_key()).second);
    EXPECT_TRUE(keys.insert(m->mask_public_key()).second);
  }
  EXPECT_EQ(keys.size(), 6u);
  EXPECT_NE(round1.round_nonce(), round2.round_nonce());
  EXPECT_NE(round1.graph_seed(), round2.graph_seed());
}

TEST(SecAgg, RoundNonceChangesPairwiseMasks) {
  v1::SecAggParams p1 = Params(5, 4, 3, 3, 10, 32, 9);
  v1::SecAggParams p2 = p1;
  p2.set_round_nonce(std::string(32, '\x01'));
  v1::SecAggParams p3 = p1;
  p3.set_round_id(10);
  auto si = GenerateX25519KeyPair();
  auto sj = GenerateX25519KeyPair();
  ASSERT_TRUE(si.ok() && sj.ok());
  auto z = X25519SharedSecret(si->private_key, sj->public_key);
  ASSERT_TRUE(z.ok());
  std::vector<std::string> seeds;
  for (const v1::SecAggParams* p : {&p1, &p2, &p3}) {
    auto a = SecAggPairwiseSeed(*p, si->private_key, sj->public_key, 1, 4);
    auto b = SecAggPairwiseSeed(*p, sj->private_key, si->public_key, 4, 1);  // both ends agree
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(*a, *b);
    const std::string info =
        "fedlora/v1 secagg pairwise mask" + U64Le(p->round_id()) + U32Le(1) + U32Le(4);
    EXPECT_EQ(*a, *HkdfSha256(*z, p->round_nonce(), info, 32));
    seeds.push_back(*a);
  }
  EXPECT_NE(seeds[0], seeds[1]);
  EXPECT_NE(seeds[0], seeds[2]);
  // And so the masks: expanded through the library and through the documented PRG, nearly all differ.
  std::vector<uint64_t> m1(1000, 0), m2(1000, 0);
  ASSERT_TRUE(AddSecAggMask(seeds[0], 32, false, m1).ok());
  ASSERT_TRUE(AddSecAggMask(seeds[1], 32, false, m2).ok());
  EXPECT_EQ(m1, ExpandMask(seeds[0], 1000, 32));
  size_t same = 0;
  for (size_t q = 0; q < 1000; ++q) same += m1[q] == m2[q];
  EXPECT_LT(same, 5u);
  std::vector<uint64_t> m64(1000, 0);
  ASSERT_TRUE(AddSecAggMask(seeds[0], 64, false, m64).ok());
  EXPECT_EQ(m64, ExpandMask(seeds[0], 1000, 64));
}

// ---------------------------------------------------------------------------------------------
// Parameters and the graph.

TEST(SecAggParams, RecommendedDegreeAndThreshold) {
  // min(n - 1, 2 * ceil(1.5 * log2 n)), computed by hand.
  EXPECT_EQ(RecommendedSecAggDegree(3), 2u);
  EXPECT_EQ(RecommendedSecAggDegree(10), 9u);
  EXPECT_EQ(RecommendedSecAggDegree(13), 12u);
  EXPECT_EQ(RecommendedSecAggDegree(14), 12u);
  EXPECT_EQ(RecommendedSecAggDegree(100), 20u);
  EXPECT_EQ(RecommendedSecAggDegree(1000), 30u);
  EXPECT_EQ(RecommendedSecAggDegree(1000000), 60u);
  EXPECT_EQ(RecommendedSecAggThreshold(20), 11u);
  EXPECT_EQ(RecommendedSecAggThreshold(9), 5u);
  for (uint32_t n = 3; n < 300; ++n) {
    SecAggConfig c;
    c.num_clients = n;
    c.vector_length = 1;
    auto p = NewSecAggParams(c);
    ASSERT_TRUE(p.ok()) << n << ": " << p.status();
  }
}

TEST(SecAggParams, Validation) {
  const v1::SecAggParams good = Params(10, 4, 3, 5, 100, 32);
  EXPECT_TRUE(ValidateSecAggParams(good).ok());
  auto bad = [&](auto edit) {
    v1::SecAggParams p = good;
    edit(p);
    absl::Status s = ValidateSecAggParams(p);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << p.DebugString();
    EXPECT_FALSE(SecAggServer::Create(p).ok());
    EXPECT_FALSE(SecAggClient::Create(p, 0).ok());
  };
  bad([](auto& p) { p.set_round_nonce("short"); });
  bad([](auto& p) { p.set_graph_seed(std::string(33, 'x')); });
  bad([](auto& p) {
    p.set_num_clients(2);
    p.set_degree(1);
    p.set_threshold(1);
    p.set_min_survivors(1);
  });
  bad([](auto& p) { p.set_degree(5); });  // odd and not n - 1
  bad([](auto& p) { p.set_degree(0); });
  bad([](auto& p) { p.set_degree(10); });    // above n - 1
  bad([](auto& p) { p.set_threshold(2); });  // not above k/2
  bad([](auto& p) { p.set_threshold(5); });  // above k
  bad([](auto& p) { p.set_min_survivors(2); });
  bad([](auto& p) { p.set_min_survivors(11); });
  bad([](auto& p) { p.set_vector_length(0); });
  bad([](auto& p) { p.set_modulus_bits(0); });
  bad([](auto& p) { p.set_modulus_bits(65); });
  v1::SecAggParams complete_even = good;
  complete_even.set_degree(9);  // n - 1, odd: the complete graph is allowed
  complete_even.set_threshold(5);
  EXPECT_TRUE(ValidateSecAggParams(complete_even).ok());
  EXPECT_EQ(SecAggClient::Create(good, 10).status().code(), StatusCode::kInvalidArgument);
}

// The graph as documented: Fisher-Yates from Prg(graph_seed) words, then the Harary ring.
TEST(SecAggGraph, MatchesItsDefinitionAndIsRegularAndSymmetric) {
  for (auto [n, k] :
       {std::pair{20u, 10u}, std::pair{40u, 30u}, std::pair{101u, 20u}, std::pair{7u, 2u}}) {
    const v1::SecAggParams p = Params(n, k, k / 2 + 1, k / 2 + 1, 1, 32);
    auto g = SecAggGraph::Create(p);
    ASSERT_TRUE(g.ok());
    // Independent shuffle.
    auto prg = Prg::Create(p.graph_seed(), 0);
    ASSERT_TRUE(prg.ok());
    std::vector<uint32_t> order(n);
    for (uint32_t i = 0; i < n; ++i) order[i] = i;
    for (uint32_t q = n - 1; q >= 1; --q) {
      const unsigned __int128 range = q + 1;
      uint64_t w;
      do {
        unsigned char b[8];
        ASSERT_TRUE(prg->Fill(b, 8).ok());
        w = 0;
        for (int x = 7; x >= 0; --x) w = (w << 8) | b[x];
      } while (w >= ((unsigned __int128)1 << 64) / range * range);
      std::swap(order[q], order[w % (q + 1)]);
    }
    for (uint32_t pos = 0; pos < n; ++pos) {
      ASSERT_EQ(g->ClientAt(pos), order[pos]);
      ASSERT_EQ(g->Position(order[pos]), pos);
    }
    for (uint32_t i = 0; i < n; ++i) {
      const std::vector<uint32_t> nb = g->Neighbours(i);
      ASSERT_EQ(nb.size(), k);
      std::set<uint32_t> expected;
      for (uint32_t d = 1; d <= k / 2; ++d) {
        expected.insert(order[(g->Position(i) + d) % n]);
        expected.insert(order[(g->Position(i) + n - d) % n]);
      }
      EXPECT_EQ(std::set<uint32_t>(nb.begin(), nb.end()), expected);
      for (uint32_t j = 0; j < n; ++j) {
        EXPECT_EQ(g->AreNeighbours(i, j), expected.contains(j));
        EXPECT_EQ(g->AreNeighbours(i, j), g->AreNeighbours(j, i));
      }
    }
    auto again = SecAggGraph::Create(p);
    ASSERT_TRUE(again.ok());
    for (uint32_t i = 0; i < n; ++i) EXPECT_EQ(again->Neighbours(i), g->Neighbours(i));
  }
  // k = n - 1 is the complete graph, for even and odd n.
  for (uint32_t n : {6u, 7u}) {
    auto g = SecAggGraph::Create(Params(n, n - 1, n / 2 + 1, n / 2 + 1, 1, 32));
    ASSERT_TRUE(g.ok());
    for (uint32_t i = 0; i < n; ++i) EXPECT_EQ(g->Neighbours(i).size(), n - 1);
  }
  // Another seed, another graph.
  auto a = SecAggGraph::Create(Params(50, 10, 6, 6, 1, 32));
  auto b = SecAggGraph::Create(Params(50, 10, 6, 6, 1, 32));
  ASSERT_TRUE(a.ok() && b.ok());
  int differ = 0;
  for (uint32_t i = 0; i < 50; ++i) differ += a->Neighbours(i) != b->Neighbours(i);
  EXPECT_GT(differ, 40);
}

// ---------------------------------------------------------------------------------------------
// Order and malformed messages.

TEST(SecAgg, PackedVectorsAreLittleEndianInCeilMOver8Bytes) {
  const std::vector<uint64_t> v = {0x0102, 0x0fff, 0};
  auto packed = PackSecAggVector(v, 12);
  ASSERT_TRUE(packed.ok());
  EXPECT_EQ(*packed, std::string("\x02\x01\xff\x0f\x00\x00", 6));
  auto back = UnpackSecAggVector(*packed, 3, 12);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, v);
  EXPECT_FALSE(PackSecAggVector(std::vector<uint64_t>{0x1000}, 12).ok());  // 2^12 is out of range
  EXPECT_FALSE(UnpackSecAggVector(std::string("\x00\x10", 2), 1, 12).ok());
  EXPECT_FALSE(UnpackSecAggVector(*packed, 4, 12).ok());
  for (uint32_t m : {1u, 8u, 33u, 63u, 64u}) {
    const std::vector<uint64_t> top = {Mask(m), 1, Mask(m) >> 1};
    auto p = PackSecAggVector(top, m);
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(p->size(), 3 * ((m + 7) / 8));
    EXPECT_EQ(*UnpackSecAggVector(*p, 3, m), top);
  }
  // A server at m = 63 refuses a masked input with bit 63 set, and takes the same input without it.
  const v1::SecAggParams params = Params(3, 2, 2, 2, 2, 63);
  Round r;
  r.params = params;
  r.inputs = RandomInputs(3, 2, 63, 16);
  auto server = SecAggServer::Create(params);
  ASSERT_TRUE(server.ok());
  std::vector<std::optional<SecAggClient>> c;
  for (uint32_t i = 0; i < 3; ++i) c.emplace_back(*SecAggClient::Create(params, i));
  for (uint32_t i = 0; i < 3; ++i)
    ASSERT_TRUE(server->ReceiveAdvertiseKeys(*c[i]->AdvertiseKeys()).ok());
  ASSERT_TRUE(server->CloseAdvertiseKeys().ok());
  for (uint32_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(server->ReceiveShareKeys(*c[i]->ShareKeys(*server->ShareKeysRequest(i))).ok());
  }
  ASSERT_TRUE(server->CloseShareKeys().ok());
  auto m0 = c[0]->MaskedInput(*server->MaskedInputRequest(0), r.inputs[0]);
  ASSERT_TRUE(m0.ok());
  v1::SecAggMaskedInputResponse bad = *m0;
  (*bad.mutable_masked_input())[15] |= '\x80';
  EXPECT_EQ(server->ReceiveMaskedInput(bad).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(server->ReceiveMaskedInput(*m0).ok());
}

TEST(SecAgg, StepsRunOnceAndInOrder) {
  const v1::SecAggParams p = Params(5, 4, 3, 3, 10, 32);
  auto c = SecAggClient::Create(p, 0);
  ASSERT_TRUE(c.ok());
  const std::vector<uint64_t> x(10, 1);
  EXPECT_EQ(c->ShareKeys({}).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(c->MaskedInput({}, x).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(c->Unmask({}).status().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(c->AdvertiseKeys().ok());
  EXPECT_EQ(c->AdvertiseKeys().status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(c->Unmask({}).status().code(), StatusCode::kFailedPrecondition);

  auto s = SecAggServer::Create(p);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->ReceiveShareKeys({}).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(s->CloseShareKeys().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(s->Finish().status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(s->ShareKeysRequest(0).status().code(), StatusCode::kFailedPrecondition);

  // A full honest round, then every step again.
  Round r;
  r.params = p;
  r.inputs = RandomInputs(5, 10, 32, 12);
  ASSERT_NO_FATAL_FAILURE(RunToUnmasking(r, Dropouts{}));
  EXPECT_EQ(r.server->ReceiveAdvertiseKeys(r.advertised.at(0)).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(r.server->CloseMaskedInput().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(r.server->ReceiveMaskedInput(r.masked_responses.at(0)).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(r.clients[0]->MaskedInput(r.masked_requests.at(0), r.inputs[0]).status().code(),
            StatusCode::kFailedPrecondition);
  ASSERT_NO_FATAL_FAILURE(AnswerAndFinish(r, Dropouts{}));
  ASSERT_TRUE(r.result.ok());
  EXPECT_EQ(r.server->ReceiveUnmasking(r.unmask_responses.at(0)).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(r.server->Finish().status().code(), StatusCode::kFailedPrecondition);
}

TEST(SecAgg, ServerRejectsMalformedMessagesAndKeepsGoing) {
  const v1::SecAggParams p = Params(6, 4, 3, 3, 16, 12);  // 12 bits: two bytes per element
  std::vector<std::optional<SecAggClient>> c;
  for (uint32_t i = 0; i < 6; ++i) c.emplace_back(*SecAggClient::Create(p, i));
  auto s = SecAggServer::Create(p);
  ASSERT_TRUE(s.ok());
  std::vector<v1::SecAggAdvertiseKeys> adv;
  for (uint32_t i = 0; i < 6; ++i) adv.push_back(*c[i]->AdvertiseKeys());

  auto rejected = [](absl::Status st, StatusCode code) { EXPECT_EQ(st.code(), code) << st; };
  v1::SecAggAdvertiseKeys m = adv[0];
  m.set_client_index(6);
  rejected(s->ReceiveAdvertiseKeys(m), StatusCode::kInvalidArgument);
  m = adv[0];
  m.set_mask_public_key("short");
  rejected(s->ReceiveAdvertiseKeys(m), StatusCode::kInvalidArgument);
  m = adv[0];
  m.set_mask_public_key(std::string(32, '\0'));  // a small-order point
  rejected(s->ReceiveAdvertiseKeys(m), StatusCode::kInvalidArgument);
  m = adv[0];
  m.set_mask_public_key(m.encryption_public_key());
  rejected(s->ReceiveAdvertiseKeys(m), StatusCode::kInvalidArgument);
  for (uint32_t i = 0; i < 6; ++i) ASSERT_TRUE(s->ReceiveAdvertiseKeys(adv[i]).ok());
  rejected(s->ReceiveAdvertiseKeys(adv[2]), StatusCode::kAlreadyExists);
  ASSERT_TRUE(s->CloseAdvertiseKeys().ok());

  std::vector<v1::SecAggShareKeysResponse> sk;
  for (uint32_t i = 0; i < 6; ++i) sk.push_back(*c[i]->ShareKeys(*s->ShareKeysRequest(i)));
  v1::SecAggShareKeysResponse bad = sk[0];
  bad.mutable_shares(0)->set_ciphertext("x");
  rejected(s->ReceiveShareKeys(bad), StatusCode::kInvalidArgument);
  bad = sk[0];
  bad.mutable_shares()->RemoveLast();
  rejected(s->ReceiveShareKeys(bad), StatusCode::kInvalidArgument);
  bad = sk[0];
  bad.mutable_shares(1)->set_receiver(bad.shares(0).receiver());
  rejected(s->ReceiveShareKeys(bad), StatusCode::kInvalidArgument);
  bad = sk[0];
  bad.mutable_shares(0)->set_receiver(0);  // itself, not a neighbour
  rejected(s->ReceiveShareKeys(bad), StatusCode::kInvalidArgument);
  bad = sk[0];
  bad.mutable_shares(0)->set_sender(1);
  rejected(s->ReceiveShareKeys(bad), StatusCode::kInvalidArgument);
  bad = sk[0];
  bad.set_client_index(1000);
  rejected(s->ReceiveShareKeys(bad), StatusCode::kInvalidArgument);
  for (uint32_t i = 0; i < 6; ++i) ASSERT_TRUE(s->ReceiveShareKeys(sk[i]).ok());
  rejected(s->ReceiveShareKeys(sk[0]), StatusCode::kAlreadyExists);
  ASSERT_TRUE(s->CloseShareKeys().ok());

  const auto x = RandomInputs(6, 16, 12, 13);
  std::vector<v1::SecAggMaskedInputResponse> mi;
  for (uint32_t i = 0; i < 6; ++i)
    mi.push_back(*c[i]->MaskedInput(*s->MaskedInputRequest(i), x[i]));
  v1::SecAggMaskedInputResponse badm = mi[0];
  badm.mutable_masked_input()->pop_back();
  rejected(s->ReceiveMaskedInput(badm), StatusCode::kInvalidArgument);
  badm = mi[0];
  (*badm.mutable_masked_input())[1] = '\xf0';  // bits above 2^12
  rejected(s->ReceiveMaskedInput(badm), StatusCode::kInvalidArgument);
  for (uint32_t i = 0; i < 6; ++i) ASSERT_TRUE(s->ReceiveMaskedInput(mi[i]).ok());
  rejected(s->ReceiveMaskedInput(mi[1]), StatusCode::kAlreadyExists);
  ASSERT_TRUE(s->CloseMaskedInput().ok());

  const v1::SecAggUnmaskingRequest req = *s->UnmaskingRequest();
  std::vector<v1::SecAggUnmaskingResponse> um;
  for (uint32_t i = 0; i < 6; ++i) um.push_back(*c[i]->Unmask(req));
  v1::SecAggUnmaskingResponse badu = um[0];
  badu.mutable_shares(0)->set_kind(v1::SEC_AGG_SHARE_KIND_MASK_PRIVATE_KEY);  // everyone survived
  rejected(s->ReceiveUnmasking(badu), StatusCode::kInvalidArgument);
  badu = um[0];
  badu.mutable_shares(0)->set_share(std::string(33, '\xff'));  // not below p
  rejected(s->ReceiveUnmasking(badu), StatusCode::kInvalidArgument);
  badu = um[0];
  badu.mutable_shares(0)->set_share("tiny");
  rejected(s->ReceiveUnmasking(badu), StatusCode::kInvalidArgument);
  badu = um[0];
  badu.mutable_shares(1)->set_owner(badu.shares(0).owner());
  rejected(s->ReceiveUnmasking(badu), StatusCode::kInvalidArgument);
  badu = um[0];
  badu.mutable_shares(0)->set_owner(0);
  rejected(s->ReceiveUnmasking(badu), StatusCode::kInvalidArgument);
  for (uint32_t i = 0; i < 6; ++i) ASSERT_TRUE(s->ReceiveUnmasking(um[i]).ok());
  rejected(s->ReceiveUnmasking(um[0]), StatusCode::kAlreadyExists);
  auto sum = s->Finish();
  ASSERT_TRUE(sum.ok()) << sum.status();
  std::set<uint32_t> all = {0, 1, 2, 3, 4, 5};
  EXPECT_EQ(*sum, PlainSum(x, all, 12));
}

TEST(SecAgg, ClientRefusesBadKeysAndShares) {
  const v1::SecAggParams p = Params(8, 4, 3, 3, 10, 32);
  Round r;
  r.params = p;
  r.inputs = RandomInputs(8, 10, 32, 14);
  ASSERT_NO_FATAL_FAILURE(RunToUnmasking(r, Dropouts{}));
  const v1::SecAggShareKeysRequest honest1 = r.share_requests.at(0);
  auto fresh = [&](uint32_t i) {
    auto c = SecAggClient::Create(p, i);
    EXPECT_TRUE(c.ok());
    return *std::move(c);
  };
  // Step 1: a request with someone else's keys in place of the client's own.
  {
    SecAggClient c = fresh(0);
    ASSERT_TRUE(c.AdvertiseKeys().ok());
    auto got =
        c.ShareKeys(honest1);  // honest1 carries the keys of round r's client 0, not this one's
    EXPECT_EQ(got.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(c.MaskedInput(r.masked_requests.at(0), r.inputs[0]).status().code(),
              StatusCode::kFailedPrecondition);
  }
  // Own keys missing; too few neighbours advertised; a non-neighbour listed.
  auto graph = SecAggGraph::Create(p);
  ASSERT_TRUE(graph.ok());
  {
    SecAggClient c = fresh(1);
    auto own = c.AdvertiseKeys();
    ASSERT_TRUE(own.ok());
    v1::SecAggShareKeysRequest q;
    for (const auto& k : r.share_requests.at(1).keys()) {
      if (k.client_index() != 1) *q.add_keys() = k;
    }
    EXPECT_EQ(c.ShareKeys(q).status().code(), StatusCode::kFailedPrecondition);
  }
  {
    SecAggClient c = fresh(1);
    auto own = c.AdvertiseKeys();
    ASSERT_TRUE(own.ok());
    v1::SecAggShareKeysRequest q;
    int kept = 0;
    for (const auto& k : r.share_requests.at(1).keys()) {
      if (k.client_index() == 1) {
        *q.add_keys() = *own;
      } else if (kept++ < 2) {
        *q.add_keys() = k;
      }
    }
    auto got = c.ShareKeys(q);
    EXPECT_EQ(got.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_TRUE(absl::StrContains(got.status().message(), "fewer than the threshold"))
        << got.status();
  }
  {
    SecAggClient c = fresh(1);
    auto own = c.AdvertiseKeys();
    ASSERT_TRUE(own.ok());
    uint32_t stranger = 0;
    while (stranger == 1 || graph->AreNeighbours(1, stranger)) ++stranger;
    v1::SecAggShareKeysRequest q;
    for (uint32_t j = 0; j < 8; ++j) {
      if (j == 1)
        *q.add_keys() = *own;
      else if (j == stranger || graph->AreNeighbours(1, j))
        *q.add_keys() = r.advertised.at(j);
    }
    EXPECT_EQ(c.ShareKeys(q).status().code(), StatusCode::kFailedPrecondition);
  }
  // Step 2: a fresh round per tampering, with client 0's step-2 request edited.
  struct Tamper {
    const char* what;
    std::function<void(v1::SecAggMaskedInputRequest&)> edit;
    StatusCode code;
  };
  const std::vector<Tamper> tampers = {
      {"flipped ciphertext bit",
       [](auto& q) { (*q.mutable_shares(0)->mutable_ciphertext())[20] ^= 1; },
       StatusCode::kPermissionDenied},
      {"sender relabelled",
       [](auto& q) {
         const uint32_t a = q.shares(0).sender(), b = q.shares(1).sender();
         q.mutable_shares(0)->set_sender(b);
         q.mutable_shares(1)->set_sender(a);
       },
       StatusCode::kPermissionDenied},
      {"misaddressed",
       [](auto& q) { q.mutable_shares(0)->set_receiver(q.shares(0).receiver() + 1); },
       StatusCode::kFailedPrecondition},
      {"share missing", [](auto& q) { q.mutable_shares()->RemoveLast(); },
       StatusCode::kFailedPrecondition},
      {"not in U2",
       [](auto& q) {
         v1::SecAggMaskedInputRequest copy = q;
         q.clear_shared_keys();
         for (uint32_t j : copy.shared_keys()) {
           if (j != 0) q.add_shared_keys(j);
         }
       },
       StatusCode::kFailedPrecondition},
  };
  for (const Tamper& tp : tampers) {
    Round fresh_round;
    fresh_round.params = Params(8, 4, 3, 3, 10, 32);
    fresh_round.inputs = r.inputs;
    // Run steps 0 and 1 through the library, then hand client 0 an edited step-2 request.
    auto server = SecAggServer::Create(fresh_round.params);
    ASSERT_TRUE(server.ok());
    std::vector<std::optional<SecAggClient>> cl;
    for (uint32_t i = 0; i < 8; ++i) cl.emplace_back(*SecAggClient::Create(fresh_round.params, i));
    for (uint32_t i = 0; i < 8; ++i)
      ASSERT_TRUE(server->ReceiveAdvertiseKeys(*cl[i]->AdvertiseKeys()).ok());
    ASSERT_TRUE(server->CloseAdvertiseKeys().ok());
    for (uint32_t i = 0; i < 8; ++i) {
      ASSERT_TRUE(server->ReceiveShareKeys(*cl[i]->ShareKeys(*server->ShareKeysRequest(i))).ok());
    }
    ASSERT_TRUE(server->CloseShareKeys().ok());
    v1::SecAggMaskedInputRequest q = *server->MaskedInputRequest(0);
    // Wrong-length input is the caller's mistake: refused without ending the client.
    EXPECT_EQ(cl[0]->MaskedInput(q, std::vector<uint64_t>(9, 0)).status().code(),
              StatusCode::kInvalidArgument);
    tp.edit(q);
    auto got = cl[0]->MaskedInput(q, fresh_round.inputs[0]);
    EXPECT_EQ(got.status().code(), tp.code) << tp.what << ": " << got.status();
    EXPECT_FALSE(cl[0]->MaskedInput(*server->MaskedInputRequest(0), fresh_round.inputs[0]).ok())
        << tp.what;
  }
}

// ---------------------------------------------------------------------------------------------
// Fixed point.

TEST(SecAggFixedPoint, OverflowCheck) {
  // m = 32, f = 16, range 1: each value up to 2^16 in magnitude; 2^31 - 1 holds 32767 of them.
  EXPECT_TRUE(CheckSecAggFixedPoint(32767, 1.0, 16, 32).ok());
  EXPECT_EQ(CheckSecAggFixedPoint(32768, 1.0, 16, 32).code(), StatusCode::kInvalidArgument);
  // A range that is not a multiple of the grid rounds up: ceil(0.3 * 2^4) = 5; 2^7 - 1 = 127 holds 25.
  EXPECT_TRUE(CheckSecAggFixedPoint(25, 0.3, 4, 8).ok());
  EXPECT_FALSE(CheckSecAggFixedPoint(26, 0.3, 4, 8).ok());
  EXPECT_TRUE(CheckSecAggFixedPoint(1000, 8.0, 40, 64).ok());
  EXPECT_FALSE(CheckSecAggFixedPoint(1, 1.0, 0, 1).ok());
  EXPECT_FALSE(CheckSecAggFixedPoint(0, 1.0, 8, 32).ok());
  EXPECT_FALSE(CheckSecAggFixedPoint(1, 0.0, 8, 32).ok());
  EXPECT_FALSE(CheckSecAggFixedPoint(1, NAN, 8, 32).ok());
  EXPECT_FALSE(CheckSecAggFixedPoint(1, 1.0, 63, 64).ok());
  EXPECT_FALSE(CheckSecAggFixedPoint(1, 1.0, 8, 65).ok());
}

TEST(SecAggFixedPoint, DecodeTwosComplement) {
  const std::vector<uint64_t> v8 = {0, 1, 127, 128, 255};
  auto d = DecodeSecAggFixedPointSum(v8, 0, 8);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(*d, (std::vector<double>{0, 1, 127, -128, -1}));
  const std::vector<uint64_t> v64 = {~uint64_t{0}, uint64_t{1} << 63, 6};
  d = DecodeSecAggFixedPointSum(v64, 1, 64);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(*d, (std::vector<double>{-0.5, -0x1p62, 3}));
  EXPECT_FALSE(DecodeSecAggFixedPointSum(std::vector<uint64_t>{256}, 0, 8).ok());
}

TEST(SecAggFixedPoint, NearestAndStochasticRounding) {
  const std::vector<float> v = {0.0f, 1.0f, -1.0f, 0.3f, -0.3f, 0.126f};
  auto e = EncodeSecAggFixedPointNearest(v, 1.0, 3, 16);
  ASSERT_TRUE(e.ok());
  // round(v * 8): 0, 8, -8, 2 (2.4), -2, 1 (1.008); negatives as 2^16 - |x|.
  EXPECT_EQ(*e, (std::vector<uint64_t>{0, 8, 65528, 2, 65534, 1}));
  EXPECT_EQ(EncodeSecAggFixedPointNearest(std::vector<float>{1.5f}, 1.0, 3, 16).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeSecAggFixedPointNearest(std::vector<float>{NAN}, 1.0, 3, 16).status().code(),
            StatusCode::kInvalidArgument);
  // Stochastic: 0.3 * 4 = 1.2 rounds to 2 with probability 0.2, else 1; -0.3 to -2 w.p. 0.2.
  auto prg = Prg::Create(std::string(32, '\x33'));
  ASSERT_TRUE(prg.ok());
  const std::vector<float> many(100000, 0.3f);
  auto s = EncodeSecAggFixedPoint(many, 1.0, 2, 32, *prg);
  ASSERT_TRUE(s.ok());
  double mean = 0;
  for (uint64_t x : *s) {
    ASSERT_TRUE(x == 1 || x == 2) << x;
    mean += static_cast<double>(x);
  }
  EXPECT_NEAR(mean / many.size(), 0.3 * 4, 0.01);  // sd of the mean ~0.0013
  const std::vector<float> neg(100000, -0.3f);
  s = EncodeSecAggFixedPoint(neg, 1.0, 2, 32, *prg);
  ASSERT_TRUE(s.ok());
  auto dec = DecodeSecAggFixedPointSum(*s, 2, 32);
  ASSERT_TRUE(dec.ok());
  mean = 0;
  for (double x : *dec) mean += x;
  EXPECT_NEAR(mean / neg.size(), -0.3, 0.0025);
}

// Floats through a SecAgg+ round: the decoded sum is within n grid steps of the float sum.
TEST(SecAggFixedPoint, FloatsThroughARound) {
  const uint32_t n = 12, f = 20, m = 32;
  const double range = 4.0;
  ASSERT_TRUE(CheckSecAggFixedPoint(n, range, f, m).ok());
  const uint64_t length = 2000;
  std::mt19937 gen(15);
  std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
  std::vector<std::vector<float>> floats(n, std::vector<float>(length));
  Round r;
  r.params =
      Params(n, RecommendedSecAggDegree(n), RecommendedSecAggThreshold(RecommendedSecAggDegree(n)),
             RecommendedSecAggThreshold(RecommendedSecAggDegree(n)), length, m);
  auto prg = Prg::Create(std::string(32, '\x44'));
  ASSERT_TRUE(prg.ok());
  for (uint32_t i = 0; i < n; ++i) {
    for (float& v : floats[i]) v = dist(gen);
    floats[i][0] = (i % 2 == 0) ? 4.0f : -4.0f;  // the extremes
    auto e = EncodeSecAggFixedPoint(floats[i], range, f, m, *prg);
    ASSERT_TRUE(e.ok());
    r.inputs.push_back(*e);
  }
  ASSERT_NO_FATAL_FAILURE(RunToUnmasking(r, Dropouts{}));
  ASSERT_NO_FATAL_FAILURE(AnswerAndFinish(r, Dropouts{}));
  ASSERT_TRUE(r.result.ok()) << r.result.status();
  auto decoded = DecodeSecAggFixedPointSum(*r.result, f, m);
  ASSERT_TRUE(decoded.ok());
  for (uint64_t q = 0; q < length; ++q) {
    double expected = 0;
    for (uint32_t i = 0; i < n; ++i) expected += floats[i][q];
    ASSERT_NEAR((*decoded)[q], expected, n * std::ldexp(1.0, -static_cast<int>(f))) << q;
  }
}

}  // namespace
}  // namespace fedlora::crypto
