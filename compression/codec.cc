// The update wire format: encoding (validation, the v2 sections) and decoding (the body walk that
// checks, materialises or keeps each tensor). Over 600 lines, not split yet: the two halves share
// the section layout and the value checks in this file's anonymous namespace; the split that
// keeps them together is codec_encode.cc beside this file, with those helpers in a private header.
#include "compression/codec.h"

#include <zstd.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <optional>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "compression/body_source.h"
#include "compression/encode_stages.h"
#include "compression/quantize.h"
#include "compression/sparsify.h"
#include "core/status.h"
#include "core/strings.h"
#include "core/tensor.h"
#include "kernels/base/topk.h"

namespace fedlora {
namespace {

using compression_internal::BodySource;
using compression_internal::EncodeStages;
using compression_internal::kMaxZstdWindowLog;
using compression_internal::Load;

static_assert(std::endian::native == std::endian::little,
              "the update wire format is little-endian; add byte swapping for big-endian hosts");

// Smallest tensor-table entry: 2 (name length)
// + 1 (name) + 1 (rank). Used to refuse tensor counts that cannot fit before reserving memory.
constexpr uint64_t kMinTableEntryBytes = 4;

void PutU8(std::string& out, uint8_t v) { out.push_back(static_cast<char>(v)); }
void PutU16(std::string& out, uint16_t v) { out.append(reinterpret_cast<const char*>(&v), 2); }
void PutU32(std::string& out, uint32_t v) { out.append(reinterpret_cast<const char*>(&v), 4); }
void PutU64(std::string& out, uint64_t v) { out.append(reinterpret_cast<const char*>(&v), 8); }

bool IsFiniteHalfBits(uint16_t bits, CodecId codec) {
  // Inf/NaN have an all-ones exponent: 5 bits (0x7C00) for fp16, 8 bits (0x7F80) for bf16.
  const uint16_t exp_mask = codec == CodecId::kF16 ? 0x7C00 : 0x7F80;
  return (bits & exp_mask) != exp_mask;
}

absl::Status ValidateTensorsForEncode(const std::vector<UpdateTensor>& tensors,
                                      uint64_t& element_count) {
  if (tensors.empty()) return absl::InvalidArgumentError("EncodeUpdate: update has no tensors");
  if (tensors.size() > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("EncodeUpdate: ", tensors.size(), " tensors is too many"));
  }
  absl::flat_hash_set<std::string_view> names;
  element_count = 0;
  for (size_t t = 0; t < tensors.size(); ++t) {
    const UpdateTensor& tensor = tensors[t];
    if (tensor.name.empty() || tensor.name.size() > kMaxTensorNameBytes) {
      return absl::InvalidArgumentError(absl::StrCat("EncodeUpdate: tensor ", t, " name length ",
                                                     tensor.name.size(), " is not in [1, ",
                                                     kMaxTensorNameBytes, "]"));
    }
    if (tensor.name.find('\0') != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("EncodeUpdate: tensor ", t, " name contains a NUL byte"));
    }
    if (!names.insert(tensor.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("EncodeUpdate: duplicate tensor name '", tensor.name, "'"));
    }
    if (tensor.shape.size() > static_cast<size_t>(kMaxTensorRank)) {
      return absl::InvalidArgumentError(absl::StrCat("EncodeUpdate: tensor '", tensor.name,
                                                     "' has rank ", tensor.shape.size(), " > ",
                                                     kMaxTensorRank));
    }
    auto numel = CheckedNumel(tensor.shape);
    if (!numel.ok())
      return Annotate(numel.status(), absl::StrCat("EncodeUpdate: tensor '", tensor.name, "'"));
    if (static_cast<uint64_t>(*numel) != tensor.values.size()) {
      return absl::InvalidArgumentError(absl::StrCat("EncodeUpdate: tensor '", tensor.name,
                                                     "' has ", tensor.values.size(),
                                                     " values but its shape holds ", *numel));
    }
    for (size_t i = 0; i < tensor.values.size(); ++i) {
      if (!std::isfinite(tensor.values[i])) {
        return absl::InvalidArgumentError(absl::StrCat("EncodeUpdate: tensor '", tensor.name,
                                                       "' value ", i, " is not finite (",
                                                       tensor.values[i], ")"));
      }
    }
    element_count += tensor.values.size();
  }
  return absl::OkStatus();
}

// Appends x[0, n) in `codec`'s element format (fp32, fp16, bf16). `name` is for messages, whose
// value index counts the values passed (with a sparsifier: the tensor's kept entries).
absl::Status AppendDenseValues(const float* x, size_t n, CodecId codec, const std::string& name,
                               std::string& out) {
  if (codec == CodecId::kRawF32) {
    if (n > 0) out.append(reinterpret_cast<const char*>(x), n * sizeof(float));
    return absl::OkStatus();
  }
  const size_t start = out.size();
  out.resize(start + n * 2);
  // std::string storage is suitably aligned only for char; convert through a local buffer in
  // blocks so the uint16_t writes are aligned.
  constexpr size_t kBlock = 4096;
  uint16_t block[kBlock];
  for (size_t i = 0; i < n; i += kBlock) {
    const size_t m = std::min(kBlock, n - i);
    if (codec == CodecId::kF16) {
      ConvertF32ToF16(x + i, block, m);
    } else {
      ConvertF32ToBF16(x + i, block, m);
    }
    for (size_t j = 0; j < m; ++j) {
      if (!IsFiniteHalfBits(block[j], codec)) {
        return absl::InvalidArgumentError(absl::StrCat("EncodeUpdate: tensor '", name, "' value ",
                                                       i + j, " (", x[i + j], ") overflows ",
                                                       ToAbsl(CodecName(codec))));
      }
    }
    std::memcpy(out.data() + start + i * 2, block, m * 2);
  }
  return absl::OkStatus();
}

