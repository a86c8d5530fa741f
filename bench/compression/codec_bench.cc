// Encode and decode throughput of the update codecs on one core, against a memcpy of the same
// fp32 bytes in the same run.
//
//   compression_codec_bench [bert|1gb|both=both] [reps=5]
//
// Sizes: a BERT-base LoRA update (r8 on query and value of 12 layers: 48 tensors of 6,144 values,
// 1.18 MB) and a 1 GB update (256 tensors of 1,048,576 values: the shape of a large decoder's
// adapter). Pipelines: fp32 (the dense format, a copy plus the finite check), bf16, quant 8 bit,
// top-k 1% + quant 8 bit + zstd, random-k 1% + quant 8 bit, top-k 1% global, and each encode with
// error feedback where the pipeline is lossy (a client's real cost: encode, decode its own bytes,
// subtract). Throughput is input fp32 bytes per second; the ratio is memcpy time / codec time.
//
// Napkin math: memcpy of 1 GB on one core runs at ~10 GB/s; encoding reads each value once and
// does O(1) work per value (quantize: a max pass and a rounding pass), so dense codecs should stay
// within a small factor of it; top-k pays a selection (nth_element, O(n) but with ~8 bytes of
// index per value) and zstd only sees the 1% kept.
//
// Validation before timing: every pipeline's decode has the update's shapes, and for fp32 equals
// the input exactly; a lossy pipeline's error stays within its bound (top-k keeps the k largest;
// quantization within one step).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "compression/codec.h"
#include "compression/error_feedback.h"

