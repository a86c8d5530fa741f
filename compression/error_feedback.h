// Error feedback for lossy update codecs (Seide et al. 2014; Karimireddy et al., ICML 2019): a
// client keeps what its codec did not send, the residual, and adds it to its next update, so that
// nothing is lost, only delayed. Over rounds, the sum of what was sent plus the final residual is
// the sum of the raw updates.
//
//   FEDLORA_ASSIGN_OR_RETURN(ErrorFeedback ef, ErrorFeedback::Load(path, run_id));
//   FEDLORA_ASSIGN_OR_RETURN(std::string wire, ef.Encode(delta, codec));   // delta + residual
//   ... upload wire; once the server accepted it:
//   ef.Commit();                                       // residual = (delta + residual) - decoded
//   FEDLORA_RETURN_IF_ERROR(ef.Save(path, run_id));
//
// An update the server never accepted changes nothing: without Commit the residual stays as it
// was. With the low-rank stage the same holds for its warm start (each tensor's last Q,
// compression/low_rank.h). Both live beside the site's other state in one safetensors file
// (the warm start under "low_rank_q/<tensor>"), written atomically, tagged with the run id; a file
// of another run starts afresh.
//
// Thread-safety: none; one per client.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "compression/codec.h"

namespace fedlora {

class ErrorFeedback {
 public:
  ErrorFeedback() = default;

  // The residual saved at `path` for `run_id`. A missing file, or one saved for another run, gives
  // an empty residual; an unreadable or malformed file is an error (as core/safetensors.h).
  static absl::StatusOr<ErrorFeedback> Load(const std::string& path, const std::string& run_id);
  // Writes the residual to `path` atomically (core/file.h).
  absl::Status Save(const std::string& path, const std::string& run_id) const;

  // update + residual, tensor by tensor (a residual tensor whose name or shape the update does not
  // have is dropped: the adapter's shape changed).
  std::vector<UpdateTensor> Corrected(const std::vector<UpdateTensor>& update) const;
  // Encodes Corrected(update) with `options`, decodes the result as the server will, and keeps
  // corrected - decoded as the pending residual (and, for low-rank, the new warm start as the
  // pending one; options.warm_start is ignored). A non-null `backend` runs the top-k and
  // quantization stages on its device (EncodeUpdate's backend overload; the same bytes). Errors as
  // EncodeUpdate / DecodeUpdate.
  absl::StatusOr<std::string> Encode(const std::vector<UpdateTensor>& update,
                                     const CodecOptions& options,
                                     kernels::Backend* backend = nullptr);
  // The pending residual and warm start become current (call once the server accepted the update).
  void Commit();

  const std::vector<UpdateTensor>& residual() const { return residual_; }
  const LowRankWarmStart& warm_start() const { return warm_; }

 private:
  std::vector<UpdateTensor> residual_, pending_;
  LowRankWarmStart warm_, pending_warm_;
  bool has_pending_ = false;
};

}  // namespace fedlora