// Streams of core/rng.h for the seeded stages: tensor t's random-k indices (or, with low-rank, its
// first Q0) and its stochastic rounding draw from distinct streams of CodecOptions::seed.
uint64_t RandomKSeed(uint64_t seed, size_t tensor) {
  return seed ^ (0x9E3779B97F4A7C15ull * (tensor + 1));
}
constexpr uint64_t kQuantStreamBase = uint64_t{1} << 40;

absl::Status CheckEncodeOptions(const CodecOptions& o) {
  if (o.codec != CodecId::kRawF32 && o.codec != CodecId::kF16 && o.codec != CodecId::kBF16 &&
      o.codec != CodecId::kQuant) {
    return absl::InvalidArgumentError(
        absl::StrCat("EncodeUpdate: unknown codec id ", static_cast<int>(o.codec)));
  }
  if (o.codec == CodecId::kQuant) {
    FEDLORA_RETURN_IF_ERROR(
        Annotate(CheckQuantSpec(o.quant_bits, o.quant_block_size), "EncodeUpdate"));
  }
  if (o.sparsifier != Sparsifier::kNone && o.sparsifier != Sparsifier::kTopK &&
      o.sparsifier != Sparsifier::kRandomK && o.sparsifier != Sparsifier::kLowRank) {
    return absl::InvalidArgumentError(
        absl::StrCat("EncodeUpdate: unknown sparsifier id ", static_cast<int>(o.sparsifier)));
  }
  if (o.sparsifier == Sparsifier::kLowRank && (o.low_rank < 1 || o.low_rank > kMaxLowRank)) {
    return absl::InvalidArgumentError(absl::StrCat("EncodeUpdate: low-rank rank ", o.low_rank,
                                                   " is not in [1, ", kMaxLowRank, "]"));
  }
  if ((o.sparsifier == Sparsifier::kTopK || o.sparsifier == Sparsifier::kRandomK) &&
      !(o.fraction > 0.0 && o.fraction <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("EncodeUpdate: kept fraction ", o.fraction, " is not in (0, 1]"));
  }
  if (o.global_top_k && o.sparsifier != Sparsifier::kTopK) {
    return absl::InvalidArgumentError("EncodeUpdate: global selection belongs to top-k");
  }
  return absl::OkStatus();
}

// The version 2 body after the tensor table: per tensor, the kept entries and their values.
absl::Status AppendV2Sections(const std::vector<UpdateTensor>& tensors, const CodecOptions& o,
                              EncodeStages& stages, std::string& body) {
  std::vector<std::vector<int64_t>> global;
  if (o.global_top_k) {
    uint64_t total = 0;
    for (const UpdateTensor& t : tensors) total += t.values.size();
    if (total > static_cast<uint64_t>(kernels::kTopKMaxN)) {
      return absl::InvalidArgumentError(
          absl::StrCat("EncodeUpdate: global top-k over ", total, " values (at most 2^32)"));
    }
    FEDLORA_ASSIGN_OR_RETURN(global, stages.GlobalTopK(tensors, o.fraction));
  }
  std::vector<float> kept;
  for (size_t ti = 0; ti < tensors.size(); ++ti) {
    const UpdateTensor& t = tensors[ti];
    const int64_t n = static_cast<int64_t>(t.values.size());
    const float* values = t.values.data();
    size_t count = t.values.size();
    if (o.sparsifier == Sparsifier::kLowRank) {
      const LowRankLayout layout = LowRankLayoutFor(t.shape, o.low_rank);
      PutU64(body, static_cast<uint64_t>(layout.values));
      if (layout.factored()) {
        std::vector<float> local;
        std::vector<float>& q = o.warm_start != nullptr ? (*o.warm_start)[t.name] : local;
        PowerIteration(values, layout, RandomKSeed(o.seed, ti), q, kept);
        values = kept.data();
        count = kept.size();
      }
    } else if (o.sparsifier != Sparsifier::kNone) {
      std::vector<int64_t> idx;
      if (o.sparsifier == Sparsifier::kRandomK) {
        const uint64_t seed = RandomKSeed(o.seed, ti);
        idx = RandomKIndices(seed, n, KeptCount(n, o.fraction));
        PutU64(body, idx.size());
        PutU64(body, seed);
      } else {
        if (o.global_top_k) {
          idx = std::move(global[ti]);
        } else if (n > kernels::kTopKMaxN) {
          return absl::InvalidArgumentError(absl::StrCat("EncodeUpdate: tensor '", t.name, "' has ",
                                                         n, " values, top-k takes at most 2^32"));
        } else {
          FEDLORA_ASSIGN_OR_RETURN(idx, stages.TopK(values, n, KeptCount(n, o.fraction)));
        }
        PutU64(body, idx.size());
        std::string gaps;
        AppendIndexGaps(idx, gaps);
        PutU64(body, gaps.size());
        body.append(gaps);
      }
      kept.resize(idx.size());
      for (size_t j = 0; j < idx.size(); ++j) kept[j] = values[idx[j]];
      values = kept.data();
      count = kept.size();
    }
    if (o.codec == CodecId::kQuant) {
      FEDLORA_RETURN_IF_ERROR(stages.QuantizeAppend(values, static_cast<int64_t>(count),
                                                    QuantSpec{.bits = o.quant_bits,
                                                              .block_size = o.quant_block_size,
                                                              .stochastic = o.quant_stochastic,
                                                              .seed = o.seed,
                                                              .stream = kQuantStreamBase + ti},
                                                    body));
    } else {
      FEDLORA_RETURN_IF_ERROR(AppendDenseValues(values, count, o.codec, t.name, body));
    }
  }
  return absl::OkStatus();
}

