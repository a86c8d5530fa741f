// `fedlora store verify|repair` as a user runs them: exit codes and what they print, on a store
// with one committed round whose adapter gets a flipped byte, and on a store a server holds.
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "compression/update_io.h"
#include "core/file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/blob_store.h"
#include "server/data_dir_lock.h"
#include "server/store.h"
#include "tests/tools/cli_test_util.h"

namespace fedlora {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

using Result = testing::CliResult;

class StoreCli : public testing::CliTest {
 protected:
  void SetUp() override {
    testing::CliTest::SetUp();
    if (HasFatalFailure()) return;
    // One run, one committed round (no downlink codec, no optimizer state), no open round.
    auto store = Store::Open(dir_ + "/fedlora.db");
    ASSERT_TRUE(store.ok()) << store.status();
    auto blobs = BlobStore::Open(dir_);
    ASSERT_TRUE(blobs.ok()) << blobs.status();
    std::vector<UpdateTensor> a = {{"w", {4}, {1, 2, 3, 4}}};
    const std::string initial = *(*blobs)->Put(*AdapterToSafetensors(a));
    a[0].values[0] = 5;
    result_ = *(*blobs)->Put(*AdapterToSafetensors(a));
    result_path_ = (*blobs)->PathFor(result_);
    nlohmann::json meta;
    meta["initial_adapter_sha256"] = initial;
    ASSERT_TRUE((*store)->CreateRun("r", meta.dump()).ok());
    ASSERT_TRUE((*store)->BeginRound("r", 1, initial, 0).ok());
    ASSERT_TRUE((*store)->SetRoundState("r", 1, RoundState::kTraining).ok());
    ASSERT_TRUE((*store)->SetRoundState("r", 1, RoundState::kAggregating).ok());
    ASSERT_TRUE((*store)->CommitRound("r", 1, result_, "{}", {}).ok());
  }
  std::string result_, result_path_;
};

TEST_F(StoreCli, VerifyRepairAndRewindAFlippedByteInTheLatestAdapter) {
  Result r = Run({"store", "verify", "--store", dir_});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("round 1 result adapter " + result_ + ": intact"));

  fs::permissions(result_path_, fs::perms::owner_write, fs::perm_options::add);
  {
    std::fstream f(result_path_, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(10);
    f.put('\x7f');
  }
  r = Run({"store", "verify", "--store", dir_, "--run-id", "r"});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("round 1 result adapter " + result_ + ": corrupt"));
  EXPECT_THAT(r.out, HasSubstr("the server will not start"));
  EXPECT_THAT(r.out, HasSubstr("run r: DAMAGED"));

  r = Run({"store", "repair", "--store", dir_});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("--rewind` rolls it back to round 0"));

  r = Run({"store", "repair", "--store", dir_, "--rewind"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("rewound to round 0; 1 committed rounds after it are marked lost"));

  r = Run({"store", "verify", "--store", dir_});
  EXPECT_EQ(r.exit_code, 0) << r.out
                            << r.err;  // round 1 is lost: nothing damaged is referenced as live
}

TEST_F(StoreCli, AStoreInUseOrAbsentOrABadVerbIsRefused) {
  {
    auto lock = DataDirLock::Acquire(dir_);  // as a running server holds it
    ASSERT_TRUE(lock.ok()) << lock.status();
    Result r = Run({"store", "verify", "--store", dir_});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_THAT(r.err, HasSubstr("is in use"));
  }
  Result r = Run({"store", "verify", "--store", dir_ + "/nothing"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("no store in"));
  EXPECT_FALSE(fs::exists(dir_ + "/nothing"));  // never creates one
  r = Run({"store", "fix", "--store", dir_});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("usage: fedlora store verify|repair"));
}

}  // namespace
}  // namespace fedlora
