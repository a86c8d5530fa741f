// SecAgg+ pieces the client and the server share: parameters, the neighbour graph, the key and mask
// derivations and the wire packing of vectors.
#include <openssl/crypto.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "crypto/envelope.h"
#include "crypto/prg.h"
#include "crypto/random.h"
#include "crypto/secagg.h"
#include "crypto/secagg_internal.h"

namespace fedlora::crypto {
namespace secagg_internal {

void AppendU32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}

void AppendU64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}

uint32_t ReadU32(std::string_view bytes) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(bytes[i]);
  return v;
}

absl::Status ReadIndexList(const google::protobuf::RepeatedField<uint32_t>& list,
                           uint32_t num_clients, std::string_view what,
                           std::vector<uint32_t>* out) {
  out->clear();
  out->reserve(list.size());
  for (uint32_t v : list) {
    if (v >= num_clients) {
      return absl::InvalidArgumentError(
          absl::StrCat(std::string(what), " lists client ", v, " of ", num_clients));
    }
    if (!out->empty() && v <= out->back()) {
      return absl::InvalidArgumentError(
          absl::StrCat(std::string(what), " is not strictly ascending at ", v));
    }
    out->push_back(v);
  }
  return absl::OkStatus();
}

namespace {

// Element i of a packed vector of `width`-byte little-endian values.
template <size_t kWidth>
inline uint64_t LoadLe(const unsigned char* p) {
  if constexpr ((kWidth == 4 || kWidth == 8) && std::endian::native == std::endian::little) {
    if constexpr (kWidth == 4) {
      uint32_t v;
      std::memcpy(&v, p, 4);
      return v;
    } else {
      uint64_t v;
      std::memcpy(&v, p, 8);
      return v;
    }
  } else {
    uint64_t v = 0;
    for (size_t b = kWidth; b-- > 0;) v = (v << 8) | p[b];
    return v;
  }
}

template <size_t kWidth>
absl::Status AddPacked(const unsigned char* p, uint64_t mask, std::span<uint64_t> sum) {
  constexpr uint64_t kFull = kWidth == 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * kWidth)) - 1;
  if (mask != kFull) {  // m is not a multiple of 8: the top bits of each value must be zero
    uint64_t high = 0;
    for (size_t i = 0; i < sum.size(); ++i) high |= LoadLe<kWidth>(p + i * kWidth) & ~mask;
    if (high != 0) return absl::InvalidArgumentError("a packed value is not below 2^modulus_bits");
  }
  for (size_t i = 0; i < sum.size(); ++i) sum[i] += LoadLe<kWidth>(p + i * kWidth);
  return absl::OkStatus();
}

}  // namespace

absl::Status AddPackedVector(std::string_view bytes, uint32_t modulus_bits,
                             std::span<uint64_t> sum) {
  if (modulus_bits < 1 || modulus_bits > 64)
    return absl::InvalidArgumentError("modulus_bits must be 1..64");
  const size_t width = (modulus_bits + 7) / 8;
  if (bytes.size() != sum.size() * width) {
    return absl::InvalidArgumentError(absl::StrCat("packed vector must be ", sum.size(), " x ",
                                                   width, " bytes, got ", bytes.size()));
  }
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const uint64_t mask = ModulusMask(modulus_bits);
  switch (width) {
    case 1:
      return AddPacked<1>(p, mask, sum);
    case 2:
      return AddPacked<2>(p, mask, sum);
    case 3:
      return AddPacked<3>(p, mask, sum);
    case 4:
      return AddPacked<4>(p, mask, sum);
    case 5:
      return AddPacked<5>(p, mask, sum);
    case 6:
      return AddPacked<6>(p, mask, sum);
    case 7:
      return AddPacked<7>(p, mask, sum);
    default:
      return AddPacked<8>(p, mask, sum);
  }
}

void Wipe(std::string& secret) {
  if (!secret.empty()) OPENSSL_cleanse(secret.data(), secret.size());
  secret.clear();
}

}  // namespace secagg_internal

using secagg_internal::AppendU32;
using secagg_internal::AppendU64;

