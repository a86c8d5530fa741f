#include "core/progress.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fedlora {
namespace {

using ::testing::ElementsAre;
using ::testing::EndsWith;
using ::testing::StartsWith;

TEST(FormatDuration, Units) {
  EXPECT_EQ(FormatDuration(0), "0s");
  EXPECT_EQ(FormatDuration(44.4), "44s");
  EXPECT_EQ(FormatDuration(59.6), "1m00s");  // rounds to the nearest second first
  EXPECT_EQ(FormatDuration(187), "3m07s");
  EXPECT_EQ(FormatDuration(7500), "2h05m");
  EXPECT_EQ(FormatDuration(-1), "?");
  EXPECT_EQ(FormatDuration(1.0 / 0.0), "?");
}

TEST(FormatProgressLine, KnownTotalWithBar) {
  // 450 of 1000 in 36 s: 12.5 it/s, 550 left -> 44 s.
  EXPECT_EQ(
      FormatProgressLine("train", 450, 1000, 36.0, "loss=0.3120", 20),
      "train [=========>          ]  45.0% 450/1000 12.5 it/s elapsed 36s ETA 44s loss=0.3120");
}

TEST(FormatProgressLine, WithoutBarForLogs) {
  EXPECT_EQ(FormatProgressLine("eval", 1, 4, 8.0, ""),
            "eval  25.0% 1/4 8.00 s/it elapsed 8s ETA 24s");
}

TEST(FormatProgressLine, EdgeCases) {
  // Nothing done yet: no rate, unknown ETA.
  EXPECT_EQ(FormatProgressLine("x", 0, 10, 0.0, "", 4), "x [>   ]   0.0% 0/10 elapsed 0s ETA ?");
  // Complete: full bar, no ETA.
  EXPECT_EQ(FormatProgressLine("x", 10, 10, 5.0, "", 4),
            "x [====] 100.0% 10/10 2.0 it/s elapsed 5s");
  // Overshoot is clamped in the bar and percentage but the count is shown as is.
  EXPECT_EQ(FormatProgressLine("x", 12, 10, 4.0, "", 4),
            "x [====] 100.0% 12/10 3.0 it/s elapsed 4s");
  // Unknown total: a count with its unit, no bar or ETA.
  EXPECT_EQ(FormatProgressLine("dl", 3000, 0, 2.0, "", 20, "MiB"),
            "dl 3000 MiB 1500.0 MiB/s elapsed 2s");
}

TEST(FormatProgressLine, EtaCountsDownThroughALongUnit) {
  // 2 of 10 rounds done at 20 s (10 s a round); the third has run for 5 s: 80 s left less those 5.
  EXPECT_EQ(FormatProgressLine("simulate", 2, 10, 25.0, "", 0, "round", 5.0),
            "simulate  20.0% 2/10 10.00 s/round elapsed 25s ETA 1m15s");
  // A round that overruns its average: never less than the rounds after it need.
  EXPECT_EQ(FormatProgressLine("simulate", 2, 10, 45.0, "", 0, "round", 25.0),
            "simulate  20.0% 2/10 10.00 s/round elapsed 45s ETA 1m10s");
}

class FakeClock {
 public:
  double now = 100.0;
};

TEST(Progress, LogModeThrottlesToInterval) {
  FakeClock clock;
  std::vector<std::string> out;
  ProgressOptions opt;
  opt.is_tty = 0;
  opt.log_interval_s = 10;
  opt.now_s = [&] { return clock.now; };
  opt.emit = [&](std::string_view s) { out.emplace_back(s); };
  {
    Progress p("train", 100, opt);
    for (int i = 1; i <= 100; ++i) {
      clock.now += 0.5;  // 50 s in all: lines at 10, 20, 30, 40, 50 s
      p.Update(i, "loss=1");
    }
    p.Finish();
    p.Finish();  // idempotent
    p.Update(100, "ignored after Finish");
  }  // the destructor does not log again
  ASSERT_EQ(out.size(), 6u);
  EXPECT_EQ(out[0], "train  20.0% 20/100 2.0 it/s elapsed 10s ETA 40s loss=1");
  EXPECT_EQ(out[4], "train 100.0% 100/100 2.0 it/s elapsed 50s loss=1");
  EXPECT_EQ(out[5], "train 100.0% 100/100 2.0 it/s elapsed 50s loss=1 (done)");
}

TEST(Progress, EtaDoesNotClimbWhileAUnitRuns) {
  FakeClock clock;
  std::vector<std::string> out;
  ProgressOptions opt;
  opt.is_tty = 0;
  opt.log_interval_s = 5;
  opt.unit = "round";
  opt.now_s = [&] { return clock.now; };
  opt.emit = [&](std::string_view s) { out.emplace_back(s); };
  Progress p("simulate", 4, opt);
  clock.now += 10;
  p.Update(1);  // one round in 10 s
  for (int i = 0; i < 3; ++i) {
    clock.now += 5;
    p.Update(1);  // the second round still running
  }
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[0], "simulate  25.0% 1/4 10.00 s/round elapsed 10s ETA 30s");
  EXPECT_EQ(out[1], "simulate  25.0% 1/4 10.00 s/round elapsed 15s ETA 25s");
  EXPECT_EQ(out[2], "simulate  25.0% 1/4 10.00 s/round elapsed 20s ETA 20s");
  EXPECT_EQ(out[3],
            "simulate  25.0% 1/4 10.00 s/round elapsed 25s ETA 20s");  // overran: 2 rounds after it
}

TEST(Progress, TerminalModeRedrawsInPlace) {
  FakeClock clock;
  std::vector<std::string> out;
  ProgressOptions opt;
  opt.is_tty = 1;
  opt.bar_width = 4;
  opt.terminal_width = 200;
  clock.now = 0;  // so that 0.05 + 0.05 is exactly the 0.1 s redraw interval
  opt.now_s = [&] { return clock.now; };
  opt.emit = [&](std::string_view s) { out.emplace_back(s); };
  Progress p("x", 4, opt);
  clock.now += 0.05;
  p.Update(1);  // within the 0.1 s redraw interval: not drawn
  clock.now += 0.05;
  p.Update(2);
  clock.now += 1.9;
  p.Update(3);
  p.Update(1);  // an older report from a slower thread does not move the bar back
  p.Finish();
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0], "\rx [==> ]  50.0% 2/4 20.0 it/s elapsed 0s ETA 0s\x1b[K");
  EXPECT_EQ(out[1], "\rx [===>]  75.0% 3/4 1.5 it/s elapsed 2s ETA 1s\x1b[K");
  EXPECT_THAT(out[2], StartsWith("\rx [===>]  75.0% 3/4"));
  EXPECT_THAT(out[2], EndsWith("\x1b[K\n"));
}

TEST(Progress, TerminalLineIsCutToWidth) {
  std::vector<std::string> out;
  ProgressOptions opt;
  opt.is_tty = 1;
  opt.terminal_width = 30;
  opt.now_s = [] { return 0.0; };
  opt.emit = [&](std::string_view s) { out.emplace_back(s); };
  Progress p("a-long-label", 10, opt);
  p.Finish();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].size(), 1 + 29 + 3 + 1);  // '\r', 29 visible columns, ESC[K, '\n'
}

}  // namespace
}  // namespace fedlora
