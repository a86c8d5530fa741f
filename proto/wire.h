// Constants of the fedlora.v1 wire protocol that live outside the messages themselves (gRPC
// metadata keys, versions). Both the server and the client SDK take them from here.
#pragma once

#include <cstdint>

namespace fedlora {

// Version of the fedlora.v1 protocol, exchanged in JoinRequest / JoinResponse.protocol_version.
// Bumped on any change a peer of the previous version would misread.
inline constexpr uint32_t kProtocolVersion = 1;

// Metadata entry carrying JoinResponse.session_token on every call after Join. gRPC metadata keys
// are lowercase ASCII.
inline constexpr char kSessionMetadataKey[] = "fedlora-session";

// Metadata entry naming the client when the server does not require client certificates (no TLS on
// loopback for simulation and tests, or server-side TLS only). With mutual TLS the identity is the
// peer certificate and this entry is ignored.
inline constexpr char kClientIdMetadataKey[] = "fedlora-client-id";

// Current wire-format version of every CodecStage (CodecStage.version).
inline constexpr uint32_t kCodecStageVersion = 1;

}  // namespace fedlora