struct CCtxDeleter {
  void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
};

// Index of the first fp32 value of `n` at `src` (unaligned) that is NaN or Inf, or n.
size_t FirstNonFiniteF32(const char* src, size_t n) {
  // Branch-free blocks (the compiler vectorises the OR-reduction), then a scalar search only in the
  // block that holds a bad value: validating is memory-bound, ~10 GB/s on one core.
  constexpr size_t kBlock = 1024;
  for (size_t i = 0; i < n; i += kBlock) {
    const size_t m = std::min(kBlock, n - i);
    uint32_t bad = 0;
    for (size_t j = 0; j < m; ++j)
      bad |= (Load<uint32_t>(src + 4 * (i + j)) & 0x7F800000u) == 0x7F800000u;
    if (bad != 0) {
      for (size_t j = 0; j < m; ++j) {
        if ((Load<uint32_t>(src + 4 * (i + j)) & 0x7F800000u) == 0x7F800000u) return i + j;
      }
    }
  }
  return n;
}

// The same for fp16/bf16 bits (see IsFiniteHalfBits).
size_t FirstNonFiniteHalf(const char* src, size_t n, CodecId codec) {
  const uint16_t exp_mask = codec == CodecId::kF16 ? 0x7C00 : 0x7F80;
  constexpr size_t kBlock = 2048;
  for (size_t i = 0; i < n; i += kBlock) {
    const size_t m = std::min(kBlock, n - i);
    uint32_t bad = 0;
    for (size_t j = 0; j < m; ++j)
      bad |= (Load<uint16_t>(src + 2 * (i + j)) & exp_mask) == exp_mask;
    if (bad != 0) {
      for (size_t j = 0; j < m; ++j) {
        if (!IsFiniteHalfBits(Load<uint16_t>(src + 2 * (i + j)), codec)) return i + j;
      }
    }
  }
  return n;
}

// Checks that the `n` encoded values at `src` are finite and, when `out` is non-null, writes them
// there as fp32. `first` is the index of src's first value within tensor `name` (for messages).
absl::Status CheckValues(CodecId codec, const char* src, size_t n, float* out,
                         std::string_view name, uint64_t first) {
  if (codec == CodecId::kRawF32) {
    const size_t bad = FirstNonFiniteF32(src, n);
    if (bad < n) {
      return absl::InvalidArgumentError(absl::StrCat("update body: tensor '", ToAbsl(name),
                                                     "' value ", first + bad, " is not finite (",
                                                     Load<float>(src + 4 * bad), ")"));
    }
    if (out != nullptr && n > 0) std::memcpy(out, src, n * 4);
    return absl::OkStatus();
  }
  const size_t bad = FirstNonFiniteHalf(src, n, codec);
  if (bad < n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "update body: tensor '", ToAbsl(name), "' value ", first + bad, " is not finite (",
        ToAbsl(CodecName(codec)), " bits 0x", absl::Hex(Load<uint16_t>(src + 2 * bad)), ")"));
  }
  if (out == nullptr) return absl::OkStatus();
  // `src` may be odd-aligned: convert through an aligned block.
  constexpr size_t kBlock = 4096;
  uint16_t block[kBlock];
  for (size_t i = 0; i < n; i += kBlock) {
    const size_t m = std::min(kBlock, n - i);
    std::memcpy(block, src + 2 * i, m * 2);
    if (codec == CodecId::kF16) {
      ConvertF16ToF32(block, out + i, m);
    } else {
      ConvertBF16ToF32(block, out + i, m);
    }
  }
  return absl::OkStatus();
}

// Reads `bytes` bytes of gap varints (compression/sparsify.h) that must give exactly k ascending
// indices below n; appends them to `indices` unless it is null.
absl::Status ReadIndexGaps(BodySource& source, uint64_t bytes, uint64_t k, uint64_t n,
                           std::vector<int64_t>* indices, const std::string& name) {
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(
        absl::StrCat("update body: tensor '", name, "' top-k indices: ", what));
  };
  uint64_t gap = 0, count = 0, next = 0;
  int shift = 0;
  for (uint64_t left = bytes; left > 0;) {
    FEDLORA_ASSIGN_OR_RETURN(std::string_view chunk, source.ReadSome(1, static_cast<size_t>(left)));
    left -= chunk.size();
    for (char ch : chunk) {
      const uint64_t c = static_cast<uint8_t>(ch);
      if (shift == 63 && (c & 0x7E) != 0) return bad("a gap overflows 64 bits");
      gap |= (c & 0x7F) << shift;
      if ((c & 0x80) != 0) {
        shift += 7;
        if (shift > 63) return bad("a gap varint is longer than 10 bytes");
        continue;
      }
      if (c == 0 && shift > 0) return bad("a gap varint is not in its shortest form");
      if (count == k) return bad(absl::StrCat("more than the ", k, " kept entries"));
      if (gap >= n - next)
        return bad(
            absl::StrCat("index ", next, " + ", gap, " is outside the tensor's ", n, " entries"));
      if (indices != nullptr) indices->push_back(static_cast<int64_t>(next + gap));
      next += gap + 1;
      ++count;
      gap = 0;
      shift = 0;
    }
  }
  if (shift != 0) return bad("the last gap varint is cut off");
  if (count != k) return bad(absl::StrCat(count, " indices for ", k, " kept entries"));
  return absl::OkStatus();
}

