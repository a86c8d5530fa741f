// What the server's upload path hashes per byte: each chunk checked against its SHA-256, and the
// same bytes fed to the blob's running SHA-256.
//
//   core_sha256_bench [MiB=256] [reps=7]
//
// Baseline (measured in the same run): two passes through OpenSSL's EVP SHA-256, the chunk's
// digest then the blob's update, as the upload path did before Sha256::UpdateAndDigest. Against
// it: UpdateAndDigest, which on a CPU with SHA-NI runs the two hashes as two interleaved lanes
// over one read of the bytes. Also UpdateAndDigest forced onto OpenSSL's block function (what a
// CPU without SHA-NI runs), and single-stream throughput of EVP and of our Sha256, so that a
// regression of either fallback or the plain path shows up too.
//
// Napkin math: SHA-256 with SHA-NI is latency-bound on SHA256RNDS2 (two rounds per instruction,
// a serial chain); a second independent chain fills the issue slots the first leaves idle, so two
// digests should cost well under twice one. Without SHA-NI both sides run OpenSSL twice: ~1.0x.
//
// Validation before timing: every chunk digest and the blob digest of both methods agree with EVP.
#include <openssl/evp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "core/sha256.h"
#include "core/sha256_blocks.h"

namespace fedlora {
namespace {

constexpr size_t kChunk = 1 << 20;  // the protocol's default chunk

struct Digests {
  std::vector<Sha256DigestBytes> chunks;
  Sha256DigestBytes blob{};
};

Sha256DigestBytes EvpFinal(EVP_MD_CTX* ctx) {
  Sha256DigestBytes d{};
  unsigned int n = 0;
  EVP_DigestFinal_ex(ctx, d.data(), &n);
  return d;
}

// Baseline: per chunk, a one-shot EVP digest, then the chunk into the blob's EVP context.
Digests TwoPassesEvp(const std::string& blob) {
  Digests out;
  EVP_MD_CTX* whole = EVP_MD_CTX_new();
  EVP_MD_CTX* one = EVP_MD_CTX_new();
  EVP_DigestInit_ex(whole, EVP_sha256(), nullptr);
  for (size_t off = 0; off < blob.size(); off += kChunk) {
    const size_t n = std::min(kChunk, blob.size() - off);
    EVP_DigestInit_ex(one, EVP_sha256(), nullptr);
    EVP_DigestUpdate(one, blob.data() + off, n);
    out.chunks.push_back(EvpFinal(one));
    EVP_DigestUpdate(whole, blob.data() + off, n);
  }
  out.blob = EvpFinal(whole);
  EVP_MD_CTX_free(one);
  EVP_MD_CTX_free(whole);
  return out;
}

Digests OnePassFused(const std::string& blob) {
  Digests out;
  Sha256 whole;
  for (size_t off = 0; off < blob.size(); off += kChunk) {
    out.chunks.push_back(whole.UpdateAndDigest(std::string_view(blob).substr(off, kChunk)));
  }
  out.blob = whole.Final();
  return out;
}

Sha256DigestBytes SingleEvp(const std::string& blob) {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  EVP_DigestUpdate(ctx, blob.data(), blob.size());
  const Sha256DigestBytes d = EvpFinal(ctx);
  EVP_MD_CTX_free(ctx);
  return d;
}

template <typename F>
double MedianSeconds(int reps, F&& f) {
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace
}  // namespace fedlora

int main(int argc, char** argv) {
  using namespace fedlora;
  int mib = 256, reps = 7;
  if (argc > 1) (void)absl::SimpleAtoi(argv[1], &mib);
  if (argc > 2) (void)absl::SimpleAtoi(argv[2], &reps);
  if (mib < 1 || reps < 1) {
    std::fprintf(stderr, "usage: core_sha256_bench [MiB >= 1] [reps >= 1]\n");
    return 2;
  }
  // Not a multiple of the chunk: the last chunk is short and ragged, as in a real upload.
  std::string blob(static_cast<size_t>(mib) * (1 << 20) + 12345, '\0');
  std::mt19937_64 gen(7);
  for (size_t i = 0; i + 8 <= blob.size(); i += 8) {
    const uint64_t v = gen();
    std::memcpy(blob.data() + i, &v, 8);
  }

  const Digests ref = TwoPassesEvp(blob);
  const Digests fused = OnePassFused(blob);
  if (fused.chunks != ref.chunks || fused.blob != ref.blob || SingleEvp(blob) != ref.blob) {
    std::fprintf(stderr, "VALIDATION FAILED: digests differ from OpenSSL EVP\n");
    return 1;
  }
  const double gb = static_cast<double>(blob.size()) / 1e9;
  const double two = MedianSeconds(reps, [&] { (void)TwoPassesEvp(blob); });
  const double one = MedianSeconds(reps, [&] { (void)OnePassFused(blob); });
  const double evp = MedianSeconds(reps, [&] { (void)SingleEvp(blob); });
  const double ours = MedianSeconds(reps, [&] { (void)Sha256Digest(blob); });
  // What a CPU without SHA-NI gets: the same calls on OpenSSL's block function.
  sha256_internal::SetEngineForTesting(sha256_internal::Engine::kOpenSsl);
  const double fallback = MedianSeconds(reps, [&] { (void)OnePassFused(blob); });
  sha256_internal::SetEngineForTesting(sha256_internal::Engine::kAuto);
  std::printf("validated: %zu chunk digests and the blob digest match OpenSSL EVP\n",
              ref.chunks.size());
  std::printf("block engine: %s\n", sha256_internal::UseShaNi()
                                        ? "SHA-NI (two interleaved lanes for UpdateAndDigest)"
                                        : "OpenSSL (no SHA-NI on this CPU)");
  std::printf("%.3f GB in 1 MiB chunks, median of %d reps; GB/s of input bytes\n", gb, reps);
  std::printf("chunk + blob digests, two EVP passes (baseline): %8.1f ms  %6.3f GB/s\n", two * 1e3,
              gb / two);
  std::printf("chunk + blob digests, UpdateAndDigest:           %8.1f ms  %6.3f GB/s\n", one * 1e3,
              gb / one);
  std::printf("one digest, OpenSSL EVP:                         %8.1f ms  %6.3f GB/s\n", evp * 1e3,
              gb / evp);
  std::printf("one digest, fedlora Sha256:                      %8.1f ms  %6.3f GB/s\n", ours * 1e3,
              gb / ours);
  std::printf(
      "chunk + blob digests, UpdateAndDigest on OpenSSL's block function (no SHA-NI): %8.1f ms  "
      "%6.3f GB/s\n",
      fallback * 1e3, gb / fallback);
  std::printf(
      "ratio: both digests %.2fx faster than the baseline (%.2fx without SHA-NI); one digest at "
      "%.2fx of EVP's "
      "speed\n",
      two / one, two / fallback, evp / ours);
  return 0;
}
