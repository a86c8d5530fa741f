#include "server/upload_reactor.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/logging.h"
#include "core/sha256.h"
#include "core/status.h"
#include "crypto/envelope.h"
#include "crypto/sealed_update.h"
#include "server/grpc_status.h"

namespace fedlora {
namespace {

// UploadUpdate: header first, then chunks in order, each checked against its SHA-256 before it is
// written. Progress becomes durable (fsync + store row) every options.upload_sync_bytes and when the
// stream ends, so a resume re-sends little (GetUploadStatus reports only those durable
// checkpoints). The ack is sent only after the blob is fsynced, renamed into place and
// its directory fsynced, the update decoded and validated, and the store's row made durable
// (group-committed with concurrent acceptances). Messages are processed on the service's upload
// pool, not on gRPC's callback threads, so that concurrent uploads hash, write and wait for fsyncs
// in parallel.
//
// The periodic checkpoints run on a second pool (the sync pool) while the stream goes on: their
// fsync waits for the disk and their store row for the WAL, neither of which the next chunk needs.
// One checkpoint per upload is in flight at a time, so progress rows land in order; when the next
// is due before it is done, the stream goes on and the next one covers more, up to
// kMaxCheckpointLag intervals, where the stream waits for the disk. Every later step that touches
// the writer or the upload's row (the commit, the end of the call) first waits for it. A server
// crash thus loses at most about 2 x kMaxCheckpointLag intervals of an upload, a broken stream
// nothing (the server makes everything it verified durable before it answers).

class UploadReactor final : public grpc::ServerReadReactor<v1::UploadChunk> {
 public:
  // Checkpoint intervals (options.upload_sync_bytes) a stream may run ahead of its last checkpoint
  // while that one still waits for the disk.
  static constexpr int64_t kMaxCheckpointLag = 2;

  UploadReactor(const ServerOptions& options, Coordinator* coordinator, BlobStore* blobs,
                ServerMetrics* metrics, ThreadPool* pool, ThreadPool* sync_pool,
                absl::StatusOr<std::string> client_id, v1::UploadAck* ack)
      : options_(options),
        coordinator_(coordinator),
        blobs_(blobs),
        metrics_(metrics),
        pool_(pool),
        sync_pool_(sync_pool),
        ack_(ack) {
    if (!client_id.ok()) {
      Finish(ToGrpcStatus(client_id.status()));
      return;
    }
    client_id_ = *std::move(client_id);
    reading_ = true;
    StartRead(&messages_[0]);
  }

  // Reads run one message ahead of processing: while the pool processes a message in one buffer,
  // gRPC reads the next into the other, so receiving overlaps hashing and writing. Processing
  // (hashing, writing and above all the fsyncs must not hold one of gRPC's few callback threads)
  // is one drain task on the upload pool at a time, taking the messages in the order they were
  // read, so a stream's chunks stay in order.
  void OnReadDone(bool ok) override {
    bool read_next = false, drain = false;
    int into = 0;
    {
      absl::MutexLock lock(&mu_);
      reading_ = false;
      if (stopping_) return;  // the call is being finished: this message is not wanted
      if (ok) {
        ++queued_;
        next_read_ ^= 1;
        read_next = queued_ < 2;  // the other buffer is free
      } else {
        eof_ = true;  // the client half-closed (or the call broke)
      }
      if (read_next) {
        reading_ = true;
        into = next_read_;
      }
      if (!draining_) draining_ = drain = true;
    }
    // Outside mu_: StartRead may react inline, and a pool without workers runs Drain inline.
    if (read_next) StartRead(&messages_[into]);
    if (drain) pool_->Submit([this] { Drain(); });
  }