// Version 2: each tensor's kept entries and their values (see the layout in codec.h). `kept`
// receives each tensor's k. With `indices` (materialize only), a top-k or random-k tensor's values
// are its k kept values, and (*indices)[t] their ascending positions, instead of the dense tensor.
absl::Status WalkV2Sections(const UpdateHeader& h, bool materialize, BodySource& source,
                            std::vector<UpdateTensor>& tensors, const std::vector<uint64_t>& numel,
                            std::vector<int64_t>& kept,
                            std::vector<std::vector<int64_t>>* indices) {
  const bool compact = indices != nullptr &&
                       (h.sparsifier == Sparsifier::kTopK || h.sparsifier == Sparsifier::kRandomK);
  std::vector<int64_t> idx;
  std::vector<float> buf, factors;
  for (size_t t = 0; t < tensors.size(); ++t) {
    UpdateTensor& tensor = tensors[t];
    const uint64_t n = numel[t];
    auto bad = [&](const std::string& what) {
      return absl::InvalidArgumentError(
          absl::StrCat("update body: tensor '", tensor.name, "' ", what));
    };
    uint64_t k = n;
    std::optional<RandomKSampler> sampler;
    LowRankLayout layout;
    idx.clear();
    if (h.sparsifier != Sparsifier::kNone) {
      FEDLORA_ASSIGN_OR_RETURN(std::string_view f, source.Read(8, "kept count"));
      k = Load<uint64_t>(f.data());
      if (k > n) return bad(absl::StrCat("keeps ", k, " of its ", n, " entries"));
      if (h.sparsifier == Sparsifier::kLowRank) {
        layout = LowRankLayoutFor(tensor.shape, h.low_rank);
        if (k != static_cast<uint64_t>(layout.values)) {
          return bad(absl::StrCat("sends ", k, " values; at rank ", h.low_rank, " it travels as ",
                                  layout.values));
        }
      } else if (h.sparsifier == Sparsifier::kTopK) {
        FEDLORA_ASSIGN_OR_RETURN(f, source.Read(8, "index byte count"));
        const uint64_t bytes = Load<uint64_t>(f.data());
        if (bytes > source.remaining() || bytes < k || bytes / 10 > k) {
          return bad(absl::StrCat("declares ", bytes, " index bytes for ", k, " indices (",
                                  source.remaining(), " body bytes remain)"));
        }
        FEDLORA_RETURN_IF_ERROR(
            ReadIndexGaps(source, bytes, k, n, materialize ? &idx : nullptr, tensor.name));
      } else {
        FEDLORA_ASSIGN_OR_RETURN(f, source.Read(8, "random-k seed"));
        if (materialize)
          sampler.emplace(Load<uint64_t>(f.data()), static_cast<int64_t>(n),
                          static_cast<int64_t>(k));
      }
    }
    kept[t] = static_cast<int64_t>(k);
    const bool quant = h.codec == CodecId::kQuant;
    const uint64_t need =
        quant ? QuantizedBytes(k, h.quant_bits, h.quant_block_size) : k * CodecElementSize(h.codec);
    if (source.remaining() < need) {
      return bad(absl::StrCat("needs ", need, " bytes for its ", k, " ", ToAbsl(CodecName(h.codec)),
                              " values but only ", source.remaining(), " remain"));
    }
    if (materialize) tensor.values.assign(static_cast<size_t>(compact ? k : n), 0.0f);
    // A factored tensor's values are read even when not materialised: their largest magnitudes
    // bound the product.
    const bool factored = layout.factored();
    const bool read_values = materialize || factored;
    if (factored && materialize) factors.resize(k);
    double max_p = 0, max_q = 0;
    const uint64_t p_values = static_cast<uint64_t>(layout.rows * layout.rank);
    // Places m decoded values, the kept entries [done, done + m), into the dense tensor.
    auto place = [&](const float* v, uint64_t done, uint64_t m) {
      float* out = tensor.values.data();
      if (factored) {
        std::memcpy(factors.data() + done, v, m * sizeof(float));
      } else if (compact || h.sparsifier == Sparsifier::kNone ||
                 h.sparsifier == Sparsifier::kLowRank) {
        std::memcpy(out + done, v, m * sizeof(float));
        if (sampler && compact) {
          for (uint64_t j = 0; j < m; ++j) idx.push_back(sampler->Next());
        }
      } else if (sampler) {
        for (uint64_t j = 0; j < m; ++j) out[sampler->Next()] = v[j];
      } else {
        for (uint64_t j = 0; j < m; ++j) out[idx[done + j]] = v[j];
      }
    };
    const std::string what = absl::StrCat("update body: tensor '", tensor.name, "'");
    for (uint64_t done = 0; done < k;) {
      uint64_t m;
      std::string_view f;
      if (quant) {
        m = std::min<uint64_t>(static_cast<uint64_t>(h.quant_block_size), k - done);
        FEDLORA_ASSIGN_OR_RETURN(f,
                                 source.Read(QuantBlockBytes(m, h.quant_bits), "quantized block"));
        if (read_values) buf.resize(m);
        FEDLORA_RETURN_IF_ERROR(DequantizeBlock(f, static_cast<int64_t>(m), h.quant_bits,
                                                read_values ? buf.data() : nullptr, what, done));
      } else {
        const size_t esize = CodecElementSize(h.codec);
        FEDLORA_ASSIGN_OR_RETURN(f,
                                 source.ReadSome(esize, static_cast<size_t>((k - done) * esize)));
        m = f.size() / esize;
        if (read_values) buf.resize(m);
        FEDLORA_RETURN_IF_ERROR(CheckValues(h.codec, f.data(), m,
                                            read_values ? buf.data() : nullptr, tensor.name, done));
      }
      if (factored) {
        for (uint64_t j = 0; j < m; ++j) {
          double& max = done + j < p_values ? max_p : max_q;
          max = std::max(max, static_cast<double>(std::fabs(buf[j])));
        }
      }
      if (materialize) place(buf.data(), done, m);
      done += m;
    }
    if (factored) {
      const double bound = static_cast<double>(layout.rank) * max_p * max_q;
      if (bound > std::numeric_limits<float>::max() / 2) {
        return bad(absl::StrCat("has rank-", layout.rank, " factors up to ", max_p, " and ", max_q,
                                " whose product may overflow"));
      }
      if (materialize) ExpandFactors(factors.data(), layout, tensor.values.data());
    }
    if (compact) (*indices)[t] = std::move(idx);
  }
  if (source.remaining() != 0) {
    return absl::InvalidArgumentError(absl::StrCat("update body: ", source.remaining(),
                                                   " bytes follow the last tensor's values"));
  }
  return absl::OkStatus();
}

