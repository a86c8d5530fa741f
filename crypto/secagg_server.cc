// SecAggServer: the server's side of one SecAgg+ round (see crypto/secagg.h).
#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "crypto/envelope.h"
#include "crypto/secagg.h"
#include "crypto/secagg_internal.h"
#include "crypto/shamir.h"

namespace fedlora::crypto {

using secagg_internal::ModulusMask;
using secagg_internal::Wipe;

namespace {

enum class Step { kAdvertise, kShareKeys, kMaskedInput, kUnmasking, kFinished, kAborted };

const char* StepName(Step s) {
  switch (s) {
    case Step::kAdvertise:
      return "AdvertiseKeys";
    case Step::kShareKeys:
      return "ShareKeys";
    case Step::kMaskedInput:
      return "MaskedInput";
    case Step::kUnmasking:
      return "Unmasking";
    case Step::kFinished:
      return "finished";
    case Step::kAborted:
      return "aborted";
  }
  return "?";
}

bool Contains(const std::vector<uint32_t>& sorted, uint32_t x) {
  return std::binary_search(sorted.begin(), sorted.end(), x);
}

}  // namespace

struct SecAggServer::Impl {
  v1::SecAggParams params;
  SecAggGraph graph;
  Step step = Step::kAdvertise;
  std::string probe_private_key;  // a throwaway key to reject small-order public keys
  std::vector<std::optional<v1::SecAggAdvertiseKeys>> keys;  // by client
  std::set<std::string> seen_keys;
  std::vector<uint32_t> u1, u2, u3;
  // Step 1: by sender, (receiver, ciphertext) ascending by receiver.
  std::vector<std::optional<std::vector<std::pair<uint32_t, std::string>>>> outgoing;
  // Step 2: the running sum of masked inputs (mod 2^64; reduced mod 2^m at the end).
  std::vector<bool> have_input;
  std::vector<uint64_t> sum;
  // Step 3.
  std::vector<bool> responded;
  std::map<uint32_t, std::vector<ShamirShare>> self_mask_shares;    // survivors
  std::map<uint32_t, std::vector<ShamirShare>> private_key_shares;  // dropped
  std::map<uint32_t, std::string> rebuilt_b, rebuilt_s;
  std::vector<uint32_t> misbehaving;  // revealers of shares found wrong

  // The secret of `shares` (at least the threshold): checked, and their wrong revealers noted,
  // when there are more.
  absl::StatusOr<std::string> Rebuild(const std::vector<ShamirShare>& shares);

  Impl(v1::SecAggParams p, SecAggGraph g) : params(std::move(p)), graph(std::move(g)) {
    const uint32_t n = params.num_clients();
    keys.resize(n);
    outgoing.resize(n);
    have_input.assign(n, false);
    responded.assign(n, false);
  }
  ~Impl() { WipeSecrets(); }

  void WipeSecrets() {
    for (auto* shares : {&self_mask_shares, &private_key_shares}) {
      for (auto& [j, v] : *shares) {
        for (ShamirShare& s : v) Wipe(s.y);
      }
      shares->clear();
    }
    for (auto* m : {&rebuilt_b, &rebuilt_s}) {
      for (auto& [j, v] : *m) Wipe(v);
      m->clear();
    }
  }

  absl::Status Expect(Step expected, const char* call) const {
    if (step == expected) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat("SecAggServer: ", call, " called in step '",
                                                      StepName(step), "', expected '",
                                                      StepName(expected), "'"));
  }

  absl::Status Abort(const std::string& why) {
    step = Step::kAborted;
    WipeSecrets();
    sum.clear();
    return absl::FailedPreconditionError(absl::StrCat("SecAggServer: round aborted: ", why));
  }

  absl::Status CheckSurvivorCount(const std::vector<uint32_t>& set, const char* name) {
    if (set.size() >= params.min_survivors()) return absl::OkStatus();
    return Abort(absl::StrCat(set.size(), " clients in ", name, ", fewer than min_survivors ",
                              params.min_survivors()));
  }

  absl::Status CheckIndex(uint32_t i, const char* what) const {
    if (i < params.num_clients()) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", i, " is not below num_clients ", params.num_clients()));
  }

  // j's neighbours that are in `set`, ascending.
  std::vector<uint32_t> NeighboursIn(uint32_t j, const std::vector<uint32_t>& set) const {
    std::vector<uint32_t> out;
    for (uint32_t x : graph.Neighbours(j)) {
      if (Contains(set, x)) out.push_back(x);
    }
    return out;
  }

  absl::StatusOr<std::vector<uint64_t>> Finish();
};