  // Processes the messages read so far, in order, then the end of the stream if it has come.
  void Drain() {
    for (;;) {
      int index = 0;
      bool end = false;
      {
        absl::MutexLock lock(&mu_);
        if (queued_ == 0 && !eof_) {
          draining_ = false;
          return;
        }
        index = next_process_;
        end = queued_ == 0;
      }
      if (end) {        // eof_, and every message before it is processed
        EndOfStream();  // finishes the call
        return;
      }
      const v1::UploadChunk& message = messages_[index];
      absl::Status s = message.has_header() ? OnHeader(message.header()) : OnData(message.data());
      bool read_next = false;
      int into = 0;
      {
        absl::MutexLock lock(&mu_);
        --queued_;
        next_process_ ^= 1;
        if (!s.ok() || complete_) {
          stopping_ = true;
        } else if (!reading_ && !eof_) {  // the read waited for this buffer
          reading_ = read_next = true;
          into = next_read_;
        }
      }
      // Finish must be the last thing a reaction does: OnDone (which deletes this) may run on
      // another thread as soon as it is called. A read still in flight is answered before OnDone,
      // and OnReadDone drops it.
      if (!s.ok()) {
        Fail(s);
        return;
      }
      if (complete_) {
        FinishCall(grpc::Status::OK);
        return;
      }
      if (read_next) StartRead(&messages_[into]);
    }
  }

  void OnDone() override {
    if (locked_) coordinator_->EndUpload(header_.upload_id());
    delete this;
  }

  // Ends the call. The upload_id is unlocked first: a client that has the answer may resume or
  // replay at once, before gRPC gets round to OnDone.
  void FinishCall(const grpc::Status& status) {
    // Every path here has already waited for its checkpoint; this keeps the writer alive for one
    // that has not, whatever its outcome (the progress it records is true either way).
    (void)AwaitCheckpoint();
    writer_.reset();
    if (locked_) {
      coordinator_->EndUpload(header_.upload_id());
      locked_ = false;
    }
    Finish(status);
  }

 private:
  // A checkpoint handed to the sync pool: the writer's SyncBeside, then the progress row for
  // `chunks` and `bytes` (what the writer held when it was handed over). Shared with the task.
  struct PendingCheckpoint {
    int64_t chunks = 0;
    int64_t bytes = 0;
    absl::Mutex mu;
    bool done ABSL_GUARDED_BY(mu) = false;
    absl::Status status ABSL_GUARDED_BY(mu);
  };

  absl::Status OnHeader(const v1::UploadHeader& header) {
    if (have_header_) return absl::InvalidArgumentError("a second upload header in one stream");
    have_header_ = true;
    header_ = header;
    FEDLORA_ASSIGN_OR_RETURN(UploadPlan plan, coordinator_->BeginUpload(client_id_, header_));
    if (plan.duplicate_ack.has_value()) {
      *ack_ = *plan.duplicate_ack;
      complete_ = true;
      return absl::OkStatus();
    }
    locked_ = true;
    const int64_t chunk = options_.chunk_bytes;
    next_chunk_ = header_.start_chunk();
    durable_chunks_ = next_chunk_;  // nothing new to make durable until a chunk arrives
    FEDLORA_ASSIGN_OR_RETURN(writer_, blobs_->OpenPartial(header_.upload_id()));
    const int64_t resume_bytes = static_cast<int64_t>(next_chunk_) * chunk;
    if (writer_->size() < resume_bytes) {
      // The partial file holds less than the store recorded (a crash between a blob commit and its
      // acceptance moved it away). Record what is really here; the client asks again and resumes.
      const int64_t have = writer_->size() / chunk;
      next_chunk_ = static_cast<uint32_t>(have);
      durable_chunks_ = have;
      FEDLORA_RETURN_IF_ERROR(writer_->TruncateTo(have * chunk));
      FEDLORA_RETURN_IF_ERROR(
          coordinator_->RecordUploadProgress(header_.upload_id(), have, have * chunk));
      return absl::AbortedError(absl::StrCat("server holds ", have, " chunks of upload '",
                                             header_.upload_id(), "'; resume from chunk ", have));
    }
    FEDLORA_RETURN_IF_ERROR(writer_->TruncateTo(resume_bytes));
    durable_chunks_ = next_chunk_;
    if (next_chunk_ == header_.manifest().num_chunks())
      return Complete();  // everything was already here
    return absl::OkStatus();
  }

