// The aggregation keys: one X25519 key pair per round, the key that round's updates are sealed to
// (TrainTask.aggregation_key publishes the public half). A round's key is created before its first
// task goes out, kept while the round is open (a restarted server still opens the updates it
// accepted), and destroyed when the round commits or is abandoned: overwritten, synced, unlinked.
// So nothing the server keeps opens an update of a closed round, whoever copies its disk later.
//
//   FEDLORA_ASSIGN_OR_RETURN(RoundKeys keys, RoundKeys::Open(options.key_dir, run_id));
//   FEDLORA_ASSIGN_OR_RETURN(AggregationKey k, keys.Create(round));   // before the round's tasks
//   ...
//   FEDLORA_RETURN_IF_ERROR(keys.Destroy(round));                       // once it has closed
//
// Files: <dir>/<run_id>.round-<N>.x25519, the 32-byte private key, mode 0600 from creation, in a
// directory of mode 0700. `dir` may lie outside the store (a tmpfs or a secret mount): then a copy
// of the store volume opens nothing, even while a round is open.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace fedlora {

struct AggregationKey {
  std::string private_key;  // 32 bytes
  std::string public_key;   // 32 bytes
  std::string key_id;       // crypto::AggregationKeyId(public_key)
  std::string
      signature;  // the server's signature on it (crypto/key_signature.h); empty without TLS
};

class RoundKeys {
 public:
  // Creates `dir` (mode 0700) when missing and makes it owner-only.
  static absl::StatusOr<RoundKeys> Open(std::string dir, std::string run_id);

  // A new key pair for `round`, durable before it returns. AlreadyExists when the round has one.
  absl::StatusOr<AggregationKey> Create(int64_t round) const;
  // The round's key; NotFound when there is none, DataLoss when the file is not a 32-byte key.
  absl::StatusOr<AggregationKey> Load(int64_t round) const;
  // Overwrites the round's key file with zeros, syncs it, unlinks it and syncs the directory. OK
  // when there is none.
  absl::Status Destroy(int64_t round) const;
  // The same for the whole run's key that protocol version 1 kept (<dir>/<run_id>.x25519).
  absl::Status DestroyRunKey() const;
  // Rounds of this run that have a key file, ascending.
  absl::StatusOr<std::vector<int64_t>> List() const;

  std::string PathOf(int64_t round) const;
  const std::string& dir() const { return dir_; }

 private:
  RoundKeys(std::string dir, std::string run_id)
      : dir_(std::move(dir)), run_id_(std::move(run_id)) {}
  std::string dir_;
  std::string run_id_;
};

}  // namespace fedlora
