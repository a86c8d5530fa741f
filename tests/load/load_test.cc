// 200 clients against one server, every client selected in each of 2 rounds, a 1 s CPU-burn
// evaluation and a 1 MiB adapter (200 MiB of downloads at each round's start): every round must
// commit with all 200 updates counted once, the final adapter must be exact, and no live client
// may be declared dead. No timing is asserted: heartbeats go every 1 s and a client counts as dead
// only after 10 s of silence (the benchmark uses 3 s, the default ratio of three missed
// heartbeats, and measures the latencies; make load), so that a busy shared machine alone cannot
// fail the test. The figures are printed for the log.
#include <cstdio>

#include "gtest/gtest.h"
#include "tests/load/load_harness.h"

namespace fedlora::load {
namespace {

TEST(LoadServerTest, TwoHundredClientsEveryRoundCommitsEveryUpdateOnceNoneDeclaredDead) {
  LoadOptions o;
  o.clients = 200;
  o.rounds = 2;
  o.adapter_kib = 1024;
  o.eval_ms = 1000;
  o.heartbeat_timeout_ms = 10'000;
  o.run_timeout_ms = 150'000;                 // under the CTest TIMEOUT of 180 s
  absl::StatusOr<LoadReport> r = RunLoad(o);  // first thing in the process: it forks the server
  ASSERT_TRUE(r.ok()) << r.status();
  std::printf("%s", FormatReport(*r).c_str());
  EXPECT_TRUE(r->finished);
  EXPECT_EQ(r->rounds_committed, o.rounds);
  for (const RoundFigures& f : r->rounds) {
    EXPECT_EQ(f.updates_in_history, o.clients) << "round " << f.round;
    EXPECT_EQ(f.accepted, o.clients) << "round " << f.round;
  }
  EXPECT_EQ(r->updates_accepted_total, int64_t{o.clients} * o.rounds);
  EXPECT_TRUE(r->adapter_exact);
  EXPECT_EQ(r->declared_dead, 0);
  EXPECT_GE(r->min_connected, o.clients);
  EXPECT_GT(r->admin_samples, 0);
  for (const std::string& p : r->problems) ADD_FAILURE() << p;
}

}  // namespace
}  // namespace fedlora::load
