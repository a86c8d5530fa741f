// Memory mappings, released when their object goes: MappedFile (a whole file, read-only) and
// MappedBuffer (anonymous scratch memory whose consumed pages can be handed back).
//
// MappedFile: a read-only memory mapping of a whole file. Pages are read on
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

// Anonymous read-write memory of `size` bytes, zero-filled, for a large buffer that is read once
// from front to back (an opened update): DropPagesBefore hands the pages already read back to the
// OS, so that it and its source are not resident twice. Movable, not copyable.
class MappedBuffer {
 public:
  // ResourceExhausted naming the size when the mapping fails. Size 0 maps nothing (data() null).
  static absl::StatusOr<MappedBuffer> Create(size_t size);

  MappedBuffer() = default;
  MappedBuffer(MappedBuffer&& other) noexcept;
  MappedBuffer& operator=(MappedBuffer&& other) noexcept;
  MappedBuffer(const MappedBuffer&) = delete;
  MappedBuffer& operator=(const MappedBuffer&) = delete;
  ~MappedBuffer();

  char* data() { return data_; }
  size_t size() const { return size_; }
  std::string_view view() const { return {data_, size_}; }

 private:
  void Release();

  char* data_ = nullptr;
  size_t size_ = 0;
};

// Hands back to the OS the whole pages of [data, data + consumed) past *dropped (a page-aligned
// mapping's start, e.g. a MappedFile's or a MappedBuffer's data()), and advances *dropped to the
// end of the last whole page consumed (never back). Advisory: on failure the pages merely stay resident until the unmap. Pages of
// a private mapping read again afterwards come back from the file, or zero-filled for anonymous
// memory.
void DropPagesBefore(const void* data, uint64_t consumed, uint64_t* dropped);

}  // namespace fedlora
