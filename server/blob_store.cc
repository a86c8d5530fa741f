#include "server/blob_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <filesystem>
#include <random>

#include "absl/strings/str_cat.h"
#include "core/file.h"
#include "core/status.h"
#include "core/strings.h"

namespace fedlora {
namespace {

constexpr size_t kHashChunk = 1 << 20;  // bytes per read when re-hashing a file

bool IsLowerHex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }

absl::Status MakeDir(const std::string& path) {
  if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST)
    return ErrnoToStatus(errno, "mkdir", path);
  return absl::OkStatus();
}

// Reads up to n bytes at `offset`; returns the count (short only at end of file) or -errno.
ssize_t PreadFull(int fd, char* buf, size_t n, int64_t offset) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r =
        ::pread(fd, buf + got, n - got, static_cast<off_t>(offset + static_cast<int64_t>(got)));
    if (r < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  return static_cast<ssize_t>(got);
}

absl::Status CheckHash(std::string_view hash) {
  if (!IsValidBlobHash(hash)) {
    return absl::InvalidArgumentError(
        absl::StrCat("blob hash '", ToAbsl(hash.substr(0, 80)),
                     "' is not a lowercase 64-character SHA-256 hex"));
  }
  return absl::OkStatus();
}

std::string UniqueTempName() {
  static std::atomic<uint64_t> counter{0};
  thread_local std::mt19937_64 gen(std::random_device{}());
  return absl::StrCat("w.", ::getpid(), ".", counter.fetch_add(1), ".", gen() % 1000000000);
}

}  // namespace

bool IsValidBlobHash(std::string_view hash) {
  return hash.size() == 2 * kSha256DigestSize && std::all_of(hash.begin(), hash.end(), IsLowerHex);
}

bool IsValidPartialId(std::string_view id) {
  if (id.empty() || id.size() > 128 || id[0] == '.') return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
  });
}

// --- BlobWriter ------------------------------------------------------------------------------------

BlobWriter::BlobWriter(std::string blobs_dir, std::string path, bool keep_on_destroy, int fd,
                       int64_t size)
    : blobs_dir_(std::move(blobs_dir)),
      path_(std::move(path)),
      keep_on_destroy_(keep_on_destroy),
      fd_(fd),
      size_(size),
      hash_valid_(size == 0) {}

BlobWriter::~BlobWriter() {
  if (finished_) return;
  ::close(fd_);
  if (!keep_on_destroy_) ::unlink(path_.c_str());
}

absl::Status BlobWriter::Append(std::string_view bytes) {
  FEDLORA_RETURN_IF_ERROR(Write(bytes));
  if (hash_valid_) hasher_.Update(bytes);
  size_ += static_cast<int64_t>(bytes.size());
  return absl::OkStatus();
}

BlobWriter::HashedBytes BlobWriter::HashNext(std::string_view bytes) const {
  HashedBytes h;
  h.end_ = size_ + static_cast<int64_t>(bytes.size());
  if (hash_valid_) {
    h.running_ = hasher_;
    h.own_ = h.running_->UpdateAndDigest(bytes);
  } else {
    h.own_ = Sha256Digest(bytes);
  }
  return h;
}

absl::Status BlobWriter::Append(std::string_view bytes, const HashedBytes& hashed) {
  // (A writer's running digest, once dropped, never comes back, so one kept now was kept by
  // HashNext too.)
  if (hashed.end_ != size_ + static_cast<int64_t>(bytes.size())) {
    return absl::FailedPreconditionError(
        absl::StrCat("Append to ", path_, ": the bytes were hashed for ending at ", hashed.end_,
                     ", not at ", size_ + static_cast<int64_t>(bytes.size())));
  }
  FEDLORA_RETURN_IF_ERROR(Write(bytes));
  if (hash_valid_) hasher_ = *hashed.running_;
  size_ += static_cast<int64_t>(bytes.size());
  return absl::OkStatus();
}

absl::Status BlobWriter::Write(std::string_view bytes) {
  if (finished_)
    return absl::FailedPreconditionError(absl::StrCat("blob writer for ", path_, " is finished"));
  if (int err = WriteAll(fd_, bytes); err != 0) {
    // The file may now hold part of `bytes`: put it back to the last good length so that size()
    // stays the truth.
    (void)::ftruncate(fd_, static_cast<off_t>(size_));
    (void)::lseek(fd_, static_cast<off_t>(size_), SEEK_SET);
    return ErrnoToStatus(err, "write", path_);
  }
  return absl::OkStatus();
}

