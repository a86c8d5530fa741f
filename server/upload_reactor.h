// The UploadUpdate stream (see upload_reactor.cc for the protocol and its durability): header
// first, then chunks in order, each checked against its SHA-256, written and checkpointed on the
// upload pools, never on a gRPC callback thread; the update is validated and accepted through the
// Coordinator before the ack goes out.
//
//   return NewUploadReactor(options, coordinator, blobs, metrics, &upload_pool, &sync_pool,
//                           Authenticate(context), response);
//
// A non-OK `client_id` finishes the call with that status. The reactor deletes itself when done.
#pragma once

#include <grpcpp/support/server_callback.h>

#include <string>

#include "absl/status/statusor.h"
#include "core/thread_pool.h"
#include "fedlora/v1/federation.pb.h"
#include "server/blob_store.h"
#include "server/coordinator.h"
#include "server/metrics.h"
#include "server/options.h"

namespace fedlora {

grpc::ServerReadReactor<v1::UploadChunk>* NewUploadReactor(const ServerOptions& options,
                                                           Coordinator* coordinator,
                                                           BlobStore* blobs, ServerMetrics* metrics,
                                                           ThreadPool* pool, ThreadPool* sync_pool,
                                                           absl::StatusOr<std::string> client_id,
                                                           v1::UploadAck* ack);

}  // namespace fedlora