  absl::Status OnData(const v1::UploadData& data) {
    if (!have_header_)
      return absl::InvalidArgumentError("the first message of an upload must be its header");
    const v1::AdapterManifest& m = header_.manifest();
    const int64_t chunk = options_.chunk_bytes;
    if (data.chunk_index() != next_chunk_) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk ", data.chunk_index(), " out of order; expected ", next_chunk_));
    }
    if (data.chunk_index() >= m.num_chunks()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chunk ", data.chunk_index(), " is past the last chunk (", m.num_chunks(), " chunks)"));
    }
    if (data.offset_bytes() != static_cast<uint64_t>(data.chunk_index()) * chunk) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk ", data.chunk_index(), " has offset ", data.offset_bytes(),
                       "; expected ", static_cast<int64_t>(data.chunk_index()) * chunk));
    }
    if (static_cast<int64_t>(data.data().size()) > options_.max_upload_chunk_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat("chunk ", data.chunk_index(), " is ",
                                                       data.data().size(), " bytes; the limit is ",
                                                       options_.max_upload_chunk_bytes));
    }
    const bool last = data.chunk_index() + 1 == m.num_chunks();
    const int64_t expected = last ? static_cast<int64_t>(m.total_bytes()) -
                                        static_cast<int64_t>(data.chunk_index()) * chunk
                                  : chunk;
    if (static_cast<int64_t>(data.data().size()) != expected) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chunk ", data.chunk_index(), " is ", data.data().size(), " bytes; expected ", expected));
    }
    // One pass over the bytes: their own digest for this check, and the blob's running digest.
    const BlobWriter::HashedBytes hashed = writer_->HashNext(data.data());
    if (ToHex(hashed.own()) != data.sha256()) {
      return absl::DataLossError(absl::StrCat("chunk ", data.chunk_index(),
                                              " does not match its SHA-256; resend from chunk ",
                                              durable_chunks_));
    }
    if (data.chunk_index() == 0) {
      // Refuse garbage from its first bytes instead of after the whole stream: a sealed update
      // starts with the header's ephemeral key and an envelope header that fits the manifest's size.
      const std::string_view first = data.data();
      if (first.size() >= crypto::SealedBlobOverheadBytes()) {
        FEDLORA_ASSIGN_OR_RETURN(std::string_view ephemeral, crypto::SealedBlobEphemeralKey(first));
        if (ephemeral != header_.encryption().ephemeral_public_key()) {
          return absl::InvalidArgumentError(
              "the sealed update's ephemeral key differs from its header's");
        }
        FEDLORA_RETURN_IF_ERROR(
            crypto::EnvelopePlaintextSize(first.substr(crypto::kX25519KeyBytes)).status());
      }
    }
    FEDLORA_RETURN_IF_ERROR(
        coordinator_->ChargeUploadBytes(client_id_, static_cast<int64_t>(data.data().size())));
    FEDLORA_RETURN_IF_ERROR(writer_->Append(data.data(), hashed));
    writer_->StartWriteback(static_cast<int64_t>(data.data().size()));
    metrics_->upload_bytes.fetch_add(static_cast<int64_t>(data.data().size()));
    ++next_chunk_;
    unsynced_bytes_ += static_cast<int64_t>(data.data().size());
    if (last) return Complete();
    if (unsynced_bytes_ >= options_.upload_sync_bytes)
      FEDLORA_RETURN_IF_ERROR(MaybeStartCheckpoint());
    return absl::OkStatus();
  }

  // A checkpoint is due. While the previous one still runs, the stream goes on unless
  // kMaxCheckpointLag intervals wait for a checkpoint: then it waits for the disk.
  absl::Status MaybeStartCheckpoint() {
    if (CheckpointRunning() && unsynced_bytes_ / kMaxCheckpointLag < options_.upload_sync_bytes) {
      return absl::OkStatus();
    }
    return StartCheckpoint();
  }

  // Hands a checkpoint of everything received so far to the sync pool once the previous one is
  // done (its error, if any, is returned instead); nothing when all of it is already durable.
  absl::Status StartCheckpoint() {
    FEDLORA_RETURN_IF_ERROR(AwaitCheckpoint());
    if (writer_ == nullptr || next_chunk_ == durable_chunks_) return absl::OkStatus();
    auto checkpoint = std::make_shared<PendingCheckpoint>();
    checkpoint->chunks = next_chunk_;
    checkpoint->bytes = writer_->size();
    checkpoint_ = checkpoint;
    unsynced_bytes_ = 0;
    // The writer outlives the task: nothing resets writer_ before AwaitCheckpoint.
    sync_pool_->Submit(
        [checkpoint, writer = writer_.get(), coordinator = coordinator_, id = header_.upload_id()] {
          absl::Status s = writer->SyncBeside();
          if (s.ok())
            s = coordinator->RecordUploadProgress(id, checkpoint->chunks, checkpoint->bytes);
          absl::MutexLock lock(&checkpoint->mu);
          checkpoint->status = std::move(s);
          checkpoint->done = true;
        });
    return absl::OkStatus();
  }

  // True while the checkpoint handed over last is still at work.
  bool CheckpointRunning() {
    if (checkpoint_ == nullptr) return false;
    absl::MutexLock lock(&checkpoint_->mu);
    return !checkpoint_->done;
  }

  // Waits for the checkpoint in flight, if any; on success its chunks count as durable.
  absl::Status AwaitCheckpoint() {
    if (checkpoint_ == nullptr) return absl::OkStatus();
    const std::shared_ptr<PendingCheckpoint> checkpoint = std::move(checkpoint_);
    checkpoint_ = nullptr;
    absl::MutexLock lock(&checkpoint->mu);
    checkpoint->mu.Await(absl::Condition(&checkpoint->done));
    if (checkpoint->status.ok()) durable_chunks_ = checkpoint->chunks;
    return checkpoint->status;
  }

  // fsyncs what was received and records it as resumable progress, and waits until it is: the
  // same checkpoint as the periodic ones, awaited at once.
  absl::Status MakeDurable() {
    FEDLORA_RETURN_IF_ERROR(StartCheckpoint());
    return AwaitCheckpoint();
  }

  absl::Status Complete() {
    // The checkpoint's progress row must land before anything below records the upload's fate,
    // and Verify may not run beside it.
    FEDLORA_RETURN_IF_ERROR(AwaitCheckpoint());
    // The bytes are checked where they are, in partial/: an update that fails validation never
    // enters blobs/.
    absl::StatusOr<std::unique_ptr<MappedBlob>> mapped =
        writer_->Verify(header_.manifest().sha256());
    if (!mapped.ok()) {
      // The partial was discarded (the blob did not match its manifest): the client starts over.
      writer_.reset();
      ForgetProgress();
      return mapped.status();
    }
    absl::Status valid = coordinator_->ValidateUpload(client_id_, header_, (*mapped)->bytes());
    mapped->reset();
    if (!valid.ok()) {
      DiscardPartial();
      // A refusal of the update itself is final; running out of memory to open it is not.
      rejected_ = absl::IsInvalidArgument(valid) || absl::IsPermissionDenied(valid);
      return valid;
    }
    absl::StatusOr<std::string> hash = writer_->Commit(header_.manifest().sha256());
    const int64_t size = writer_->size();
    writer_.reset();
    if (!hash.ok()) {
      ForgetProgress();
      return hash.status();
    }
    absl::StatusOr<v1::UploadAck> ack =
        coordinator_->CompleteUpload(client_id_, header_, *hash, size);
    if (!ack.ok()) {
      ForgetProgress();
      // A refusal of the update itself is final; a store hiccup (Unavailable, Internal) is not.
      rejected_ = !absl::IsUnavailable(ack.status()) && !absl::IsInternal(ack.status());
      return ack.status();
    }
    *ack_ = *std::move(ack);
    complete_ = true;
    return absl::OkStatus();
  }

  // Deletes what was received of an upload that cannot succeed, and forgets its progress.
  void DiscardPartial() {
    (void)AwaitCheckpoint();
    if (writer_ != nullptr) {
      absl::Status s = writer_->Abort();
      if (!s.ok()) {
        FEDLORA_LOG(WARNING) << "upload " << header_.upload_id() << ": " << s;
      }
      writer_.reset();
    }
    ForgetProgress();
  }

  // The upload starts over from chunk 0: its stored progress is reset.
  void ForgetProgress() {
    (void)coordinator_->RecordUploadProgress(header_.upload_id(), 0, 0);
    durable_chunks_ = 0;
  }

  void EndOfStream() {
    if (!have_header_) {
      Fail(absl::InvalidArgumentError("upload stream ended before its header"));
      return;
    }
    absl::Status s = MakeDurable();
    if (!s.ok()) {
      Fail(s);
      return;
    }
    ack_->set_upload_id(header_.upload_id());
    ack_->set_state(v1::UPLOAD_STATE_IN_PROGRESS);
    ack_->set_chunks_acknowledged(static_cast<uint32_t>(durable_chunks_));
    ack_->set_bytes_acknowledged(static_cast<uint64_t>(durable_chunks_) * options_.chunk_bytes);
    FinishCall(grpc::Status::OK);
  }

  void Fail(const absl::Status& status) {
    // Refusals of the update itself (not of the transport) are counted and remembered as rejected.
    const bool permanent = rejected_ || absl::IsInvalidArgument(status) ||
                           absl::IsPermissionDenied(status) || absl::IsFailedPrecondition(status) ||
                           absl::IsResourceExhausted(status);
    if (permanent) {
      // Nothing of it can be used again: its bytes go now, not at the next restart.
      if (locked_ && writer_ != nullptr) DiscardPartial();
    } else if (writer_ != nullptr) {
      // Chunks verified before the bad one stay durable, so the client can resume after them.
      absl::Status s = MakeDurable();
      if (!s.ok()) {
        FEDLORA_LOG(WARNING) << "upload " << header_.upload_id() << ": " << s;
      }
    }
    if (permanent) {
      coordinator_->RejectUpload(client_id_, rejected_ ? header_.upload_id() : "", status);
    }
    FEDLORA_LOG(DEBUG) << "upload " << header_.upload_id() << " from " << client_id_
                       << " refused: " << status;
    FinishCall(ToGrpcStatus(status));
  }

  const ServerOptions& options_;
  Coordinator* const coordinator_;
  BlobStore* const blobs_;
  ServerMetrics* const metrics_;
  ThreadPool* const pool_;
  ThreadPool* const sync_pool_;
  v1::UploadAck* const ack_;
  std::string client_id_;
  // Read-ahead (see OnReadDone). Messages are read into messages_[next_read_] and processed from
  // messages_[next_process_]; queued_ counts those read and not yet processed (at most 2).
  absl::Mutex mu_;
  v1::UploadChunk messages_[2];
  int next_read_ ABSL_GUARDED_BY(mu_) = 0;
  int next_process_ ABSL_GUARDED_BY(mu_) = 0;
  int queued_ ABSL_GUARDED_BY(mu_) = 0;
  bool reading_ ABSL_GUARDED_BY(mu_) = false;   // a StartRead is outstanding
  bool eof_ ABSL_GUARDED_BY(mu_) = false;       // the last read failed: no more messages
  bool draining_ ABSL_GUARDED_BY(mu_) = false;  // a Drain task is queued or running
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;  // the call is being finished
  v1::UploadHeader header_;
  bool have_header_ = false;
  bool locked_ = false;    // BeginUpload locked header_.upload_id() to this stream
  bool complete_ = false;  // *ack_ holds the final answer; Finish once the reaction ends
  bool rejected_ = false;  // the complete update was refused by validation
  std::unique_ptr<BlobWriter> writer_;
  uint32_t next_chunk_ = 0;
  int64_t durable_chunks_ = 0;
  int64_t unsynced_bytes_ = 0;                     // received since the last checkpoint was started
  std::shared_ptr<PendingCheckpoint> checkpoint_;  // in flight on the sync pool, or null
};

}  // namespace

grpc::ServerReadReactor<v1::UploadChunk>* NewUploadReactor(const ServerOptions& options,
                                                           Coordinator* coordinator,
                                                           BlobStore* blobs, ServerMetrics* metrics,
                                                           ThreadPool* pool, ThreadPool* sync_pool,
                                                           absl::StatusOr<std::string> client_id,
                                                           v1::UploadAck* ack) {
  return new UploadReactor(options, coordinator, blobs, metrics, pool, sync_pool,
                           std::move(client_id), ack);
}

}  // namespace fedlora
