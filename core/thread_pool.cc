#include "core/thread_pool.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <latch>
#include <string>

namespace fedlora {
namespace {
thread_local bool tls_in_worker = false;
}  // namespace

ThreadPool::ThreadPool(int num_threads) : ThreadPool(num_threads, 0) {}

ThreadPool::ThreadPool(int num_threads, int nice_increment) {
  if (num_threads <= 0)
    num_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  num_threads_ = num_threads;
  width_.store(num_threads, std::memory_order_relaxed);
  nice_increment = std::clamp(nice_increment, 0, 19);
  // The niceness a worker sets is relative to its creator's: a new thread inherits it.
  workers_.reserve(num_threads - 1);
  for (int i = 0; i + 1 < num_threads; ++i) {
    workers_.emplace_back([this, nice_increment] {
      if (nice_increment > 0) {
        errno = 0;
        const int now = getpriority(PRIO_PROCESS, static_cast<id_t>(gettid()));
        // Best effort: a worker that cannot lower itself still works at its creator's priority.
        if (errno == 0)
          (void)setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()),
                            std::min(now + nice_increment, 19));
      }
      WorkerLoop();
    });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::SetWidth(int width) {
  width_.store(std::clamp(width, 1, num_threads_), std::memory_order_relaxed);
}

void ThreadPool::WorkerLoop() {
  tls_in_worker = true;
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stopping and drained
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

void ThreadPool::Submit(std::function<void()> task) {
  if (workers_.empty()) {
    task();
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(task));
  }
  cv_.notify_one();
}

bool ThreadPool::TrySubmit(std::function<void()> task, size_t max_queued) {
  if (workers_.empty()) {
    task();
    return true;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (tasks_.size() >= max_queued) return false;
    tasks_.push_back(std::move(task));
  }
  cv_.notify_one();
  return true;
}

size_t ThreadPool::Queued() {
  std::lock_guard<std::mutex> lock(mu_);
  return tasks_.size();
}

void ThreadPool::ParallelFor(int64_t begin, int64_t end, int64_t grain,
                             const std::function<void(int64_t, int64_t)>& fn) {
  const int64_t n = end - begin;
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t max_chunks = (n + grain - 1) / grain;
  const int64_t chunks = std::min<int64_t>(max_chunks, Width());
  if (chunks <= 1 || workers_.empty() || tls_in_worker) {
    fn(begin, end);
    return;
  }
  // Even split: chunk i covers [begin + i*n/chunks, begin + (i+1)*n/chunks).
  std::latch done(chunks - 1);
  for (int64_t i = 1; i < chunks; ++i) {
    const int64_t b = begin + i * n / chunks, e = begin + (i + 1) * n / chunks;
    Submit([&fn, &done, b, e] {
      fn(b, e);
      done.count_down();
    });
  }
  fn(begin, begin + n / chunks);
  done.wait();
}

ThreadPool& ThreadPool::Default() {
  static ThreadPool* pool = [] {
    int n = 0;
    if (const char* env = std::getenv("FEDLORA_NUM_THREADS")) n = std::atoi(env);
    return new ThreadPool(n);
  }();
  return *pool;
}

}  // namespace fedlora
