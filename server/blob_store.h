// Content-addressed blob files: the bytes of uploads and checkpoints, named by their SHA-256.
//
//   FEDLORA_ASSIGN_OR_RETURN(auto blobs, BlobStore::Open("/var/lib/fedlora"));
//   FEDLORA_ASSIGN_OR_RETURN(std::string hash, blobs->Put(bytes));          // one shot
//
//   FEDLORA_ASSIGN_OR_RETURN(auto w, blobs->OpenPartial(upload_id));          // resumable upload
//   FEDLORA_RETURN_IF_ERROR(w->TruncateTo(recorded_bytes));                   // drop unrecorded tail
//   FEDLORA_RETURN_IF_ERROR(w->Append(chunk));  ...  FEDLORA_RETURN_IF_ERROR(w->Sync());
//   FEDLORA_ASSIGN_OR_RETURN(std::string hash, w->Commit(expected_sha256_hex));
//
//   FEDLORA_ASSIGN_OR_RETURN(auto r, blobs->OpenReader(hash));                // streaming download
//   while (!r->done()) { FEDLORA_ASSIGN_OR_RETURN(std::string chunk, r->Read(1 << 20)); ... }
//
// Layout under <store_dir>:
//   blobs/ab/cdef...   the blob whose lowercase SHA-256 hex is "abcdef..." (2 + 62 characters)
//   partial/<id>       an upload in progress (resumable across restarts)
//   tmp/               anonymous writers and one-shot Puts before their rename
// A blob appears under blobs/ only complete and verified: it is written to a temporary file,
// fsynced, renamed into place, and the directory is fsynced, so a crash leaves either no blob or the
// whole blob. Blobs are immutable; writing an existing blob again is a no-op.
//
// Errors: InvalidArgument for a malformed hash or partial id; NotFound for a missing blob;
// DataLoss when a blob's bytes do not hash to its name (on read) or to the expected hash (on
// commit); I/O errors as core/file.h's ErrnoToStatus (PermissionDenied, ResourceExhausted for a full
// disk, Internal), each naming the path.
//
// Thread-safety: BlobStore methods are thread-safe (the file system arbitrates; distinct writers
// use distinct temp files). A BlobWriter / BlobReader is used by one thread at a time, with one
// exception: BlobWriter::SyncBeside may run on a second thread while the owner calls Append (see
// there). Two writers on the same partial id at once are a caller bug (the RPC layer serialises
// one upload_id).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/mapped_file.h"
#include "core/sha256.h"

namespace fedlora {

// True for a lowercase 64-character hex SHA-256.
bool IsValidBlobHash(std::string_view hash);
// True for a partial-upload id usable as a file name: 1..128 characters of [A-Za-z0-9._-], not
// starting with '.'.
bool IsValidPartialId(std::string_view id);

// Appends bytes to a not-yet-committed blob. Destroying a writer without Commit keeps a partial
// (OpenPartial) file for a later resume and deletes an anonymous (NewWriter) one.
class MappedBlob;

class BlobWriter {
 public:
  ~BlobWriter();
  BlobWriter(const BlobWriter&) = delete;
  BlobWriter& operator=(const BlobWriter&) = delete;

  // Appends `bytes` at the end. Not durable until Sync(), SyncBeside() or Commit().
  absl::Status Append(std::string_view bytes);

  // Bytes hashed for the next Append: their own SHA-256, to check against the one their sender
  // gave, and the blob's running digest advanced over them. HashNext reads the bytes once for
  // both (Sha256::UpdateAndDigest), so that a chunked upload hashes each byte once instead of
  // twice; Append(bytes, hashed) then writes them without hashing again.
  class HashedBytes {
   public:
    const Sha256DigestBytes& own() const { return own_; }

