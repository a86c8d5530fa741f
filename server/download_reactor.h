// The DownloadAdapter stream (see download_reactor.cc): a global adapter blob from start_chunk on,
// one chunk in flight at a time, each with its SHA-256, served out of `cache` (download_cache.h:
// the blob verified and its chunks hashed once, for every client). The first use of a blob is
// indexed on `pool`, never on a gRPC callback thread; a resumed download starts at its chunk at once.
//
//   return NewDownloadReactor(&cache, metrics, &io_pool, 1024, on_chunk, release_slot,
//                             coordinator->AdapterManifestFor(hash), start);
//
// A non-OK `manifest` finishes the call with that status. `on_chunk` (may be empty) runs after each
// chunk went out, with its size and whether it was the blob's last (the server marks the client
// seen and counts the bytes); `on_done` (may be empty) runs once when the call is over, whatever its
// end (the server frees the client's download slot). When `pool` already has `max_queued` tasks
// waiting, the call ends RESOURCE_EXHAUSTED. The reactor deletes itself when done.
#pragma once

#include <grpcpp/support/server_callback.h>

#include <cstdint>
#include <functional>

#include "absl/status/statusor.h"
#include "core/thread_pool.h"
#include "fedlora/v1/federation.pb.h"
#include "server/download_cache.h"
#include "server/metrics.h"

namespace fedlora {

using DownloadChunkCallback = std::function<void(int64_t bytes, bool last)>;

grpc::ServerWriteReactor<v1::DownloadChunk>* NewDownloadReactor(
    DownloadCache* cache, ServerMetrics* metrics, ThreadPool* pool, size_t max_queued,
    DownloadChunkCallback on_chunk, std::function<void()> on_done,
    absl::StatusOr<v1::AdapterManifest> manifest, uint32_t start_chunk);

}  // namespace fedlora
