#include "server/data_dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "core/file.h"

namespace fedlora {

absl::StatusOr<std::unique_ptr<DataDirLock>> DataDirLock::Acquire(const std::string& data_dir) {
  const std::string path = data_dir + "/fedlora.lock";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoToStatus(errno, "open lock file", path);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd);
    if (err == EWOULDBLOCK) {
      return absl::FailedPreconditionError(
          absl::StrCat("the store in ", data_dir, " is in use (", path,
                       " is locked): stop the server that uses it first"));
    }
    return ErrnoToStatus(err, "flock", path);
  }
  return std::unique_ptr<DataDirLock>(new DataDirLock(fd));
}

DataDirLock::~DataDirLock() { ::close(fd_); }

}  // namespace fedlora