absl::Status BlobWriter::Sync() {
  if (finished_)
    return absl::FailedPreconditionError(absl::StrCat("blob writer for ", path_, " is finished"));
  return SyncBeside();
}

absl::Status BlobWriter::SyncBeside() {
  // Touches only what Append leaves alone: the descriptor (fsync through it covers every write
  // that returned before the call) and the directory state. `finished_` is the owner's; the
  // contract keeps Commit and Abort away while this runs.
  if (::fsync(fd_) != 0) return ErrnoToStatus(errno, "fsync", path_);
  if (!dir_synced_) {
    // A new file's directory entry is durable only once its directory is fsynced.
    FEDLORA_RETURN_IF_ERROR(FsyncDirectory(path_.substr(0, path_.find_last_of('/'))));
    dir_synced_ = true;
  }
  return absl::OkStatus();
}

void BlobWriter::StartWriteback(int64_t bytes) {
  if (finished_ || bytes <= 0) return;
  const int64_t from = std::max<int64_t>(0, size_ - bytes);
  // Errors (EIO shows up again at fsync; ESPIPE/EINVAL on odd file systems) are left to Sync.
  (void)::sync_file_range(fd_, static_cast<off_t>(from), static_cast<off_t>(size_ - from),
                          SYNC_FILE_RANGE_WRITE);
}

absl::Status BlobWriter::TruncateTo(int64_t size) {
  if (finished_)
    return absl::FailedPreconditionError(absl::StrCat("blob writer for ", path_, " is finished"));
  if (size < 0 || size > size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("TruncateTo(", size, ") on ", path_, ": must be in [0, ", size_, "]"));
  }
  if (size == size_) return absl::OkStatus();
  if (::ftruncate(fd_, static_cast<off_t>(size)) != 0)
    return ErrnoToStatus(errno, "ftruncate", path_);
  if (::lseek(fd_, static_cast<off_t>(size), SEEK_SET) < 0)
    return ErrnoToStatus(errno, "lseek", path_);
  size_ = size;
  hash_valid_ = false;  // the running digest covered the dropped tail
  return absl::OkStatus();
}

absl::StatusOr<std::string> BlobWriter::HashFile() {
  Sha256 h;
  std::string buf(kHashChunk, '\0');
  for (int64_t off = 0; off < size_;) {
    const size_t want =
        static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(kHashChunk), size_ - off));
    const ssize_t n = PreadFull(fd_, buf.data(), want, off);
    if (n < 0) return ErrnoToStatus(static_cast<int>(-n), "read", path_);
    if (static_cast<size_t>(n) != want) {
      return absl::DataLossError(
          absl::StrCat(path_, " is shorter (", off + n, " bytes) than written (", size_, ")"));
    }
    h.Update(buf.data(), want);
    off += n;
  }
  const Sha256DigestBytes d = h.Final();
  return ToHex(d);
}

absl::StatusOr<std::string> BlobWriter::SyncAndCheckDigest(std::string_view expected_sha256_hex) {
  if (!expected_sha256_hex.empty() && !IsValidBlobHash(expected_sha256_hex))
    return CheckHash(expected_sha256_hex);
  if (::fsync(fd_) != 0) return ErrnoToStatus(errno, "fsync", path_);
  std::string hash;
  if (!verified_hash_.empty()) {
    hash = verified_hash_;
  } else if (hash_valid_) {
    const Sha256DigestBytes d = hasher_.Final();
    hash = ToHex(d);
  } else {
    FEDLORA_ASSIGN_OR_RETURN(hash, HashFile());
  }
  if (!expected_sha256_hex.empty() && hash != expected_sha256_hex) {
    return absl::DataLossError(absl::StrCat("blob content hashes to ", hash, " but ",
                                            ToAbsl(expected_sha256_hex), " was expected (", size_,
                                            " bytes discarded)"));
  }
  return hash;
}

absl::StatusOr<std::unique_ptr<MappedBlob>> BlobWriter::Verify(
    std::string_view expected_sha256_hex) {
  if (finished_)
    return absl::FailedPreconditionError(absl::StrCat("blob writer for ", path_, " is finished"));
  absl::StatusOr<std::string> hash = SyncAndCheckDigest(expected_sha256_hex);
  if (!hash.ok()) {
    (void)Abort();
    return hash.status();
  }
  verified_hash_ = *std::move(hash);
  FEDLORA_ASSIGN_OR_RETURN(
      MappedFile file,
      MappedFile::FromFd(fd_, static_cast<size_t>(size_), path_, MappedFile::Sharing::kShared));
  return std::unique_ptr<MappedBlob>(new MappedBlob(std::move(file)));
}

