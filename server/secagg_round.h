// Secure aggregation on the server (config.privacy.secure_aggregation): the fixed-point encoding
// every round of a run uses, and SecAggRound, one round's SecAgg+ protocol (crypto/secagg.h)
// through its phases. When the selection closes, the selected clients become the round's cohort
// (SecAggRound::Start); they advertise keys and share their secrets through the SecureAggregation
// RPC (steps 0 and 1: Receive and Answer, each step closed by Advance once every client answered or
// its time ran out), upload their masked fixed-point updates through UploadUpdate (step 2:
// MayUpload; the round closes as usual), and answer the unmasking request the aggregation thread
// publishes (step 3: OpenUnmasking, CollectUnmasking). The protocol's state lives in memory only: a
// restarted server abandons an open secure-aggregation round, and the clients, whose keys are drawn
// per task, start afresh in the next one.
//
// Thread-safety: SecAggRound is not thread-safe; the coordinator calls it under its lock. The
// aggregation thread takes the protocol server out (TakeServer) and drives steps 2 and 3 on it with
// no lock held.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "aggregation/fedavg.h"
#include "compression/codec.h"
#include "crypto/secagg.h"
#include "fedlora/v1/config.pb.h"
#include "fedlora/v1/federation.pb.h"

namespace fedlora {

// The fixed-point encoding of a run's masked updates.
struct SecAggEncoding {
  double clip_norm = 0;  // what clients clip their updates to
  double range = 0;      // the largest coordinate an encoded update may hold
  uint32_t frac_bits = 0;
  uint32_t modulus_bits = 0;

  // The encoding for `config`, whose rounds have min_clients survivors and cohorts of at most
  // max_cohort clients. InvalidArgument when no encoding fits (the codec's bits, 64-bit elements).
  static absl::StatusOr<SecAggEncoding> For(const v1::RunConfig& config, int64_t min_clients,
                                            int64_t max_cohort);
  // The checks of a masked upload (its size and values) of an adapter of `elements` values.
  absl::Status ValidateMasked(std::string_view plain, int64_t elements) const;
  // DataLoss when the unmasked sum `total` of `n` updates is larger than n clipped updates (plus
  // the distributed noise of `dp`) can be: a client's wrong share or masked input randomised it.
  absl::Status CheckUnmaskedSum(int64_t round, const std::vector<double>& total, int64_t n,
                                const v1::DifferentialPrivacyConfig& dp) const;
};

// The mean of the unmasked sum `total` of `n` updates, as the adapter's tensors (`spec` order).
std::vector<UpdateTensor> UnmaskedMean(const std::vector<double>& total, int64_t n,
                                       const std::vector<TensorSpec>& spec);

class SecAggRound {
 public:
  enum class Phase { kAdvertise, kShareKeys, kMaskedInput, kUnmasking, kDone };

  // The SecAgg+ parameters of round `round` over `n` clients and an adapter of `elements` values.
  // An error (its message says why) means no parameters fit: the round cannot run.
  static absl::StatusOr<v1::SecAggParams> Params(int64_t round, uint32_t n, int64_t elements,
                                                 const SecAggEncoding& e, int64_t min_clients);
  // The round's protocol over `cohort` (the selected clients; index order is client id order),
  // its first key step due at now + step_ms. Errors of crypto::SecAggServer::Create.
  static absl::StatusOr<std::unique_ptr<SecAggRound>> Start(int64_t round,
                                                            const std::set<std::string>& cohort,
                                                            const v1::SecAggParams& params,
                                                            const SecAggEncoding& e,
                                                            const v1::DifferentialPrivacyConfig& dp,
                                                            int64_t step_ms, int64_t now);
  // How long a key step (and the unmasking step) waits for the clients that have not answered.
  static int64_t StepMs(int64_t round_deadline_ms);

  // The answers to a client that end its part in the protocol, or ask it to poll again.
  static v1::SecureAggregationResponse Done(std::string why);
  static v1::SecureAggregationResponse Retry();

  int64_t round() const { return round_; }
  Phase phase() const { return phase_; }
  int64_t step_ms() const { return step_ms_; }
  size_t cohort_size() const { return cohort_.size(); }
  // Client id -> cohort index.
  const std::map<std::string, uint32_t>& index() const { return index_; }
  std::optional<uint32_t> IndexOf(const std::string& client_id) const;
  // The task's secure_aggregation part for cohort member `client_id`.
  v1::SecureAggregationTask TaskFor(const std::string& client_id) const;
  // Whether `client_id` may upload a masked update now: in the masked-input step, and in the key
  // sharing (U2).
  bool MayUpload(const std::string& client_id) const;
  // In the masked-input step, the uploads the round can still get (|U2|); nullopt otherwise.
  std::optional<int64_t> UploadCap() const;

  // The round clock: closes a key step once every client answered or `now` passed its time. An
  // error (naming the step) means too few clients are left: the round cannot go on.
  absl::Status Advance(int64_t now);
  // Cohort member `i`'s message. Returns the answer when the message settles it, nullopt when the
  // answer is Answer's (after Advance); an error when the message breaks the protocol.
  absl::StatusOr<std::optional<v1::SecureAggregationResponse>> Receive(
      uint32_t i, const v1::SecureAggregationRequest& request);
  // What cohort member `i` does next, in the phase the round is in; `uploaded`: its masked update
  // was accepted.
  absl::StatusOr<v1::SecureAggregationResponse> Answer(uint32_t i, bool uploaded) const;

  // The aggregation thread's part. The protocol server, once (null after: its keys are spent).
  std::unique_ptr<crypto::SecAggServer> TakeServer() { return std::move(server_); }
  // Step 3 opens with `request` to its survivors.
  void OpenUnmasking(const v1::SecAggUnmaskingRequest& request);
  // The step 3 answers, once `expected` arrived or `time_up`, closing the step; nullopt while it
  // waits.
  std::optional<std::map<uint32_t, v1::SecAggUnmaskingResponse>> CollectUnmasking(size_t expected,
                                                                                  bool time_up);

 private:
  SecAggRound() = default;

  int64_t round_ = 0;
  Phase phase_ = Phase::kAdvertise;
  int64_t step_ms_ = 0;
  std::unique_ptr<crypto::SecAggServer> server_;  // null once the aggregation thread took it
  v1::SecureAggregationTask task_;                // without client_index
  std::vector<std::string> cohort_;               // index -> client id
  std::map<std::string, uint32_t> index_;
  std::set<uint32_t> advertised_, shared_;  // U1 and U2 as they fill
  std::vector<uint32_t> u1_, u2_;           // once fixed
  int64_t step_deadline_ms_ = 0;            // of the open key step
  // Published by the aggregation thread for step 3, and the answers it collects.
  v1::SecAggUnmaskingRequest unmasking_;
  std::set<uint32_t> survivors_;
  std::map<uint32_t, v1::SecAggUnmaskingResponse> unmasking_responses_;
};

}  // namespace fedlora
