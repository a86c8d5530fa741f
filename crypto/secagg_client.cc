// SecAggClient: one client's side of one SecAgg+ round (see crypto/secagg.h).
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "crypto/envelope.h"
#include "crypto/random.h"
#include "crypto/secagg.h"
#include "crypto/secagg_internal.h"
#include "crypto/shamir.h"

namespace fedlora::crypto {

using secagg_internal::AppendU32;
using secagg_internal::ModulusMask;
using secagg_internal::ReadIndexList;
using secagg_internal::ReadU32;
using secagg_internal::Wipe;

namespace {

enum class Step { kNew, kAdvertised, kSharedKeys, kMasked, kDone, kRefused };

const char* StepName(Step s) {
  switch (s) {
    case Step::kNew:
      return "new";
    case Step::kAdvertised:
      return "keys advertised";
    case Step::kSharedKeys:
      return "keys shared";
    case Step::kMasked:
      return "masked input sent";
    case Step::kDone:
      return "unmasking answered";
    case Step::kRefused:
      return "refused";
  }
  return "?";
}

struct PeerKeys {
  std::string encryption_public_key;
  std::string mask_public_key;
};

// The two shares a neighbour sent us (y-coordinates; x is our index + 1).
struct HeldShares {
  std::string self_mask_seed;
  std::string mask_private_key;
};

}  // namespace

struct SecAggClient::Impl {
  v1::SecAggParams params;
  uint32_t index = 0;
  SecAggGraph graph;
  std::vector<uint32_t> neighbours;
  Step step = Step::kNew;
  X25519KeyPair c;                      // share encryption
  X25519KeyPair s;                      // mask agreement
  std::string b;                        // self-mask seed
  std::map<uint32_t, PeerKeys> peers;   // neighbours in U1
  std::map<uint32_t, HeldShares> held;  // neighbours in U2, their shares to us
  std::vector<uint32_t> u2;

  Impl(v1::SecAggParams p, uint32_t i, SecAggGraph g)
      : params(std::move(p)), index(i), graph(std::move(g)), neighbours(graph.Neighbours(i)) {}
  ~Impl() { WipeSecrets(); }

  bool IsNeighbour(uint32_t j) const { return graph.AreNeighbours(index, j); }

  void WipeSecrets() {
    Wipe(c.private_key);
    Wipe(s.private_key);
    Wipe(b);
    for (auto& [j, h] : held) {
      Wipe(h.self_mask_seed);
      Wipe(h.mask_private_key);
    }
    held.clear();
  }

  // Checks that the client is at `expected`; otherwise FailedPrecondition, without changing state.
  absl::Status Expect(Step expected, const char* call) const {
    if (step == expected) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat("SecAggClient ", index, ": ", call,
                                                      " called in state '", StepName(step),
                                                      "', expected '", StepName(expected), "'"));
  }

  // Every failure while handling a server message is final: the client refuses and forgets its secrets.
  absl::Status Refuse(absl::Status status) {
    step = Step::kRefused;
    WipeSecrets();
    return absl::Status(status.code(),
                        absl::StrCat("SecAggClient ", index, ": ", std::string(status.message())));
  }

  absl::StatusOr<v1::SecAggShareKeysResponse> ShareKeys(const v1::SecAggShareKeysRequest& request);
  absl::StatusOr<std::string> DecryptShares(const v1::SecAggEncryptedShares& m);
  absl::StatusOr<v1::SecAggMaskedInputResponse> MaskedInput(
      const v1::SecAggMaskedInputRequest& request, std::span<const uint64_t> input);
  absl::StatusOr<v1::SecAggUnmaskingResponse> Unmask(const v1::SecAggUnmaskingRequest& request);
};

SecAggClient::SecAggClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SecAggClient::SecAggClient(SecAggClient&&) noexcept = default;
SecAggClient& SecAggClient::operator=(SecAggClient&&) noexcept = default;
SecAggClient::~SecAggClient() = default;

uint32_t SecAggClient::client_index() const { return impl_->index; }
const std::vector<uint32_t>& SecAggClient::neighbours() const { return impl_->neighbours; }

