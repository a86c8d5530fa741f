// Fuzzes the messages of secure aggregation (crypto/secagg.h), on both sides: what a client sends
// the server (advertised keys, encrypted shares, masked inputs, unmasking shares) and what the
// server sends a client (the step requests). Each input runs an honest round of four clients up to
// a step the input picks, then hands one party the honest message of that step with the input's
// mutations applied (bytes flipped, the message cut or extended) and parsed back. The party must
// answer with a status, never crash, read out of bounds or leak; and an unchanged message must be
// accepted as it was.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "crypto/secagg.h"
#include "fuzz/fuzz_util.h"

namespace {

using namespace fedlora;
using namespace fedlora::crypto;

constexpr uint32_t kClients = 4;
constexpr uint64_t kLength = 16;

// The serialized message with the input's mutations; `changed` says whether any took effect.
template <typename Message>
std::optional<Message> Mutate(const Message& honest, FuzzedDataProvider& fdp, bool* changed) {
  std::string bytes = honest.SerializeAsString();
  const std::string original = bytes;
  const int flips = fdp.ConsumeIntegralInRange<int>(0, 8);
  for (int i = 0; i < flips && !bytes.empty(); ++i) {
    const size_t at = fdp.ConsumeIntegralInRange<size_t>(0, bytes.size() - 1);
    bytes[at] = static_cast<char>(bytes[at] ^ fdp.ConsumeIntegral<uint8_t>());
  }
  switch (fdp.ConsumeIntegralInRange<int>(0, 2)) {
    case 1:
      bytes.resize(fdp.ConsumeIntegralInRange<size_t>(0, bytes.size()));
      break;
    case 2:
      bytes += fdp.ConsumeBytesAsString(fdp.ConsumeIntegralInRange<size_t>(0, 64));
      break;
    default:
      break;
  }
  *changed = bytes != original;
  Message m;
  if (!m.ParseFromString(bytes)) return std::nullopt;
  return m;
}

struct Round {
  v1::SecAggParams params;
  std::optional<SecAggServer> server;
  std::vector<SecAggClient> clients;
  std::vector<v1::SecAggAdvertiseKeys> keys;
  std::vector<v1::SecAggShareKeysResponse> shares;
  std::vector<v1::SecAggMaskedInputResponse> masked;
  std::vector<v1::SecAggUnmaskingResponse> unmasking;
};

void Check(const absl::Status& s) { FUZZ_CHECK(s.ok(), s); }

// Runs the honest round through step `upto` (0..3): every client's message of the steps before it
// delivered and closed; the messages of step `upto` itself made but not delivered.
Round Honest(int upto) {
  Round r;
  SecAggConfig c;
  c.round_id = 7;
  c.num_clients = kClients;
  c.vector_length = kLength;
  c.modulus_bits = 32;
  auto params = NewSecAggParams(c);
  FUZZ_CHECK(params.ok(), params.status());
  r.params = *params;
  auto server = SecAggServer::Create(r.params);
  FUZZ_CHECK(server.ok(), server.status());
  r.server.emplace(*std::move(server));
  for (uint32_t i = 0; i < kClients; ++i) {
    auto client = SecAggClient::Create(r.params, i);
    FUZZ_CHECK(client.ok(), client.status());
    r.clients.push_back(*std::move(client));
    auto keys = r.clients.back().AdvertiseKeys();
    FUZZ_CHECK(keys.ok(), keys.status());
    r.keys.push_back(*keys);
  }
  if (upto == 0) return r;
  for (const auto& k : r.keys) Check(r.server->ReceiveAdvertiseKeys(k));
  Check(r.server->CloseAdvertiseKeys());
  for (uint32_t i = 0; i < kClients; ++i) {
    auto request = r.server->ShareKeysRequest(i);
    FUZZ_CHECK(request.ok(), request.status());
    auto shares = r.clients[i].ShareKeys(*request);
    FUZZ_CHECK(shares.ok(), shares.status());
    r.shares.push_back(*shares);
  }
  if (upto == 1) return r;
  for (const auto& s : r.shares) Check(r.server->ReceiveShareKeys(s));
  Check(r.server->CloseShareKeys());
  for (uint32_t i = 0; i < kClients; ++i) {
    auto request = r.server->MaskedInputRequest(i);
    FUZZ_CHECK(request.ok(), request.status());
    const std::vector<uint64_t> input(kLength, i + 1);
    auto masked = r.clients[i].MaskedInput(*request, input);
    FUZZ_CHECK(masked.ok(), masked.status());
    r.masked.push_back(*masked);
  }
  if (upto == 2) return r;
  for (const auto& m : r.masked) Check(r.server->ReceiveMaskedInput(m));
  Check(r.server->CloseMaskedInput());
  auto request = r.server->UnmaskingRequest();
  FUZZ_CHECK(request.ok(), request.status());
  for (uint32_t i = 0; i < kClients; ++i) {
    auto shares = r.clients[i].Unmask(*request);
    FUZZ_CHECK(shares.ok(), shares.status());
    r.unmasking.push_back(*shares);
  }
  return r;
}

// The server receives client `who`'s message of the step, mutated.
void FuzzServer(int step, FuzzedDataProvider& fdp) {
  Round r = Honest(step);
  const uint32_t who = fdp.ConsumeIntegralInRange<uint32_t>(0, kClients - 1);
  bool changed = false;
  absl::Status s;
  switch (step) {
    case 0:
      if (auto m = Mutate(r.keys[who], fdp, &changed)) s = r.server->ReceiveAdvertiseKeys(*m);
      break;
    case 1:
      if (auto m = Mutate(r.shares[who], fdp, &changed)) s = r.server->ReceiveShareKeys(*m);
      break;
    case 2:
      if (auto m = Mutate(r.masked[who], fdp, &changed)) s = r.server->ReceiveMaskedInput(*m);
      break;
    default:
      if (auto m = Mutate(r.unmasking[who], fdp, &changed)) {
        s = r.server->ReceiveUnmasking(*m);
        for (uint32_t i = 0; i < kClients; ++i) {
          if (i != who) (void)r.server->ReceiveUnmasking(r.unmasking[i]);
        }
        auto sum = r.server->Finish();
        FUZZ_TRACE("finish: %s\n", sum.ok() ? "ok" : sum.status().ToString().c_str());
        if (sum.ok() && !changed) {
          for (uint64_t v : *sum) FUZZ_CHECK(v == 1 + 2 + 3 + 4, "the honest sum is wrong");
        }
      }
      break;
  }
  if (!changed) FUZZ_CHECK(s.ok(), s);
  FUZZ_TRACE("server step %d from %u: %s\n", step, who, s.ToString().c_str());
}

// Client `who` receives the server's request of the step, mutated.
void FuzzClient(int step, FuzzedDataProvider& fdp) {
  const uint32_t who = fdp.ConsumeIntegralInRange<uint32_t>(0, kClients - 1);
  bool changed = false;
  absl::Status s;
  if (step == 1) {
    Round r = Honest(0);
    Check(r.server->ReceiveAdvertiseKeys(r.keys[0]));
    for (uint32_t i = 1; i < kClients; ++i) Check(r.server->ReceiveAdvertiseKeys(r.keys[i]));
    Check(r.server->CloseAdvertiseKeys());
    auto request = r.server->ShareKeysRequest(who);
    FUZZ_CHECK(request.ok(), request.status());
    if (auto m = Mutate(*request, fdp, &changed)) s = r.clients[who].ShareKeys(*m).status();
  } else if (step == 2) {
    Round r = Honest(1);
    for (const auto& sh : r.shares) Check(r.server->ReceiveShareKeys(sh));
    Check(r.server->CloseShareKeys());
    auto request = r.server->MaskedInputRequest(who);
    FUZZ_CHECK(request.ok(), request.status());
    const std::vector<uint64_t> input(kLength, 5);
    if (auto m = Mutate(*request, fdp, &changed))
      s = r.clients[who].MaskedInput(*m, input).status();
  } else {
    Round r = Honest(2);
    for (const auto& m : r.masked) Check(r.server->ReceiveMaskedInput(m));
    Check(r.server->CloseMaskedInput());
    auto request = r.server->UnmaskingRequest();
    FUZZ_CHECK(request.ok(), request.status());
    if (auto m = Mutate(*request, fdp, &changed)) s = r.clients[who].Unmask(*m).status();
  }
  if (!changed) FUZZ_CHECK(s.ok(), s);
  FUZZ_TRACE("client step %d at %u: %s\n", step, who, s.ToString().c_str());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider fdp(data, size);
  const int target = fdp.ConsumeIntegralInRange<int>(0, 6);
  if (target < 4) {
    FuzzServer(target, fdp);
  } else {
    FuzzClient(target - 3, fdp);
  }
  return 0;
}