SecAggServer::SecAggServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SecAggServer::SecAggServer(SecAggServer&&) noexcept = default;
SecAggServer& SecAggServer::operator=(SecAggServer&&) noexcept = default;
SecAggServer::~SecAggServer() = default;

absl::StatusOr<SecAggServer> SecAggServer::Create(const v1::SecAggParams& params) {
  FEDLORA_ASSIGN_OR_RETURN(SecAggGraph graph, SecAggGraph::Create(params));
  auto impl = std::make_unique<Impl>(params, std::move(graph));
  FEDLORA_ASSIGN_OR_RETURN(X25519KeyPair probe, GenerateX25519KeyPair());
  impl->probe_private_key = std::move(probe.private_key);
  return SecAggServer(std::move(impl));
}

const v1::SecAggParams& SecAggServer::params() const { return impl_->params; }
const std::vector<uint32_t>& SecAggServer::advertised() const { return impl_->u1; }
const std::vector<uint32_t>& SecAggServer::shared_keys() const { return impl_->u2; }
const std::vector<uint32_t>& SecAggServer::survivors() const { return impl_->u3; }
bool SecAggServer::aborted() const { return impl_->step == Step::kAborted; }
const std::map<uint32_t, std::string>& SecAggServer::reconstructed_self_mask_seeds() const {
  return impl_->rebuilt_b;
}
const std::vector<uint32_t>& SecAggServer::misbehaving() const { return impl_->misbehaving; }
const std::map<uint32_t, std::string>& SecAggServer::reconstructed_mask_private_keys() const {
  return impl_->rebuilt_s;
}

std::vector<uint32_t> SecAggServer::unmasking_responders() const {
  std::vector<uint32_t> out;
  for (uint32_t i = 0; i < impl_->responded.size(); ++i) {
    if (impl_->responded[i]) out.push_back(i);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Step 0.

absl::Status SecAggServer::ReceiveAdvertiseKeys(const v1::SecAggAdvertiseKeys& message) {
  Impl& s = *impl_;
  FEDLORA_RETURN_IF_ERROR(s.Expect(Step::kAdvertise, "ReceiveAdvertiseKeys"));
  const uint32_t i = message.client_index();
  FEDLORA_RETURN_IF_ERROR(s.CheckIndex(i, "AdvertiseKeys from client"));
  if (s.keys[i].has_value())
    return absl::AlreadyExistsError(absl::StrCat("client ", i, " already advertised keys"));
  for (const std::string* k : {&message.encryption_public_key(), &message.mask_public_key()}) {
    if (k->size() != kX25519KeyBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("client ", i, " advertised a key of ", k->size(), " bytes"));
    }
    // X25519SharedSecret refuses small-order points, which would give every neighbour a zero secret.
    absl::StatusOr<std::string> probe = X25519SharedSecret(s.probe_private_key, *k);
    if (!probe.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "client ", i, " advertised an unusable key: ", std::string(probe.status().message())));
    }
    Wipe(*probe);
  }
  if (message.encryption_public_key() == message.mask_public_key() ||
      s.seen_keys.contains(message.encryption_public_key()) ||
      s.seen_keys.contains(message.mask_public_key())) {
    return absl::InvalidArgumentError(
        absl::StrCat("client ", i, " advertised a public key already in use"));
  }
  s.seen_keys.insert(message.encryption_public_key());
  s.seen_keys.insert(message.mask_public_key());
  s.keys[i] = message;
  return absl::OkStatus();
}

absl::Status SecAggServer::CloseAdvertiseKeys() {
  Impl& s = *impl_;
  FEDLORA_RETURN_IF_ERROR(s.Expect(Step::kAdvertise, "CloseAdvertiseKeys"));
  for (uint32_t i = 0; i < s.keys.size(); ++i) {
    if (s.keys[i].has_value()) s.u1.push_back(i);
  }
  s.step = Step::kShareKeys;
  return s.CheckSurvivorCount(s.u1, "U1");
}

// ---------------------------------------------------------------------------------------------
// Step 1.

absl::StatusOr<v1::SecAggShareKeysRequest> SecAggServer::ShareKeysRequest(uint32_t client) const {
  const Impl& s = *impl_;
  FEDLORA_RETURN_IF_ERROR(s.Expect(Step::kShareKeys, "ShareKeysRequest"));
  FEDLORA_RETURN_IF_ERROR(s.CheckIndex(client, "client"));
  if (!Contains(s.u1, client))
    return absl::FailedPreconditionError(absl::StrCat("client ", client, " is not in U1"));
  v1::SecAggShareKeysRequest out;
  std::vector<uint32_t> listed = s.NeighboursIn(client, s.u1);
  listed.insert(std::upper_bound(listed.begin(), listed.end(), client), client);
  for (uint32_t j : listed) *out.add_keys() = *s.keys[j];
  return out;
}