absl::StatusOr<SecAggClient> SecAggClient::Create(const v1::SecAggParams& params,
                                                  uint32_t client_index) {
  FEDLORA_ASSIGN_OR_RETURN(SecAggGraph graph, SecAggGraph::Create(params));
  if (client_index >= params.num_clients()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "client index ", client_index, " is not below num_clients ", params.num_clients()));
  }
  return SecAggClient(std::make_unique<Impl>(params, client_index, std::move(graph)));
}

// ---------------------------------------------------------------------------------------------
// Step 0.

absl::StatusOr<v1::SecAggAdvertiseKeys> SecAggClient::AdvertiseKeys() {
  FEDLORA_RETURN_IF_ERROR(impl_->Expect(Step::kNew, "AdvertiseKeys"));
  absl::StatusOr<X25519KeyPair> c = GenerateX25519KeyPair();
  if (!c.ok()) return impl_->Refuse(c.status());
  absl::StatusOr<X25519KeyPair> s = GenerateX25519KeyPair();
  if (!s.ok()) return impl_->Refuse(s.status());
  impl_->c = *std::move(c);
  impl_->s = *std::move(s);
  v1::SecAggAdvertiseKeys out;
  out.set_client_index(impl_->index);
  out.set_encryption_public_key(impl_->c.public_key);
  out.set_mask_public_key(impl_->s.public_key);
  impl_->step = Step::kAdvertised;
  return out;
}

// ---------------------------------------------------------------------------------------------
// Step 1.

absl::StatusOr<v1::SecAggShareKeysResponse> SecAggClient::ShareKeys(
    const v1::SecAggShareKeysRequest& request) {
  FEDLORA_RETURN_IF_ERROR(impl_->Expect(Step::kAdvertised, "ShareKeys"));
  absl::StatusOr<v1::SecAggShareKeysResponse> r = impl_->ShareKeys(request);
  if (!r.ok()) return impl_->Refuse(r.status());
  impl_->step = Step::kSharedKeys;
  return r;
}

