#include "client/health_check.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/wire_format_lite.h>
#include <grpcpp/client_context.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/support/byte_buffer.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "client/rpc_status.h"

namespace fedlora {
namespace {

constexpr uint32_t kServiceTag =
    (1 << 3) | 2;  // HealthCheckRequest.service: field 1, length-delimited
constexpr uint32_t kStatusTag = (1 << 3) | 0;  // HealthCheckResponse.status: field 1, varint

std::string EncodeRequest(const std::string& service) {
  std::string out;
  if (service.empty()) return out;  // proto3: the default value is not written
  google::protobuf::io::StringOutputStream stream(&out);
  google::protobuf::io::CodedOutputStream coded(&stream);
  coded.WriteTag(kServiceTag);
  coded.WriteVarint32(static_cast<uint32_t>(service.size()));
  coded.WriteString(service);
  return out;
}

absl::StatusOr<HealthStatus> DecodeResponse(const std::string& bytes) {
  google::protobuf::io::CodedInputStream coded(reinterpret_cast<const uint8_t*>(bytes.data()),
                                               static_cast<int>(bytes.size()));
  uint64_t status = 0;  // absent field: UNKNOWN
  while (uint32_t tag = coded.ReadTag()) {
    if (tag == kStatusTag) {
      if (!coded.ReadVarint64(&status))
        return absl::DataLossError("health response: truncated status");
    } else if (!google::protobuf::internal::WireFormatLite::SkipField(&coded, tag)) {
      return absl::DataLossError("health response: malformed field");
    }
  }
  if (!coded.ConsumedEntireMessage())
    return absl::DataLossError("health response: malformed message");
  if (status > 3)
    return absl::DataLossError(absl::StrCat("health response: unknown serving status ", status));
  return static_cast<HealthStatus>(status);
}

}  // namespace

const char* HealthStatusName(HealthStatus status) {
  switch (status) {
    case HealthStatus::kServing:
      return "SERVING";
    case HealthStatus::kNotServing:
      return "NOT_SERVING";
    case HealthStatus::kServiceUnknown:
      return "SERVICE_UNKNOWN";
    case HealthStatus::kUnknown:
      break;
  }
  return "UNKNOWN";
}

absl::StatusOr<HealthStatus> CheckHealth(const std::shared_ptr<grpc::Channel>& channel,
                                         const std::string& service, int64_t deadline_ms) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(deadline_ms));
  const std::string request_bytes = EncodeRequest(service);
  grpc::Slice slice(request_bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  grpc::Status status;
  grpc::CompletionQueue cq;
  auto call = stub.PrepareUnaryCall(&ctx, "/grpc.health.v1.Health/Check", request, &cq);
  call->StartCall();
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  const bool got = cq.Next(&tag, &ok);
  cq.Shutdown();
  void* drained_tag = nullptr;
  bool drained_ok = false;
  while (cq.Next(&drained_tag, &drained_ok)) {
  }
  if (!got || !ok) return absl::InternalError("health check: the call did not complete");
  if (!status.ok()) {
    absl::Status s = FromGrpcStatus(status);
    return absl::Status(s.code(), absl::StrCat("grpc.health.v1.Health/Check: ", s.message()));
  }
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return absl::DataLossError("health response: unreadable");
  std::string bytes;
  for (const grpc::Slice& s : slices)
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return DecodeResponse(bytes);
}

}  // namespace fedlora