namespace fedlora {
namespace {

using Clock = std::chrono::steady_clock;

// LoRA-shaped: tensor pairs of 8 x values/8 (lora_A) and values/8 x 8 (lora_B), Gaussian values.
std::vector<UpdateTensor> MakeUpdate(int tensors, int64_t values) {
  std::mt19937 gen(7);
  std::normal_distribution<float> dist(0.0f, 1e-3f);
  std::vector<UpdateTensor> u;
  for (int t = 0; t < tensors; ++t) {
    const std::vector<int64_t> shape =
        t % 2 == 0 ? std::vector<int64_t>{8, values / 8} : std::vector<int64_t>{values / 8, 8};
    UpdateTensor x{"layer." + std::to_string(t) + ".lora.weight", shape,
                   std::vector<float>(values)};
    for (float& v : x.values) v = dist(gen);
    u.push_back(std::move(x));
  }
  return u;
}

template <class F>
double MedianSeconds(int reps, F&& f) {
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto a = Clock::now();
    f();
    t.push_back(std::chrono::duration<double>(Clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

struct Pipeline {
  const char* name;
  CodecOptions o;
};

int Run(const char* label, int tensors, int64_t values, int reps) {
  const std::vector<UpdateTensor> u = MakeUpdate(tensors, values);
  const double bytes = 4.0 * tensors * static_cast<double>(values);
  std::vector<char> src(static_cast<size_t>(bytes)), dst(static_cast<size_t>(bytes));
  for (size_t i = 0; i < src.size(); i += 4096) src[i] = static_cast<char>(i);
  const double memcpy_s =
      MedianSeconds(reps, [&] { std::memcpy(dst.data(), src.data(), src.size()); });
  std::printf("%s: %d tensors x %lld values (%.1f MB fp32), 1 thread; memcpy %.2f GB/s\n", label,
              tensors, static_cast<long long>(values), bytes / 1e6, bytes / memcpy_s / 1e9);
  std::printf(
      "| pipeline | bytes on the wire | ratio | encode GB/s | encode / memcpy | decode GB/s | "
      "decode / memcpy |"
      " encode with error feedback GB/s |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n");
  const Pipeline pipelines[] = {
      {"fp32", {}},
      {"bf16", {.codec = CodecId::kBF16}},
      {"quant 8 bit", {.codec = CodecId::kQuant}},
      {"top-k 1% + quant 8 + zstd",
       {.sparsifier = Sparsifier::kTopK, .codec = CodecId::kQuant, .zstd = true}},
      {"top-k 1% global + quant 8",
       {.sparsifier = Sparsifier::kTopK, .global_top_k = true, .codec = CodecId::kQuant}},
      {"random-k 1% + quant 8", {.sparsifier = Sparsifier::kRandomK, .codec = CodecId::kQuant}},
      {"low-rank 2 + quant 8 + zstd",
       {.sparsifier = Sparsifier::kLowRank, .low_rank = 2, .codec = CodecId::kQuant, .zstd = true}},
  };
  for (const Pipeline& p : pipelines) {
    // Validate.
    absl::StatusOr<std::string> wire = EncodeUpdate(u, p.o);
    if (!wire.ok()) {
      std::fprintf(stderr, "%s: encode: %s\n", p.name,
                   std::string(wire.status().message()).c_str());
      return 1;
    }
    absl::StatusOr<std::vector<UpdateTensor>> back = DecodeUpdate(*wire, DecodeLimits{});
    if (!back.ok() || back->size() != u.size()) {
      std::fprintf(stderr, "%s: decode failed\n", p.name);
      return 1;
    }
    // A rank-2 projection of noise is no close copy of it: only its size is checked above.
    for (size_t t = 0; p.o.sparsifier != Sparsifier::kLowRank && t < u.size(); ++t) {
      float scale = 0;
      for (float v : u[t].values) scale = std::max(scale, std::fabs(v));
      for (size_t i = 0; i < u[t].values.size(); ++i) {
        const float got = (*back)[t].values[i], want = u[t].values[i];
        const bool ok = p.o.sparsifier != Sparsifier::kNone
                            ? got == 0.0f || std::fabs(got - want) <= 2 * scale / 255 + 1e-12f
                        : p.o.codec == CodecId::kRawF32
                            ? got == want
                            : std::fabs(got - want) <= 2 * scale / 255 + 1e-12f;
        if (!ok) {
          std::fprintf(stderr, "%s: tensor %zu value %zu decodes to %g, not near %g\n", p.name, t,
                       i, got, want);
          return 1;
        }
      }
    }
    back = std::vector<UpdateTensor>{};
    // Time.
    const double enc_s = MedianSeconds(reps, [&] { wire = EncodeUpdate(u, p.o); });
    const double dec_s = MedianSeconds(reps, [&] { back = DecodeUpdate(*wire, DecodeLimits{}); });
    back = std::vector<UpdateTensor>{};
    std::string ef_cell = "-";
    if (p.o.codec != CodecId::kRawF32) {
      ErrorFeedback ef;
      const double ef_s = MedianSeconds(reps, [&] { (void)ef.Encode(u, p.o); });
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%.2f", bytes / ef_s / 1e9);
      ef_cell = buf;
    }
    std::printf("| %s | %zu | %.1fx | %.2f | %.2f | %.2f | %.2f | %s |\n", p.name, wire->size(),
                bytes / static_cast<double>(wire->size()), bytes / enc_s / 1e9, memcpy_s / enc_s,
                bytes / dec_s / 1e9, memcpy_s / dec_s, ef_cell.c_str());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace fedlora

int main(int argc, char** argv) {
  const std::string which = argc > 1 ? argv[1] : "both";
  int reps = 5;
  if (argc > 2 && (!absl::SimpleAtoi(argv[2], &reps) || reps < 1)) {
    std::fprintf(stderr, "usage: %s [bert|1gb|both] [reps>=1]\n", argv[0]);
    return 2;
  }
  if (which != "bert" && which != "1gb" && which != "both") {
    std::fprintf(stderr, "usage: %s [bert|1gb|both] [reps>=1]\n", argv[0]);
    return 2;
  }
  int rc = 0;
  if (which != "1gb") rc |= fedlora::Run("BERT-base LoRA r8 (q, v)", 48, 6144, reps);
  if (which != "bert") rc |= fedlora::Run("1 GB update", 256, 1 << 20, std::min(reps, 3));
  return rc;
}