// Parses the tensor table from `source` into `tensors` (names and shapes) and checks every value;
// with `materialize`, also fills each tensor's values (compactly with `indices`: see
// WalkV2Sections), and `kept` gets the entries each tensor sends. Body errors only (see BodySource).
absl::Status WalkBody(const UpdateHeader& h, const DecodeLimits& limits, bool materialize,
                      BodySource& source, std::vector<UpdateTensor>& tensors,
                      std::vector<int64_t>& kept, std::vector<std::vector<int64_t>>* indices) {
  FEDLORA_ASSIGN_OR_RETURN(std::string_view field, source.Read(4, "tensor count"));
  const uint32_t count = Load<uint32_t>(field.data());
  if (count == 0) return absl::InvalidArgumentError("update body: tensor count is 0");
  if (count > static_cast<uint64_t>(std::max<int64_t>(limits.max_tensors, 0))) {
    return absl::InvalidArgumentError(absl::StrCat("update body: tensor count ", count,
                                                   " exceeds the limit of ", limits.max_tensors));
  }
  if (count > source.remaining() / kMinTableEntryBytes) {
    return absl::InvalidArgumentError(absl::StrCat("update body: tensor count ", count,
                                                   " cannot fit in the ", source.remaining(),
                                                   " remaining body bytes"));
  }

  // `tensors` is sized once, so the views of its names in `names` stay valid.
  tensors.assign(count, UpdateTensor{});
  std::vector<uint64_t> numel(count);
  absl::flat_hash_set<std::string_view> names;
  uint64_t total = 0;
  for (uint32_t t = 0; t < count; ++t) {
    UpdateTensor& tensor = tensors[t];
    FEDLORA_ASSIGN_OR_RETURN(field, source.Read(2, "tensor name length"));
    const uint16_t name_len = Load<uint16_t>(field.data());
    if (name_len == 0 || name_len > kMaxTensorNameBytes) {
      return absl::InvalidArgumentError(absl::StrCat("update body: tensor ", t, " name length ",
                                                     name_len, " is not in [1, ",
                                                     kMaxTensorNameBytes, "]"));
    }
    FEDLORA_ASSIGN_OR_RETURN(field, source.Read(name_len, "tensor name"));
    if (field.find('\0') != std::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("update body: tensor ", t, " name contains a NUL byte"));
    }
    tensor.name = std::string(field);
    if (!names.insert(tensor.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("update body: duplicate tensor name '", tensor.name, "'"));
    }
    FEDLORA_ASSIGN_OR_RETURN(field, source.Read(1, "tensor rank"));
    const uint8_t rank = Load<uint8_t>(field.data());
    if (rank > kMaxTensorRank) {
      return absl::InvalidArgumentError(absl::StrCat("update body: tensor '", tensor.name,
                                                     "' rank ", rank, " exceeds ", kMaxTensorRank));
    }
    tensor.shape.resize(rank);
    for (uint8_t d = 0; d < rank; ++d) {
      FEDLORA_ASSIGN_OR_RETURN(field, source.Read(8, "tensor dimension"));
      const uint64_t dim = Load<uint64_t>(field.data());
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return absl::InvalidArgumentError(
            absl::StrCat("update body: tensor '", tensor.name, "' dimension ", d, " is negative"));
      }
      tensor.shape[d] = static_cast<int64_t>(dim);
    }
    auto n = CheckedNumel(tensor.shape);
    if (!n.ok())
      return Annotate(n.status(), absl::StrCat("update body: tensor '", tensor.name, "'"));
    if (static_cast<uint64_t>(*n) > h.element_count - total) {
      return absl::InvalidArgumentError(absl::StrCat(
          "update body: tensor '", tensor.name, "' with ", *n,
          " elements takes the table past the header's element count ", h.element_count));
    }
    numel[t] = static_cast<uint64_t>(*n);
    total += numel[t];
  }
  if (total != h.element_count) {
    return absl::InvalidArgumentError(absl::StrCat("update body: the tensor shapes hold ", total,
                                                   " elements but the header declares ",
                                                   h.element_count));
  }
  kept.assign(count, 0);
  if (h.format_version == kUpdateFormatVersion2) {
    if (indices != nullptr) indices->assign(count, {});
    return WalkV2Sections(h, materialize, source, tensors, numel, kept, indices);
  }
  for (uint32_t t = 0; t < count; ++t) kept[t] = static_cast<int64_t>(numel[t]);
  const size_t esize = CodecElementSize(h.codec);
  if (source.remaining() != h.element_count * esize) {
    return absl::InvalidArgumentError(absl::StrCat(
        "update body: ", source.remaining(), " bytes follow the tensor table but ", h.element_count,
        " ", ToAbsl(CodecName(h.codec)), " values need ", h.element_count * esize));
  }

  // element_count <= max_elements was checked with the header: the values fit the limits.
  if (materialize) {
    for (uint32_t t = 0; t < count; ++t) tensors[t].values.resize(static_cast<size_t>(numel[t]));
  }
  for (uint32_t t = 0; t < count; ++t) {
    for (uint64_t done = 0; done < numel[t];) {
      FEDLORA_ASSIGN_OR_RETURN(
          field, source.ReadSome(esize, static_cast<size_t>((numel[t] - done) * esize)));
      const size_t n = field.size() / esize;
      float* out = materialize ? tensors[t].values.data() + done : nullptr;
      FEDLORA_RETURN_IF_ERROR(CheckValues(h.codec, field.data(), n, out, tensors[t].name, done));
      done += n;
    }
  }
  return absl::OkStatus();
}

