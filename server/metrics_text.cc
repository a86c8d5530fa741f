// ServerMetrics' Prometheus text (server/metrics.h).
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/metrics.h"

namespace fedlora {
namespace {

void AppendMetric(std::string& out, const char* name, const char* type, const char* help,
                  int64_t value) {
  absl::StrAppend(&out, "# HELP fedlora_", name, " ", help, "\n# TYPE fedlora_", name, " ", type,
                  "\nfedlora_", name, " ", value, "\n");
}

}  // namespace

std::string ServerMetrics::ToPrometheusText() const {
  std::string out;
  AppendMetric(out, "rounds_committed_total", "counter", "Rounds aggregated and committed.",
               rounds_committed.load());
  AppendMetric(
      out, "rounds_abandoned_total", "counter",
      "Round attempts abandoned (too few updates by the deadline, or every selected site failed).",
      rounds_abandoned.load());
  AppendMetric(out, "clients_failed_total", "counter",
               "Clients that left on an error they could not get past (a broken dataset, a model "
               "of the wrong kind).",
               clients_failed.load());
  AppendMetric(out, "current_round", "gauge", "Round in progress (0 before the first).",
               current_round.load());
  AppendMetric(out, "clients_registered", "gauge", "Clients known to the server.",
               clients_registered.load());
  AppendMetric(out, "clients_live", "gauge", "Clients heard from within the heartbeat timeout.",
               clients_live.load());
  AppendMetric(out, "joins_total", "counter", "Successful Join calls.", joins.load());
  AppendMetric(out, "updates_accepted_total", "counter", "Updates accepted, each counted once.",
               updates_accepted.load());
  AppendMetric(out, "updates_rejected_total", "counter", "Upload attempts refused.",
               updates_rejected.load());
  AppendMetric(out, "updates_duplicate_total", "counter",
               "Re-sent uploads answered with the original ack.", updates_duplicate.load());
  AppendMetric(
      out, "updates_corrupt_total", "counter",
      "Accepted updates found corrupt or missing in the blob store at aggregation and left out.",
      updates_corrupt.load());
  AppendMetric(out, "upload_bytes_total", "counter", "Update bytes received in chunks.",
               upload_bytes.load());
  AppendMetric(out, "download_bytes_total", "counter", "Adapter bytes sent in chunks.",
               download_bytes.load());
  AppendMetric(out, "download_full_bytes_total", "counter",
               "Completed downloads as full adapters: a downlink delta chain counts the adapter it "
               "rebuilds.",
               download_full_bytes.load());
  AppendMetric(out, "update_fp32_bytes_total", "counter",
               "Accepted updates as dense fp32 values (4 bytes per adapter parameter each), before "
               "the run's codec.",
               update_fp32_bytes.load());
  AppendMetric(out, "store_bytes", "gauge",
               "Bytes of the store's files: database, blobs, partial uploads.", store_bytes.load());
  AppendMetric(out, "partial_uploads_discarded_total", "counter",
               "Partial uploads deleted because their round closed or they were refused.",
               partial_uploads_discarded.load());
  AppendMetric(out, "quota_refusals_total", "counter",
               "Uploads and reports refused for a per-client quota or the free-disk watermark.",
               quota_refusals.load());
  AppendMetric(out, "aggregation_failures_total", "counter", "Aggregation tries that failed.",
               aggregation_failures.load());
  AppendMetric(
      out, "secagg_implausible_sums_total", "counter",
      "Secure-aggregation sums refused as larger than their clipped updates can make them.",
      secagg_implausible_sums.load());
  AppendMetric(
      out, "secagg_misbehaving_clients_total", "counter",
      "Clients found revealing wrong secure-aggregation shares (each then sits out a round).",
      secagg_misbehaving_clients.load());
  AppendMetric(out, "uploads_streaming", "gauge", "Upload streams admitted and not yet ended.",
               uploads_streaming.load());
  AppendMetric(
      out, "tls_handshakes_refused_total", "counter",
      "TLS handshakes refused for the client certificate: none, not signed by the client CA, "
      "expired or not yet valid, not a client certificate, revoked, or a client id not allowed.",
      tls_handshakes_refused.load());
  if (const int64_t eps = dp_epsilon_micro.load(); eps >= 0) {
    absl::StrAppend(
        &out,
        "# HELP fedlora_dp_epsilon Privacy spent by the committed rounds (epsilon at "
        "privacy.dp.target_delta).\n# TYPE fedlora_dp_epsilon gauge\nfedlora_dp_epsilon ",
        absl::StrFormat("%.6f", static_cast<double>(eps) / 1e6), "\n");
  }
  return out;
}

}  // namespace fedlora
