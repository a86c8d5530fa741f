// Secure aggregation (SecAgg+): the server learns the sum of the clients' integer vectors mod 2^m and
// nothing else about any one of them, even when clients drop out part way. Bonawitz et al. 2017
// ("Practical Secure Aggregation for Privacy-Preserving Machine Learning") run over the sparse
// neighbour graph of Bell et al. 2020 ("Secure Single-Server Aggregation with (Poly)Logarithmic
// Overhead"): each client shares its secrets with, and masks against, only its k = O(log n)
// neighbours instead of all n - 1 others. A library, no networking: one SecAggClient per client per
// round and one SecAggServer per round exchange the messages of proto/fedlora/v1/secure_aggregation.proto.
//
// A round (U1 ⊇ U2 ⊇ U3 are the clients that completed steps 0, 1, 2; N(i) is i's neighbours):
//   Step 0 AdvertiseKeys: client i draws two fresh X25519 key pairs, c_i (share encryption) and s_i
//     (mask agreement), and sends both public keys.
//   Step 1 ShareKeys: i receives the keys of its neighbours in U1, draws a 32-byte self-mask seed
//     b_i, Shamir-shares b_i and s_i's private key t-of-|N(i) ∩ U1| (share x = neighbour index + 1)
//     and sends each neighbour j its two shares under AES-256-GCM keyed by
//     HKDF(X25519(c_i, c_j)), addressed to j through the server.
//   Step 2 MaskedInput: i receives U2 and the shares addressed to it, decrypts and checks them, and
//     sends y_i = x_i + PRG(b_i) + sum_{j in U2 ∩ N(i)} sign(i, j) PRG(s_ij)  mod 2^m, with
//     s_ij = HKDF(X25519(s_i, s_j)) and sign(i, j) = +1 if i < j, -1 otherwise.
//   Step 3 Unmasking: the server sends U3 (the survivors) and U2 \ U3 (the dropped); i reveals, for
//     each neighbour j in U2, its share of b_j if j survived or of s_j if j dropped, never both.
//   Finish: the server rebuilds each survivor's b and each dropped client's s from t shares, removes
//     PRG(b_i) for survivors and the pairwise masks survivors added with dropped clients; the
//     survivors' pairwise masks cancel, leaving sum_{i in U3} x_i mod 2^m.
//
// Derivations (round = round_id as 8 bytes little-endian, indices as 4 bytes little-endian, labels
// as written, || concatenation; every HKDF is HKDF-SHA256 with salt = round_nonce and 32 bytes out):
//   share key k_{i->j} = HKDF(X25519(c_i, c_j), info = "fedlora/v1 secagg share key" || round || i || j)
//   share AAD          = "fedlora/v1 secagg share" || round || round_nonce || i || j
//   share plaintext    = i || j || y of the share of b_i (33) || y of the share of s_i (33)
//   pair seed s_ij     = HKDF(X25519(s_i, s_j), info = "fedlora/v1 secagg pairwise mask" || round ||
//                             min(i, j) || max(i, j))
//   PRG(seed)          = crypto::Prg(seed, stream 0) keystream read as little-endian words of 4 bytes
//                        when m <= 32 and 8 bytes otherwise, each reduced mod 2^m.
//
// Neighbour graph: the Harary graph H(k, n) (ring position p adjacent to p ± 1..k/2 mod n; the
// complete graph when k = n - 1) over the clients permuted by a Fisher-Yates shuffle drawn from
// crypto::Prg(graph_seed) (uniform by rejection sampling on 64-bit words). Every party computes it
// from SecAggParams, so the server cannot show clients inconsistent neighbourhoods.
//
// Security model and its limits:
// - Honest-but-curious server: it follows the protocol but keeps and studies every message. Given
//   every message of a round it learns only the sum over U3 (and the membership of U1..U3).
// - Not implemented: signatures on advertised keys (Bonawitz's malicious-server variant with a PKI).
//   A server that substitutes public keys can read the shares and unmask individual inputs. Clients
//   colluding with the server are likewise out of scope for the parameters below.
// - Defence in depth against a server that lies in step 3: an honest client refuses a request that
//   lists a client as both surviving and dropped, lists as survivor a client outside U2, leaves
//   fewer than t of its neighbours or fewer than min_survivors clients surviving, or omits the
//   client itself; and it answers only one unmasking request. Because t > k/2, no server can gather
//   t shares of b_j and t shares of s_j from honest neighbours of j.
// - Why k/2 < t: each survivor keeps > k/2 surviving neighbours, so at least one on each side of the
//   ring within distance k/2; consecutive survivors around the ring are then adjacent, the survivors'
//   mask graph is connected and no partial sum (let alone a single input) is left unmasked.
// - The server picks graph_seed; a malicious one could try seeds until the graph suits it (Bell et
//   al. derive the graph from shared randomness). Outside the honest-but-curious model, like keys.
// - Fresh per round: both key pairs and b are drawn per SecAggClient; round_nonce (random per round)
//   salts every derivation, so nothing is reused across rounds or restarts.
// - Dropouts: a round completes only if every survivor keeps t surviving neighbours and t of each
//   survivor's (and each dropped client's) neighbours answer step 3. As t > k/2, that stays below
//   half of every neighbourhood; see kSecAggDegreeConstant for odds at given dropout rates.
// Secrets (private keys, b, received shares) are wiped when a client finishes or refuses.
//
// Errors: InvalidArgument for malformed parameters or messages (naming the field), FailedPrecondition
// for a step out of order or repeated and for an inconsistent request a client refuses (a refusal is
// final: the client answers nothing more), PermissionDenied for shares that do not authenticate,
// AlreadyExists for a second message from one client in one step, Internal when OpenSSL fails.
// Neither class is thread-safe; both are movable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fedlora/v1/secure_aggregation.pb.h"

