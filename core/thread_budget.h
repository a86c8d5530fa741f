// Shares a fixed number of cores among the thread pools that are busy at the moment, so that k
// concurrent jobs (the simulator's training clients) keep every core busy without oversubscribing
// them: each member pool gets width (ThreadPool::SetWidth) cores / k, the first cores % k members
// in order of joining one more, and at least 1.
//
//   ThreadBudget budget(/*cores=*/4);
//   ThreadPool a(4), b(4);  // each pool has threads for all the cores
//   budget.Join(&a);        // a: width 4
//   budget.Join(&b);        // a: 2, b: 2
//   budget.Leave(&a);       // b: 4; a: 1
//
// Widths change when members join and leave, also while a member's pool is running (its next
// ParallelFor sees the new width). Thread-safe.
#pragma once

#include <mutex>
#include <vector>

#include "core/thread_pool.h"

namespace fedlora {

class ThreadBudget {
 public:
  // cores <= 0: std::thread::hardware_concurrency().
  explicit ThreadBudget(int cores);
  ThreadBudget(const ThreadBudget&) = delete;
  ThreadBudget& operator=(const ThreadBudget&) = delete;

  int cores() const { return cores_; }
  // Makes `pool` a member (a pool already in is left as it is) and rebalances the widths.
  void Join(ThreadPool* pool);
  // Removes `pool` (width back to 1) and hands its share to the remaining members.
  void Leave(ThreadPool* pool);

 private:
  void Rebalance();  // mu_ held

  const int cores_;
  std::mutex mu_;
  std::vector<ThreadPool*> members_;  // in order of joining
};

}  // namespace fedlora
