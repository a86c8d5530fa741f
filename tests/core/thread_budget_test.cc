#include "core/thread_budget.h"

#include <atomic>
#include <vector>

#include "gtest/gtest.h"

namespace fedlora {
namespace {

// How many chunks (each on its own thread) one ParallelFor of `pool` runs now.
int ChunksRun(ThreadPool& pool) {
  std::atomic<int> chunks{0};
  pool.ParallelFor(0, 1000, 1, [&](int64_t, int64_t) { chunks.fetch_add(1); });
  return chunks.load();
}

TEST(ThreadBudget, ALoneMemberGetsEveryCore) {
  ThreadBudget budget(4);
  ThreadPool pool(4);
  pool.SetWidth(1);
  budget.Join(&pool);
  EXPECT_EQ(pool.Width(), 4);
  EXPECT_EQ(ChunksRun(pool), 4);
}

TEST(ThreadBudget, MembersShareTheCoresAndTheRemainderGoesToTheFirst) {
  ThreadBudget budget(5);
  ThreadPool a(5), b(5), c(5);
  budget.Join(&a);
  budget.Join(&b);
  EXPECT_EQ(a.Width(), 3);
  EXPECT_EQ(b.Width(), 2);
  budget.Join(&c);
  EXPECT_EQ(a.Width() + b.Width() + c.Width(), 5);
  EXPECT_EQ(a.Width(), 2);
  EXPECT_EQ(b.Width(), 2);
  EXPECT_EQ(c.Width(), 1);
  EXPECT_EQ(ChunksRun(c), 1);
  // A member that leaves hands its share on: the one left alone gets all five cores.
  budget.Leave(&a);
  EXPECT_EQ(a.Width(), 1);
  EXPECT_EQ(b.Width(), 3);
  EXPECT_EQ(c.Width(), 2);
  budget.Leave(&b);
  EXPECT_EQ(c.Width(), 5);
  EXPECT_EQ(ChunksRun(c), 5);
}

TEST(ThreadBudget, MoreMembersThanCoresGetOneThreadEach) {
  ThreadBudget budget(2);
  std::vector<ThreadPool> pools(3);  // each with a thread per hardware core
  for (ThreadPool& p : pools) budget.Join(&p);
  for (ThreadPool& p : pools) EXPECT_EQ(p.Width(), 1);
}

TEST(ThreadBudget, JoiningTwiceAndLeavingUnknownPoolsChangeNothing) {
  ThreadBudget budget(4);
  ThreadPool a(4), b(4), stranger(4);
  budget.Join(&a);
  budget.Join(&b);
  budget.Join(&a);
  EXPECT_EQ(a.Width(), 2);
  EXPECT_EQ(b.Width(), 2);
  budget.Leave(&stranger);
  EXPECT_EQ(stranger.Width(), 4);
  EXPECT_EQ(a.Width(), 2);
}

TEST(ThreadBudget, WidthNeverExceedsThePoolsThreads) {
  ThreadBudget budget(8);
  ThreadPool small(2);
  budget.Join(&small);
  EXPECT_EQ(small.Width(), 2);
}

}  // namespace
}  // namespace fedlora
