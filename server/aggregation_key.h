// The run's aggregation key: the X25519 key pair clients seal their updates to (JoinResponse
// publishes the public half). One per run, created with the run and kept in the store directory
// (keys/<run_id>.x25519, mode 0600 in a 0700 directory), so that a restarted server still opens
// the updates it accepted before; a new run gets a new key.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace fedlora {

struct AggregationKey {
  std::string private_key;  // 32 bytes
  std::string public_key;   // 32 bytes
  std::string key_id;       // crypto::AggregationKeyId(public_key)
};

// Loads the key of `run_id` from `store_dir`, or creates it durably when there is none. DataLoss
// when the file exists but is not a 32-byte key.
absl::StatusOr<AggregationKey> LoadOrCreateAggregationKey(const std::string& store_dir, const std::string& run_id);

}  // namespace fedlora
