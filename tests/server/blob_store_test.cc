#include "server/blob_store.h"

#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <random>
#include <thread>

#include "core/file.h"
#include "core/sha256.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fedlora {
namespace {

using ::testing::HasSubstr;

// SHA-256("hello"), from `printf hello | sha256sum`.
constexpr char kHelloHash[] = "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824";

class BlobStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "blob_store_test.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    auto s = BlobStore::Open(dir_ + "/store");
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = *std::move(s);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  size_t CountFiles(const std::string& sub) const {
    size_t n = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir_ + "/store/" + sub))
      n += e.is_regular_file();
    return n;
  }

  std::string dir_;
  std::unique_ptr<BlobStore> store_;
};

TEST_F(BlobStoreTest, PutGetIsContentAddressedAndDeduplicated) {
  auto hash = store_->Put("hello");
  ASSERT_TRUE(hash.ok()) << hash.status();
  EXPECT_EQ(*hash, kHelloHash);
  const std::string path =
      dir_ + "/store/blobs/2c/f24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824";
  EXPECT_EQ(store_->PathFor(*hash), path);
  EXPECT_EQ(ReadFileToString(path).value(), "hello");
  EXPECT_EQ(store_->Get(*hash).value(), "hello");
  EXPECT_TRUE(store_->Exists(*hash).value());
  EXPECT_EQ(store_->Size(*hash).value(), 5);
  EXPECT_EQ(store_->Put("hello").value(), kHelloHash);  // dedup: same name, no error
  EXPECT_EQ(store_->List().value(), std::vector<std::string>{kHelloHash});
  EXPECT_EQ(CountFiles("tmp"), 0u);  // no temp file left behind

  // The empty blob is a blob too.
  auto empty = store_->Put("");
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(*empty, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(store_->Get(*empty).value(), "");

  // Reopening the directory finds the same blobs.
  auto again = BlobStore::Open(dir_ + "/store");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)->Get(kHelloHash).value(), "hello");
}

TEST_F(BlobStoreTest, MapCommittedShowsTheCommittedBytesWithoutACopy) {
  auto w = store_->OpenPartial("up-1");
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE((*w)->Append("hel").ok());
  (*w)->StartWriteback(3);  // best effort; must not disturb the content or the running hash
  ASSERT_TRUE((*w)->Append("lo").ok());
  (*w)->StartWriteback(2);
  auto hash = (*w)->Commit(kHelloHash);
  ASSERT_TRUE(hash.ok()) << hash.status();
  auto mapped = store_->MapCommitted(*hash);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  EXPECT_EQ((*mapped)->bytes(), "hello");

  // The empty blob maps to an empty view.
  auto empty = store_->Put("");
  ASSERT_TRUE(empty.ok());
  auto mapped_empty = store_->MapCommitted(*empty);
  ASSERT_TRUE(mapped_empty.ok()) << mapped_empty.status();
  EXPECT_TRUE((*mapped_empty)->bytes().empty());

  // SHA-256("abc") is a valid name that was never stored; "nope" is not a name at all.
  EXPECT_TRUE(absl::IsNotFound(
      store_->MapCommitted("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
          .status()));
  EXPECT_TRUE(absl::IsInvalidArgument(store_->MapCommitted("nope").status()));
}

TEST_F(BlobStoreTest, OpenCreatesEveryShardDirectory) {
  // So that committing a blob never has to create (and fsync) a shard on the upload path.
  size_t shards = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir_ + "/store/blobs"))
    shards += e.is_directory();
  EXPECT_EQ(shards, 256u);
  EXPECT_TRUE(std::filesystem::is_directory(dir_ + "/store/blobs/00"));
  EXPECT_TRUE(std::filesystem::is_directory(dir_ + "/store/blobs/ff"));
}

