// A read-only memory mapping of a whole file, released when the object goes. Pages are read on
// first touch and shared with the page cache, so multi-GB checkpoints and blobs stay out of the
// heap and a file just written is read without a copy. An empty file maps to no memory (data() is
// null, size() 0).
//
//   FEDLORA_ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
//   Parse(file.bytes());
//
// The file must not be truncated by another process while mapped (reading the lost pages would
// fault, as with any mmap reader). Errors as core/file.h's, naming the path. Movable, not copyable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace fedlora {

class MappedFile {
 public:
  // Whether another process's writes to the file may show through (kShared) or not (kPrivate;
  // Linux shows them anyway until a page is written, which a read-only mapping never does).
  enum class Sharing { kPrivate, kShared };

  // Opens `path` (a regular file, else FailedPrecondition) and maps all of it.
  static absl::StatusOr<MappedFile> Open(const std::string& path,
                                         Sharing sharing = Sharing::kPrivate);
  // Maps the first `size` bytes of an open file descriptor, which stays the caller's (the mapping
  // outlives its closing). `path` names it in errors.
  static absl::StatusOr<MappedFile> FromFd(int fd, size_t size, const std::string& path,
                                           Sharing sharing = Sharing::kPrivate);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  std::string_view bytes() const { return {reinterpret_cast<const char*>(data_), size_}; }

 private:
  void Release();

  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace fedlora
