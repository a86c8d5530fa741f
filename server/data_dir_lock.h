// An exclusive advisory lock (flock) on <data_dir>/fedlora.lock, held by the server for its life
// and by `fedlora store verify|repair`, so that the offline tools never work on a store a running
// server is writing, and two servers never share one data directory. The kernel drops the lock
// when its holder exits, however it exits.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace fedlora {

class DataDirLock {
 public:
  // FailedPrecondition naming the directory when another process (or another lock in this one)
  // holds it; errno-based errors when the file cannot be opened.
  static absl::StatusOr<std::unique_ptr<DataDirLock>> Acquire(const std::string& data_dir);
  ~DataDirLock();
  DataDirLock(const DataDirLock&) = delete;
  DataDirLock& operator=(const DataDirLock&) = delete;

 private:
  explicit DataDirLock(int fd) : fd_(fd) {}
  int fd_;
};

}  // namespace fedlora