   private:
    friend class BlobWriter;
    Sha256DigestBytes own_{};
    std::optional<Sha256> running_;  // absent when the writer keeps no running digest
    int64_t end_ = 0;                // size() once the bytes are appended
  };
  HashedBytes HashNext(std::string_view bytes) const;
  // Append for bytes that HashNext hashed; FailedPrecondition if `hashed` is for another length
  // or another position (the writer changed since), with nothing written.
  absl::Status Append(std::string_view bytes, const HashedBytes& hashed);
  // fsyncs what was appended so far: after it returns OK the first size() bytes survive a crash.
  // Call before recording progress (chunks_received, bytes) in the store.
  absl::Status Sync();
  // Sync for a second thread, so that the owner need not wait for the disk: it may keep calling
  // Append (and only Append) meanwhile. When it returns OK, every byte appended before the call
  // survives a crash (the caller notes size() when it hands the call over, and records that much
  // as progress). At most one at a time, and the owner waits for it to return before it calls
  // anything but Append, and before it destroys the writer.
  absl::Status SyncBeside();
  // Asks the kernel to start writing the last `bytes` appended to disk without waiting (Linux
  // sync_file_range). Durability still comes only from Sync/Commit; this lets the disk work while
  // more bytes arrive, so the next Sync or Commit waits for less. Best effort: never fails.
  void StartWriteback(int64_t bytes);
  // Cuts the file to `size` bytes (<= size()), e.g. to the length the store recorded before a
  // crash, dropping a tail that was written but never acknowledged. InvalidArgument if size is
  // negative or > size(). (The file is shorter than the recorded length only if a crash came
  // between Commit/DiscardPartial and the store update; resume from min(recorded, size()).)
  absl::Status TruncateTo(int64_t size);
  // Bytes in the blob so far.
  int64_t size() const { return size_; }
  // Hashes the bytes written, fsyncs them, and checks the digest equals `expected_sha256_hex`
  // (DataLoss naming both hashes on a mismatch; InvalidArgument on a malformed expectation; the
  // data is discarded in both cases). Then moves it into blobs/ durably and returns the hash.
  // An empty expectation skips the check (trust our own bytes, e.g. a checkpoint). The writer is
  // unusable afterwards (FailedPrecondition), whatever the outcome.
  absl::StatusOr<std::string> Commit(std::string_view expected_sha256_hex);
  // Commit's first half, for bytes that must be checked before they may enter blobs/: fsyncs,
  // checks the digest as Commit does (discarding the data on a mismatch), and maps the file
  // read-only where it is. A later Commit moves it into place without hashing it again; Abort
  // deletes it. The mapping stays valid after either.
  absl::StatusOr<std::unique_ptr<MappedBlob>> Verify(std::string_view expected_sha256_hex);
  // Deletes the file (partial or anonymous) without committing. Idempotent.
  absl::Status Abort();

 private:
  friend class BlobStore;
  BlobWriter(std::string blobs_dir, std::string path, bool keep_on_destroy, int fd, int64_t size);
  // Re-hashes the file from disk when a resumed or truncated writer lost its running digest.
  absl::StatusOr<std::string> HashFile();
  // fsyncs and checks the content hash against `expected` (empty: no check); the hash, or an error
  // after which the caller discards the data.
  absl::StatusOr<std::string> SyncAndCheckDigest(std::string_view expected);
  // Writes `bytes` at the end of the file, or puts the file back to size_ and fails; the caller
  // moves size_ and the digest on.
  absl::Status Write(std::string_view bytes);

  std::string blobs_dir_;
  std::string path_;
  bool keep_on_destroy_;
  int fd_;
  int64_t size_;
  bool finished_ = false;
  bool dir_synced_ = false;  // the file's directory entry has been fsynced
  bool hash_valid_;          // hasher_ covers exactly the first size_ bytes
  Sha256 hasher_;
  std::string verified_hash_;  // set by Verify: the file's content hash, checked
};

// Reads a committed blob in chunks, hashing as it goes; the last Read (the one that reaches the
// end) returns DataLoss if the bytes do not hash to the blob's name, so a consumer that acts only
// after the final chunk never acts on corrupt data.
class BlobReader {
 public:
  ~BlobReader();
  BlobReader(const BlobReader&) = delete;
  BlobReader& operator=(const BlobReader&) = delete;

  // Up to `max_bytes` (> 0) next bytes; empty only at the end. DataLoss at the end on a hash
  // mismatch or if the file changed size while reading.
  absl::StatusOr<std::string> Read(size_t max_bytes);
  int64_t size() const { return size_; }      // total bytes of the blob
  int64_t offset() const { return offset_; }  // bytes returned so far
  bool done() const { return offset_ == size_ && verified_; }
  const std::string& hash() const { return hash_; }

