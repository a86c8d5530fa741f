// A fixed-size thread pool with a blocking ParallelFor, used by the CPU kernels and the server.
//
//   fedlora::ThreadPool pool(4);
//   pool.ParallelFor(0, rows, /*grain=*/16, [&](int64_t begin, int64_t end) { ... });
//
// ParallelFor splits [begin, end) into contiguous chunks of at least `grain` items, runs them on
// the workers and the calling thread, and returns when all are done. Chunk boundaries depend only
// on (begin, end, grain, Width()), so results that depend on the split are reproducible; the CPU
// kernels go further and give the same bits at every width (see kernels/base/context.h).
// Thread-safe: several threads may call Submit/ParallelFor at once. A ParallelFor issued from
// inside a worker runs inline (no nested parallelism, no deadlock).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace fedlora {

class ThreadPool {
 public:
  // num_threads <= 0 means std::thread::hardware_concurrency(). The calling thread also works,
  // so a pool of n threads keeps n - 1 workers.
  explicit ThreadPool(int num_threads = 0);
  // Workers that run `nice_increment` steps of niceness below the thread that made the pool (Linux
  // keeps niceness per thread): bulk work that must yield the cores to latency-bound threads.
  // 0 is the plain pool; the increment is clamped to 0..19.
  ThreadPool(int num_threads, int nice_increment);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int NumThreads() const { return num_threads_; }
  // The most threads one ParallelFor uses, the caller included: 1..NumThreads(), NumThreads()
  // unless set. A pool shared out by a ThreadBudget (core/thread_budget.h) has it set there. May
  // change while another thread runs ParallelFor; a call in progress keeps the width it read.
  int Width() const { return width_.load(std::memory_order_relaxed); }
  void SetWidth(int width);

  // Runs fn(chunk_begin, chunk_end) over [begin, end). Blocks until every chunk has run.
  void ParallelFor(int64_t begin, int64_t end, int64_t grain,
                   const std::function<void(int64_t, int64_t)>& fn);

  // Queues a task; it runs on some worker (or inline when the pool has no workers).
  void Submit(std::function<void()> task);
  // Submit, unless `max_queued` tasks already wait for a worker: then false, and `task` is dropped
  // (a pool without workers runs it inline and returns true). For queues that peers can fill.
  bool TrySubmit(std::function<void()> task, size_t max_queued);
  // Tasks waiting for a worker now.
  size_t Queued();

  // The process-wide pool used by kernels. Sized by FEDLORA_NUM_THREADS, else the core count.
  static ThreadPool& Default();

 private:
  void WorkerLoop();

  int num_threads_;
  std::atomic<int> width_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
};

}  // namespace fedlora
