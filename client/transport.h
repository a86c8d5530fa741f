// The SDK's transport: the Federation service's calls as one interface, so that the client's stages
// (client/*_stage.h) never see gRPC. GrpcTransport (client/grpc_transport.h) is the real one; tests
// use an in-memory fake (tests/client/fake_transport.h). Internal to fedlora::client: it shows
// protobuf types, which the public headers in include/fedlora/ never do.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "crypto/key_signature.h"
#include "fedlora/client.h"
#include "fedlora/client_trainer.h"
#include "fedlora/v1/federation.pb.h"

namespace fedlora {

// What every call carries besides its message: the session token from Join (empty before) and how
// long the call may take.
struct CallMeta {
  std::string session;
  int64_t deadline_ms = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;

  virtual absl::Status Join(const CallMeta& meta, const v1::JoinRequest& request,
                            v1::JoinResponse* response) = 0;
  virtual absl::Status WaitForTask(const CallMeta& meta, const v1::WaitForTaskRequest& request,
                                   v1::WaitForTaskResponse* response) = 0;
  // Called from the heartbeat thread while the main thread trains (never at the same time as
  // Join): implementations must allow it beside the other calls.
  virtual absl::Status Heartbeat(const CallMeta& meta, const v1::HeartbeatRequest& request,
                                 v1::HeartbeatResponse* response) = 0;
  // Streams the adapter's chunks from request.start_chunk() to `on_chunk`, in order. An error from
  // `on_chunk` cancels the stream and is returned as it is.
  virtual absl::Status DownloadAdapter(
      const CallMeta& meta, const v1::DownloadRequest& request,
      absl::FunctionRef<absl::Status(const v1::DownloadChunk&)> on_chunk) = 0;
  virtual absl::Status GetUploadStatus(const CallMeta& meta, const v1::UploadStatusRequest& request,
                                       v1::UploadStatusResponse* response) = 0;
  // Sends `header` (an UploadChunk with the header set), then each message `next` fills until it
  // returns false, then reads the server's ack. A refused write ends the stream early; the ack
  // then says how far it got.
  virtual absl::Status UploadUpdate(const CallMeta& meta, const v1::UploadChunk& header,
                                    absl::FunctionRef<bool(v1::UploadChunk*)> next,
                                    v1::UploadAck* ack) = 0;
  virtual absl::Status SecureAggregation(const CallMeta& meta,
                                         const v1::SecureAggregationRequest& request,
                                         v1::SecureAggregationResponse* response) = 0;
  virtual absl::Status ReportMetrics(const CallMeta& meta, const v1::MetricsReport& request,
                                     v1::MetricsAck* response) = 0;
  virtual absl::Status Leave(const CallMeta& meta, const v1::LeaveRequest& request,
                             v1::LeaveResponse* response) = 0;

  // For a call that failed Unavailable: the reason when it is the connection's own and trying again
  // cannot fix it (a certificate either side refuses, plaintext against TLS), as a status that is
  // not Unavailable; else `failure` unchanged. Default: unchanged.
  virtual absl::Status ExplainUnavailable(const absl::Status& failure) { return failure; }
  // Over TLS: the server key a round's aggregation key must be signed by; null without TLS.
  virtual const crypto::AggregationKeyTrust* KeyTrust() const { return nullptr; }
};

// A client over `transport` (tests: an in-memory fake; Client::Create uses GrpcTransport).
// `options` as for Client::Create, minus the checks of address and TLS, which are the transport's.
absl::StatusOr<std::unique_ptr<Client>> NewClientOverTransport(
    ClientOptions options, ClientTrainer* trainer, std::unique_ptr<Transport> transport);

}  // namespace fedlora