namespace fedlora::crypto {

inline constexpr size_t kSecAggNonceBytes = 32;
inline constexpr size_t kSecAggSeedBytes = 32;
inline constexpr uint32_t kSecAggMaxClients = 1u << 20;
inline constexpr uint64_t kSecAggMaxVectorLength = uint64_t{1} << 28;
// nonce (12) || ciphertext of (sender 4, receiver 4, two 33-byte shares) || tag (16).
inline constexpr size_t kSecAggSharePlaintextBytes = 4 + 4 + 2 * 33;
inline constexpr size_t kSecAggShareCiphertextBytes = 12 + kSecAggSharePlaintextBytes + 16;
// c in the recommended degree min(n - 1, 2 * ceil(c * log2 n)): n = 100 gives k = 20, n = 1,000
// k = 30, n = 10^6 k = 60. With t = k/2 + 1 and independent dropouts at rate 10%, a client loses more
// than k - t of its neighbours with probability 7e-6 (n = 100), 4e-8 (n = 1,000); at 30%, 5e-2 and
// 2e-2: plan for dropout rates well below one half.
inline constexpr double kSecAggDegreeConstant = 1.5;

// The recommended degree for n clients (see kSecAggDegreeConstant); n - 1 (complete) for n <= 13.
uint32_t RecommendedSecAggDegree(uint32_t num_clients);
// The recommended threshold for degree k: k/2 + 1 rounded down, the smallest allowed, which tolerates
// the most dropouts (k - t neighbours of each client).
uint32_t RecommendedSecAggThreshold(uint32_t degree);

// Checks every field of `params` (see SecAggParams in the .proto): round_nonce and graph_seed 32
// bytes, 3 <= n <= kSecAggMaxClients, k even with 2 <= k <= n - 2 or k = n - 1, k/2 < t <= k,
// t <= min_survivors <= n, 1 <= L <= kSecAggMaxVectorLength, 1 <= m <= 64.
absl::Status ValidateSecAggParams(const v1::SecAggParams& params);

struct SecAggConfig {
  uint64_t round_id = 0;
  uint32_t num_clients = 0;
  uint64_t vector_length = 0;
  uint32_t modulus_bits = 32;
  uint32_t degree = 0;         // 0: RecommendedSecAggDegree(num_clients)
  uint32_t threshold = 0;      // 0: RecommendedSecAggThreshold(degree)
  uint32_t min_survivors = 0;  // 0: the threshold
};
// Parameters for a new round with a fresh random round nonce and graph seed, validated.
absl::StatusOr<v1::SecAggParams> NewSecAggParams(const SecAggConfig& config);

// The neighbour graph of a round (see the top of this file).
class SecAggGraph {
 public:
  static absl::StatusOr<SecAggGraph> Create(const v1::SecAggParams& params);

