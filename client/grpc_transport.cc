#include "client/grpc_transport.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <optional>

#include "absl/strings/str_cat.h"
#include "client/rpc_status.h"
#include "core/file.h"
#include "core/status.h"
#include "crypto/grpc_log.h"
#include "crypto/key_signature.h"
#include "crypto/tls.h"
#include "crypto/tls_probe.h"
#include "fedlora/v1/federation.grpc.pb.h"
#include "proto/address.h"
#include "proto/wire.h"

namespace fedlora {
namespace {

class GrpcTransport final : public Transport {
 public:
  GrpcTransport(std::shared_ptr<grpc::Channel> channel, std::string plaintext_client_id,
                std::optional<crypto::AggregationKeyTrust> key_trust, crypto::TlsProbeOptions probe)
      : channel_(channel),
        stub_(v1::Federation::NewStub(channel)),
        plaintext_client_id_(std::move(plaintext_client_id)),
        key_trust_(std::move(key_trust)),
        probe_(std::move(probe)) {}

  absl::Status Join(const CallMeta& meta, const v1::JoinRequest& request,
                    v1::JoinResponse* response) override {
    auto ctx = Context(meta);
    return FromGrpcStatus(stub_->Join(ctx.get(), request, response));
  }
  absl::Status WaitForTask(const CallMeta& meta, const v1::WaitForTaskRequest& request,
                           v1::WaitForTaskResponse* response) override {
    auto ctx = Context(meta);
    return FromGrpcStatus(stub_->WaitForTask(ctx.get(), request, response));
  }
  absl::Status Heartbeat(const CallMeta& meta, const v1::HeartbeatRequest& request,
                         v1::HeartbeatResponse* response) override {
    auto ctx = Context(meta);
    return FromGrpcStatus(stub_->Heartbeat(ctx.get(), request, response));
  }
  absl::Status GetUploadStatus(const CallMeta& meta, const v1::UploadStatusRequest& request,
                               v1::UploadStatusResponse* response) override {
    auto ctx = Context(meta);
    return FromGrpcStatus(stub_->GetUploadStatus(ctx.get(), request, response));
  }
  absl::Status SecureAggregation(const CallMeta& meta, const v1::SecureAggregationRequest& request,
                                 v1::SecureAggregationResponse* response) override {
    auto ctx = Context(meta);
    return FromGrpcStatus(stub_->SecureAggregation(ctx.get(), request, response));
  }
  absl::Status ReportMetrics(const CallMeta& meta, const v1::MetricsReport& request,
                             v1::MetricsAck* response) override {
    auto ctx = Context(meta);
    return FromGrpcStatus(stub_->ReportMetrics(ctx.get(), request, response));
  }
  absl::Status Leave(const CallMeta& meta, const v1::LeaveRequest& request,
                     v1::LeaveResponse* response) override {
    auto ctx = Context(meta);
    return FromGrpcStatus(stub_->Leave(ctx.get(), request, response));
  }

  absl::Status DownloadAdapter(
      const CallMeta& meta, const v1::DownloadRequest& request,
      absl::FunctionRef<absl::Status(const v1::DownloadChunk&)> on_chunk) override {
    auto ctx = Context(meta);
    std::unique_ptr<grpc::ClientReader<v1::DownloadChunk>> reader =
        stub_->DownloadAdapter(ctx.get(), request);
    v1::DownloadChunk chunk;
    while (reader->Read(&chunk)) {
      absl::Status s = on_chunk(chunk);
      if (!s.ok()) {
        ctx->TryCancel();
        reader->Finish();
        return s;
      }
    }
    return FromGrpcStatus(reader->Finish());
  }

  absl::Status UploadUpdate(const CallMeta& meta, const v1::UploadChunk& header,
                            absl::FunctionRef<bool(v1::UploadChunk*)> next,
                            v1::UploadAck* ack) override {
    auto ctx = Context(meta);
    std::unique_ptr<grpc::ClientWriter<v1::UploadChunk>> writer =
        stub_->UploadUpdate(ctx.get(), ack);
    bool ok = writer->Write(header);
    v1::UploadChunk message;
    while (ok && next(&message)) ok = writer->Write(message);
    if (ok) writer->WritesDone();
    return FromGrpcStatus(writer->Finish());
  }

  absl::Status ExplainUnavailable(const absl::Status& failure) override {
    if (channel_->GetState(false) == GRPC_CHANNEL_READY) return failure;
    return crypto::ExplainConnectionFailure(failure, probe_);
  }
  const crypto::AggregationKeyTrust* KeyTrust() const override {
    return key_trust_.has_value() ? &*key_trust_ : nullptr;
  }