absl::StatusOr<std::string> BlobWriter::Commit(std::string_view expected_sha256_hex) {
  if (finished_)
    return absl::FailedPreconditionError(absl::StrCat("blob writer for ", path_, " is finished"));
  // Whatever happens next, this writer is done; on failure its data is discarded.
  auto discard = [this](absl::Status s) {
    (void)Abort();
    return s;
  };
  absl::StatusOr<std::string> checked = SyncAndCheckDigest(expected_sha256_hex);
  if (!checked.ok()) return discard(checked.status());
  const std::string hash = *std::move(checked);
  const std::string shard = absl::StrCat(blobs_dir_, "/", hash.substr(0, 2));
  const std::string target = absl::StrCat(shard, "/", hash.substr(2));
  struct stat st;
  if (::stat(shard.c_str(), &st) != 0) {
    if (errno != ENOENT) return discard(ErrnoToStatus(errno, "stat", shard));
    if (::mkdir(shard.c_str(), 0755) != 0 && errno != EEXIST)
      return discard(ErrnoToStatus(errno, "mkdir", shard));
    if (absl::Status s = FsyncDirectory(blobs_dir_); !s.ok()) return discard(s);
  }
  if (::stat(target.c_str(), &st) == 0) {
    // Content addressing: the same bytes are already stored (and were verified when written).
    (void)Abort();
    return hash;
  }
  ::close(fd_);
  finished_ = true;
  if (::rename(path_.c_str(), target.c_str()) != 0) {
    const int err = errno;
    ::unlink(path_.c_str());
    return ErrnoToStatus(err, "rename into place", target);
  }
  FEDLORA_RETURN_IF_ERROR(FsyncDirectory(shard));
  return hash;
}

absl::Status BlobWriter::Abort() {
  if (finished_) return absl::OkStatus();
  finished_ = true;
  ::close(fd_);
  if (::unlink(path_.c_str()) != 0 && errno != ENOENT) return ErrnoToStatus(errno, "unlink", path_);
  return absl::OkStatus();
}

// --- BlobReader ------------------------------------------------------------------------------------

BlobReader::BlobReader(std::string hash, std::string path, int fd, int64_t size)
    : hash_(std::move(hash)), path_(std::move(path)), fd_(fd), size_(size) {}

BlobReader::~BlobReader() { ::close(fd_); }

absl::StatusOr<std::string> BlobReader::Read(size_t max_bytes) {
  if (max_bytes == 0) return absl::InvalidArgumentError("BlobReader::Read: max_bytes must be > 0");
  std::string chunk;
  if (offset_ < size_) {
    const size_t want =
        static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(max_bytes), size_ - offset_));
    chunk.resize(want);
    const ssize_t n = PreadFull(fd_, chunk.data(), want, offset_);
    if (n < 0) return ErrnoToStatus(static_cast<int>(-n), "read", path_);
    if (static_cast<size_t>(n) != want) {
      return absl::DataLossError(absl::StrCat(
          "blob ", hash_, " shrank while reading: ", offset_ + n, " of ", size_, " bytes"));
    }
    hasher_.Update(chunk);
    offset_ += n;
  }
  if (offset_ == size_ && !verified_) {
    char extra;
    const ssize_t more = PreadFull(fd_, &extra, 1, size_);
    if (more < 0) return ErrnoToStatus(static_cast<int>(-more), "read", path_);
    if (more > 0)
      return absl::DataLossError(
          absl::StrCat("blob ", hash_, " grew while reading past ", size_, " bytes"));
    const Sha256DigestBytes d = hasher_.Final();
    const std::string got = ToHex(d);
    if (got != hash_) {
      return absl::DataLossError(
          absl::StrCat("blob ", hash_, " is corrupt: its ", size_, " bytes hash to ", got));
    }
    verified_ = true;
  }
  return chunk;
}

// --- BlobStore -------------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<BlobStore>> BlobStore::Open(const std::string& store_dir) {
  if (store_dir.empty())
    return absl::InvalidArgumentError("BlobStore::Open: empty store directory");
  std::string dir = store_dir;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  FEDLORA_RETURN_IF_ERROR(MakeDir(dir));
  for (const char* sub : {"blobs", "partial", "tmp"})
    FEDLORA_RETURN_IF_ERROR(MakeDir(absl::StrCat(dir, "/", sub)));
  FEDLORA_RETURN_IF_ERROR(FsyncDirectory(dir));
  // Every shard directory up front: one directory fsync here instead of a mkdir plus an fsync of
  // blobs/ on the upload path each time a blob lands in a new shard. (Commit still creates a shard
  // that has gone missing.)
  const std::string blobs = absl::StrCat(dir, "/blobs");
  static constexpr char kHex[] = "0123456789abcdef";
  for (int i = 0; i < 256; ++i) {
    const char shard[3] = {kHex[i >> 4], kHex[i & 15], '\0'};
    FEDLORA_RETURN_IF_ERROR(MakeDir(absl::StrCat(blobs, "/", shard)));
  }
  FEDLORA_RETURN_IF_ERROR(FsyncDirectory(blobs));
  return std::unique_ptr<BlobStore>(new BlobStore(std::move(dir)));
}