  uint32_t num_clients() const { return static_cast<uint32_t>(position_.size()); }
  uint32_t degree() const { return degree_; }
  // Client i's place on the ring, and the client at a place.
  uint32_t Position(uint32_t client) const { return position_[client]; }
  uint32_t ClientAt(uint32_t position) const { return order_[position]; }
  // Whether a != b are adjacent. Both must be < num_clients().
  bool AreNeighbours(uint32_t a, uint32_t b) const;
  // Client i's k neighbours, ascending.
  std::vector<uint32_t> Neighbours(uint32_t client) const;

 private:
  SecAggGraph(uint32_t degree, std::vector<uint32_t> order);
  uint32_t degree_;
  std::vector<uint32_t> order_;     // position -> client
  std::vector<uint32_t> position_;  // client -> position
};

// The derivations at the top of this file, exposed for tests and audits.
absl::StatusOr<std::string> SecAggShareKey(const v1::SecAggParams& params,
                                           std::string_view own_private_key,
                                           std::string_view peer_public_key, uint32_t sender,
                                           uint32_t receiver);
std::string SecAggShareAssociatedData(const v1::SecAggParams& params, uint32_t sender,
                                      uint32_t receiver);
absl::StatusOr<std::string> SecAggPairwiseSeed(const v1::SecAggParams& params,
                                               std::string_view own_private_key,
                                               std::string_view peer_public_key, uint32_t a,
                                               uint32_t b);
// values[i] += (or -= when `subtract`) PRG(seed)[i] mod 2^64; the caller reduces mod 2^m.
absl::Status AddSecAggMask(std::string_view seed, uint32_t modulus_bits, bool subtract,
                           std::span<uint64_t> values);

// Vectors of integers mod 2^m on the wire: ceil(m/8) little-endian bytes each. Pack requires every
// value < 2^m (InvalidArgument otherwise); Unpack checks the size and that no value is >= 2^m.
absl::StatusOr<std::string> PackSecAggVector(std::span<const uint64_t> values,
                                             uint32_t modulus_bits);
absl::StatusOr<std::vector<uint64_t>> UnpackSecAggVector(std::string_view bytes, uint64_t length,
                                                         uint32_t modulus_bits);

// One client's side of one round. Steps must be called once each, in order.
class SecAggClient {
 public:
  // `client_index` is this client's index in 0..n-1.
  static absl::StatusOr<SecAggClient> Create(const v1::SecAggParams& params, uint32_t client_index);

  SecAggClient(SecAggClient&&) noexcept;
  SecAggClient& operator=(SecAggClient&&) noexcept;
  ~SecAggClient();

  // Step 0: draws c_i and s_i.
  absl::StatusOr<v1::SecAggAdvertiseKeys> AdvertiseKeys();
  // Step 1. Refuses (FailedPrecondition) when its own keys are missing or differ, when an entry is
  // not a neighbour, or when fewer than t neighbours advertised; InvalidArgument for malformed keys.
  absl::StatusOr<v1::SecAggShareKeysResponse> ShareKeys(const v1::SecAggShareKeysRequest& request);
  // Step 2. `input` holds L values, each < 2^m. Refuses when U2 omits this client, when a share is
  // missing, extra, misaddressed or from outside U2 ∩ N(i) ∩ U1, or fewer than t neighbours are in
  // U2; PermissionDenied when a share does not authenticate.
  absl::StatusOr<v1::SecAggMaskedInputResponse> MaskedInput(
      const v1::SecAggMaskedInputRequest& request, std::span<const uint64_t> input);
  // Step 3. Refuses an inconsistent request (see the top of this file) and any second request.
  absl::StatusOr<v1::SecAggUnmaskingResponse> Unmask(const v1::SecAggUnmaskingRequest& request);

