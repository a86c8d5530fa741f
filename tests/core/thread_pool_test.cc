#include "core/thread_pool.h"

#include <atomic>
#include <numeric>
#include <vector>

#include "gtest/gtest.h"

namespace fedlora {
namespace {

TEST(ThreadPool, ParallelForCoversEveryIndexExactlyOnce) {
  for (int threads : {1, 2, 4, 7}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 5, 100, 1001}) {
      std::vector<std::atomic<int>> hits(n);
      pool.ParallelFor(0, n, 3, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "threads=" << threads << " n=" << n;
    }
  }
}

TEST(ThreadPool, ChunksRespectGrain) {
  ThreadPool pool(4);
  std::atomic<int> chunks{0};
  pool.ParallelFor(0, 10, 8, [&](int64_t b, int64_t e) { chunks.fetch_add(1); });
  EXPECT_EQ(chunks.load(), 2);  // ceil(10 / 8) chunks at most
}

TEST(ThreadPool, NestedParallelForRunsInline) {
  ThreadPool pool(3);
  std::atomic<int64_t> sum{0};
  pool.ParallelFor(0, 6, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      pool.ParallelFor(0, 10, 1, [&](int64_t b2, int64_t e2) {
        for (int64_t j = b2; j < e2; ++j) sum.fetch_add(j);
      });
    }
  });
  EXPECT_EQ(sum.load(), 6 * 45);
}

TEST(ThreadPool, SubmitRunsEveryTask) {
  std::atomic<int> done{0};
  {
    ThreadPool pool(3);
    for (int i = 0; i < 50; ++i) pool.Submit([&] { done.fetch_add(1); });
  }  // destructor drains the queue
  EXPECT_EQ(done.load(), 50);
}

}  // namespace
}  // namespace fedlora