std::string BlobStore::PathFor(std::string_view hash) const {
  return absl::StrCat(dir_, "/blobs/", ToAbsl(hash.substr(0, 2)), "/",
                      ToAbsl(hash.size() > 2 ? hash.substr(2) : ""));
}

absl::StatusOr<std::unique_ptr<BlobWriter>> BlobStore::NewWriter() {
  const std::string path = absl::StrCat(dir_, "/tmp/", UniqueTempName());
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoToStatus(errno, "create", path);
  return std::unique_ptr<BlobWriter>(
      new BlobWriter(dir_ + "/blobs", path, /*keep_on_destroy=*/false, fd, 0));
}

absl::StatusOr<std::unique_ptr<BlobWriter>> BlobStore::OpenPartial(const std::string& partial_id) {
  if (!IsValidPartialId(partial_id)) {
    return absl::InvalidArgumentError(absl::StrCat("partial upload id '", partial_id.substr(0, 160),
                                                   "' is not 1..128 characters of [A-Za-z0-9._-]"));
  }
  const std::string path = absl::StrCat(dir_, "/partial/", partial_id);
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoToStatus(errno, "open", path);
  const off_t end = ::lseek(fd, 0, SEEK_END);
  if (end < 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoToStatus(err, "lseek", path);
  }
  return std::unique_ptr<BlobWriter>(new BlobWriter(dir_ + "/blobs", path, /*keep_on_destroy=*/true,
                                                    fd, static_cast<int64_t>(end)));
}

absl::Status BlobStore::DiscardPartial(const std::string& partial_id) {
  if (!IsValidPartialId(partial_id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("partial upload id '", partial_id.substr(0, 160), "' is invalid"));
  }
  const std::string path = absl::StrCat(dir_, "/partial/", partial_id);
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return ErrnoToStatus(errno, "unlink", path);
  return absl::OkStatus();
}

absl::StatusOr<std::string> BlobStore::Put(std::string_view bytes) {
  const std::string hash = Sha256Hex(bytes);
  struct stat st;
  if (::stat(PathFor(hash).c_str(), &st) == 0) return hash;
  FEDLORA_ASSIGN_OR_RETURN(std::unique_ptr<BlobWriter> w, NewWriter());
  FEDLORA_RETURN_IF_ERROR(w->Append(bytes));
  return w->Commit(hash);
}

absl::StatusOr<std::string> BlobStore::Get(const std::string& hash) const {
  FEDLORA_RETURN_IF_ERROR(CheckHash(hash));
  const std::string path = PathFor(hash);
  FEDLORA_ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(path));
  const std::string got = Sha256Hex(bytes);
  if (got != hash) {
    return absl::DataLossError(
        absl::StrCat("blob ", hash, " is corrupt: its ", bytes.size(), " bytes hash to ", got));
  }
  return bytes;
}

namespace {

struct OpenedBlob {
  int fd;        // read-only; the caller closes it
  int64_t size;  // bytes
};

absl::StatusOr<OpenedBlob> OpenBlobFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, "open blob", path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoToStatus(err, "fstat", path);
  }
  return OpenedBlob{fd, static_cast<int64_t>(st.st_size)};
}

}  // namespace

absl::StatusOr<std::unique_ptr<MappedBlob>> BlobStore::MapCommitted(const std::string& hash) const {
  FEDLORA_RETURN_IF_ERROR(CheckHash(hash));
  const std::string path = PathFor(hash);
  FEDLORA_ASSIGN_OR_RETURN(const OpenedBlob file, OpenBlobFile(path));
  absl::StatusOr<MappedFile> mapped = MappedFile::FromFd(file.fd, static_cast<size_t>(file.size),
                                                         path, MappedFile::Sharing::kShared);
  ::close(file.fd);  // the mapping keeps the file open
  if (!mapped.ok()) return mapped.status();
  return std::unique_ptr<MappedBlob>(new MappedBlob(*std::move(mapped)));
}