  uint32_t client_index() const;
  const std::vector<uint32_t>& neighbours() const;

 private:
  struct Impl;
  explicit SecAggClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The server's side of one round. Per step: Receive* for each arriving message (a rejected message
// changes nothing), then Close* once the step's deadline passes; the Close of a step after which
// fewer than min_survivors clients remain aborts the round (FailedPrecondition, and every later call
// fails). The caller maps indices to client identities and delivers the messages.
class SecAggServer {
 public:
  static absl::StatusOr<SecAggServer> Create(const v1::SecAggParams& params);

  SecAggServer(SecAggServer&&) noexcept;
  SecAggServer& operator=(SecAggServer&&) noexcept;
  ~SecAggServer();

  const v1::SecAggParams& params() const;

  // Step 0.
  absl::Status ReceiveAdvertiseKeys(const v1::SecAggAdvertiseKeys& message);
  absl::Status CloseAdvertiseKeys();  // fixes U1
  // Step 1: the request for client i in U1.
  absl::StatusOr<v1::SecAggShareKeysRequest> ShareKeysRequest(uint32_t client) const;
  absl::Status ReceiveShareKeys(const v1::SecAggShareKeysResponse& message);
  absl::Status CloseShareKeys();  // fixes U2
  // Step 2: the request for client i in U2.
  absl::StatusOr<v1::SecAggMaskedInputRequest> MaskedInputRequest(uint32_t client) const;
  absl::Status ReceiveMaskedInput(const v1::SecAggMaskedInputResponse& message);
  absl::Status CloseMaskedInput();  // fixes U3
  // Step 3: the same request for every survivor.
  absl::StatusOr<v1::SecAggUnmaskingRequest> UnmaskingRequest() const;
  absl::Status ReceiveUnmasking(const v1::SecAggUnmaskingResponse& message);
  // Reconstructs, unmasks and returns sum_{i in U3} x_i mod 2^m. FailedPrecondition, with nothing
  // reconstructed, when some survivor's b or dropped client's s has fewer than t revealed shares or a
  // survivor has fewer than t surviving neighbours; the round is then aborted. DataLoss when a
  // rebuilt mask key does not match its advertised public key.
  absl::StatusOr<std::vector<uint64_t>> Finish();

  // U1, U2, U3 and the clients that answered step 3, ascending (empty until fixed).
  const std::vector<uint32_t>& advertised() const;
  const std::vector<uint32_t>& shared_keys() const;
  const std::vector<uint32_t>& survivors() const;
  std::vector<uint32_t> unmasking_responders() const;
  // What Finish reconstructed: survivors' self-mask seeds and dropped clients' mask private keys
  // (empty unless Finish succeeded). The server holds these; exposed so tests can show what it learns.
  const std::map<uint32_t, std::string>& reconstructed_self_mask_seeds() const;
  const std::map<uint32_t, std::string>& reconstructed_mask_private_keys() const;
  bool aborted() const;
  // Clients whose revealed shares were found wrong while Finish decoded a secret from more shares
  // than the threshold (ShamirCombineChecked), ascending; the sum is then still the right one.
  // Shares beyond the threshold are what catches them: with exactly the threshold, a wrong share
  // goes unnoticed unless it breaks the result (a dropped client's rebuilt key, the sum's size).
  const std::vector<uint32_t>& misbehaving() const;

 private:
  struct Impl;
  explicit SecAggServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fedlora::crypto