uint32_t RecommendedSecAggDegree(uint32_t num_clients) {
  if (num_clients < 2) return 0;
  const double c = std::ceil(kSecAggDegreeConstant * std::log2(static_cast<double>(num_clients)));
  const uint64_t k = 2 * static_cast<uint64_t>(c);
  return static_cast<uint32_t>(std::min<uint64_t>(num_clients - 1, k));
}

uint32_t RecommendedSecAggThreshold(uint32_t degree) { return degree / 2 + 1; }

absl::Status ValidateSecAggParams(const v1::SecAggParams& p) {
  if (p.round_nonce().size() != kSecAggNonceBytes) {
    return absl::InvalidArgumentError(absl::StrCat("SecAggParams.round_nonce must be ",
                                                   kSecAggNonceBytes, " bytes, got ",
                                                   p.round_nonce().size()));
  }
  if (p.graph_seed().size() != kSecAggSeedBytes) {
    return absl::InvalidArgumentError(absl::StrCat("SecAggParams.graph_seed must be ",
                                                   kSecAggSeedBytes, " bytes, got ",
                                                   p.graph_seed().size()));
  }
  const uint32_t n = p.num_clients(), k = p.degree(), t = p.threshold();
  if (n < 3 || n > kSecAggMaxClients) {
    return absl::InvalidArgumentError(
        absl::StrCat("SecAggParams.num_clients must be 3..", kSecAggMaxClients, ", got ", n));
  }
  if (k != n - 1 && (k < 2 || k > n - 2 || k % 2 != 0)) {
    return absl::InvalidArgumentError(absl::StrCat("SecAggParams.degree must be even and in 2..",
                                                   n - 2, ", or ", n - 1,
                                                   " (the complete graph), got ", k));
  }
  if (t > k || 2 * uint64_t{t} <= k) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SecAggParams.threshold must satisfy degree/2 < threshold <= degree (", k, "), got ", t));
  }
  if (p.min_survivors() < t || p.min_survivors() > n) {
    return absl::InvalidArgumentError(
        absl::StrCat("SecAggParams.min_survivors must be in threshold..num_clients (", t, "..", n,
                     "), got ", p.min_survivors()));
  }
  if (p.vector_length() < 1 || p.vector_length() > kSecAggMaxVectorLength) {
    return absl::InvalidArgumentError(absl::StrCat("SecAggParams.vector_length must be 1..",
                                                   kSecAggMaxVectorLength, ", got ",
                                                   p.vector_length()));
  }
  if (p.modulus_bits() < 1 || p.modulus_bits() > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("SecAggParams.modulus_bits must be 1..64, got ", p.modulus_bits()));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::SecAggParams> NewSecAggParams(const SecAggConfig& config) {
  v1::SecAggParams p;
  p.set_round_id(config.round_id);
  p.set_num_clients(config.num_clients);
  p.set_degree(config.degree != 0 ? config.degree : RecommendedSecAggDegree(config.num_clients));
  p.set_threshold(config.threshold != 0 ? config.threshold
                                        : RecommendedSecAggThreshold(p.degree()));
  p.set_min_survivors(config.min_survivors != 0 ? config.min_survivors : p.threshold());
  p.set_vector_length(config.vector_length);
  p.set_modulus_bits(config.modulus_bits);
  FEDLORA_ASSIGN_OR_RETURN(std::string nonce, RandomBytes(kSecAggNonceBytes));
  FEDLORA_ASSIGN_OR_RETURN(std::string seed, RandomBytes(kSecAggSeedBytes));
  p.set_round_nonce(nonce);
  p.set_graph_seed(seed);
  FEDLORA_RETURN_IF_ERROR(ValidateSecAggParams(p));
  return p;
}

// ---------------------------------------------------------------------------------------------
// The graph.

namespace {

// 64-bit words from a Prg, buffered.
class WordSource {
 public:
  explicit WordSource(Prg prg) : prg_(std::move(prg)) {}
  absl::StatusOr<uint64_t> Next() {
    if (next_ == buffer_.size()) {
      FEDLORA_RETURN_IF_ERROR(prg_.Fill(bytes_.data(), bytes_.size()));
      for (size_t i = 0; i < buffer_.size(); ++i) {
        uint64_t w = 0;
        for (int b = 7; b >= 0; --b) w = (w << 8) | bytes_[8 * i + b];
        buffer_[i] = w;
      }
      next_ = 0;
    }
    return buffer_[next_++];
  }

