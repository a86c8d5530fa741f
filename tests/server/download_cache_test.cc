// The download cache: a blob verified and chunk-hashed once, shared by every download of it.
#include "server/download_cache.h"

#include <filesystem>
#include <fstream>

#include "core/sha256.h"
#include "gtest/gtest.h"
#include "tests/server/federation_test_util.h"

namespace fedlora {
namespace {

std::string Bytes(size_t n, char seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(seed + i * 31);
  return s;
}

TEST(DownloadCacheTest, ChunksAndTheirHashesMatchTheBlob) {
  testing::TempDir dir;
  auto blobs = BlobStore::Open(dir.path());
  ASSERT_TRUE(blobs.ok()) << blobs.status();
  const std::string bytes = Bytes(2500, 'a');
  auto hash = (*blobs)->Put(bytes);
  ASSERT_TRUE(hash.ok());
  DownloadCache cache(blobs->get(), 2);
  auto a = cache.Get(*hash, 1024);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ((*a)->chunk_sha256.size(), 3u);  // 1024 + 1024 + 452
  for (size_t i = 0; i < 3; ++i) {
    const std::string expected = bytes.substr(i * 1024, 1024);
    EXPECT_EQ((*a)->Chunk(i), expected) << i;
    EXPECT_EQ((*a)->chunk_sha256[i], Sha256Hex(expected)) << i;
  }
  // The second download of the blob gets the same index; another chunk size gets its own.
  auto again = cache.Get(*hash, 1024);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->get(), a->get());
  auto other = cache.Get(*hash, 1000);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ((*other)->chunk_sha256.size(), 3u);
  EXPECT_NE(other->get(), a->get());
}

TEST(DownloadCacheTest, EvictedEntriesStayValidForTheirDownloads) {
  testing::TempDir dir;
  auto blobs = BlobStore::Open(dir.path());
  ASSERT_TRUE(blobs.ok());
  auto h1 = (*blobs)->Put(Bytes(3000, 'x'));
  auto h2 = (*blobs)->Put(Bytes(3000, 'y'));
  ASSERT_TRUE(h1.ok() && h2.ok());
  DownloadCache cache(blobs->get(), 1);
  auto first = cache.Get(*h1, 1024);
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(cache.Get(*h2, 1024).ok());  // evicts the first from the cache
  EXPECT_EQ((*first)->Chunk(0), Bytes(3000, 'x').substr(0, 1024));
  auto reindexed = cache.Get(*h1, 1024);
  ASSERT_TRUE(reindexed.ok());
  EXPECT_NE(reindexed->get(), first->get());
}

TEST(DownloadCacheTest, ACorruptOrMissingBlobIsNotServed) {
  testing::TempDir dir;
  auto blobs = BlobStore::Open(dir.path());
  ASSERT_TRUE(blobs.ok());
  auto hash = (*blobs)->Put(Bytes(2000, 'c'));
  ASSERT_TRUE(hash.ok());
  const std::filesystem::path path =
      std::filesystem::path(dir.path()) / "blobs" / hash->substr(0, 2) / hash->substr(2);
  std::filesystem::permissions(path, std::filesystem::perms::owner_write,
                               std::filesystem::perm_options::add);
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(10);
    f.put('!');
  }
  DownloadCache cache(blobs->get(), 2);
  auto a = cache.Get(*hash, 1024);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kDataLoss) << a.status();
  EXPECT_EQ(cache.Get(std::string(64, 'a'), 1024).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(cache.Get(*hash, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fedlora