// Everything DecodeUpdate and ValidateUpdate check, in one walk over the encoded update: header,
// payload size, zstd stage, tensor table, values. Fills `tensors` with names and shapes, and with
// values too when `materialize`.
absl::Status WalkUpdate(std::string_view encoded, const DecodeLimits& limits, bool materialize,
                        std::vector<UpdateTensor>& tensors, std::vector<int64_t>& kept,
                        const std::function<void(uint64_t)>* consumed = nullptr,
                        std::vector<std::vector<int64_t>>* indices = nullptr) {
  FEDLORA_ASSIGN_OR_RETURN(const UpdateHeader h, ParseUpdateHeader(encoded, limits));
  const std::string_view payload = encoded.substr(h.header_bytes());
  if (payload.size() < h.payload_bytes) {
    return absl::DataLossError(absl::StrCat("update payload truncated: ", payload.size(), " of ",
                                            h.payload_bytes, " declared bytes present"));
  }
  if (payload.size() > h.payload_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("update: ", payload.size() - h.payload_bytes,
                                                   " trailing bytes after the declared payload of ",
                                                   h.payload_bytes));
  }
  std::optional<BodySource> source;
  if (h.zstd()) {
    FEDLORA_ASSIGN_OR_RETURN(source, BodySource::ForZstd(payload, h.raw_bytes));
  } else {
    source.emplace(payload);
  }
  source->SetConsumedHook(consumed, h.header_bytes());
  const absl::Status body = WalkBody(h, limits, materialize, *source, tensors, kept, indices);
  // A broken zstd stage explains any body error it caused, so it is reported first.
  FEDLORA_RETURN_IF_ERROR(source->Finish());
  return body;
}

}  // namespace

absl::StatusOr<std::string> EncodeUpdate(const std::vector<UpdateTensor>& tensors,
                                         const CodecOptions& options) {
  return EncodeUpdate(tensors, options, nullptr);
}

