#include "kernels/base/context.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "kernels/base/device.h"
#include "kernels/base/kernel_util.h"

namespace fedlora::kernels {
namespace {

std::mutex g_pool_mu;
std::atomic<ThreadPool*> g_pool{nullptr};

// Pools made by SetDefaultPoolThreads; kept alive so that pointers handed out earlier stay valid.
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

void SetDefaultPoolThreads(int n) {
  if (n <= 0) n = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::lock_guard<std::mutex> lock(g_pool_mu);
  auto pool = std::make_unique<ThreadPool>(n);
  g_pool.store(pool.get(), std::memory_order_release);
  OwnedPools().push_back(std::move(pool));
}

int NumThreads() { return DefaultPool().NumThreads(); }

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
