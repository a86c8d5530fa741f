// The downlink's adapter deltas: how the server turns one global adapter into the next as an encoded
// update, and how a client applies it. Both sides rebuild the next "broadcast" adapter with the same
// function, so a client that applies every delta of a chain holds the server's adapter bit for bit
// (its safetensors image hashes to the manifest's SHA-256).
//
//   // server, at each commit: the exact adapter `global`, the one clients hold `broadcast`
//   FEDLORA_ASSIGN_OR_RETURN(DownlinkDelta d, EncodeDownlinkDelta(broadcast, global, options));
//   // d.blob goes to the blob store; d.rebuilt is the next broadcast adapter
//   // client: held = broadcast, then for each delta blob of the chain
//   FEDLORA_RETURN_IF_ERROR(ApplyDownlinkDelta(held, blob, limits));
//
// What the codec drops is not lost: the next round's delta is taken from the rebuilt adapter, so it
// carries the error forward (error feedback on the server). Thread-safe (no shared state).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "compression/codec.h"

namespace fedlora {

struct DownlinkDelta {
  std::string blob;                   // EncodeUpdate(target - base, options)
  std::vector<UpdateTensor> rebuilt;  // base with the decoded blob applied (ApplyDownlinkDelta)
};

// Encodes target - base. InvalidArgument when the two adapters differ in names or shapes (same
// order), or as EncodeUpdate.
absl::StatusOr<DownlinkDelta> EncodeDownlinkDelta(const std::vector<UpdateTensor>& base,
                                                  const std::vector<UpdateTensor>& target,
                                                  const CodecOptions& options);

// Decodes `blob` (DecodeUpdate under `limits`) and adds it to `adapter` in fp32, tensor by tensor.
// InvalidArgument, leaving `adapter` unchanged, when the delta's names or shapes differ from the
// adapter's or the sum overflows to Inf.
absl::Status ApplyDownlinkDelta(std::vector<UpdateTensor>& adapter, std::string_view blob,
                                const DecodeLimits& limits);

}  // namespace fedlora
