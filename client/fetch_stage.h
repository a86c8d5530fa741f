// A task's first stage: the round's global adapter, as a safetensors image. The adapter already
// held when it is the task's; else rebuilt from the task's downlink delta chain; else downloaded
// whole (resumed chunk by chunk, each chunk and the whole checked against the manifest).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/session.h"
#include "fedlora/client_trainer.h"
#include "fedlora/v1/federation.pb.h"

namespace fedlora {

// The adapter's safetensors image as the SDK's public tensor type.
absl::StatusOr<std::vector<NamedTensor>> ParseAdapter(const std::string& bytes);

class AdapterFetcher {
 public:
  explicit AdapterFetcher(Session& session) : session_(session) {}

  // Loads the held adapter from state_dir, at the start of a run (a missing or unreadable file: the
  // one in memory, if any, stays).
  void LoadHeld();
  // The task's global adapter, which becomes the held one (kept in state_dir when set).
  absl::StatusOr<std::string> Fetch(const v1::TrainTask& task);
  // One adapter or delta by its manifest; DataLoss when the bytes do not match it.
  absl::StatusOr<std::string> Download(const v1::AdapterManifest& manifest);

  const std::string& held_sha256() const { return held_sha256_; }
  int64_t downloaded() const { return downloaded_; }
  int64_t rebuilt() const { return rebuilt_; }
  int64_t reused() const { return reused_; }

 private:
  // The held adapter with the chain's deltas applied; DataLoss when it does not hash to `target`.
  absl::StatusOr<std::string> RebuildFromDeltas(const v1::AdapterDeltaChain& chain,
                                                const v1::AdapterManifest& target);
  std::string HeldPath() const;

  Session& session_;
  // The last global adapter this client obtained, and its SHA-256 (empty: none).
  std::string held_adapter_;
  std::string held_sha256_;
  int64_t downloaded_ = 0, rebuilt_ = 0, reused_ = 0;
};

}  // namespace fedlora
