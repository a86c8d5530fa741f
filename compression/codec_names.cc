// Names and descriptions of the update wire format's codecs and options (compression/codec.h).
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "compression/codec.h"
#include "core/strings.h"

namespace fedlora {

std::string_view CodecName(CodecId codec) {
  switch (codec) {
    case CodecId::kRawF32:
      return "fp32";
    case CodecId::kF16:
      return "fp16";
    case CodecId::kBF16:
      return "bf16";
    case CodecId::kQuant:
      return "quant";
  }
  return "unknown";
}

std::string_view SparsifierName(Sparsifier sparsifier) {
  switch (sparsifier) {
    case Sparsifier::kNone:
      return "none";
    case Sparsifier::kTopK:
      return "top-k";
    case Sparsifier::kRandomK:
      return "random-k";
    case Sparsifier::kLowRank:
      return "low-rank";
  }
  return "unknown";
}

std::string CodecOptions::Describe() const {
  std::string out;
  if (sparsifier == Sparsifier::kLowRank) {
    absl::StrAppend(&out, "low-rank ", low_rank, " + ");
  } else if (sparsifier != Sparsifier::kNone) {
    absl::StrAppend(&out, ToAbsl(SparsifierName(sparsifier)), " ", fraction * 100, "%",
                    global_top_k ? " global" : "", " + ");
  }
  if (codec == CodecId::kQuant) {
    absl::StrAppend(&out, "quant ", quant_bits, " bit/", quant_block_size,
                    quant_stochastic ? "" : " nearest");
  } else {
    absl::StrAppend(&out, ToAbsl(CodecName(codec)));
  }
  if (zstd) absl::StrAppend(&out, " + zstd");
  return out;
}

CodecOptions UpdateHeader::options() const {
  CodecOptions o;
  o.sparsifier = sparsifier;
  o.codec = codec;
  if (sparsifier == Sparsifier::kLowRank) o.low_rank = low_rank;
  if (codec == CodecId::kQuant) {
    o.quant_bits = quant_bits;
    o.quant_block_size = quant_block_size;
  }
  o.zstd = zstd();
  return o;
}

absl::StatusOr<CodecId> ParseCodecName(std::string_view name) {
  const std::string lower = absl::AsciiStrToLower(ToAbsl(name));
  if (lower == "fp32" || lower == "f32") return CodecId::kRawF32;
  if (lower == "fp16" || lower == "f16") return CodecId::kF16;
  if (lower == "bf16") return CodecId::kBF16;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown update codec '", ToAbsl(name), "' (expected fp32, fp16 or bf16)"));
}

size_t CodecElementSize(CodecId codec) {
  return codec == CodecId::kRawF32 ? 4 : codec == CodecId::kQuant ? 0 : 2;
}

}  // namespace fedlora