 private:
  Prg prg_;
  std::vector<unsigned char> bytes_ = std::vector<unsigned char>(8 * 512);
  std::vector<uint64_t> buffer_ = std::vector<uint64_t>(512);
  size_t next_ = 512;
};

}  // namespace

SecAggGraph::SecAggGraph(uint32_t degree, std::vector<uint32_t> order)
    : degree_(degree), order_(std::move(order)), position_(order_.size()) {
  for (uint32_t p = 0; p < order_.size(); ++p) position_[order_[p]] = p;
}

absl::StatusOr<SecAggGraph> SecAggGraph::Create(const v1::SecAggParams& params) {
  FEDLORA_RETURN_IF_ERROR(ValidateSecAggParams(params));
  const uint32_t n = params.num_clients();
  FEDLORA_ASSIGN_OR_RETURN(Prg prg, Prg::Create(params.graph_seed(), /*stream=*/0));
  WordSource words(std::move(prg));
  std::vector<uint32_t> order(n);
  for (uint32_t i = 0; i < n; ++i) order[i] = i;
  // Fisher-Yates: for q = n-1 .. 1 swap order[q] with order[r], r uniform in [0, q].
  for (uint32_t q = n - 1; q >= 1; --q) {
    const uint64_t range = uint64_t{q} + 1;
    const uint64_t reject_from = ~uint64_t{0} - (~uint64_t{0} % range);  // accept w < reject_from
    uint64_t w = 0;
    do {
      FEDLORA_ASSIGN_OR_RETURN(w, words.Next());
    } while (w >= reject_from);
    std::swap(order[q], order[w % range]);
  }
  return SecAggGraph(params.degree(), std::move(order));
}

bool SecAggGraph::AreNeighbours(uint32_t a, uint32_t b) const {
  const uint32_t n = num_clients();
  if (a == b || a >= n || b >= n) return false;
  if (degree_ == n - 1) return true;
  const uint32_t pa = position_[a], pb = position_[b];
  const uint32_t d = pa > pb ? pa - pb : pb - pa;
  return std::min(d, n - d) <= degree_ / 2;
}

