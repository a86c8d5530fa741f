#include "server/aggregation_key.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/file.h"
#include "core/status.h"
#include "crypto/envelope.h"
#include "crypto/sealed_update.h"

namespace fedlora {
namespace {

constexpr char kSuffix[] = ".x25519";

// Overwrites `path` with zeros, syncs it and unlinks it (OK when it does not exist). In place first,
// so that the key's blocks do not outlive the unlink on a file system that writes in place (ext4,
// xfs); a copy-on-write file system or an SSD's remapping may still keep old blocks, which is why
// the key directory can be a tmpfs (ServerOptions::key_dir).
absl::Status ShredKeyFile(const std::string& path, const std::string& dir) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return ErrnoToStatus(errno, "open", path);
  }
  struct stat st {};
  const int size_err = ::fstat(fd, &st) != 0 ? errno : 0;
  const size_t bytes =
      size_err == 0 ? std::max<size_t>(static_cast<size_t>(st.st_size), crypto::kX25519KeyBytes)
                    : 0;
  const int err = size_err != 0 ? size_err : WriteAll(fd, std::string(bytes, '\0'));
  const int sync = err == 0 && ::fsync(fd) != 0 ? errno : 0;
  ::close(fd);
  if (err != 0) return ErrnoToStatus(err, "overwrite", path);
  if (sync != 0) return ErrnoToStatus(sync, "fsync", path);
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return ErrnoToStatus(errno, "unlink", path);
  return FsyncDirectory(dir);
}

}  // namespace

absl::StatusOr<RoundKeys> RoundKeys::Open(std::string dir, std::string run_id) {
  if (dir.empty()) return absl::InvalidArgumentError("the aggregation key directory is empty");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    return absl::UnavailableError(
        absl::StrCat("creating the key directory ", dir, ": ", ec.message()));
  // Owner only, whoever created the directory (an older server, a restore from backup, a mount).
  if (::chmod(dir.c_str(), 0700) != 0) return ErrnoToStatus(errno, "chmod", dir);
  return RoundKeys(std::move(dir), std::move(run_id));
}

std::string RoundKeys::PathOf(int64_t round) const {
  return absl::StrCat(dir_, "/", run_id_, ".round-", round, kSuffix);
}

absl::StatusOr<AggregationKey> RoundKeys::Create(int64_t round) const {
  const std::string path = PathOf(round);
  std::error_code ec;
  if (std::filesystem::exists(path, ec)) {
    return absl::AlreadyExistsError(
        absl::StrCat("round ", round, " already has an aggregation key (", path, ")"));
  }
  FEDLORA_ASSIGN_OR_RETURN(crypto::X25519KeyPair pair, crypto::GenerateX25519KeyPair());
  FEDLORA_RETURN_IF_ERROR(WriteFileAtomically(path, pair.private_key, 0600));
  AggregationKey key;
  key.private_key = std::move(pair.private_key);
  key.public_key = std::move(pair.public_key);
  key.key_id = crypto::AggregationKeyId(key.public_key);
  return key;
}

absl::StatusOr<AggregationKey> RoundKeys::Load(int64_t round) const {
  const std::string path = PathOf(round);
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    return absl::NotFoundError(
        absl::StrCat("round ", round, "'s aggregation key ", path, " does not exist"));
  }
  AggregationKey key;
  FEDLORA_ASSIGN_OR_RETURN(key.private_key, ReadFileToString(path));
  if (key.private_key.size() != crypto::kX25519KeyBytes) {
    return absl::DataLossError(absl::StrCat(path, " holds ", key.private_key.size(),
                                            " bytes, not a ", crypto::kX25519KeyBytes,
                                            "-byte X25519 key"));
  }
  FEDLORA_ASSIGN_OR_RETURN(key.public_key, crypto::X25519PublicKey(key.private_key));
  key.key_id = crypto::AggregationKeyId(key.public_key);
  return key;
}

absl::Status RoundKeys::Destroy(int64_t round) const { return ShredKeyFile(PathOf(round), dir_); }

absl::Status RoundKeys::DestroyRunKey() const {
  return ShredKeyFile(absl::StrCat(dir_, "/", run_id_, kSuffix), dir_);
}

absl::StatusOr<std::vector<int64_t>> RoundKeys::List() const {
  std::vector<int64_t> rounds;
  const std::string prefix = absl::StrCat(run_id_, ".round-");
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!absl::StartsWith(name, prefix) || !absl::EndsWith(name, kSuffix)) continue;
    const std::string digits =
        name.substr(prefix.size(), name.size() - prefix.size() - (sizeof(kSuffix) - 1));
    int64_t round = 0;
    if (absl::SimpleAtoi(digits, &round) && round >= 1) rounds.push_back(round);
  }
  if (ec)
    return absl::UnavailableError(
        absl::StrCat("listing the key directory ", dir_, ": ", ec.message()));
  std::sort(rounds.begin(), rounds.end());
  return rounds;
}

}  // namespace fedlora
