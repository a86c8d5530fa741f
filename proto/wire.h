// Constants of the fedlora.v1 wire protocol that live outside the messages themselves (gRPC
// metadata keys, versions). Both the server and the client SDK take them from here.
#pragma once

#include <cstdint>

namespace fedlora {

// Version of the fedlora.v1 protocol, exchanged in JoinRequest / JoinResponse.protocol_version.
// Bumped on any change a peer of the previous version would misread.
inline constexpr uint32_t kProtocolVersion =
    2;  // 2: per-round signed aggregation keys, the weight sealed

// Metadata entry carrying JoinResponse.session_token on every call after Join. gRPC metadata keys
// are lowercase ASCII.
inline constexpr char kSessionMetadataKey[] = "fedlora-session";

// Metadata entry naming the client on a plaintext server (loopback only, with --insecure: simulation
// and tests). With mutual TLS, the only TLS the server offers, the identity is the peer certificate
// and this entry is ignored.
inline constexpr char kClientIdMetadataKey[] = "fedlora-client-id";

// Current wire-format version of every CodecStage (CodecStage.version).
inline constexpr uint32_t kCodecStageVersion = 1;

}  // namespace fedlora
