#include "core/thread_budget.h"

#include <algorithm>
#include <thread>

namespace fedlora {

ThreadBudget::ThreadBudget(int cores)
    : cores_(cores > 0 ? cores
                       : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))) {}

void ThreadBudget::Join(ThreadPool* pool) {
  std::lock_guard<std::mutex> lock(mu_);
  if (std::find(members_.begin(), members_.end(), pool) == members_.end()) members_.push_back(pool);
  Rebalance();
}

void ThreadBudget::Leave(ThreadPool* pool) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = std::find(members_.begin(), members_.end(), pool);
  if (it == members_.end()) return;
  members_.erase(it);
  pool->SetWidth(1);
  Rebalance();
}

void ThreadBudget::Rebalance() {
  const int k = static_cast<int>(members_.size());
  if (k == 0) return;
  for (int i = 0; i < k; ++i) members_[i]->SetWidth(cores_ / k + (i < cores_ % k ? 1 : 0));
}

}  // namespace fedlora