std::vector<uint32_t> SecAggGraph::Neighbours(uint32_t client) const {
  const uint32_t n = num_clients();
  std::vector<uint32_t> out;
  if (client >= n) return out;
  out.reserve(degree_);
  if (degree_ == n - 1) {
    for (uint32_t j = 0; j < n; ++j) {
      if (j != client) out.push_back(j);
    }
    return out;
  }
  const uint32_t p = position_[client];
  for (uint32_t d = 1; d <= degree_ / 2; ++d) {
    out.push_back(order_[(p + d) % n]);
    out.push_back(order_[(p + n - d) % n]);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// ---------------------------------------------------------------------------------------------
// Derivations.

namespace {

constexpr char kShareKeyLabel[] = "fedlora/v1 secagg share key";
constexpr char kShareAadLabel[] = "fedlora/v1 secagg share";
constexpr char kPairwiseLabel[] = "fedlora/v1 secagg pairwise mask";

}  // namespace

absl::StatusOr<std::string> SecAggShareKey(const v1::SecAggParams& params,
                                           std::string_view own_private_key,
                                           std::string_view peer_public_key, uint32_t sender,
                                           uint32_t receiver) {
  FEDLORA_ASSIGN_OR_RETURN(std::string shared,
                           X25519SharedSecret(own_private_key, peer_public_key));
  std::string info = kShareKeyLabel;
  AppendU64(info, params.round_id());
  AppendU32(info, sender);
  AppendU32(info, receiver);
  absl::StatusOr<std::string> key = HkdfSha256(shared, params.round_nonce(), info, kAes256KeyBytes);
  secagg_internal::Wipe(shared);
  return key;
}

std::string SecAggShareAssociatedData(const v1::SecAggParams& params, uint32_t sender,
                                      uint32_t receiver) {
  std::string aad = kShareAadLabel;
  AppendU64(aad, params.round_id());
  aad += params.round_nonce();
  AppendU32(aad, sender);
  AppendU32(aad, receiver);
  return aad;
}

absl::StatusOr<std::string> SecAggPairwiseSeed(const v1::SecAggParams& params,
                                               std::string_view own_private_key,
                                               std::string_view peer_public_key, uint32_t a,
                                               uint32_t b) {
  FEDLORA_ASSIGN_OR_RETURN(std::string shared,
                           X25519SharedSecret(own_private_key, peer_public_key));
  std::string info = kPairwiseLabel;
  AppendU64(info, params.round_id());
  AppendU32(info, std::min(a, b));
  AppendU32(info, std::max(a, b));
  absl::StatusOr<std::string> seed =
      HkdfSha256(shared, params.round_nonce(), info, Prg::kSeedBytes);
  secagg_internal::Wipe(shared);
  return seed;
}

absl::Status AddSecAggMask(std::string_view seed, uint32_t modulus_bits, bool subtract,
                           std::span<uint64_t> values) {
  if (modulus_bits < 1 || modulus_bits > 64)
    return absl::InvalidArgumentError("modulus_bits must be 1..64");
  FEDLORA_ASSIGN_OR_RETURN(Prg prg, Prg::Create(seed, /*stream=*/0));
  const size_t word = modulus_bits <= 32 ? 4 : 8;
  const uint64_t mask = secagg_internal::ModulusMask(modulus_bits);
  constexpr size_t kChunkWords = 8192;
  std::vector<unsigned char> buf(kChunkWords * word);
  for (size_t i = 0; i < values.size(); i += kChunkWords) {
    const size_t n = std::min(kChunkWords, values.size() - i);
    FEDLORA_RETURN_IF_ERROR(prg.Fill(buf.data(), n * word));
    const unsigned char* b = buf.data();
    uint64_t* v = values.data() + i;
    if (word == 4) {
      for (size_t j = 0; j < n; ++j, b += 4) {
        const uint64_t w =
            (uint64_t{b[0]} | uint64_t{b[1]} << 8 | uint64_t{b[2]} << 16 | uint64_t{b[3]} << 24) &
            mask;
        v[j] = subtract ? v[j] - w : v[j] + w;
      }
    } else {
      for (size_t j = 0; j < n; ++j, b += 8) {
        uint64_t w = 0;
        for (int k = 7; k >= 0; --k) w = (w << 8) | b[k];
        w &= mask;
        v[j] = subtract ? v[j] - w : v[j] + w;
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> PackSecAggVector(std::span<const uint64_t> values,
                                             uint32_t modulus_bits) {
  if (modulus_bits < 1 || modulus_bits > 64)
    return absl::InvalidArgumentError("modulus_bits must be 1..64");
  const size_t width = (modulus_bits + 7) / 8;
  const uint64_t mask = secagg_internal::ModulusMask(modulus_bits);
  std::string out(values.size() * width, '\0');
  char* o = out.data();
  for (size_t i = 0; i < values.size(); ++i) {
    const uint64_t v = values[i];
    if ((v & ~mask) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("value ", i, " is not below 2^", modulus_bits));
    }
    for (size_t b = 0; b < width; ++b) *o++ = static_cast<char>(v >> (8 * b));
  }
  return out;
}

absl::StatusOr<std::vector<uint64_t>> UnpackSecAggVector(std::string_view bytes, uint64_t length,
                                                         uint32_t modulus_bits) {
  if (modulus_bits < 1 || modulus_bits > 64)
    return absl::InvalidArgumentError("modulus_bits must be 1..64");
  const size_t width = (modulus_bits + 7) / 8;
  if (length > kSecAggMaxVectorLength || bytes.size() != length * width) {
    return absl::InvalidArgumentError(
        absl::StrCat("packed vector must be ", length, " x ", width, " bytes, got ", bytes.size()));
  }
  const uint64_t mask = secagg_internal::ModulusMask(modulus_bits);
  std::vector<uint64_t> out(length);
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  for (size_t i = 0; i < length; ++i, p += width) {
    uint64_t v = 0;
    for (size_t b = width; b-- > 0;) v = (v << 8) | p[b];
    if ((v & ~mask) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("packed value ", i, " is not below 2^", modulus_bits));
    }
    out[i] = v;
  }
  return out;
}

}  // namespace fedlora::crypto
