#include "kernels/context.h"

#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <iterator>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "kernels/device.h"
#include "kernels/kernel_util.h"

namespace fedlora::kernels {
namespace {

std::mutex g_pool_mu;
std::atomic<ThreadPool*> g_pool{nullptr};

// Pools made by SetNumThreads; kept alive so that pointers handed out earlier stay valid.
std::vector<std::unique_ptr<ThreadPool>>& OwnedPools() {
  static auto* pools = new std::vector<std::unique_ptr<ThreadPool>>();
  return *pools;
}

}  // namespace

ThreadPool& ExecContext::Pool() const { return pool != nullptr ? *pool : DefaultPool(); }

ThreadPool& DefaultPool() {
  ThreadPool* p = g_pool.load(std::memory_order_acquire);
  return p != nullptr ? *p : ThreadPool::Default();
}

void SetNumThreads(int n) {
  if (n <= 0) n = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::lock_guard<std::mutex> lock(g_pool_mu);
  auto pool = std::make_unique<ThreadPool>(n);
  g_pool.store(pool.get(), std::memory_order_release);
  OwnedPools().push_back(std::move(pool));
  openblas_set_num_threads(n);
}

int NumThreads() { return DefaultPool().NumThreads(); }

std::string OpenBlasCoreName() {
  const char* name = openblas_get_corename();
  return name != nullptr ? name : "";
}

void RestartForFasterOpenBlas(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;
  // OpenBLAS's names for kernel sets older than AVX2 (its fallbacks for an unknown model).
  static const char* const kOld[] = {"prescott",   "core2",     "penryn",      "dunnington",
                                     "nehalem",    "atom",      "sandybridge", "katmai",
                                     "coppermine", "northwood", "banias"};
  std::string core = OpenBlasCoreName();
  for (char& ch : core) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (std::find(std::begin(kOld), std::end(kOld), core) == std::end(kOld)) return;
  const char* better = nullptr;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
    better = "SkylakeX";
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    better = "Haswell";
  }
  if (better == nullptr) return;
  setenv("OPENBLAS_CORETYPE", better, 1);
  execv("/proc/self/exe", argv);
  unsetenv("OPENBLAS_CORETYPE");  // the exec failed: go on with the kernels there are
}

namespace internal {

absl::Status CheckBackend(const ExecContext& ctx, std::string_view op) {
  if (ctx.device == Device::kCpu) return absl::OkStatus();
  if (ctx.device != Device::kCuda) return InvalidArg(op, "unknown device");
  absl::Status s = CheckCudaAvailable();
  if (!s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(absl::string_view(op.data(), op.size()),
                                                      ": CUDA requested but ", s.message()));
  }
  return absl::OkStatus();
}

absl::Status CheckDims(std::string_view op, std::initializer_list<int64_t> dims) {
  constexpr int64_t kMax = int64_t{1} << 62;
  int64_t product = 1;
  for (int64_t d : dims) {
    if (d < 0) return InvalidArg(op, absl::StrCat("negative dimension ", d));
    if (d != 0 && product > kMax / d) return InvalidArg(op, "tensor size overflows int64");
    product *= d;
  }
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace fedlora::kernels
