// Federated averaging's exact accumulation (kernels/base/fixed_point.h, what StreamingFedAvg runs per
// update) against a plain copy of memory, on the CPU or a GPU, in the same run.
//
//   kernels_aggregation_bench [cpu|cuda] [elements] [updates] [reps]
//
// Adds `updates` updates of `elements` fp32 values, already in the device's memory (8 distinct
// buffers, cycled), into the 128-bit sums. Per update and element the kernel reads the value
// (4 bytes) and reads and writes its sum (32 bytes). The baseline copies a buffer of the sums' size
// on the same device (memcpy on the CPU, a device-to-device copy on a GPU; bytes read plus
// written). Validates the sums against a serial computation first; prints the bytes per second of
// both and their ratio (medians of `reps` timings).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench/kernels/bench_util.h"
#include "kernels/base/backend.h"
#include "kernels/base/fixed_point.h"

namespace fk = fedlora::kernels;
using fedlora::bench::Check;
using fedlora::bench::MedianSeconds;

int main(int argc, char** argv) {
  const std::string device_name = argc > 1 ? argv[1] : "cpu";
  const bool cuda = device_name == "cuda";
  if (!cuda && device_name != "cpu") {
    std::fprintf(stderr, "device must be cpu or cuda, not '%s'\n", device_name.c_str());
    return 2;
  }
  const int64_t n = argc > 2 ? std::atoll(argv[2]) : (cuda ? int64_t{1} << 24 : int64_t{1} << 22);
  const int updates = argc > 3 ? std::atoi(argv[3]) : 100;
  const int reps = argc > 4 ? std::atoi(argv[4]) : 3;
  if (n < 1 || updates < 1 || reps < 1) {
    std::fprintf(stderr, "elements, updates and reps must be positive\n");
    return 2;
  }
  constexpr int kBuffers = 8;
  auto backend = fk::Backend::Create(cuda ? fedlora::Device::kCuda : fedlora::Device::kCpu);
  Check(backend.status(), "backend");
  fk::Backend& b = **backend;
  auto sums = fk::DeviceArray<fk::u128>::Zeros(b, n);
  auto copy_dst = fk::DeviceArray<fk::u128>::Zeros(b, n);
  Check(sums.status(), "sums");
  Check(copy_dst.status(), "copy target");
  std::vector<std::vector<float>> host;
  std::vector<fk::DeviceArray<float>> values;
  for (int i = 0; i < kBuffers; ++i) {
    host.push_back(fedlora::bench::Random(n, 100 + i));
    auto v = fk::DeviceArray<float>::Zeros(b, n);
    Check(v.status(), "update buffer");
    Check(b.Upload(v->data(), host.back().data(), n * sizeof(float)), "upload");
    values.push_back(*std::move(v));
  }
  auto add = [&](int u) {
    int64_t bad = 0;
    Check(fk::FixedPointAccumulate(b.ctx(), {.n = n,
                                             .x = values[u % kBuffers].data(),
                                             .weight = static_cast<uint64_t>(1 + u % 97),
                                             .sums = sums->data(),
                                             .first_bad = &bad}),
          "FixedPointAccumulate");
    if (bad != -1) {
      std::fprintf(stderr, "value %lld out of range\n", static_cast<long long>(bad));
      std::exit(1);
    }
  };

  // Validation: `updates` updates against the serial sums of the first 4096 elements.
  for (int u = 0; u < updates; ++u) add(u);
  const int64_t check = std::min<int64_t>(n, 4096);
  std::vector<fk::u128> got(check), want(check, 0);
  Check(b.Download(got.data(), sums->data(), check * sizeof(fk::u128)), "download");
  for (int u = 0; u < updates; ++u) {
    for (int64_t i = 0; i < check; ++i) {
      uint32_t bits;
      std::memcpy(&bits, &host[u % kBuffers][i], 4);
      fk::u128 term;
      if (!fk::FixedPointTerm(bits, 1 + u % 97, &term)) return 1;
      want[i] += term;
    }
  }
  if (got != want) {
    std::fprintf(stderr, "validation failed: the sums differ from the serial computation\n");
    return 1;
  }

  const double add_s = MedianSeconds(reps, [&] {
    for (int u = 0; u < updates; ++u) add(u);
    Check(b.Synchronize(), "synchronize");
  });
  const double copy_s = MedianSeconds(reps, [&] {
    for (int u = 0; u < updates; ++u) {
      Check(b.CopyRows(copy_dst->data(), n * sizeof(fk::u128), sums->data(), n * sizeof(fk::u128),
                       n * sizeof(fk::u128), 1),
            "copy");
    }
    Check(b.Synchronize(), "synchronize");
  });
  const double add_bytes = 36.0 * n * updates, copy_bytes = 2.0 * 16.0 * n * updates;
  const double add_gbs = add_bytes / add_s / 1e9, copy_gbs = copy_bytes / copy_s / 1e9;
  std::printf(
      "| device | elements | updates | accumulate GB/s | %s GB/s | accumulate / copy | updates/s "
      "|\n",
      cuda ? "device copy" : "memcpy");
  std::printf("| --- | --- | --- | --- | --- | --- | --- |\n");
  std::printf("| %s | %lld | %d | %.1f | %.1f | %.2f | %.1f |\n", device_name.c_str(),
              static_cast<long long>(n), updates, add_gbs, copy_gbs, add_gbs / copy_gbs,
              updates / add_s);
  return 0;
}
