#include "core/file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/core/test_util.h"

namespace fedlora {
namespace {

using ::testing::HasSubstr;

TEST(File, WriteThenReadRoundTripsBinary) {
  coretest::TempDir dir;
  std::string bytes;
  for (int i = 0; i < 300000; ++i)
    bytes.push_back(static_cast<char>(i * 7 + (i >> 8)));  // > one 64 KiB read
  bytes[5] = '\0';
  ASSERT_TRUE(WriteFileAtomically(dir.File("a.bin"), bytes).ok());
  auto read = ReadFileToString(dir.File("a.bin"));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, bytes);
}

TEST(File, EmptyFile) {
  coretest::TempDir dir;
  ASSERT_TRUE(WriteFileAtomically(dir.File("empty"), "").ok());
  auto read = ReadFileToString(dir.File("empty"));
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(*read, "");
}

TEST(File, OverwriteReplacesWholeContentAndLeavesNoTempFiles) {
  coretest::TempDir dir;
  ASSERT_TRUE(WriteFileAtomically(dir.File("f"), std::string(1000, 'x')).ok());
  ASSERT_TRUE(WriteFileAtomically(dir.File("f"), "short").ok());
  EXPECT_EQ(*ReadFileToString(dir.File("f")), "short");
  int entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    ++entries;
    EXPECT_EQ(e.path().filename(), "f");
  }
  EXPECT_EQ(entries, 1);
}

TEST(File, ConcurrentWritersNeverProduceAMix) {
  coretest::TempDir dir;
  const std::string path = dir.File("race");
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i)
        ASSERT_TRUE(WriteFileAtomically(path, std::string(4096, 'a' + t)).ok());
    });
  }
  for (auto& th : threads) th.join();
  const std::string got = *ReadFileToString(path);
  ASSERT_EQ(got.size(), 4096u);
  EXPECT_EQ(got, std::string(4096, got[0]));
}

TEST(File, ReadMissingIsNotFoundNamingPath) {
  coretest::TempDir dir;
  auto r = ReadFileToString(dir.File("nope.json"));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("nope.json"));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("No such file"));
}

TEST(File, ReadDirectoryIsFailedPrecondition) {
  coretest::TempDir dir;
  EXPECT_EQ(ReadFileToString(dir.path()).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(File, WriteIntoMissingDirectoryIsNotFound) {
  coretest::TempDir dir;
  auto s = WriteFileAtomically(dir.File("no/such/dir/x"), "data");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(s.message()), HasSubstr("no/such/dir/x"));
}

TEST(File, PermissionDenied) {
  if (::geteuid() == 0) GTEST_SKIP() << "root ignores file permissions";
  coretest::TempDir dir;
  ASSERT_EQ(::chmod(dir.path().c_str(), 0500), 0);  // read + search, no write
  auto s = WriteFileAtomically(dir.File("x"), "data");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  ASSERT_EQ(::chmod(dir.path().c_str(), 0700), 0);
  ASSERT_TRUE(WriteFileAtomically(dir.File("secret"), "data").ok());
  ASSERT_EQ(::chmod(dir.File("secret").c_str(), 0000), 0);
  EXPECT_EQ(ReadFileToString(dir.File("secret")).status().code(),
            absl::StatusCode::kPermissionDenied);
}

TEST(File, WriteOntoDirectoryFailsAndLeavesItAlone) {
  coretest::TempDir dir;
  std::filesystem::create_directory(dir.File("sub"));
  auto s = WriteFileAtomically(dir.File("sub"), "data");
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(std::filesystem::is_directory(dir.File("sub")));
  // The temporary file was cleaned up.
  int entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) (void)e, ++entries;
  EXPECT_EQ(entries, 1);
}

TEST(File, RelativePathWithoutDirectory) {
  coretest::TempDir dir;
  const auto old = std::filesystem::current_path();
  std::filesystem::current_path(dir.path());
  EXPECT_TRUE(WriteFileAtomically("rel.txt", "hi").ok());
  EXPECT_EQ(*ReadFileToString("rel.txt"), "hi");
  std::filesystem::current_path(old);
}

TEST(File, ErrnoMapsToMostSpecificCode) {
  // Covers the permission codes even where the tests run as root (PermissionDenied skips there).
  EXPECT_EQ(ErrnoToStatus(EACCES, "open", "/p").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(ErrnoToStatus(EROFS, "open", "/p").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(ErrnoToStatus(ENOENT, "open", "/p").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ErrnoToStatus(ENOSPC, "write", "/p").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ErrnoToStatus(EIO, "read", "/p").code(), absl::StatusCode::kInternal);
  EXPECT_EQ(std::string(ErrnoToStatus(EIO, "read", "/data/x.bin").message()),
            "read '/data/x.bin': Input/output error");
}

TEST(File, EmptyPathIsInvalidArgument) {
  EXPECT_EQ(WriteFileAtomically("", "x").code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fedlora
