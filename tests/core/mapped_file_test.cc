#include "core/mapped_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
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

TEST(MappedBufferTest, IsZeroFilledWritableAndMoves) {
  absl::StatusOr<MappedBuffer> buffer = MappedBuffer::Create(3 * 4096 + 5);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  EXPECT_EQ(buffer->view(), std::string(3 * 4096 + 5, '\0'));
  buffer->data()[0] = 'x';
  buffer->data()[3 * 4096 + 4] = 'y';
  MappedBuffer moved = *std::move(buffer);
  EXPECT_EQ(buffer->data(), nullptr);
  EXPECT_EQ(moved.size(), 3u * 4096 + 5);
  EXPECT_EQ(moved.view().front(), 'x');
  EXPECT_EQ(moved.view().back(), 'y');
  absl::StatusOr<MappedBuffer> empty = MappedBuffer::Create(0);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->data(), nullptr);
  EXPECT_TRUE(empty->view().empty());
}

// Dropped pages are handed back: anonymous memory reads zero again; only whole pages go, and
// *dropped advances to the last whole page, never back.
TEST(MappedBufferTest, DropPagesBeforeReleasesWholeConsumedPagesOnly) {
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  absl::StatusOr<MappedBuffer> buffer = MappedBuffer::Create(3 * page);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  std::fill(buffer->data(), buffer->data() + 3 * page, 'a');
  uint64_t dropped = 0;
  DropPagesBefore(buffer->data(), page + page / 2, &dropped);  // one and a half pages read
  EXPECT_EQ(dropped, page);
  EXPECT_EQ(buffer->view()[0], '\0');
  EXPECT_EQ(buffer->view()[page - 1], '\0');
  EXPECT_EQ(buffer->view()[page], 'a');  // the half-read page stays
  DropPagesBefore(buffer->data(), page / 2, &dropped);
  EXPECT_EQ(dropped, page);
  DropPagesBefore(buffer->data(), 3 * page, &dropped);
  EXPECT_EQ(dropped, 3 * page);
  EXPECT_EQ(buffer->view(), std::string(3 * page, '\0'));
}

}  // namespace
}  // namespace fedlora