absl::StatusOr<std::string> EncodeUpdate(const std::vector<UpdateTensor>& tensors,
                                         const CodecOptions& options, kernels::Backend* backend) {
  FEDLORA_RETURN_IF_ERROR(CheckEncodeOptions(options));
  EncodeStages stages(backend);
  if (stages.on_device() && options.sparsifier == Sparsifier::kLowRank) {
    return absl::UnimplementedError(
        "EncodeUpdate: the low-rank stage has no GPU path; encode on the CPU (--device cpu) or "
        "choose another "
        "sparsifier");
  }
  const bool v2 = options.sparsifier != Sparsifier::kNone || options.codec == CodecId::kQuant;
  uint64_t element_count = 0;
  FEDLORA_RETURN_IF_ERROR(ValidateTensorsForEncode(tensors, element_count));

  // The body is built behind room for the header, so that an update without zstd is written once
  // and returned as it is (a 1 GB update is not copied a second time).
  const size_t header_bytes = v2 ? kUpdateHeaderSizeV2 : kUpdateHeaderSize;
  std::string body(header_bytes, '\0');
  size_t table_bytes = 4;
  for (const UpdateTensor& t : tensors) table_bytes += 2 + t.name.size() + 1 + 8 * t.shape.size();
  if (!v2)
    body.reserve(header_bytes + table_bytes + element_count * CodecElementSize(options.codec));
  PutU32(body, static_cast<uint32_t>(tensors.size()));
  for (const UpdateTensor& t : tensors) {
    PutU16(body, static_cast<uint16_t>(t.name.size()));
    body.append(t.name);
    PutU8(body, static_cast<uint8_t>(t.shape.size()));
    for (int64_t d : t.shape) PutU64(body, static_cast<uint64_t>(d));
  }
  if (v2) {
    FEDLORA_RETURN_IF_ERROR(AppendV2Sections(tensors, options, stages, body));
  } else {
    for (const UpdateTensor& t : tensors) {
      FEDLORA_RETURN_IF_ERROR(
          AppendDenseValues(t.values.data(), t.values.size(), options.codec, t.name, body));
    }
  }
  const size_t raw_bytes = body.size() - header_bytes;

  std::string out;
  if (options.zstd) {
    std::unique_ptr<ZSTD_CCtx, CCtxDeleter> cctx(ZSTD_createCCtx());
    if (cctx == nullptr)
      return absl::ResourceExhaustedError("EncodeUpdate: ZSTD_createCCtx failed");
    // The frame carries its content size (the decoder cross-checks it against the header) and a
    // checksum of the content (the decoder reports a mismatch as DataLoss).
    for (auto [param, value] :
         {std::pair{ZSTD_c_compressionLevel, options.zstd_level},
          std::pair{ZSTD_c_contentSizeFlag, 1}, std::pair{ZSTD_c_checksumFlag, 1}}) {
      const size_t rc = ZSTD_CCtx_setParameter(cctx.get(), param, value);
      if (ZSTD_isError(rc)) {
        return absl::InvalidArgumentError(absl::StrCat("EncodeUpdate: zstd parameter ",
                                                       static_cast<int>(param), " = ", value, ": ",
                                                       ZSTD_getErrorName(rc)));
      }
    }
    out.resize(header_bytes + ZSTD_compressBound(raw_bytes));
    const size_t n =
        ZSTD_compress2(cctx.get(), out.data() + header_bytes, out.size() - header_bytes,
                       body.data() + header_bytes, raw_bytes);
    if (ZSTD_isError(n))
      return absl::InternalError(absl::StrCat("EncodeUpdate: zstd: ", ZSTD_getErrorName(n)));
    out.resize(header_bytes + n);
  } else {
    out = std::move(body);
  }

  std::string header;
  header.reserve(header_bytes);
  header.append(kUpdateMagic, 4);
  PutU16(header, v2 ? kUpdateFormatVersion2 : kUpdateFormatVersion);
  PutU8(header, static_cast<uint8_t>(options.codec));
  PutU8(header, kCodecVersion);
  PutU32(header, options.zstd ? kUpdateFlagZstd : 0u);
  PutU32(header, 0);  // reserved
  PutU64(header, element_count);
  PutU64(header, raw_bytes);
  PutU64(header, out.size() - header_bytes);
  if (v2) {
    const bool quant = options.codec == CodecId::kQuant;
    PutU8(header, static_cast<uint8_t>(options.sparsifier));
    PutU8(header, quant ? static_cast<uint8_t>(options.quant_bits) : 0);
    PutU16(header, options.sparsifier == Sparsifier::kLowRank
                       ? static_cast<uint16_t>(options.low_rank)
                       : 0);
    PutU32(header, quant ? static_cast<uint32_t>(options.quant_block_size) : 0);
  }
  std::memcpy(out.data(), header.data(), header_bytes);
  return out;
}

