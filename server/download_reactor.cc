#include "server/download_reactor.h"

#include <functional>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "server/grpc_status.h"

namespace fedlora {
namespace {

// DownloadAdapter: streams a global adapter blob from start_chunk on, one chunk in flight at a time
// (memory: one chunk per download, besides the shared mapping). The first use of a blob indexes it
// on the pool (DownloadCache); gRPC's callback threads only start writes and see them complete.
class DownloadReactor final : public grpc::ServerWriteReactor<v1::DownloadChunk> {
 public:
  DownloadReactor(DownloadCache* cache, ServerMetrics* metrics, ThreadPool* pool, size_t max_queued,
                  DownloadChunkCallback on_chunk, std::function<void()> on_done,
                  absl::StatusOr<v1::AdapterManifest> manifest, uint32_t start_chunk)
      : cache_(cache),
        metrics_(metrics),
        pool_(pool),
        on_chunk_(std::move(on_chunk)),
        on_done_(std::move(on_done)),
        index_(start_chunk) {
    if (!manifest.ok()) {
      Finish(ToGrpcStatus(manifest.status()));
      return;
    }
    manifest_ = *std::move(manifest);
    const bool queued = pool_->TrySubmit(
        [this] {
          absl::Status s = Start();
          if (!s.ok()) {
            Finish(ToGrpcStatus(s));
            return;
          }
          Next();
        },
        max_queued);
    if (!queued) {
      Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          "the server's download queue is full; retry later"));
    }
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "download stream broken"));
      return;
    }
    metrics_->download_bytes.fetch_add(static_cast<int64_t>(chunk_.data().size()));
    ++index_;
    if (on_chunk_)
      on_chunk_(static_cast<int64_t>(chunk_.data().size()), index_ == manifest_.num_chunks());
    Next();
  }

  void OnDone() override {
    if (on_done_) on_done_();
    delete this;
  }

 private:
  absl::Status Start() {
    if (index_ > manifest_.num_chunks()) {
      return absl::OutOfRangeError(absl::StrCat("start_chunk ", index_, " is past the last chunk (",
                                                manifest_.num_chunks(), " chunks)"));
    }
    FEDLORA_ASSIGN_OR_RETURN(adapter_,
                             cache_->Get(manifest_.sha256(), manifest_.chunk_size_bytes()));
    if (adapter_->chunk_sha256.size() != manifest_.num_chunks()) {
      return absl::DataLossError(absl::StrCat("adapter blob has ", adapter_->chunk_sha256.size(),
                                              " chunks; its manifest says ",
                                              manifest_.num_chunks()));
    }
    return absl::OkStatus();
  }

  // The next chunk is a copy out of the mapping, with its precomputed hash: no disk read, no hash.
  void Next() {
    if (index_ >= manifest_.num_chunks()) {
      Finish(grpc::Status::OK);
      return;
    }
    chunk_.Clear();
    chunk_.set_chunk_index(index_);
    chunk_.set_offset_bytes(static_cast<uint64_t>(index_) * manifest_.chunk_size_bytes());
    chunk_.set_sha256(adapter_->chunk_sha256[index_]);
    const std::string_view bytes = adapter_->Chunk(index_);
    chunk_.set_data(bytes.data(), bytes.size());
    StartWrite(&chunk_);
  }

  DownloadCache* const cache_;
  ServerMetrics* const metrics_;
  ThreadPool* const pool_;
  const DownloadChunkCallback on_chunk_;
  const std::function<void()> on_done_;
  uint32_t index_;
  v1::AdapterManifest manifest_;
  std::shared_ptr<const CachedAdapter> adapter_;
  v1::DownloadChunk chunk_;
};

}  // namespace

grpc::ServerWriteReactor<v1::DownloadChunk>* NewDownloadReactor(
    DownloadCache* cache, ServerMetrics* metrics, ThreadPool* pool, size_t max_queued,
    DownloadChunkCallback on_chunk, std::function<void()> on_done,
    absl::StatusOr<v1::AdapterManifest> manifest, uint32_t start_chunk) {
  return new DownloadReactor(cache, metrics, pool, max_queued, std::move(on_chunk),
                             std::move(on_done), std::move(manifest), start_chunk);
}

}  // namespace fedlora
