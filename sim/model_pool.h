// The simulator's model pool: a fixed set of LoraModels (workload/lora_model.h) that virtual
// clients (and the evaluator) borrow one at a time. Each model computes on a thread pool of its
// own, with a thread per core; while it is lent, its pool is a member of `budget`, which shares the
// cores among the models lent at the moment (core/thread_budget.h).
#pragma once

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "core/thread_budget.h"
#include "core/thread_pool.h"
#include "workload/lora_model.h"

namespace fedlora::sim {

class ModelPool {
 public:
  explicit ModelPool(ThreadBudget& budget) : budget_(budget) {}
  void Add(std::unique_ptr<LoraModel> m) {
    auto threads = std::make_unique<ThreadPool>(budget_.cores());
    threads->SetWidth(1);
    m->SetThreadPool(threads.get());
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(m.get());
    threads_[m.get()] = std::move(threads);
    all_.push_back(std::move(m));
  }
  LoraModel* Acquire() {
    LoraModel* m = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return !free_.empty(); });
      m = free_.back();
      free_.pop_back();
    }
    budget_.Join(threads_.at(m).get());
    return m;
  }
  // Every model at once (waits until none is lent), so that nothing else computes meanwhile.
  std::vector<LoraModel*> AcquireAll() {
    std::vector<LoraModel*> out;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return free_.size() == all_.size(); });
      out.swap(free_);
    }
    for (LoraModel* m : out) budget_.Join(threads_.at(m).get());
    return out;
  }
  void ReleaseAll(std::vector<LoraModel*> models) {
    for (LoraModel* m : models) budget_.Leave(threads_.at(m).get());
    {
      std::lock_guard<std::mutex> lock(mu_);
      free_.insert(free_.end(), models.begin(), models.end());
    }
    cv_.notify_all();
  }
  void Release(LoraModel* m) {
    budget_.Leave(threads_.at(m).get());
    {
      std::lock_guard<std::mutex> lock(mu_);
      free_.push_back(m);
    }
    cv_.notify_one();
  }

 private:
  ThreadBudget& budget_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<LoraModel*> free_;
  std::vector<std::unique_ptr<LoraModel>> all_;
  // Written by Add only, before any model is lent.
  std::map<const LoraModel*, std::unique_ptr<ThreadPool>> threads_;
};

// One model borrowed for a scope.
class Lease {
 public:
  explicit Lease(ModelPool& pool) : pool_(pool), model_(pool.Acquire()) {}
  ~Lease() { pool_.Release(model_); }
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  LoraModel& operator*() const { return *model_; }
  LoraModel* operator->() const { return model_; }

 private:
  ModelPool& pool_;
  LoraModel* model_;
};

}  // namespace fedlora::sim