absl::StatusOr<UpdateHeader> ParseUpdateHeader(std::string_view encoded,
                                               const DecodeLimits& limits) {
  if (encoded.size() < kUpdateHeaderSize) {
    return absl::DataLossError(absl::StrCat("update header truncated: ", encoded.size(),
                                            " bytes, need ", kUpdateHeaderSize));
  }
  const char* p = encoded.data();
  if (std::memcmp(p, kUpdateMagic, 4) != 0) {
    return absl::InvalidArgumentError(
        "update header: bad magic (expected \"FLU1\"); not an encoded update");
  }
  UpdateHeader h;
  h.format_version = Load<uint16_t>(p + 4);
  const uint8_t codec = Load<uint8_t>(p + 6);
  h.codec_version = Load<uint8_t>(p + 7);
  h.flags = Load<uint32_t>(p + 8);
  const uint32_t reserved = Load<uint32_t>(p + 12);
  h.element_count = Load<uint64_t>(p + 16);
  h.raw_bytes = Load<uint64_t>(p + 24);
  h.payload_bytes = Load<uint64_t>(p + 32);

  if (h.format_version != kUpdateFormatVersion && h.format_version != kUpdateFormatVersion2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "update header: unsupported format version ", h.format_version,
        " (this build reads versions ", kUpdateFormatVersion, " and ", kUpdateFormatVersion2, ")"));
  }
  const bool v2 = h.format_version == kUpdateFormatVersion2;
  if (codec != static_cast<uint8_t>(CodecId::kRawF32) &&
      codec != static_cast<uint8_t>(CodecId::kF16) &&
      codec != static_cast<uint8_t>(CodecId::kBF16) &&
      codec != static_cast<uint8_t>(CodecId::kQuant)) {
    return absl::InvalidArgumentError(absl::StrCat("update header: unknown codec id ", codec));
  }
  h.codec = static_cast<CodecId>(codec);
  if (v2) {
    if (encoded.size() < kUpdateHeaderSizeV2) {
      return absl::DataLossError(absl::StrCat("update header truncated: ", encoded.size(),
                                              " bytes, need ", kUpdateHeaderSizeV2,
                                              " for format version 2"));
    }
    const uint8_t sparsifier = Load<uint8_t>(p + 40);
    h.quant_bits = Load<uint8_t>(p + 41);
    h.low_rank = Load<uint16_t>(p + 42);
    h.quant_block_size = Load<uint32_t>(p + 44);
    if (sparsifier > static_cast<uint8_t>(Sparsifier::kLowRank)) {
      return absl::InvalidArgumentError(
          absl::StrCat("update header: unknown sparsifier id ", sparsifier));
    }
    h.sparsifier = static_cast<Sparsifier>(sparsifier);
    if (h.sparsifier == Sparsifier::kLowRank ? h.low_rank < 1 || h.low_rank > kMaxLowRank
                                             : h.low_rank != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("update header: low-rank rank ", h.low_rank, " with sparsifier ",
                       ToAbsl(SparsifierName(h.sparsifier)), " (must be 1 to ", kMaxLowRank,
                       " with low-rank, else 0)"));
    }
    if (h.codec == CodecId::kQuant) {
      FEDLORA_RETURN_IF_ERROR(
          Annotate(CheckQuantSpec(h.quant_bits, h.quant_block_size), "update header"));
    } else if (h.quant_bits != 0 || h.quant_block_size != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("update header: quantization bits ", h.quant_bits, " and block size ",
                       h.quant_block_size, " without the ", "quant codec (both must be 0)"));
    }
    if (h.sparsifier == Sparsifier::kNone && h.codec != CodecId::kQuant) {
      return absl::InvalidArgumentError(absl::StrCat("update header: format version 2 for a dense ",
                                                     ToAbsl(CodecName(h.codec)),
                                                     " update (written as version 1)"));
    }
  } else if (h.codec == CodecId::kQuant) {
    return absl::InvalidArgumentError("update header: the quant codec needs format version 2");
  }
  if (h.codec_version != kCodecVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("update header: unsupported ", ToAbsl(CodecName(h.codec)), " codec version ",
                     h.codec_version, " (this build reads version ", kCodecVersion, ")"));
  }
  if ((h.flags & ~kUpdateFlagZstd) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("update header: unknown flag bits 0x", absl::Hex(h.flags & ~kUpdateFlagZstd)));
  }
  if (reserved != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("update header: reserved field is ", reserved, ", must be 0"));
  }
  const uint64_t max_elements = static_cast<uint64_t>(std::max<int64_t>(limits.max_elements, 0));
  const uint64_t max_bytes = static_cast<uint64_t>(std::max<int64_t>(limits.max_decoded_bytes, 0));
  if (h.element_count > max_elements) {
    return absl::InvalidArgumentError(absl::StrCat("update header: element count ", h.element_count,
                                                   " exceeds the limit of ", max_elements));
  }
  if (h.raw_bytes > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("update header: raw size ", h.raw_bytes,
                                                   " bytes exceeds the limit of ", max_bytes));
  }
  // element_count <= max_elements (int64) and element size <= 4: no overflow in uint64. Version 2
  // sizes depend on what each tensor keeps: the body walk checks them.
  const uint64_t min_raw = v2 ? 4 : 4 + h.element_count * CodecElementSize(h.codec);
  if (h.raw_bytes < min_raw) {
    return absl::InvalidArgumentError(absl::StrCat(
        "update header: raw size ", h.raw_bytes, " bytes cannot hold ", h.element_count, " ",
        ToAbsl(CodecName(h.codec)), " values plus a tensor table (needs at least ", min_raw, ")"));
  }
  if (!h.zstd() && h.payload_bytes != h.raw_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("update header: payload size ", h.payload_bytes,
                                                   " differs from raw size ", h.raw_bytes,
                                                   " without a compression stage"));
  }
  return h;
}

absl::StatusOr<std::vector<UpdateTensor>> DecodeUpdate(std::string_view encoded,
                                                       const DecodeLimits& limits) {
  std::vector<UpdateTensor> tensors;
  std::vector<int64_t> kept;
  FEDLORA_RETURN_IF_ERROR(WalkUpdate(encoded, limits, /*materialize=*/true, tensors, kept));
  return tensors;
}

absl::StatusOr<std::vector<KeptTensor>> DecodeUpdateKept(std::string_view encoded,
                                                         const DecodeLimits& limits) {
  std::vector<UpdateTensor> tensors;
  std::vector<int64_t> kept;
  std::vector<std::vector<int64_t>> indices;
  FEDLORA_RETURN_IF_ERROR(
      WalkUpdate(encoded, limits, /*materialize=*/true, tensors, kept, nullptr, &indices));
  FEDLORA_ASSIGN_OR_RETURN(const UpdateHeader h, ParseUpdateHeader(encoded, limits));
  const bool sparse = h.sparsifier == Sparsifier::kTopK || h.sparsifier == Sparsifier::kRandomK;
  std::vector<KeptTensor> out(tensors.size());
  for (size_t t = 0; t < tensors.size(); ++t) {
    out[t].name = std::move(tensors[t].name);
    out[t].shape = std::move(tensors[t].shape);
    out[t].values = std::move(tensors[t].values);
    out[t].dense = !sparse;
    if (sparse) out[t].indices = std::move(indices[t]);
  }
  return out;
}

absl::StatusOr<std::vector<UpdateTensorInfo>> ValidateUpdate(
    std::string_view encoded, const DecodeLimits& limits,
    const std::function<void(uint64_t)>& consumed) {
  std::vector<UpdateTensor> tensors;
  std::vector<int64_t> kept;
  FEDLORA_RETURN_IF_ERROR(
      WalkUpdate(encoded, limits, /*materialize=*/false, tensors, kept, &consumed));
  std::vector<UpdateTensorInfo> table(tensors.size());
  for (size_t t = 0; t < tensors.size(); ++t) {
    table[t].name = std::move(tensors[t].name);
    table[t].shape = std::move(tensors[t].shape);
    table[t].kept = kept[t];
  }
  return table;
}

}  // namespace fedlora
