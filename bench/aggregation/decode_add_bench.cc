// What the server does with each accepted sparsified update: decode it and add it into the exact
// sums. The kept path (DecodeUpdateKept + StreamingFedAvg::Add of the kept entries, what the
// coordinator runs) against the dense path (DecodeUpdate + Add of the expanded update, what it ran
// before), with the sums on the CPU or a GPU, in the same run.
//
//   aggregation_decode_add_bench [cpu|cuda] [elements] [updates] [reps]
//
// The update is LoRA-shaped (pairs of 8 x m and m x 8 tensors of 1,048,576 values, Gaussian),
// encoded once per client seed (4 distinct encodings, cycled). Pipelines: top-k 1% + quant 8 bit,
// random-k 1% + quant 8 bit, top-k 10% fp32. Validation first: both paths' means are the same bits.
// Prints updates per second of both paths and their ratio (medians of `reps` timings).
//
// Napkin math: the dense path writes and reads 4 bytes per element for the expansion, and adds
// every element (32 bytes of sums read and written, most of them adding 0); on a GPU it also copies
// 4 bytes per element to the device. The kept path touches only the kept 1% (plus their indices),
// so it should be limited by decoding, some 10x or more faster at 1%.
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "aggregation/fedavg.h"
#include "bench/aggregation/lora_update.h"
#include "bench/kernels/bench_util.h"
#include "compression/codec.h"

namespace fedlora {
namespace {

using bench::Check;
using bench::MedianSeconds;

constexpr int64_t kTensorValues = int64_t{1} << 20;

std::vector<UpdateTensor> MakeUpdate(int64_t elements, uint32_t seed) {
  return bench::LoraShapedUpdate(elements, seed, kTensorValues);
}

std::string Bits(const std::vector<UpdateTensor>& mean) {
  std::string out;
  for (const UpdateTensor& t : mean)
    out.append(reinterpret_cast<const char*>(t.values.data()), t.values.size() * 4);
  return out;
}

}  // namespace
}  // namespace fedlora

int main(int argc, char** argv) {
  using namespace fedlora;
  const std::string device_name = argc > 1 ? argv[1] : "cpu";
  const bool cuda = device_name == "cuda";
  if (!cuda && device_name != "cpu") {
    std::fprintf(stderr, "device must be cpu or cuda, not '%s'\n", device_name.c_str());
    return 2;
  }
  const int64_t elements = argc > 2 ? std::atoll(argv[2]) : int64_t{1} << 23;
  const int updates = argc > 3 ? std::atoi(argv[3]) : 8;
  const int reps = argc > 4 ? std::atoi(argv[4]) : 3;
  if (elements < 8 || updates < 1 || reps < 1) {
    std::fprintf(stderr, "elements (>= 8), updates and reps must be positive\n");
    return 2;
  }
  const Device device = cuda ? Device::kCuda : Device::kCpu;
  struct Pipeline {
    const char* name;
    CodecOptions options;
  };
  const std::vector<Pipeline> pipelines = {
      {"top-k 1% + quant 8",
       {.sparsifier = Sparsifier::kTopK, .fraction = 0.01, .codec = CodecId::kQuant}},
      {"random-k 1% + quant 8",
       {.sparsifier = Sparsifier::kRandomK, .fraction = 0.01, .codec = CodecId::kQuant}},
      {"top-k 10% fp32", {.sparsifier = Sparsifier::kTopK, .fraction = 0.1}},
  };
  std::printf(
      "| device | elements | updates | pipeline | MB per update | dense decode+add updates/s | "
      "kept decode+add "
      "updates/s | kept / dense |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (const Pipeline& p : pipelines) {
    std::vector<std::string> wires;
    for (uint32_t s = 0; s < 4; ++s) {
      CodecOptions o = p.options;
      o.seed = s;
      auto wire = EncodeUpdate(MakeUpdate(elements, 10 + s), o);
      Check(wire.status(), "EncodeUpdate");
      wires.push_back(*std::move(wire));
    }
    auto spec_update = DecodeUpdate(wires[0], {});
    Check(spec_update.status(), "DecodeUpdate");
    const std::vector<TensorSpec> spec = SpecFromUpdate(*spec_update);
    const DecodeLimits limits{.max_elements = elements, .max_decoded_bytes = int64_t{4} << 30};
    // One update decoded and added by either path.
    auto add = [&](StreamingFedAvg& avg, const std::string& wire, bool kept, int64_t weight) {
      if (kept) {
        auto k = DecodeUpdateKept(wire, limits);
        Check(k.status(), "DecodeUpdateKept");
        Check(avg.Add(*k, weight), "Add kept");
      } else {
        auto d = DecodeUpdate(wire, limits);
        Check(d.status(), "DecodeUpdate");
        Check(avg.Add(*d, weight), "Add dense");
      }
    };
    auto fresh = [&]() {
      auto avg = StreamingFedAvg::Create(spec, device);
      Check(avg.status(), "StreamingFedAvg::Create");
      return *std::move(avg);
    };
    std::string means[2];
    for (bool kept : {false, true}) {
      StreamingFedAvg avg = fresh();
      for (int u = 0; u < updates; ++u) add(avg, wires[u % wires.size()], kept, 1 + u % 7);
      const auto mean = avg.Finish();
      Check(mean.status(), "Finish");
      means[kept] = Bits(*mean);
    }
    if (means[0] != means[1]) {
      std::fprintf(stderr,
                   "validation failed (%s): the kept path's mean differs from the dense path's\n",
                   p.name);
      return 1;
    }
    // Timed: the adds of `updates` updates into an accumulator created outside the timing.
    auto time_adds = [&](bool kept) {
      StreamingFedAvg avg = fresh();
      int u = 0;
      return MedianSeconds(reps, [&] {
        for (int i = 0; i < updates; ++i, ++u) add(avg, wires[u % wires.size()], kept, 1);
      });
    };
    const double dense_s = time_adds(false), kept_s = time_adds(true);
    std::printf("| %s | %lld | %d | %s | %.2f | %.1f | %.1f | %.1fx |\n", device_name.c_str(),
                static_cast<long long>(elements), updates, p.name, wires[0].size() / 1e6,
                updates / dense_s, updates / kept_s, dense_s / kept_s);
  }
  return 0;
}