absl::StatusOr<v1::SecAggShareKeysResponse> SecAggClient::Impl::ShareKeys(
    const v1::SecAggShareKeysRequest& request) {
  const uint32_t n = params.num_clients();
  bool saw_self = false;
  std::set<std::string> distinct_keys;
  int64_t last = -1;
  for (const v1::SecAggAdvertiseKeys& k : request.keys()) {
    const uint32_t j = k.client_index();
    if (j >= n || static_cast<int64_t>(j) <= last) {
      return absl::InvalidArgumentError(
          absl::StrCat("ShareKeys request: client ", j, " out of range or out of order"));
    }
    last = j;
    if (k.encryption_public_key().size() != kX25519KeyBytes ||
        k.mask_public_key().size() != kX25519KeyBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("ShareKeys request: client ", j, "'s keys are not 32 bytes"));
    }
    if (!distinct_keys.insert(k.encryption_public_key()).second ||
        !distinct_keys.insert(k.mask_public_key()).second) {
      return absl::FailedPreconditionError(
          absl::StrCat("ShareKeys request: client ", j, " repeats a public key"));
    }
    if (j == index) {
      if (k.encryption_public_key() != c.public_key || k.mask_public_key() != s.public_key) {
        return absl::FailedPreconditionError(
            "ShareKeys request carries keys for this client it did not advertise");
      }
      saw_self = true;
    } else if (!IsNeighbour(j)) {
      return absl::FailedPreconditionError(
          absl::StrCat("ShareKeys request lists client ", j, ", not a neighbour"));
    } else {
      peers[j] = PeerKeys{k.encryption_public_key(), k.mask_public_key()};
    }
  }
  if (!saw_self)
    return absl::FailedPreconditionError("ShareKeys request omits this client's own keys");
  if (peers.size() < params.threshold()) {
    return absl::FailedPreconditionError(absl::StrCat("only ", peers.size(),
                                                      " neighbours advertised keys, fewer than ",
                                                      "the threshold ", params.threshold()));
  }

  FEDLORA_ASSIGN_OR_RETURN(b, RandomBytes(kShamirSecretBytes));
  std::vector<uint32_t> xs;
  for (const auto& [j, unused] : peers) xs.push_back(j + 1);
  FEDLORA_ASSIGN_OR_RETURN(std::vector<ShamirShare> b_shares,
                           ShamirSplitAt(b, params.threshold(), xs));
  FEDLORA_ASSIGN_OR_RETURN(std::vector<ShamirShare> s_shares,
                           ShamirSplitAt(s.private_key, params.threshold(), xs));

  v1::SecAggShareKeysResponse out;
  out.set_client_index(index);
  size_t q = 0;
  for (const auto& peer : peers) {
    // Named copies, not structured bindings: a lambda below uses them (clang 14 cannot capture
    // structured bindings).
    const uint32_t j = peer.first;
    const auto& keys = peer.second;
    std::string plaintext;
    AppendU32(plaintext, index);
    AppendU32(plaintext, j);
    plaintext += b_shares[q].y;
    plaintext += s_shares[q].y;
    Wipe(b_shares[q].y);
    Wipe(s_shares[q].y);
    ++q;
    // nonce || AES-256-GCM(k_{i->j}, nonce, aad, plaintext); the key is used for this one message.
    auto seal = [&]() -> absl::StatusOr<std::string> {
      FEDLORA_ASSIGN_OR_RETURN(
          std::string key,
          SecAggShareKey(params, c.private_key, keys.encryption_public_key, index, j));
      FEDLORA_ASSIGN_OR_RETURN(std::string nonce, RandomBytes(kGcmNonceBytes));
      absl::StatusOr<std::string> sealed =
          Aes256GcmSeal(key, nonce, SecAggShareAssociatedData(params, index, j), plaintext);
      Wipe(key);
      if (!sealed.ok()) return sealed.status();
      return nonce + *sealed;
    };
    absl::StatusOr<std::string> ciphertext = seal();
    Wipe(plaintext);
    if (!ciphertext.ok()) return ciphertext.status();
    v1::SecAggEncryptedShares* m = out.add_shares();
    m->set_sender(index);
    m->set_receiver(j);
    m->set_ciphertext(*std::move(ciphertext));
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Step 2.

// The plaintext of one neighbour's encrypted shares, checked for this round, sender and receiver.
absl::StatusOr<std::string> SecAggClient::Impl::DecryptShares(const v1::SecAggEncryptedShares& m) {
  const uint32_t j = m.sender();
  if (m.ciphertext().size() != kSecAggShareCiphertextBytes) {
    return absl::InvalidArgumentError(absl::StrCat("encrypted shares from client ", j, " are ",
                                                   m.ciphertext().size(), " bytes, expected ",
                                                   kSecAggShareCiphertextBytes));
  }
  FEDLORA_ASSIGN_OR_RETURN(
      std::string key,
      SecAggShareKey(params, c.private_key, peers.at(j).encryption_public_key, j, index));
  const std::string_view ct = m.ciphertext();
  absl::StatusOr<std::string> plaintext =
      Aes256GcmOpen(key, ct.substr(0, kGcmNonceBytes), SecAggShareAssociatedData(params, j, index),
                    ct.substr(kGcmNonceBytes));
  Wipe(key);
  if (!plaintext.ok()) {
    return absl::PermissionDeniedError(
        absl::StrCat("encrypted shares from client ", j,
                     " do not authenticate: ", std::string(plaintext.status().message())));
  }
  if (plaintext->size() != kSecAggSharePlaintextBytes || ReadU32(*plaintext) != j ||
      ReadU32(std::string_view(*plaintext).substr(4)) != index) {
    Wipe(*plaintext);
    return absl::PermissionDeniedError(
        absl::StrCat("shares from client ", j, " name the wrong sender or receiver"));
  }
  return plaintext;
}

absl::StatusOr<v1::SecAggMaskedInputResponse> SecAggClient::MaskedInput(
    const v1::SecAggMaskedInputRequest& request, std::span<const uint64_t> input) {
  FEDLORA_RETURN_IF_ERROR(impl_->Expect(Step::kSharedKeys, "MaskedInput"));
  // The caller's input is checked first: a wrong input is the caller's to fix and changes nothing.
  if (input.size() != impl_->params.vector_length()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "input has ", input.size(), " values, the round expects ", impl_->params.vector_length()));
  }
  const uint64_t mask = ModulusMask(impl_->params.modulus_bits());
  for (size_t i = 0; i < input.size(); ++i) {
    if ((input[i] & ~mask) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("input value ", i, " is not below 2^", impl_->params.modulus_bits()));
    }
  }
  absl::StatusOr<v1::SecAggMaskedInputResponse> r = impl_->MaskedInput(request, input);
  if (!r.ok()) return impl_->Refuse(r.status());
  impl_->step = Step::kMasked;
  return r;
}

