#include "core/thread_pool.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <mutex>
#include <numeric>
#include <thread>
#include <utility>
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
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(hits[i].load(), 1) << "threads=" << threads << " n=" << n;
    }
  }
}

TEST(ThreadPool, WidthBoundsTheChunksOfParallelFor) {
  ThreadPool pool(4);
  EXPECT_EQ(pool.Width(), 4);
  for (const auto& [set, want] : std::vector<std::pair<int, int>>{{2, 2}, {0, 1}, {9, 4}, {3, 3}}) {
    pool.SetWidth(set);
    EXPECT_EQ(pool.Width(), want);
    std::mutex mu;
    std::vector<std::pair<int64_t, int64_t>> chunks;
    pool.ParallelFor(0, 12, 1, [&](int64_t b, int64_t e) {
      std::lock_guard<std::mutex> lock(mu);
      chunks.emplace_back(b, e);
    });
    std::sort(chunks.begin(), chunks.end());
    ASSERT_EQ(static_cast<int>(chunks.size()), want) << "width " << set;
    for (int i = 0; i < want; ++i)
      EXPECT_EQ(chunks[i], (std::pair<int64_t, int64_t>(i * 12 / want, (i + 1) * 12 / want)));
  }
}

TEST(ThreadPool, NiceWorkersRunBelowTheirCreator) {
  errno = 0;
  const int mine = getpriority(PRIO_PROCESS, static_cast<id_t>(gettid()));
  ASSERT_EQ(errno, 0);
  for (const auto& [increment, want] : std::vector<std::pair<int, int>>{
           {0, mine}, {5, std::min(mine + 5, 19)}, {40, 19}, {-3, mine}}) {
    ThreadPool pool(3, increment);
    std::mutex mu;
    std::vector<int> seen;
    std::atomic<int> left{8};
    for (int i = 0; i < 8; ++i) {
      pool.Submit([&] {
        const int p = getpriority(PRIO_PROCESS, static_cast<id_t>(gettid()));
        {
          std::lock_guard<std::mutex> lock(mu);
          seen.push_back(p);
        }
        left.fetch_sub(1);
      });
    }
    while (left.load() > 0) std::this_thread::yield();
    for (int p : seen) EXPECT_EQ(p, want) << "increment " << increment;
  }
  EXPECT_EQ(getpriority(PRIO_PROCESS, static_cast<id_t>(gettid())),
            mine);  // the creator keeps its own
}

// A queue peers can fill holds at most max_queued waiting tasks: TrySubmit refuses the next one
// (the server answers that call RESOURCE_EXHAUSTED) and takes tasks again once the queue drains.
TEST(ThreadPool, TrySubmitRefusesPastTheQueueBound) {
  ThreadPool pool(2);  // one worker
  std::mutex gate;
  gate.lock();
  std::atomic<int> ran{0};
  std::atomic<bool> started{false};
  ASSERT_TRUE(pool.TrySubmit(
      [&] {
        started = true;
        std::lock_guard<std::mutex> hold(gate);  // the worker is busy until the gate opens
        ++ran;
      },
      3));
  while (!started.load()) std::this_thread::yield();
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(pool.TrySubmit([&] { ++ran; }, 3)) << i;
  EXPECT_EQ(pool.Queued(), 3u);
  EXPECT_FALSE(pool.TrySubmit([&] { ++ran; }, 3));
  gate.unlock();
  while (ran.load() < 4) std::this_thread::yield();
  EXPECT_EQ(pool.Queued(), 0u);
  EXPECT_TRUE(pool.TrySubmit([&] { ++ran; }, 3));
  while (ran.load() < 5) std::this_thread::yield();
  EXPECT_EQ(ran.load(), 5);
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

namespace fedlora {
namespace {

// Edge cases of the ParallelFor contract in thread_pool.h.
TEST(ThreadPoolEdges, EmptyAndReversedRangesDoNothing) {
  ThreadPool pool(4);
  int calls = 0;
  pool.ParallelFor(5, 5, 1, [&](int64_t, int64_t) { ++calls; });
  pool.ParallelFor(9, 2, 1, [&](int64_t, int64_t) { ++calls; });
  EXPECT_EQ(calls, 0);
}

TEST(ThreadPoolEdges, NonZeroBeginAndNonPositiveGrain) {
  ThreadPool pool(3);
  for (int64_t grain : {0, -5}) {  // treated as 1
    std::vector<std::atomic<int>> hits(40);
    pool.ParallelFor(-20, 20, grain, [&](int64_t b, int64_t e) {
      EXPECT_LE(-20, b);
      EXPECT_LE(e, 20);
      for (int64_t i = b; i < e; ++i) hits[i + 20].fetch_add(1);
    });
    for (auto& h : hits) EXPECT_EQ(h.load(), 1);
  }
}

TEST(ThreadPoolEdges, ChunkBoundariesAreDeterministic) {
  ThreadPool pool(4);
  auto chunks = [&] {
    std::mutex mu;
    std::vector<std::pair<int64_t, int64_t>> out;
    pool.ParallelFor(3, 1003, 10, [&](int64_t b, int64_t e) {
      std::lock_guard<std::mutex> lock(mu);
      out.emplace_back(b, e);
    });
    std::sort(out.begin(), out.end());
    return out;
  };
  const auto first = chunks();
  // min(ceil(1000 / 10), 4 threads) = 4 even chunks of 250.
  ASSERT_EQ(first.size(), 4u);
  EXPECT_EQ(first[0], std::make_pair(int64_t{3}, int64_t{253}));
  EXPECT_EQ(first[3], std::make_pair(int64_t{753}, int64_t{1003}));
  for (int i = 0; i < 20; ++i) EXPECT_EQ(chunks(), first);
}

TEST(ThreadPoolEdges, SingleThreadPoolRunsInlineOnCaller) {
  ThreadPool pool(1);
  EXPECT_EQ(pool.NumThreads(), 1);
  const auto caller = std::this_thread::get_id();
  bool inline_for = false, inline_submit = false;
  pool.ParallelFor(0, 100, 1, [&](int64_t b, int64_t e) {
    inline_for = std::this_thread::get_id() == caller && b == 0 && e == 100;
  });
  pool.Submit([&] { inline_submit = std::this_thread::get_id() == caller; });
  EXPECT_TRUE(inline_for);
  EXPECT_TRUE(inline_submit);
}

TEST(ThreadPoolEdges, DefaultSizeIsAtLeastOne) {
  ThreadPool pool(0);
  EXPECT_GE(pool.NumThreads(), 1);
  ThreadPool negative(-3);
  EXPECT_GE(negative.NumThreads(), 1);
  EXPECT_EQ(&ThreadPool::Default(), &ThreadPool::Default());
}

TEST(ThreadPoolEdges, ConcurrentParallelForCallers) {
  ThreadPool pool(4);
  std::atomic<int64_t> total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&] {
      for (int rep = 0; rep < 50; ++rep) {
        pool.ParallelFor(0, 1000, 7, [&](int64_t b, int64_t e) { total.fetch_add(e - b); });
      }
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(total.load(), 4 * 50 * 1000);
}

}  // namespace
}  // namespace fedlora