TEST_F(BlobStoreTest, MissingAndMalformedHashes) {
  const std::string absent(64, 'a');
  EXPECT_EQ(store_->Get(absent).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->OpenReader(absent).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->Size(absent).status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(store_->Exists(absent).value());
  for (const std::string& bad : {std::string("abc"), std::string(64, 'A'),
                                 std::string(63, 'a') + "/", std::string("../../etc/passwd")}) {
    EXPECT_EQ(store_->Get(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(store_->Exists(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_FALSE(IsValidBlobHash(std::string(64, 'g')));
  EXPECT_TRUE(IsValidBlobHash(kHelloHash));
}

TEST_F(BlobStoreTest, StreamingWriterVerifiesTheExpectedHash) {
  auto w = store_->NewWriter();
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->Append("hel").ok());
  ASSERT_TRUE((*w)->Append("lo").ok());
  EXPECT_EQ((*w)->size(), 5);
  auto hash = (*w)->Commit(kHelloHash);
  ASSERT_TRUE(hash.ok()) << hash.status();
  EXPECT_EQ(*hash, kHelloHash);
  EXPECT_EQ((*w)->Append("x").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*w)->Commit("").status().code(), absl::StatusCode::kFailedPrecondition);

  // Wrong content for the promised hash: DataLoss naming both, nothing stored, temp removed.
  auto bad = store_->NewWriter();
  ASSERT_TRUE(bad.ok());
  ASSERT_TRUE((*bad)->Append("hellO").ok());
  auto s = (*bad)->Commit(kHelloHash).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(kHelloHash));
  EXPECT_THAT(std::string(s.message()), HasSubstr(Sha256Hex("hellO")));
  EXPECT_FALSE(store_->Exists(Sha256Hex("hellO")).value());
  EXPECT_EQ(CountFiles("tmp"), 0u);

  auto malformed = store_->NewWriter();
  ASSERT_TRUE((*malformed)->Append("x").ok());
  EXPECT_EQ((*malformed)->Commit("nothex").status().code(), absl::StatusCode::kInvalidArgument);

  // A writer dropped without Commit leaves nothing behind.
  {
    auto dropped = store_->NewWriter();
    ASSERT_TRUE((*dropped)->Append("abandoned").ok());
  }
  EXPECT_EQ(CountFiles("tmp"), 0u);
  EXPECT_EQ(store_->List().value().size(), 1u);
}

TEST_F(BlobStoreTest, PartialUploadResumesAcrossWritersAndDropsUnrecordedTail) {
  {
    auto w = store_->OpenPartial("upload-1");
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ((*w)->size(), 0);
    ASSERT_TRUE((*w)->Append("abc").ok());
    ASSERT_TRUE((*w)->Sync().ok());  // the store would now record bytes = 3
  }
  {
    // "Crash" after writing more bytes that were never recorded.
    auto w = store_->OpenPartial("upload-1");
    ASSERT_TRUE(w.ok());
    EXPECT_EQ((*w)->size(), 3);
    ASSERT_TRUE((*w)->Append("XYZ").ok());
  }
  auto w = store_->OpenPartial("upload-1");
  ASSERT_TRUE(w.ok());
  EXPECT_EQ((*w)->size(), 6);
  EXPECT_EQ((*w)->TruncateTo(7).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE((*w)->TruncateTo(3).ok());
  ASSERT_TRUE((*w)->Append("def").ok());
  auto hash = (*w)->Commit(Sha256Hex("abcdef"));
  ASSERT_TRUE(hash.ok()) << hash.status();
  EXPECT_EQ(store_->Get(*hash).value(), "abcdef");
  EXPECT_EQ(CountFiles("partial"), 0u);  // moved into blobs/

  // Discarding is idempotent; bad ids are refused before touching the file system.
  ASSERT_TRUE(store_->OpenPartial("upload-2").ok());
  EXPECT_EQ(CountFiles("partial"), 1u);
  EXPECT_TRUE(store_->DiscardPartial("upload-2").ok());
  EXPECT_TRUE(store_->DiscardPartial("upload-2").ok());
  EXPECT_EQ(CountFiles("partial"), 0u);
  for (const char* bad : {"", "../escape", ".hidden", "a/b", "sp ace"}) {
    EXPECT_EQ(store_->OpenPartial(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST_F(BlobStoreTest, HashNextChecksEachChunkAndFeedsTheBlobDigestAppendUses) {
  std::string blob;
  for (int i = 0; i < 3 * 128 + 5; ++i) blob += static_cast<char>(i * 37 + 11);
  {
    auto w = store_->OpenPartial("hashed");
    ASSERT_TRUE(w.ok()) << w.status();
    for (size_t off = 0; off < blob.size(); off += 128) {
      const std::string_view chunk = std::string_view(blob).substr(off, 128);
      const BlobWriter::HashedBytes h = (*w)->HashNext(chunk);
      EXPECT_EQ(h.own(), Sha256Digest(chunk)) << off;
      ASSERT_TRUE((*w)->Append(chunk, h).ok()) << off;
    }
    // Commit checks the running digest Append took over from HashNext against the whole blob.
    auto hash = (*w)->Commit(Sha256Hex(blob));
    ASSERT_TRUE(hash.ok()) << hash.status();
    EXPECT_EQ(store_->Get(*hash).value(), blob);
  }

  auto w = store_->OpenPartial("stale");
  ASSERT_TRUE(w.ok());
  const BlobWriter::HashedBytes abc = (*w)->HashNext("abc");
  ASSERT_TRUE((*w)->Append("abc", abc).ok());
  // Hashed for another position, or for another length: refused, nothing written.
  EXPECT_EQ((*w)->Append("def", abc).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*w)->Append("de", (*w)->HashNext("def")).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*w)->size(), 3);
  ASSERT_TRUE((*w)->Append("d").ok());  // the plain Append and HashNext mix
  ASSERT_TRUE((*w)->Append("ef", (*w)->HashNext("ef")).ok());
  ASSERT_TRUE((*w)->Sync().ok());
  w->reset();

  // A resumed writer holds no running digest: HashNext still gives the chunk's own, and Commit
  // hashes the file.
  auto resumed = store_->OpenPartial("stale");
  ASSERT_TRUE(resumed.ok());
  ASSERT_EQ((*resumed)->size(), 6);
  const BlobWriter::HashedBytes g = (*resumed)->HashNext("ghi");
  EXPECT_EQ(g.own(), Sha256Digest("ghi"));
  ASSERT_TRUE((*resumed)->Append("ghi", g).ok());
  auto hash = (*resumed)->Commit(Sha256Hex("abcdefghi"));
  ASSERT_TRUE(hash.ok()) << hash.status();
  EXPECT_EQ(store_->Get(*hash).value(), "abcdefghi");
}

TEST_F(BlobStoreTest, SyncBesideRunsOnAnotherThreadWhileTheOwnerAppends) {
  // The upload stream's pattern: every few chunks a checkpoint fsyncs on a second thread while the
  // owner keeps appending; each byte appended before a checkpoint started is in the file when it
  // returns, and the running digest (Append's alone) still covers everything at Commit.
  auto w = store_->OpenPartial("upload-beside");
  ASSERT_TRUE(w.ok()) << w.status();
  BlobWriter& writer = **w;
  std::string all;
  std::thread checkpoint;
  absl::Status checkpoint_status;
  int64_t checkpoint_size = 0;
  for (int i = 0; i < 64; ++i) {
    const std::string chunk(4096 + i, static_cast<char>('a' + i % 26));
    EXPECT_TRUE(writer.Append(chunk).ok());  // not ASSERT: a checkpoint thread may be running
    all += chunk;
    if (i % 8 == 7) {
      if (checkpoint.joinable()) {  // one at a time, as the contract asks
        checkpoint.join();
        ASSERT_TRUE(checkpoint_status.ok()) << checkpoint_status;
        EXPECT_GE(
            static_cast<int64_t>(std::filesystem::file_size(dir_ + "/store/partial/upload-beside")),
            checkpoint_size);
      }
      checkpoint_size = writer.size();
      checkpoint =
          std::thread([&writer, &checkpoint_status] { checkpoint_status = writer.SyncBeside(); });
    }
  }
  checkpoint.join();  // the owner waits before anything but Append
  ASSERT_TRUE(checkpoint_status.ok()) << checkpoint_status;
  ASSERT_TRUE(writer.Sync().ok());
  auto hash = writer.Commit(Sha256Hex(all));
  ASSERT_TRUE(hash.ok()) << hash.status();
  EXPECT_EQ(store_->Get(*hash).value(), all);
}

TEST_F(BlobStoreTest, StreamingReadInChunksVerifiesAtTheEnd) {
  std::string big(3 * (1 << 20) + 123, '\0');
  std::mt19937 gen(5);
  for (char& c : big) c = static_cast<char>(gen());
  auto hash = store_->Put(big);
  ASSERT_TRUE(hash.ok());

  auto r = store_->OpenReader(*hash);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)->size(), static_cast<int64_t>(big.size()));
  std::string got;
  int chunks = 0;
  while (!(*r)->done()) {
    auto chunk = (*r)->Read(1 << 20);
    ASSERT_TRUE(chunk.ok()) << chunk.status();
    got += *chunk;
    ++chunks;
  }
  EXPECT_EQ(chunks, 4);
  EXPECT_EQ(got, big);
  EXPECT_EQ((*r)->Read(10).value(), "");  // at the end: empty
}

TEST_F(BlobStoreTest, CorruptBlobIsDataLossOnGetAndOnTheLastStreamedChunk) {
  std::string data(2 * (1 << 20), 'x');
  auto hash = store_->Put(data);
  ASSERT_TRUE(hash.ok());
  // Flip one byte in place (bit rot / a tampered disk), keeping the size.
  data[12345] = 'y';
  ASSERT_TRUE(WriteFileAtomically(store_->PathFor(*hash), data).ok());

  auto s = store_->Get(*hash).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("is corrupt"));

  auto r = store_->OpenReader(*hash);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE((*r)->Read(1 << 20).ok());  // the first chunk cannot know yet
  auto last = (*r)->Read(1 << 20);
  EXPECT_EQ(last.status().code(), absl::StatusCode::kDataLoss) << last.status();
  EXPECT_FALSE((*r)->done());

  // A truncated blob as well.
  ASSERT_TRUE(WriteFileAtomically(store_->PathFor(*hash), "short").ok());
  EXPECT_EQ(store_->Get(*hash).status().code(), absl::StatusCode::kDataLoss);
}

TEST_F(BlobStoreTest, GarbageCollectionKeepsReferencedBlobsAndPartials) {
  const std::string a = store_->Put("aaaa").value();
  const std::string b = store_->Put("bbbbbb").value();
  const std::string c = store_->Put("cc").value();
  ASSERT_TRUE(store_->OpenPartial("in-flight").ok());
  ASSERT_TRUE(WriteFileAtomically(dir_ + "/store/tmp/w.crashed.1", "leftover").ok());

  auto stats = store_->CollectGarbage({a});
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->blobs_kept, 1);
  EXPECT_EQ(stats->blobs_deleted, 2);
  EXPECT_EQ(stats->bytes_deleted, 8);
  EXPECT_EQ(stats->temp_files_deleted, 1);
  EXPECT_EQ(store_->List().value(), std::vector<std::string>{a});
  EXPECT_FALSE(store_->Exists(b).value());
  EXPECT_FALSE(store_->Exists(c).value());
  EXPECT_EQ(CountFiles("partial"), 1u);
}

}  // namespace
}  // namespace fedlora
