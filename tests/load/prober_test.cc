// The prober's plumbing without a server: its table is shared across fork(), and its results file
// reads back as written (and a cut-short file is refused).
#include "tests/load/prober.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace fedlora::load {
namespace {

TEST(ProbeTableTest, PublishedInTheChildIsReadInTheParent) {
  ProbeTable* table = ProbeTable::Create(3);
  ASSERT_NE(table, nullptr);
  EXPECT_EQ(table->slots(), 3);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const bool ok = table->Publish(2, "session-2", "r5-task", 5);
    table->MarkDone(0);
    table->Stop();
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  const ProbeTable::View two = table->Read(2);
  EXPECT_EQ(two.session, "session-2");
  EXPECT_EQ(two.task_id, "r5-task");
  EXPECT_EQ(two.task_round, 5u);
  EXPECT_FALSE(two.done);
  EXPECT_TRUE(table->Read(0).done);
  EXPECT_TRUE(table->Read(1).session.empty());
  EXPECT_TRUE(table->stopped());
  // Clearing the task is published too; fields longer than the table holds are refused.
  ASSERT_TRUE(table->Publish(2, "session-2", "", 5));
  EXPECT_TRUE(table->Read(2).task_id.empty());
  EXPECT_FALSE(table->Publish(1, std::string(ProbeTable::kMaxField + 1, 's'), "", 0));
  EXPECT_FALSE(table->Publish(3, "s", "", 0));  // no such slot
}

TEST(ProbeResultsTest, RoundTripAndCutShort) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("fedlora_probe_" + std::to_string(getpid()) + ".bin"))
                               .string();
  std::vector<ProbeResult> in(2);
  in[0].samples = {{kProbeHeartbeat, 10.5, 2.25, true, 0}, {kBaseline, 11.0, 0.5, false, 14}};
  in[0].unauthenticated = 1;
  in[1].cancels = {{3, "r3-abc"}};
  ASSERT_TRUE(WriteProbeResults(path, in));
  absl::StatusOr<std::vector<ProbeResult>> out = ReadProbeResults(path, 2);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), 2u);
  ASSERT_EQ((*out)[0].samples.size(), 2u);
  EXPECT_EQ((*out)[0].samples[1].rpc, kBaseline);
  EXPECT_DOUBLE_EQ((*out)[0].samples[0].dur_ms, 2.25);
  EXPECT_EQ((*out)[0].samples[1].code, 14);
  EXPECT_EQ((*out)[0].unauthenticated, 1);
  ASSERT_EQ((*out)[1].cancels.size(), 1u);
  EXPECT_EQ((*out)[1].cancels[0].second, "r3-abc");
  EXPECT_EQ((*out)[1].cancels[0].first, 3u);
  // More slots than written, or a truncated file: refused.
  EXPECT_EQ(ReadProbeResults(path, 3).status().code(), absl::StatusCode::kDataLoss);
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 3);
  EXPECT_EQ(ReadProbeResults(path, 2).status().code(), absl::StatusCode::kDataLoss);
  std::filesystem::remove(path);
  EXPECT_EQ(ReadProbeResults(path, 2).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace fedlora::load
