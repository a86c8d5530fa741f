#include "core/mapped_file.h"

#include <gtest/gtest.h>

#include <string>

#include "core/file.h"
#include "tests/core/test_util.h"

namespace fedlora {
namespace {

class MappedFileTest : public ::testing::Test {
 protected:
  coretest::TempDir tmp_;
  const std::string& dir_ = tmp_.path();
};

TEST_F(MappedFileTest, MapsTheWholeFileAndMovesOwnership) {
  const std::string path = dir_ + "/f.bin";
  const std::string content("abc\0def", 7);
  ASSERT_TRUE(WriteFileAtomically(path, content).ok());
  absl::StatusOr<MappedFile> file = MappedFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->bytes(), content);
  MappedFile moved = *std::move(file);
  EXPECT_EQ(moved.size(), 7u);
  EXPECT_EQ(moved.bytes(), content);
  EXPECT_EQ(file->data(), nullptr);
  EXPECT_EQ(file->size(), 0u);
}

TEST_F(MappedFileTest, EmptyFileMapsToNoMemory) {
  const std::string path = dir_ + "/empty";
  ASSERT_TRUE(WriteFileAtomically(path, "").ok());
  absl::StatusOr<MappedFile> file = MappedFile::Open(path, MappedFile::Sharing::kShared);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->data(), nullptr);
  EXPECT_TRUE(file->bytes().empty());
}

TEST_F(MappedFileTest, RefusesAMissingFileAndADirectoryNamingThePath) {
  absl::StatusOr<MappedFile> missing = MappedFile::Open(dir_ + "/nope");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find(dir_ + "/nope"), std::string::npos);
  absl::StatusOr<MappedFile> directory = MappedFile::Open(dir_);
  EXPECT_EQ(directory.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(directory.status().message().find("not a regular file"), std::string::npos);
}

}  // namespace
}  // namespace fedlora
