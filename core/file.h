// Whole-file reads and crash-safe whole-file writes.
//
//   FEDLORA_ASSIGN_OR_RETURN(std::string bytes, ReadFileToString("config.json"));
//   FEDLORA_RETURN_IF_ERROR(WriteFileAtomically("ckpt/round_7.safetensors", bytes));
//
// Errors: NotFound (path or its directory does not exist), PermissionDenied (EACCES/EPERM/EROFS),
// FailedPrecondition (path is a directory), ResourceExhausted (ENOSPC, EDQUOT, out of file
// descriptors), Internal (any other I/O failure). Each message names
// the path and carries the errno text. Thread-safe (no shared state).
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fedlora {

// Reads the whole file into memory. Meant for small files (configs, headers); stream big ones.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

// Writes `bytes` to `path` so that a reader (or a crash) sees either the old file or the complete
// new one, never a mix: writes a temporary file in the same directory, fsyncs it, renames it over
// `path`, then fsyncs the directory so the rename itself is durable. On failure the temporary
// file is removed and `path` is untouched. The new file has `mode` (minus the umask) from its
// creation: a secret written with 0600 is never readable by others, not even for a moment.
absl::Status WriteFileAtomically(const std::string& path, std::string_view bytes,
                                 unsigned mode = 0644);

// Makes the directory entries of `dir` durable (creations, renames, removals in it): opens the
// directory and fsyncs it. Errors as above, naming the directory.
absl::Status FsyncDirectory(const std::string& dir);

// Writes all of `bytes` to `fd`, retrying on short writes and EINTR. Returns 0 or the errno of
// the failed write (for callers that build their own status with ErrnoToStatus).
int WriteAll(int fd, std::string_view bytes);

// Maps an errno value from an operation on `path` to the most specific status code.
// `op` names the failed call ("open", "read", ...). Exposed for the other file-handling code
// in core/ (safetensors, sha256) so all of them report I/O errors the same way.
absl::Status ErrnoToStatus(int err, std::string_view op, const std::string& path);

}  // namespace fedlora
