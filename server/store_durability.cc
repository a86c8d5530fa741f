// The store's durability: WalSyncer's group fsync of the WAL (store_internal.h says why one fsync
// serves a batch of commits) and the Store methods that wait on it.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"
#include "server/store.h"
#include "server/store_internal.h"

namespace fedlora {

using store_internal::SqlError;

// Called right after a COMMIT succeeded, under Store::mu_, so tickets follow commit order.
DurabilityTicket WalSyncer::Committed() {
  std::lock_guard<std::mutex> lock(mu_);
  return DurabilityTicket{++committed_};
}

absl::Status WalSyncer::WaitDurable(uint64_t seq) {
  std::unique_lock<std::mutex> lock(mu_);
  while (synced_ < seq) {
    if (!failed_.ok()) return failed_;
    if (syncing_) {
      cv_.wait(lock);
      continue;
    }
    syncing_ = true;
    const uint64_t target = committed_;  // every commit up to here has written its frames
    lock.unlock();
    absl::Status s = FsyncWal();
    lock.lock();
    syncing_ = false;
    cv_.notify_all();
    if (!s.ok()) {
      failed_ =
          absl::DataLossError(absl::StrCat(s.message(),
                                           "; the store is no longer durable and refuses "
                                           "every later write's durability: restart the server"));
      return failed_;
    }
    synced_ = std::max(synced_, target);
  }
  return absl::OkStatus();
}

bool WalSyncer::IsDurable(uint64_t seq) {
  std::lock_guard<std::mutex> lock(mu_);
  return synced_ >= seq;
}

absl::Status WalSyncer::SyncAll() {
  uint64_t target;
  {
    std::lock_guard<std::mutex> lock(mu_);
    target = committed_;
  }
  return WaitDurable(target);
}

// fsync through a descriptor of our own: Linux flushes the inode whichever descriptor asks.
// Opened per call because SQLite may recreate the file (then the frames we need were
// checkpointed into the database, which SQLite synced).
absl::Status WalSyncer::FsyncWal() {
  const int fd = ::open(wal_path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return absl::InternalError(
        absl::StrCat("opening ", wal_path_, " to fsync it: ", std::strerror(errno)));
  }
  int rc = ::fsync(fd);
  int err = errno;
  if (rc == 0 && fault_hook_ != nullptr) {
    if (absl::Status injected = fault_hook_("WalSyncer:fsync"); !injected.ok()) {
      rc = -1;
      err = EIO;
    }
  }
  ::close(fd);
  if (rc != 0)
    return absl::InternalError(absl::StrCat("fsync ", wal_path_, ": ", std::strerror(err)));
  if (!dir_synced_) {
    // The WAL's directory entry, once: a new file is durable only with its entry.
    const std::string dir = wal_path_.substr(0, wal_path_.find_last_of('/') + 1);
    const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
      return absl::InternalError(absl::StrCat("opening ", dir, ": ", std::strerror(errno)));
    const int drc = ::fsync(dfd);
    const int derr = errno;
    ::close(dfd);
    if (drc != 0)
      return absl::InternalError(absl::StrCat("fsync ", dir, ": ", std::strerror(derr)));
    dir_synced_ = true;  // only the syncing thread (syncing_ set) touches it
  }
  return absl::OkStatus();
}

absl::Status Store::FinishDurability(DurabilityTicket ticket, DurabilityTicket* deferred) {
  if (deferred != nullptr) {
    *deferred = ticket;
    return absl::OkStatus();
  }
  return syncer_->WaitDurable(ticket.seq);
}

absl::Status Store::WaitDurable(DurabilityTicket ticket) {
  return syncer_->WaitDurable(ticket.seq);
}

bool Store::IsDurable(DurabilityTicket ticket) { return syncer_->IsDurable(ticket.seq); }

absl::Status Store::SyncCommitted() { return syncer_->SyncAll(); }

absl::Status Store::CheckpointWal() {
  absl::MutexLock lock(&mu_);
  char* err = nullptr;
  const int rc = sqlite3_exec(impl_->db, "PRAGMA wal_checkpoint(TRUNCATE)", nullptr, nullptr, &err);
  sqlite3_free(err);
  if (rc != SQLITE_OK) return SqlError(impl_->db, rc, "checkpointing the WAL");
  return absl::OkStatus();
}

}  // namespace fedlora