 private:
  // A context with the identity/session metadata and a deadline.
  std::unique_ptr<grpc::ClientContext> Context(const CallMeta& meta) const {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() +
                      std::chrono::milliseconds(meta.deadline_ms));
    if (!plaintext_client_id_.empty()) ctx->AddMetadata(kClientIdMetadataKey, plaintext_client_id_);
    if (!meta.session.empty()) ctx->AddMetadata(kSessionMetadataKey, meta.session);
    return ctx;
  }

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Federation::Stub> stub_;
  const std::string plaintext_client_id_;  // sent without TLS only
  // With TLS: whose signature a round's aggregation key must carry (crypto/key_signature.h).
  const std::optional<crypto::AggregationKeyTrust> key_trust_;
  const crypto::TlsProbeOptions probe_;  // the channel's address, CA, certificate and key
};

// The aggregation key's trust and the probe's files under TLS.
absl::Status LoadTlsTrust(const ClientOptions& options, crypto::AggregationKeyTrust* trust,
                          crypto::TlsProbeOptions* probe) {
  FEDLORA_ASSIGN_OR_RETURN(trust->root_ca_pem, ReadFileToString(options.tls.root_ca_file));
  uint32_t port = 0;
  if (!options.tls.server_name_override.empty()) {
    trust->expected_host = options.tls.server_name_override;
  } else if (!SplitHostPort(options.server_address, &trust->expected_host, &port)) {
    return absl::InvalidArgumentError(
        absl::StrCat("server address '", options.server_address, "' is not host:port"));
  }
  trust->pin_sha256_hex = options.tls.server_key_pin;
  if (!trust->pin_sha256_hex.empty() &&
      (trust->pin_sha256_hex.size() != 64 ||
       trust->pin_sha256_hex.find_first_not_of("0123456789abcdef") != std::string::npos)) {
    return absl::InvalidArgumentError(
        "ClientTlsOptions.server_key_pin must be 64 lowercase hex digits (a SHA-256)");
  }
  probe->root_ca_pem = trust->root_ca_pem;
  FEDLORA_ASSIGN_OR_RETURN(probe->cert_pem, ReadFileToString(options.tls.cert_file));
  FEDLORA_ASSIGN_OR_RETURN(probe->key_pem, ReadFileToString(options.tls.key_file));
  probe->server_name = options.tls.server_name_override;
  probe->ca_label = absl::StrCat("the CA file ", options.tls.root_ca_file);
  probe->cert_label = absl::StrCat("this site's certificate ", options.tls.cert_file);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Transport>> CreateGrpcTransport(const ClientOptions& options) {
  crypto::RouteGrpcLogs();  // gRPC's lines in this log; the handshake failures the probe explains
                            // at DEBUG
  std::shared_ptr<grpc::ChannelCredentials> creds;
  std::optional<crypto::AggregationKeyTrust> key_trust;
  crypto::TlsProbeOptions probe;
  probe.address = options.server_address;
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  // Keepalive pings every 30 s (the server tolerates one per 10 s): keeps NAT bindings open during
  // long local training.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 30'000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10'000);
  if (options.tls.enabled()) {
    if (options.insecure)
      return absl::InvalidArgumentError("ClientOptions.insecure and TLS exclude each other");
    if (options.tls.root_ca_file.empty() || options.tls.cert_file.empty() ||
        options.tls.key_file.empty()) {
      return absl::InvalidArgumentError(
          "TLS needs root_ca_file, cert_file and key_file: the server identifies clients by their "
          "certificate");
    }
    // Checked up front: the files parse, the root is a CA, the key belongs to the certificate.
    FEDLORA_ASSIGN_OR_RETURN(
        creds, crypto::ClientChannelCredentials(options.tls.root_ca_file, options.tls.cert_file,
                                                options.tls.key_file));
    if (!options.tls.server_name_override.empty()) {
      args.SetSslTargetNameOverride(options.tls.server_name_override);
    }
    crypto::AggregationKeyTrust trust;
    FEDLORA_RETURN_IF_ERROR(LoadTlsTrust(options, &trust, &probe));
    key_trust = std::move(trust);
  } else {
    FEDLORA_RETURN_IF_ERROR(
        CheckPlaintextAllowed(options.server_address, options.insecure, "server address"));
    if (options.client_id.empty()) {
      return absl::InvalidArgumentError("ClientOptions.client_id is required without TLS");
    }
    creds = grpc::InsecureChannelCredentials();
  }
  auto channel = grpc::CreateCustomChannel(options.server_address, creds, args);
  return std::unique_ptr<Transport>(
      new GrpcTransport(std::move(channel), options.tls.enabled() ? "" : options.client_id,
                        std::move(key_trust), std::move(probe)));
}

}  // namespace fedlora
