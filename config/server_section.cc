// The server section: its defaults (config/defaults.h holds the values) and its checks of
// addresses, TLS, per-client limits, gRPC bounds, chunking and the store.
#include <algorithm>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "config/defaults.h"
#include "config/sections.h"
#include "proto/address.h"

namespace fedlora::config_internal {

void ApplyServerDefaults(v1::RunConfig* c) {
  auto* srv = c->mutable_server();
  if (srv->listen_address().empty()) srv->set_listen_address(kDefaultListenAddress);
  if (srv->store_dir().empty()) srv->set_store_dir(kDefaultStoreDir);
  if (!srv->has_chunk_size_bytes()) srv->set_chunk_size_bytes(kDefaultChunkSizeBytes);
  if (!srv->has_max_update_bytes()) srv->set_max_update_bytes(kDefaultMaxUpdateBytes);
  if (!srv->has_max_message_bytes()) srv->set_max_message_bytes(kDefaultMaxMessageBytes);
  if (!srv->has_max_client_bytes_per_round()) {
    srv->set_max_client_bytes_per_round(kDefaultClientBytesPerRoundUpdates *
                                        srv->max_update_bytes());
  }
  if (!srv->has_max_client_uploads_in_flight())
    srv->set_max_client_uploads_in_flight(kDefaultMaxClientUploadsInFlight);
  if (!srv->has_max_client_uploads_per_round())
    srv->set_max_client_uploads_per_round(kDefaultMaxClientUploadsPerRound);
  if (!srv->has_max_client_reports_per_round())
    srv->set_max_client_reports_per_round(kDefaultMaxClientReportsPerRound);
  if (!srv->has_max_metrics_per_report())
    srv->set_max_metrics_per_report(kDefaultMaxMetricsPerReport);
  if (!srv->has_min_free_disk_bytes()) srv->set_min_free_disk_bytes(kDefaultMinFreeDiskBytes);
  if (!srv->has_max_aggregation_attempts())
    srv->set_max_aggregation_attempts(kDefaultMaxAggregationAttempts);
  if (!srv->has_grpc_memory_bytes()) srv->set_grpc_memory_bytes(kDefaultGrpcMemoryBytes);
  if (!srv->has_grpc_max_threads()) srv->set_grpc_max_threads(kDefaultGrpcMaxThreads);
  if (!srv->has_max_concurrent_streams())
    srv->set_max_concurrent_streams(kDefaultMaxConcurrentStreams);
  if (!srv->has_max_client_downloads_in_flight())
    srv->set_max_client_downloads_in_flight(kDefaultMaxClientDownloadsInFlight);
  if (!srv->has_retain_rounds()) srv->set_retain_rounds(kDefaultRetainRounds);
}

namespace {

bool HasTls(const v1::ServerConfig& s) {
  const v1::TlsConfig& tls = s.tls();
  return !tls.cert_file().empty() || !tls.key_file().empty() || !tls.client_ca_file().empty();
}

// server.tls: all three files or none, and what needs them; the identity lists.
void ValidateTls(Problems& p, const v1::ServerConfig& s) {
  const v1::TlsConfig& tls = s.tls();
  const bool has_tls = HasTls(s);
  if (has_tls &&
      (tls.cert_file().empty() || tls.key_file().empty() || tls.client_ca_file().empty())) {
    p.Add(
        "server.tls needs cert_file, key_file and client_ca_file together: every client presents a "
        "certificate, "
        "and its CN is the client's identity (server-only TLS, with self-named clients, is not "
        "supported)");
  }
  if (!has_tls && (!tls.crl_file().empty() || tls.allowed_client_ids_size() > 0 ||
                   tls.operator_ids_size() > 0)) {
    p.Add(
        "server.tls.crl_file, allowed_client_ids and operator_ids need server.tls (cert_file, "
        "key_file, "
        "client_ca_file): without TLS no caller has a certificate");
  }
  auto check_ids = [&](const google::protobuf::RepeatedPtrField<std::string>& ids,
                       const char* field) {
    for (int i = 0; i < ids.size(); ++i) {
      const std::string& id = ids.Get(i);
      const bool ok =
          !id.empty() && id.size() <= 128 && std::all_of(id.begin(), id.end(), [](char ch) {
            return absl::ascii_isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '_' ||
                   ch == '-' || ch == '@';
          });
      if (!ok)
        p.Bad(absl::StrCat("server.tls.", field, "[", i, "]"), Quoted(id),
              "must be 1-128 characters of [A-Za-z0-9._@-]");
    }
  };
  check_ids(tls.allowed_client_ids(), "allowed_client_ids");
  check_ids(tls.operator_ids(), "operator_ids");
  if (s.insecure() && has_tls) p.Add("server.insecure and server.tls exclude each other");
}

// The listen, metrics and health addresses.
void ValidateAddresses(Problems& p, const v1::ServerConfig& s) {
  const bool has_tls = HasTls(s);
  // The plaintext rule is the server's (Server::Create, whatever sets the address): a loopback
  // address without TLS still needs server.insecure there; `fedlora simulate` sets it itself.
  std::string host;
  uint32_t port = 0;
  if (!SplitHostPort(s.listen_address(), &host, &port)) {
    p.Bad("server.listen_address", Quoted(s.listen_address()),
          "must be host:port with an explicit host (IPv6 in brackets) and a port 0-65535");
  } else if (!has_tls && !IsLoopbackHost(host)) {
    p.Bad("server.listen_address", Quoted(s.listen_address()),
          "is not a loopback address and needs server.tls.cert_file, key_file and client_ca_file "
          "(plaintext, "
          "with server.insecure, is for 127.0.0.1, [::1] and localhost only)");
  }
  if (!s.metrics_address().empty() && !SplitHostPort(s.metrics_address(), &host, &port)) {
    p.Bad("server.metrics_address", Quoted(s.metrics_address()),
          "must be host:port with an explicit host (IPv6 in brackets) and a port 0-65535");
  }
  if (!s.health_address().empty()) {
    if (!SplitHostPort(s.health_address(), &host, &port)) {
      p.Bad("server.health_address", Quoted(s.health_address()),
            "must be host:port with an explicit host (IPv6 in brackets) and a port 0-65535");
    } else if (port != 0 && (s.health_address() == s.listen_address() ||
                             s.health_address() == s.metrics_address())) {
      p.Bad("server.health_address", Quoted(s.health_address()),
            "must differ from server.listen_address and server.metrics_address");
    }
  }
}

// Per-client quotas, gRPC bounds, the store and chunking.
void ValidateLimits(Problems& p, const v1::ServerConfig& s) {
  if (s.max_client_bytes_per_round() < s.max_update_bytes()) {
    p.Bad("server.max_client_bytes_per_round", s.max_client_bytes_per_round(),
          absl::StrCat("is less than server.max_update_bytes (", s.max_update_bytes(),
                       "): no update could arrive"));
  }
  p.Range<uint32_t>("server.max_client_uploads_in_flight", s.max_client_uploads_in_flight(), 1, 64);
  p.Range<uint32_t>("server.max_client_uploads_per_round", s.max_client_uploads_per_round(), 1,
                    1000);
  p.Range<uint32_t>("server.max_client_reports_per_round", s.max_client_reports_per_round(), 1,
                    1000);
  p.Range<uint32_t>("server.max_metrics_per_report", s.max_metrics_per_report(), 0, 10'000);
  p.Range<uint32_t>("server.max_aggregation_attempts", s.max_aggregation_attempts(), 1, 100);
  p.Range<uint64_t>("server.grpc_memory_bytes", s.grpc_memory_bytes(), uint64_t{16} << 20,
                    uint64_t{64} << 30);
  p.Range<uint32_t>("server.grpc_max_threads", s.grpc_max_threads(), 4, 4096);
  p.Range<uint32_t>("server.max_concurrent_streams", s.max_concurrent_streams(), 4, 10'000);
  p.Range<uint32_t>("server.max_client_downloads_in_flight", s.max_client_downloads_in_flight(), 1,
                    64);
  p.Range<uint32_t>("server.retain_rounds", s.retain_rounds(), 0, 1'000'000);
  p.NonEmpty("server.store_dir", s.store_dir());
  p.Range<uint32_t>("server.chunk_size_bytes", s.chunk_size_bytes(), kMinChunkSizeBytes,
                    kMaxChunkSizeBytes);
  if (s.max_update_bytes() < s.chunk_size_bytes()) {
    p.Bad("server.max_update_bytes", s.max_update_bytes(),
          absl::StrCat("is less than server.chunk_size_bytes (", s.chunk_size_bytes(), ")"));
  }
  // gRPC takes its message limit as an int.
  constexpr uint64_t kMaxGrpcMessageBytes = (1ull << 31) - 1;
  uint64_t min_message = uint64_t{s.chunk_size_bytes()} + kChunkMessageOverheadBytes;
  if (s.max_message_bytes() < min_message || s.max_message_bytes() > kMaxGrpcMessageBytes) {
    p.Bad("server.max_message_bytes", s.max_message_bytes(),
          absl::StrCat("must be in [server.chunk_size_bytes + ", kChunkMessageOverheadBytes, " = ",
                       min_message, ", ", kMaxGrpcMessageBytes, "]"));
  }
}

}  // namespace

void ValidateServer(Problems& p, const v1::ServerConfig& s) {
  ValidateTls(p, s);
  ValidateAddresses(p, s);
  ValidateLimits(p, s);
}

}  // namespace fedlora::config_internal