absl::StatusOr<v1::SecAggMaskedInputResponse> SecAggClient::Impl::MaskedInput(
    const v1::SecAggMaskedInputRequest& request, std::span<const uint64_t> input) {
  FEDLORA_RETURN_IF_ERROR(ReadIndexList(request.shared_keys(), params.num_clients(), "U2", &u2));
  if (!std::binary_search(u2.begin(), u2.end(), index)) {
    return absl::FailedPreconditionError("U2 does not list this client, which completed ShareKeys");
  }
  std::set<uint32_t> expected;  // U2 ∩ N(i)
  for (uint32_t j : u2) {
    if (j == index || !IsNeighbour(j)) continue;
    if (!peers.contains(j)) {
      return absl::FailedPreconditionError(
          absl::StrCat("U2 lists neighbour ", j, ", which did not advertise keys"));
    }
    expected.insert(j);
  }
  if (expected.size() < params.threshold()) {
    return absl::FailedPreconditionError(
        absl::StrCat("only ", expected.size(), " neighbours completed ShareKeys, ",
                     "fewer than the threshold ", params.threshold()));
  }
  if (static_cast<size_t>(request.shares_size()) != expected.size()) {
    return absl::FailedPreconditionError(absl::StrCat("expected encrypted shares from ",
                                                      expected.size(), " neighbours in U2, got ",
                                                      request.shares_size()));
  }
  for (const v1::SecAggEncryptedShares& m : request.shares()) {
    const uint32_t j = m.sender();
    if (m.receiver() != index) {
      return absl::FailedPreconditionError(
          absl::StrCat("encrypted shares from ", j, " are addressed to ", m.receiver()));
    }
    if (!expected.contains(j)) {
      return absl::FailedPreconditionError(
          absl::StrCat("encrypted shares from ", j, ", not a neighbour in U2"));
    }
    if (held.contains(j))
      return absl::FailedPreconditionError(absl::StrCat("two sets of shares from client ", j));
    FEDLORA_ASSIGN_OR_RETURN(std::string plaintext, DecryptShares(m));
    HeldShares h{plaintext.substr(8, kShamirShareBytes),
                 plaintext.substr(8 + kShamirShareBytes, kShamirShareBytes)};
    Wipe(plaintext);
    held[j] = std::move(h);
    for (const std::string* y : {&held[j].self_mask_seed, &held[j].mask_private_key}) {
      FEDLORA_RETURN_IF_ERROR(CheckShamirShare(ShamirShare{index + 1, *y}));
    }
  }

  const uint32_t m = params.modulus_bits();
  std::vector<uint64_t> y(input.begin(), input.end());
  FEDLORA_RETURN_IF_ERROR(AddSecAggMask(b, m, /*subtract=*/false, y));
  for (uint32_t j : expected) {
    FEDLORA_ASSIGN_OR_RETURN(
        std::string seed,
        SecAggPairwiseSeed(params, s.private_key, peers.at(j).mask_public_key, index, j));
    absl::Status st = AddSecAggMask(seed, m, /*subtract=*/index > j, y);
    Wipe(seed);
    FEDLORA_RETURN_IF_ERROR(st);
  }
  const uint64_t mask = ModulusMask(m);
  for (uint64_t& v : y) v &= mask;
  FEDLORA_ASSIGN_OR_RETURN(std::string packed, PackSecAggVector(y, m));
  // Our own secrets are no longer needed: the server rebuilds b or s from the neighbours' shares.
  Wipe(c.private_key);
  Wipe(s.private_key);
  Wipe(b);
  v1::SecAggMaskedInputResponse out;
  out.set_client_index(index);
  out.set_masked_input(std::move(packed));
  return out;
}