absl::Status SecAggServer::ReceiveShareKeys(const v1::SecAggShareKeysResponse& message) {
  Impl& s = *impl_;
  FEDLORA_RETURN_IF_ERROR(s.Expect(Step::kShareKeys, "ReceiveShareKeys"));
  const uint32_t i = message.client_index();
  FEDLORA_RETURN_IF_ERROR(s.CheckIndex(i, "ShareKeys from client"));
  if (!Contains(s.u1, i))
    return absl::FailedPreconditionError(absl::StrCat("client ", i, " is not in U1"));
  if (s.outgoing[i].has_value())
    return absl::AlreadyExistsError(absl::StrCat("client ", i, " already shared keys"));
  const std::vector<uint32_t> expected = s.NeighboursIn(i, s.u1);
  if (static_cast<size_t>(message.shares_size()) != expected.size()) {
    return absl::InvalidArgumentError(absl::StrCat("client ", i, " sent shares for ",
                                                   message.shares_size(), " neighbours, expected ",
                                                   expected.size()));
  }
  std::vector<std::pair<uint32_t, std::string>> out;
  for (const v1::SecAggEncryptedShares& m : message.shares()) {
    if (m.sender() != i)
      return absl::InvalidArgumentError(absl::StrCat("client ", i, " sent shares as ", m.sender()));
    if (!Contains(expected, m.receiver())) {
      return absl::InvalidArgumentError(
          absl::StrCat("client ", i, " sent shares to ", m.receiver(), ", not a neighbour in U1"));
    }
    if (m.ciphertext().size() != kSecAggShareCiphertextBytes) {
      return absl::InvalidArgumentError(absl::StrCat("client ", i, " sent encrypted shares of ",
                                                     m.ciphertext().size(), " bytes, expected ",
                                                     kSecAggShareCiphertextBytes));
    }
    out.emplace_back(m.receiver(), m.ciphertext());
  }
  std::sort(out.begin(), out.end());
  for (size_t q = 1; q < out.size(); ++q) {
    if (out[q].first == out[q - 1].first) {
      return absl::InvalidArgumentError(
          absl::StrCat("client ", i, " sent two sets of shares to ", out[q].first));
    }
  }
  s.outgoing[i] = std::move(out);
  return absl::OkStatus();
}

absl::Status SecAggServer::CloseShareKeys() {
  Impl& s = *impl_;
  FEDLORA_RETURN_IF_ERROR(s.Expect(Step::kShareKeys, "CloseShareKeys"));
  for (uint32_t i = 0; i < s.outgoing.size(); ++i) {
    if (s.outgoing[i].has_value()) s.u2.push_back(i);
  }
  s.step = Step::kMaskedInput;
  return s.CheckSurvivorCount(s.u2, "U2");
}

// ---------------------------------------------------------------------------------------------
// Step 2.

absl::StatusOr<v1::SecAggMaskedInputRequest> SecAggServer::MaskedInputRequest(
    uint32_t client) const {
  const Impl& s = *impl_;
  FEDLORA_RETURN_IF_ERROR(s.Expect(Step::kMaskedInput, "MaskedInputRequest"));
  FEDLORA_RETURN_IF_ERROR(s.CheckIndex(client, "client"));
  if (!Contains(s.u2, client))
    return absl::FailedPreconditionError(absl::StrCat("client ", client, " is not in U2"));
  v1::SecAggMaskedInputRequest out;
  for (uint32_t j : s.u2) out.add_shared_keys(j);
  for (uint32_t j : s.NeighboursIn(client, s.u2)) {
    const auto& from_j = *s.outgoing[j];
    auto it = std::lower_bound(from_j.begin(), from_j.end(), std::make_pair(client, std::string()));
    if (it == from_j.end() || it->first != client) {
      return absl::InternalError(
          absl::StrCat("no shares from ", j, " to ", client));  // checked on receipt
    }
    v1::SecAggEncryptedShares* m = out.add_shares();
    m->set_sender(j);
    m->set_receiver(client);
    m->set_ciphertext(it->second);
  }
  return out;
}

