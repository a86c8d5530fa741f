#include "client/fetch_stage.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "compression/codec.h"
#include "compression/downlink.h"
#include "compression/update_io.h"
#include "core/file.h"
#include "core/logging.h"
#include "core/sha256.h"
#include "core/status.h"
#include "core/strings.h"

namespace fedlora {

absl::StatusOr<std::vector<NamedTensor>> ParseAdapter(const std::string& bytes) {
  return AdapterFromSafetensors(bytes);
}

std::string AdapterFetcher::HeldPath() const {
  return session_.options().state_dir + "/global_adapter.safetensors";
}

void AdapterFetcher::LoadHeld() {
  if (session_.options().state_dir.empty()) return;
  absl::StatusOr<std::string> bytes = ReadFileToString(HeldPath());
  if (!bytes.ok()) return;  // none yet, or unreadable: the next task downloads the adapter whole
  held_sha256_ = Sha256Hex(*bytes);
  held_adapter_ = *std::move(bytes);
}

absl::StatusOr<std::string> AdapterFetcher::RebuildFromDeltas(const v1::AdapterDeltaChain& chain,
                                                              const v1::AdapterManifest& target) {
  FEDLORA_ASSIGN_OR_RETURN(std::vector<UpdateTensor> adapter,
                           AdapterFromSafetensors(held_adapter_));
  DecodeLimits limits;
  limits.max_elements = 0;
  for (const UpdateTensor& t : adapter)
    limits.max_elements += static_cast<int64_t>(t.values.size());
  limits.max_decoded_bytes = std::max<int64_t>(limits.max_elements * 8, 1 << 20);
  limits.max_tensors = static_cast<int64_t>(adapter.size());
  for (const v1::AdapterManifest& m : chain.deltas()) {
    FEDLORA_ASSIGN_OR_RETURN(std::string blob, Download(m));
    FEDLORA_RETURN_IF_ERROR_CTX(ApplyDownlinkDelta(adapter, blob, limits),
                                absl::StrCat("downlink delta ", m.sha256().substr(0, 16)));
  }
  FEDLORA_ASSIGN_OR_RETURN(std::string rebuilt, AdapterToSafetensors(adapter));
  if (Sha256Hex(rebuilt) != target.sha256()) {
    return absl::DataLossError(absl::StrCat("the adapter rebuilt from ", chain.deltas_size(),
                                            " downlink deltas does not hash to ",
                                            target.sha256().substr(0, 16)));
  }
  return rebuilt;
}

absl::StatusOr<std::string> AdapterFetcher::Fetch(const v1::TrainTask& task) {
  const v1::AdapterManifest& target = task.global_adapter();
  if (!held_sha256_.empty() && held_sha256_ == target.sha256()) {
    ++reused_;
    return held_adapter_;
  }
  std::optional<std::string> blob;
  if (task.has_global_delta() && !held_sha256_.empty() &&
      task.global_delta().base_sha256() == held_sha256_) {
    absl::StatusOr<std::string> rebuilt = RebuildFromDeltas(task.global_delta(), target);
    if (rebuilt.ok()) {
      ++rebuilt_;
      blob = *std::move(rebuilt);
    } else {
      if (absl::IsCancelled(rebuilt.status()) && session_.Stopped()) return rebuilt.status();
      FEDLORA_LOG(WARNING) << session_.Who() << ": " << rebuilt.status()
                           << "; downloading the adapter whole";
    }
  }
  if (!blob.has_value()) {
    FEDLORA_ASSIGN_OR_RETURN(blob, Download(target));
    ++downloaded_;
  }
  held_adapter_ = *blob;
  held_sha256_ = target.sha256();
  if (!session_.options().state_dir.empty()) {
    absl::Status saved = WriteFileAtomically(HeldPath(), held_adapter_);
    if (!saved.ok()) {
      FEDLORA_LOG(WARNING) << session_.Who() << ": keeping the global adapter: " << saved;
    }
  }
  return *std::move(blob);
}

absl::StatusOr<std::string> AdapterFetcher::Download(const v1::AdapterManifest& manifest) {
  std::string blob;
  // The manifest comes from the server, but a client never trusts a size enough to allocate it
  // blindly: reserve at most 1 GiB up front, and refuse a stream that outgrows its manifest.
  blob.reserve(static_cast<size_t>(std::min<uint64_t>(manifest.total_bytes(), uint64_t{1} << 30)));
  uint32_t next = 0;
  Sha256 whole;  // the digest of `blob`, fed as verified chunks arrive
  auto on_chunk = [&](const v1::DownloadChunk& chunk) -> absl::Status {
    if (chunk.chunk_index() != next || chunk.offset_bytes() != blob.size()) {
      return absl::DataLossError(absl::StrCat("download: got chunk ", chunk.chunk_index(),
                                              " at offset ", chunk.offset_bytes(),
                                              ", expected chunk ", next));
    }
    if (blob.size() + chunk.data().size() > manifest.total_bytes()) {
      return absl::DataLossError(
          absl::StrCat("download: more than the manifest's ", manifest.total_bytes(), " bytes"));
    }
    // One pass for the chunk's own digest and the blob's; the blob's moves on only if it matches.
    Sha256 advanced = whole;
    const Sha256DigestBytes own = advanced.UpdateAndDigest(chunk.data());
    if (ToHex(own) != chunk.sha256()) {
      // Transient by nature (corruption on the way): retry from this chunk.
      return absl::AbortedError(
          absl::StrCat("download: chunk ", next, " does not match its SHA-256"));
    }
    whole = advanced;
    blob += chunk.data();
    ++next;
    return absl::OkStatus();
  };
  FEDLORA_RETURN_IF_ERROR(session_.Retry(
      "DownloadAdapter",
      [&]() -> absl::Status {
        v1::DownloadRequest request;
        request.set_adapter_sha256(manifest.sha256());
        request.set_start_chunk(next);  // resume after the chunks already held
        return session_.transport().DownloadAdapter(
            session_.Meta(session_.options().transfer_deadline_ms), request, on_chunk);
      },
      /*busy_is_transient=*/true));  // the server frees our last stream's slot when it sees it end
  const Sha256DigestBytes digest = whole.Final();
  if (blob.size() != manifest.total_bytes() || ToHex(digest) != manifest.sha256()) {
    return absl::DataLossError(
        absl::StrCat("downloaded adapter (", blob.size(), " bytes) does not match its manifest (",
                     manifest.total_bytes(), " bytes, ", manifest.sha256(), ")"));
  }
  return blob;
}

}  // namespace fedlora
