#include "core/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/file.h"

namespace fedlora {

absl::StatusOr<MappedFile> MappedFile::FromFd(int fd, size_t size, const std::string& path,
                                              Sharing sharing) {
  MappedFile file;
  if (size == 0) return file;
  void* p = ::mmap(nullptr, size, PROT_READ, sharing == Sharing::kShared ? MAP_SHARED : MAP_PRIVATE,
                   fd, 0);
  if (p == MAP_FAILED) return ErrnoToStatus(errno, "mmap", path);
  file.data_ = static_cast<const uint8_t*>(p);
  file.size_ = size;
  return file;
}

absl::StatusOr<MappedFile> MappedFile::Open(const std::string& path, Sharing sharing) {
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return ErrnoToStatus(errno, "open", path);
  struct stat st;
  absl::StatusOr<MappedFile> file;
  if (::fstat(fd, &st) != 0) {
    file = ErrnoToStatus(errno, "fstat", path);
  } else if (!S_ISREG(st.st_mode)) {
    file = absl::FailedPreconditionError(absl::StrCat(path, ": not a regular file"));
  } else {
    file = FromFd(fd, static_cast<size_t>(st.st_size), path, sharing);
  }
  ::close(fd);  // a mapping stays valid after close
  return file;
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    Release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

MappedFile::~MappedFile() { Release(); }

void MappedFile::Release() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

absl::StatusOr<MappedBuffer> MappedBuffer::Create(size_t size) {
  MappedBuffer b;
  if (size == 0) return b;
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot map ", size, " bytes of memory: ", std::strerror(errno)));
  }
  b.data_ = static_cast<char*>(p);
  b.size_ = size;
  return b;
}

MappedBuffer::MappedBuffer(MappedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

MappedBuffer& MappedBuffer::operator=(MappedBuffer&& other) noexcept {
  if (this != &other) {
    Release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

MappedBuffer::~MappedBuffer() { Release(); }

void MappedBuffer::Release() {
  if (data_ != nullptr) ::munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
}

void DropPagesBefore(const void* data, uint64_t consumed, uint64_t* dropped) {
  static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t end = consumed / page * page;
  if (end <= *dropped) return;
  (void)::madvise(static_cast<char*>(const_cast<void*>(data)) + *dropped, end - *dropped,
                  MADV_DONTNEED);
  *dropped = end;
}

}  // namespace fedlora