absl::Status SecAggServer::ReceiveMaskedInput(const v1::SecAggMaskedInputResponse& message) {
  Impl& s = *impl_;
  FEDLORA_RETURN_IF_ERROR(s.Expect(Step::kMaskedInput, "ReceiveMaskedInput"));
  const uint32_t i = message.client_index();
  FEDLORA_RETURN_IF_ERROR(s.CheckIndex(i, "MaskedInput from client"));
  if (!Contains(s.u2, i))
    return absl::FailedPreconditionError(absl::StrCat("client ", i, " is not in U2"));
  if (s.have_input[i])
    return absl::AlreadyExistsError(absl::StrCat("client ", i, " already sent its masked input"));
  if (s.sum.empty()) s.sum.assign(s.params.vector_length(), 0);
  absl::Status added =
      secagg_internal::AddPackedVector(message.masked_input(), s.params.modulus_bits(), s.sum);
  if (!added.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("masked input from client ", i, ": ", std::string(added.message())));
  }
  s.have_input[i] = true;
  return absl::OkStatus();
}

absl::Status SecAggServer::CloseMaskedInput() {
  Impl& s = *impl_;
  FEDLORA_RETURN_IF_ERROR(s.Expect(Step::kMaskedInput, "CloseMaskedInput"));
  for (uint32_t i = 0; i < s.have_input.size(); ++i) {
    if (s.have_input[i]) s.u3.push_back(i);
  }
  s.step = Step::kUnmasking;
  FEDLORA_RETURN_IF_ERROR(s.CheckSurvivorCount(s.u3, "U3"));
  // Honest clients refuse to unmask when fewer than t of their neighbours survive; stop here.
  for (uint32_t i : s.u3) {
    const size_t alive = s.NeighboursIn(i, s.u3).size();
    if (alive < s.params.threshold()) {
      return s.Abort(absl::StrCat("survivor ", i, " has ", alive,
                                  " surviving neighbours, fewer than the threshold ",
                                  s.params.threshold()));
    }
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Step 3.

absl::StatusOr<v1::SecAggUnmaskingRequest> SecAggServer::UnmaskingRequest() const {
  const Impl& s = *impl_;
  FEDLORA_RETURN_IF_ERROR(s.Expect(Step::kUnmasking, "UnmaskingRequest"));
  v1::SecAggUnmaskingRequest out;
  for (uint32_t j : s.u2) {
    if (Contains(s.u3, j)) {
      out.add_survivors(j);
    } else {
      out.add_dropped(j);
    }
  }
  return out;
}

absl::Status SecAggServer::ReceiveUnmasking(const v1::SecAggUnmaskingResponse& message) {
  Impl& s = *impl_;
  FEDLORA_RETURN_IF_ERROR(s.Expect(Step::kUnmasking, "ReceiveUnmasking"));
  const uint32_t r = message.client_index();
  FEDLORA_RETURN_IF_ERROR(s.CheckIndex(r, "Unmasking from client"));
  if (!Contains(s.u3, r))
    return absl::FailedPreconditionError(absl::StrCat("client ", r, " is not a survivor"));
  if (s.responded[r])
    return absl::AlreadyExistsError(absl::StrCat("client ", r, " already answered unmasking"));
  // r holds shares from exactly its neighbours in U2 (it was in U1 when they shared).
  const std::vector<uint32_t> expected = s.NeighboursIn(r, s.u2);
  if (static_cast<size_t>(message.shares_size()) != expected.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "client ", r, " revealed ", message.shares_size(), " shares, expected ", expected.size()));
  }
  std::vector<std::pair<uint32_t, ShamirShare>> accepted;
  std::set<uint32_t> owners;
  for (const v1::SecAggRevealedShare& m : message.shares()) {
    const uint32_t j = m.owner();
    if (!Contains(expected, j) || !owners.insert(j).second) {
      return absl::InvalidArgumentError(absl::StrCat("client ", r, " revealed a share of ", j,
                                                     ", not a neighbour in U2 or repeated"));
    }
    const auto want = Contains(s.u3, j) ? v1::SEC_AGG_SHARE_KIND_SELF_MASK_SEED
                                        : v1::SEC_AGG_SHARE_KIND_MASK_PRIVATE_KEY;
    if (m.kind() != want) {
      return absl::InvalidArgumentError(
          absl::StrCat("client ", r, " revealed the wrong kind of share of ", j));
    }
    ShamirShare share{r + 1, m.share()};
    absl::Status st = CheckShamirShare(share);
    if (!st.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("client ", r, "'s share of ", j, ": ", std::string(st.message())));
    }
    accepted.emplace_back(j, std::move(share));
  }
  for (auto& [j, share] : accepted) {
    (Contains(s.u3, j) ? s.self_mask_shares : s.private_key_shares)[j].push_back(std::move(share));
  }
  s.responded[r] = true;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint64_t>> SecAggServer::Finish() {
  FEDLORA_RETURN_IF_ERROR(impl_->Expect(Step::kUnmasking, "Finish"));
  absl::StatusOr<std::vector<uint64_t>> result = impl_->Finish();
  if (!result.ok() && impl_->step != Step::kAborted) {
    (void)impl_->Abort(std::string(result.status().message()));  // e.g. an OpenSSL failure part way
  }
  return result;
}