// ---------------------------------------------------------------------------------------------
// Step 3.

absl::StatusOr<v1::SecAggUnmaskingResponse> SecAggClient::Unmask(
    const v1::SecAggUnmaskingRequest& request) {
  if (impl_->step == Step::kDone) {
    return absl::FailedPreconditionError(absl::StrCat(
        "SecAggClient ", impl_->index, ": already answered an unmasking request this round"));
  }
  FEDLORA_RETURN_IF_ERROR(impl_->Expect(Step::kMasked, "Unmask"));
  absl::StatusOr<v1::SecAggUnmaskingResponse> r = impl_->Unmask(request);
  if (!r.ok()) return impl_->Refuse(r.status());
  impl_->step = Step::kDone;
  impl_->WipeSecrets();
  return r;
}

absl::StatusOr<v1::SecAggUnmaskingResponse> SecAggClient::Impl::Unmask(
    const v1::SecAggUnmaskingRequest& request) {
  std::vector<uint32_t> survivors, dropped;
  FEDLORA_RETURN_IF_ERROR(
      ReadIndexList(request.survivors(), params.num_clients(), "survivors", &survivors));
  FEDLORA_RETURN_IF_ERROR(
      ReadIndexList(request.dropped(), params.num_clients(), "dropped", &dropped));
  const auto in = [](const std::vector<uint32_t>& v, uint32_t x) {
    return std::binary_search(v.begin(), v.end(), x);
  };
  for (uint32_t j : survivors) {
    if (in(dropped, j)) {
      return absl::FailedPreconditionError(
          absl::StrCat("unmasking request lists client ", j, " both as surviving and as dropped"));
    }
    if (!in(u2, j)) {
      return absl::FailedPreconditionError(
          absl::StrCat("unmasking request lists client ", j,
                       " as surviving but it never completed ShareKeys (not in U2)"));
    }
  }
  for (uint32_t j : dropped) {
    if (!in(u2, j)) {
      return absl::FailedPreconditionError(
          absl::StrCat("unmasking request lists client ", j, " as dropped but it is not in U2"));
    }
  }
  if (survivors.size() + dropped.size() != u2.size()) {
    return absl::FailedPreconditionError(
        "unmasking request: survivors and dropped do not cover U2");
  }
  if (!in(survivors, index)) {
    return absl::FailedPreconditionError(
        "unmasking request does not list this client as a survivor");
  }
  if (survivors.size() < params.min_survivors()) {
    return absl::FailedPreconditionError(absl::StrCat("unmasking request has ", survivors.size(),
                                                      " survivors, fewer than min_survivors ",
                                                      params.min_survivors()));
  }
  size_t surviving_neighbours = 0;
  for (uint32_t j : survivors) surviving_neighbours += IsNeighbour(j) ? 1 : 0;
  if (surviving_neighbours < params.threshold()) {
    return absl::FailedPreconditionError(
        absl::StrCat("unmasking request leaves ", surviving_neighbours,
                     " surviving neighbours, fewer than the threshold ", params.threshold()));
  }
  v1::SecAggUnmaskingResponse out;
  out.set_client_index(index);
  for (const auto& [j, h] : held) {
    v1::SecAggRevealedShare* r = out.add_shares();
    r->set_owner(j);
    if (in(survivors, j)) {
      r->set_kind(v1::SEC_AGG_SHARE_KIND_SELF_MASK_SEED);
      r->set_share(h.self_mask_seed);
    } else {
      r->set_kind(v1::SEC_AGG_SHARE_KIND_MASK_PRIVATE_KEY);
      r->set_share(h.mask_private_key);
    }
  }
  return out;
}

}  // namespace fedlora::crypto