absl::StatusOr<std::unique_ptr<BlobReader>> BlobStore::OpenReader(const std::string& hash) const {
  FEDLORA_RETURN_IF_ERROR(CheckHash(hash));
  const std::string path = PathFor(hash);
  FEDLORA_ASSIGN_OR_RETURN(const OpenedBlob file, OpenBlobFile(path));
  return std::unique_ptr<BlobReader>(new BlobReader(hash, path, file.fd, file.size));
}

absl::StatusOr<bool> BlobStore::Exists(const std::string& hash) const {
  FEDLORA_RETURN_IF_ERROR(CheckHash(hash));
  struct stat st;
  if (::stat(PathFor(hash).c_str(), &st) == 0) return true;
  if (errno == ENOENT) return false;
  return ErrnoToStatus(errno, "stat", PathFor(hash));
}

absl::StatusOr<int64_t> BlobStore::Size(const std::string& hash) const {
  FEDLORA_RETURN_IF_ERROR(CheckHash(hash));
  struct stat st;
  if (::stat(PathFor(hash).c_str(), &st) != 0)
    return ErrnoToStatus(errno, "stat blob", PathFor(hash));
  return static_cast<int64_t>(st.st_size);
}

namespace {

// Names in `dir` (no "." / ".."), or NotFound/... per ErrnoToStatus.
absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return ErrnoToStatus(errno, "opendir", dir);
  std::vector<std::string> names;
  errno = 0;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  const int err = errno;
  ::closedir(d);
  if (err != 0) return ErrnoToStatus(err, "readdir", dir);
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> BlobStore::List() const {
  std::vector<std::string> hashes;
  FEDLORA_ASSIGN_OR_RETURN(std::vector<std::string> shards, ListDir(dir_ + "/blobs"));
  for (const std::string& shard : shards) {
    if (shard.size() != 2 || !IsLowerHex(shard[0]) || !IsLowerHex(shard[1])) continue;
    FEDLORA_ASSIGN_OR_RETURN(std::vector<std::string> files,
                             ListDir(absl::StrCat(dir_, "/blobs/", shard)));
    for (const std::string& f : files) {
      const std::string hash = shard + f;
      if (IsValidBlobHash(hash)) hashes.push_back(hash);
    }
  }
  return hashes;
}

absl::Status BlobStore::Delete(const std::string& hash) {
  if (!IsValidBlobHash(hash))
    return absl::InvalidArgumentError(absl::StrCat("not a blob hash: '", hash.substr(0, 80), "'"));
  const std::string path = PathFor(hash);
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return ErrnoToStatus(errno, "unlink", path);
  return absl::OkStatus();
}

absl::StatusOr<BlobGcStats> BlobStore::CollectGarbage(
    const absl::flat_hash_set<std::string>& referenced) {
  BlobGcStats stats;
  FEDLORA_ASSIGN_OR_RETURN(std::vector<std::string> hashes, List());
  for (const std::string& hash : hashes) {
    if (referenced.contains(hash)) {
      ++stats.blobs_kept;
      continue;
    }
    const std::string path = PathFor(hash);
    struct stat st;
    const int64_t size = ::stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : 0;
    if (::unlink(path.c_str()) != 0) {
      if (errno == ENOENT) continue;
      return ErrnoToStatus(errno, "unlink", path);
    }
    ++stats.blobs_deleted;
    stats.bytes_deleted += size;
  }
  FEDLORA_ASSIGN_OR_RETURN(std::vector<std::string> temps, ListDir(dir_ + "/tmp"));
  for (const std::string& name : temps) {
    const std::string path = absl::StrCat(dir_, "/tmp/", name);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) return ErrnoToStatus(errno, "unlink", path);
    ++stats.temp_files_deleted;
  }
  return stats;
}

absl::StatusOr<std::vector<std::string>> BlobStore::ListPartials() const {
  FEDLORA_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDir(dir_ + "/partial"));
  std::vector<std::string> ids;
  for (std::string& n : names) {
    if (IsValidPartialId(n)) ids.push_back(std::move(n));
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

absl::StatusOr<int64_t> BlobStore::DiskUsageBytes() const {
  std::error_code ec;
  int64_t total = 0;
  for (const char* sub : {"/blobs", "/partial", "/tmp"}) {
    const std::string dir = dir_ + sub;
    for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
         !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
      std::error_code size_ec;
      if (it->is_regular_file(size_ec)) {
        const uintmax_t n = it->file_size(size_ec);
        if (!size_ec) total += static_cast<int64_t>(n);
      }
    }
    if (ec && ec != std::errc::no_such_file_or_directory) {
      return absl::InternalError(absl::StrCat("listing ", dir, ": ", ec.message()));
    }
    ec.clear();
  }
  return total;
}

}  // namespace fedlora