 private:
  friend class BlobStore;
  BlobReader(std::string hash, std::string path, int fd, int64_t size);

  std::string hash_;
  std::string path_;
  int fd_;
  int64_t size_;
  int64_t offset_ = 0;
  bool verified_ = false;
  Sha256 hasher_;
};

// A committed blob mapped read-only into memory (BlobStore::MapCommitted). The pages come from the
// page cache, so a blob just written is read without a copy or a disk read.
class MappedBlob {
 public:
  MappedBlob(const MappedBlob&) = delete;
  MappedBlob& operator=(const MappedBlob&) = delete;

  std::string_view bytes() const { return file_.bytes(); }

 private:
  friend class BlobStore;
  friend class BlobWriter;
  explicit MappedBlob(MappedFile file) : file_(std::move(file)) {}

  MappedFile file_;
};

struct BlobGcStats {
  int64_t blobs_kept = 0;
  int64_t blobs_deleted = 0;
  int64_t bytes_deleted = 0;
  int64_t temp_files_deleted = 0;  // leftovers in tmp/ from crashed writers
};

class BlobStore {
 public:
  // Creates <store_dir>/{blobs,partial,tmp} as needed (store_dir itself must exist or be creatable
  // as one level). Errors as ErrnoToStatus.
  static absl::StatusOr<std::unique_ptr<BlobStore>> Open(const std::string& store_dir);

  // Stores `bytes` durably and returns its hash (dedups: an existing blob is not rewritten).
  absl::StatusOr<std::string> Put(std::string_view bytes);
  // A writer on a fresh anonymous temp file.
  absl::StatusOr<std::unique_ptr<BlobWriter>> NewWriter();
  // The writer for upload `partial_id`, creating partial/<id> or resuming it at its current size.
  absl::StatusOr<std::unique_ptr<BlobWriter>> OpenPartial(const std::string& partial_id);
  // Deletes partial/<id> if present. Idempotent.
  absl::Status DiscardPartial(const std::string& partial_id);
  // The ids of every partial upload on disk, sorted.
  absl::StatusOr<std::vector<std::string>> ListPartials() const;
  // Bytes the store's files take: blobs/, partial/ and tmp/ (file sizes, not blocks).
  absl::StatusOr<int64_t> DiskUsageBytes() const;

  // The whole blob, verified against its hash (DataLoss on mismatch). Meant for blobs that fit in
  // memory (updates, adapters); stream bigger ones with OpenReader.
  absl::StatusOr<std::string> Get(const std::string& hash) const;
  absl::StatusOr<std::unique_ptr<BlobReader>> OpenReader(const std::string& hash) const;
  // The blob mapped read-only WITHOUT re-hashing it: only for a caller whose BlobWriter::Commit just
  // returned `hash` (Commit hashed the bytes; a third pass over them would only cost time). Others
  // use Get or OpenReader. Errors as ErrnoToStatus.
  absl::StatusOr<std::unique_ptr<MappedBlob>> MapCommitted(const std::string& hash) const;
  absl::StatusOr<bool> Exists(const std::string& hash) const;
  // Size in bytes without reading (NotFound when absent).
  absl::StatusOr<int64_t> Size(const std::string& hash) const;
  // Unlinks committed blob `hash` (a sealed update whose round has closed). Idempotent.
  absl::Status Delete(const std::string& hash);
  // Every committed blob's hash, sorted.
  absl::StatusOr<std::vector<std::string>> List() const;

  // Deletes every blob whose hash is not in `referenced` and every file in tmp/ (call only while no
  // writer is active, e.g. at startup or between rounds). Partial uploads are not touched: discard
  // them through DiscardPartial when their upload is abandoned.
  absl::StatusOr<BlobGcStats> CollectGarbage(const absl::flat_hash_set<std::string>& referenced);

  // Where the blob with this hash lives (whether or not it exists).
  std::string PathFor(std::string_view hash) const;
  const std::string& dir() const { return dir_; }

 private:
  explicit BlobStore(std::string dir) : dir_(std::move(dir)) {}
  std::string dir_;
};

}  // namespace fedlora
