#include "core/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace fedlora {
namespace {

// Closes a file descriptor on scope exit unless released.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) ::close(fd_);
  }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;
  // Closes now and reports the close() error, which for some filesystems (NFS) is where a
  // deferred write error surfaces.
  int Close() {
    const int rc = ::close(fd_);
    fd_ = -1;
    return rc;
  }

 private:
  int fd_;
};

std::string DirName(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

int WriteAll(int fd, std::string_view bytes) {
  const char* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  return 0;
}

absl::Status FsyncDirectory(const std::string& dir) {
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return ErrnoToStatus(errno, "open directory", dir);
  FdCloser closer(dfd);
  if (::fsync(dfd) != 0) return ErrnoToStatus(errno, "fsync directory", dir);
  return absl::OkStatus();
}

absl::Status ErrnoToStatus(int err, std::string_view op, const std::string& path) {
  const std::string msg =
      absl::StrCat(absl::string_view(op.data(), op.size()), " '", path, "': ", std::strerror(err));
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(msg);
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(msg);
    case EISDIR:
      return absl::FailedPreconditionError(msg);
    case ENOSPC:
    case EDQUOT:
    case EMFILE:
    case ENFILE:
    case ENOMEM:
      return absl::ResourceExhaustedError(msg);
    default:
      return absl::InternalError(msg);
  }
}

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return ErrnoToStatus(errno, "open", path);
  FdCloser closer(fd);
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoToStatus(errno, "fstat", path);
  if (S_ISDIR(st.st_mode)) return ErrnoToStatus(EISDIR, "read", path);
  std::string out;
  // st_size is only a hint (procfs files report 0, files may grow); read until EOF.
  if (S_ISREG(st.st_mode) && st.st_size > 0) out.reserve(static_cast<size_t>(st.st_size));
  char buf[64 * 1024];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, "read", path);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

absl::Status WriteFileAtomically(const std::string& path, std::string_view bytes, unsigned mode) {
  if (path.empty() || path.back() == '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("WriteFileAtomically: not a file path: '", path, "'"));
  }
  const std::string dir = DirName(path);
  // A unique temp name per call: pid + a process-wide counter + random bits, so concurrent writers
  // (threads or processes) to the same target never share a temp file. O_EXCL guards the rest.
  static std::atomic<uint64_t> counter{0};
  thread_local std::mt19937_64 gen(std::random_device{}());
  std::string tmp;
  int fd = -1;
  for (int attempt = 0; attempt < 16; ++attempt) {
    tmp = absl::StrCat(path, ".tmp.", ::getpid(), ".", counter.fetch_add(1), ".", gen() % 1000000);
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, static_cast<mode_t>(mode));
    if (fd >= 0 || errno != EEXIST) break;
  }
  if (fd < 0) return ErrnoToStatus(errno, "create temporary file for", path);
  FdCloser closer(fd);
  auto fail = [&](int err, std::string_view op) {
    ::unlink(tmp.c_str());
    return ErrnoToStatus(err, op, path);
  };
  if (int err = WriteAll(fd, bytes); err != 0) return fail(err, "write");
  if (::fsync(fd) != 0) return fail(errno, "fsync");
  if (closer.Close() != 0) return fail(errno, "close");
  if (::rename(tmp.c_str(), path.c_str()) != 0) return fail(errno, "rename temporary file onto");
  // Make the rename durable: without this a crash can leave the directory entry pointing at the
  // old file (or none) even though the data blocks were synced.
  return FsyncDirectory(dir);
}

}  // namespace fedlora