absl::StatusOr<std::string> SecAggServer::Impl::Rebuild(const std::vector<ShamirShare>& shares) {
  const uint32_t t = params.threshold();
  if (shares.size() <= t) return ShamirCombine(shares, t);
  FEDLORA_ASSIGN_OR_RETURN(ShamirDecoded decoded, ShamirCombineChecked(shares, t));
  for (uint32_t x : decoded.wrong_x) {
    const uint32_t revealer = x - 1;  // client r's shares are at x = r + 1
    if (!Contains(misbehaving, revealer)) {
      misbehaving.insert(std::upper_bound(misbehaving.begin(), misbehaving.end(), revealer),
                         revealer);
    }
  }
  return std::move(decoded.secret);
}

absl::StatusOr<std::vector<uint64_t>> SecAggServer::Impl::Finish() {
  const uint32_t t = params.threshold();
  // Every check comes before any reconstruction: an aborted round reveals nothing.
  if (u3.size() < params.min_survivors()) {
    return Abort(
        absl::StrCat(u3.size(), " survivors, fewer than min_survivors ", params.min_survivors()));
  }
  for (uint32_t i : u3) {
    const size_t have = self_mask_shares.contains(i) ? self_mask_shares.at(i).size() : 0;
    if (have < t) {
      return Abort(absl::StrCat("survivor ", i, "'s self-mask seed has ", have,
                                " shares, fewer than the threshold ", t));
    }
  }
  std::vector<std::pair<uint32_t, std::vector<uint32_t>>>
      dropped;  // j and its surviving neighbours
  for (uint32_t j : u2) {
    if (Contains(u3, j)) continue;
    std::vector<uint32_t> alive = NeighboursIn(j, u3);
    if (alive.empty()) continue;  // j masked against no survivor: nothing to remove
    const size_t have = private_key_shares.contains(j) ? private_key_shares.at(j).size() : 0;
    if (have < t) {
      return Abort(absl::StrCat("dropped client ", j, "'s mask key has ", have,
                                " shares, fewer than the threshold ", t));
    }
    dropped.emplace_back(j, std::move(alive));
  }

  const uint32_t m = params.modulus_bits();
  if (sum.empty()) sum.assign(params.vector_length(), 0);
  for (uint32_t i : u3) {
    absl::StatusOr<std::string> b = Rebuild(self_mask_shares.at(i));
    if (!b.ok())
      return Abort(
          absl::StrCat("survivor ", i, "'s self-mask seed: ", std::string(b.status().message())));
    rebuilt_b[i] = *b;
    FEDLORA_RETURN_IF_ERROR(AddSecAggMask(*b, m, /*subtract=*/true, sum));
    Wipe(*b);
  }
  for (const auto& [j, alive] : dropped) {
    absl::StatusOr<std::string> sk = Rebuild(private_key_shares.at(j));
    if (!sk.ok())
      return Abort(
          absl::StrCat("dropped client ", j, "'s mask key: ", std::string(sk.status().message())));
    absl::StatusOr<std::string> pk = X25519PublicKey(*sk);
    if (!pk.ok() || *pk != keys[j]->mask_public_key()) {
      Wipe(*sk);
      (void)Abort("inconsistent shares");
      return absl::DataLossError(
          absl::StrCat("SecAggServer: dropped client ", j,
                       "'s rebuilt mask key does not match its advertised key"));
    }
    rebuilt_s[j] = *sk;
    for (uint32_t i : alive) {
      FEDLORA_ASSIGN_OR_RETURN(std::string seed,
                               SecAggPairwiseSeed(params, *sk, keys[i]->mask_public_key(), j, i));
      // i added sign(i, j) PRG(s_ij): +1 when i < j. Take it out.
      absl::Status st = AddSecAggMask(seed, m, /*subtract=*/i < j, sum);
      Wipe(seed);
      FEDLORA_RETURN_IF_ERROR(st);
    }
    Wipe(*sk);
  }
  const uint64_t mask = ModulusMask(m);
  for (uint64_t& v : sum) v &= mask;
  step = Step::kFinished;
  for (auto* shares : {&self_mask_shares, &private_key_shares}) {
    for (auto& [j, v] : *shares) {
      for (ShamirShare& sh : v) Wipe(sh.y);
    }
    shares->clear();
  }
  return std::move(sum);
}

}  // namespace fedlora::crypto
