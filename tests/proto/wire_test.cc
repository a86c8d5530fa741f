// Checks of the wire contract itself: the services expose exactly the documented methods with the
// documented streaming directions, messages survive serialization, and field numbers stay put.
#include "proto/wire.h"

#include <string>
#include <utility>
#include <vector>

#include "fedlora/v1/admin.grpc.pb.h"
#include "fedlora/v1/admin.pb.h"
#include "fedlora/v1/common.pb.h"
#include "fedlora/v1/config.pb.h"
#include "fedlora/v1/federation.grpc.pb.h"
#include "fedlora/v1/federation.pb.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"

namespace fedlora {
namespace {

using ::google::protobuf::Descriptor;
using ::google::protobuf::DescriptorPool;
using ::google::protobuf::EnumDescriptor;
using ::google::protobuf::FileDescriptor;
using ::google::protobuf::MethodDescriptor;
using ::google::protobuf::ServiceDescriptor;
using ::google::protobuf::util::MessageDifferencer;

enum class Streaming { kUnary, kServer, kClient, kBidi };

struct ExpectedMethod {
  std::string name;
  std::string input;   // full message name
  std::string output;  // full message name
  Streaming streaming;
};

Streaming StreamingOf(const MethodDescriptor* m) {
  if (m->client_streaming() && m->server_streaming()) return Streaming::kBidi;
  if (m->client_streaming()) return Streaming::kClient;
  if (m->server_streaming()) return Streaming::kServer;
  return Streaming::kUnary;
}

void ExpectExactMethods(const std::string& service_name, const std::vector<ExpectedMethod>& want) {
  const ServiceDescriptor* service =
      DescriptorPool::generated_pool()->FindServiceByName(service_name);
  ASSERT_NE(service, nullptr) << service_name;
  ASSERT_EQ(service->method_count(), static_cast<int>(want.size())) << service->DebugString();
  for (int i = 0; i < service->method_count(); ++i) {
    const MethodDescriptor* m = service->method(i);
    SCOPED_TRACE(m->full_name());
    EXPECT_EQ(m->name(), want[i].name);
    EXPECT_EQ(m->input_type()->full_name(), want[i].input);
    EXPECT_EQ(m->output_type()->full_name(), want[i].output);
    EXPECT_EQ(StreamingOf(m), want[i].streaming);
  }
}

TEST(WireTest, FederationServiceHasExactlyTheDocumentedMethods) {
  EXPECT_STREQ(v1::Federation::service_full_name(), "fedlora.v1.Federation");
  ExpectExactMethods(
      v1::Federation::service_full_name(),
      {
          {"Join", "fedlora.v1.JoinRequest", "fedlora.v1.JoinResponse", Streaming::kUnary},
          {"WaitForTask", "fedlora.v1.WaitForTaskRequest", "fedlora.v1.WaitForTaskResponse",
           Streaming::kUnary},
          {"Heartbeat", "fedlora.v1.HeartbeatRequest", "fedlora.v1.HeartbeatResponse",
           Streaming::kUnary},
          {"DownloadAdapter", "fedlora.v1.DownloadRequest", "fedlora.v1.DownloadChunk",
           Streaming::kServer},
          {"UploadUpdate", "fedlora.v1.UploadChunk", "fedlora.v1.UploadAck", Streaming::kClient},
          {"GetUploadStatus", "fedlora.v1.UploadStatusRequest", "fedlora.v1.UploadStatusResponse",
           Streaming::kUnary},
          {"ReportMetrics", "fedlora.v1.MetricsReport", "fedlora.v1.MetricsAck", Streaming::kUnary},
          {"Leave", "fedlora.v1.LeaveRequest", "fedlora.v1.LeaveResponse", Streaming::kUnary},
          {"SecureAggregation", "fedlora.v1.SecureAggregationRequest",
           "fedlora.v1.SecureAggregationResponse", Streaming::kUnary},
      });
}

TEST(WireTest, AdminServiceHasExactlyTheDocumentedMethods) {
  EXPECT_STREQ(v1::Admin::service_full_name(), "fedlora.v1.Admin");
  ExpectExactMethods(v1::Admin::service_full_name(),
                     {
                         {"GetStatus", "fedlora.v1.GetStatusRequest",
                          "fedlora.v1.GetStatusResponse", Streaming::kUnary},
                         {"ListClients", "fedlora.v1.ListClientsRequest",
                          "fedlora.v1.ListClientsResponse", Streaming::kUnary},
                         {"BlockClient", "fedlora.v1.BlockClientRequest",
                          "fedlora.v1.BlockClientResponse", Streaming::kUnary},
                     });
}

// Health comes from grpc.health.v1; the project's files must not define their own.
TEST(WireTest, NoServicesBeyondFederationAndAdmin) {
  const DescriptorPool* pool = DescriptorPool::generated_pool();
  int services = 0;
  for (const char* file :
       {"fedlora/v1/common.proto", "fedlora/v1/config.proto", "fedlora/v1/secure_aggregation.proto",
        "fedlora/v1/federation.proto", "fedlora/v1/admin.proto"}) {
    const FileDescriptor* fd = pool->FindFileByName(file);
    ASSERT_NE(fd, nullptr) << file;
    EXPECT_EQ(fd->package(), "fedlora.v1");
    services += fd->service_count();
  }
  EXPECT_EQ(services, 2);
  EXPECT_EQ(pool->FindServiceByName("fedlora.v1.Health"), nullptr);
}

void CollectEnums(const Descriptor* d, std::vector<const EnumDescriptor*>* out) {
  for (int i = 0; i < d->enum_type_count(); ++i) out->push_back(d->enum_type(i));
  for (int i = 0; i < d->nested_type_count(); ++i) CollectEnums(d->nested_type(i), out);
}

// Every enum's zero value means "unset" so that a field a peer did not send is never mistaken for
// a real choice (see common.proto).
TEST(WireTest, EveryEnumStartsWithUnspecified) {
  std::vector<const EnumDescriptor*> enums;
  for (const FileDescriptor* fd :
       {v1::TensorSpec::descriptor()->file(), v1::RunConfig::descriptor()->file(),
        v1::SecAggParams::descriptor()->file(), v1::JoinRequest::descriptor()->file(),
        v1::GetStatusRequest::descriptor()->file()}) {
    for (int i = 0; i < fd->enum_type_count(); ++i) enums.push_back(fd->enum_type(i));
    for (int i = 0; i < fd->message_type_count(); ++i) CollectEnums(fd->message_type(i), &enums);
  }
  EXPECT_GE(enums.size(), 14u);  // the 14 enums of today; proves the walk found them
  for (const EnumDescriptor* e : enums) {
    const auto* zero = e->FindValueByNumber(0);
    ASSERT_NE(zero, nullptr) << e->full_name();
    EXPECT_THAT(zero->name(), ::testing::EndsWith("UNSPECIFIED")) << e->full_name();
  }
}

v1::UploadChunk SampleHeader() {
  v1::UploadChunk chunk;
  v1::UploadHeader* h = chunk.mutable_header();
  h->set_upload_id("5f0c6a1e9b3d4c2aa1b2c3d4e5f60718");
  h->set_round(7);
  h->set_task_id("r7-client-3");
  h->set_num_examples(412);
  v1::CodecStage* topk = h->mutable_codec()->add_stages();
  topk->set_id(v1::CodecStage::TOPK);
  topk->set_version(kCodecStageVersion);
  topk->mutable_top_k()->set_fraction(0.05);
  topk->mutable_top_k()->set_error_feedback(true);
  v1::CodecStage* zstd = h->mutable_codec()->add_stages();
  zstd->set_id(v1::CodecStage::ZSTD);
  zstd->set_version(kCodecStageVersion);
  zstd->mutable_zstd()->set_level(3);
  h->mutable_encryption()->set_scheme(v1::EncryptionSpec::X25519_HKDF_AES256GCM);
  h->mutable_encryption()->set_ephemeral_public_key(std::string(32, '\x7f'));
  h->mutable_encryption()->set_server_key_id("k1");
  v1::AdapterManifest* m = h->mutable_manifest();
  v1::TensorSpec* a = m->add_tensors();
  a->set_name("encoder.layer.0.attention.self.query.lora_A.weight");
  a->set_dtype("F32");
  a->add_shape(8);
  a->add_shape(384);
  m->set_total_bytes(3'000'001);
  m->set_sha256(std::string(64, 'a'));
  m->set_chunk_size_bytes(1u << 20);
  m->set_num_chunks(3);
  m->set_round(7);
  h->set_base_adapter_sha256(std::string(64, 'b'));
  h->set_start_chunk(0);
  return chunk;
}

TEST(WireTest, UploadChunksSurviveSerialization) {
  v1::UploadChunk data_chunk;
  v1::UploadData* d = data_chunk.mutable_data();
  d->set_chunk_index(2);
  d->set_offset_bytes(2u << 20);
  // Binary payload with NULs and high bytes: bytes fields must carry them unchanged.
  d->set_data(std::string("\x00\x01\xff\xfe\x00payload", 12));
  d->set_sha256(std::string(64, 'c'));

  for (const v1::UploadChunk& original : {SampleHeader(), data_chunk}) {
    std::string wire;
    ASSERT_TRUE(original.SerializeToString(&wire));
    v1::UploadChunk parsed;
    ASSERT_TRUE(parsed.ParseFromString(wire));
    EXPECT_EQ(parsed.kind_case(), original.kind_case());
    EXPECT_TRUE(MessageDifferencer::Equals(original, parsed)) << parsed.DebugString();
  }
  v1::UploadChunk parsed;
  ASSERT_TRUE(parsed.ParseFromString(data_chunk.SerializeAsString()));
  EXPECT_EQ(parsed.data().data().size(), 12u);
  EXPECT_EQ(parsed.data().data()[2], '\xff');
}

// Known bytes for a DownloadChunk: guards the field numbers and types of the hot-path message,
// which peers built from another commit must still read. Fields: 1 varint, 2 varint, 3 bytes, 4
// string.
TEST(WireTest, DownloadChunkEncodingIsStable) {
  v1::DownloadChunk chunk;
  chunk.set_chunk_index(2);
  chunk.set_offset_bytes(2048);
  chunk.set_data("ab");
  chunk.set_sha256("x");
  const std::string expected(
      "\x08\x02\x10\x80\x10\x1a\x02"
      "ab"
      "\x22\x01"
      "x",
      12);
  EXPECT_EQ(chunk.SerializeAsString(), expected);
}

// The same for the upload header's identity fields (upload_id = 1, round = 2, task_id = 3,
// num_examples = 4), nested as field 1 of UploadChunk.
TEST(WireTest, UploadHeaderEncodingIsStable) {
  v1::UploadChunk chunk;
  chunk.mutable_header()->set_upload_id("u");
  chunk.mutable_header()->set_round(3);
  chunk.mutable_header()->set_task_id("t");
  chunk.mutable_header()->set_num_examples(300);
  const std::string expected(
      "\x0a\x0b"
      "\x0a\x01u"
      "\x10\x03"
      "\x1a\x01t"
      "\x20\xac\x02",
      13);
  EXPECT_EQ(chunk.SerializeAsString(), expected);
}

TEST(WireTest, WaitForTaskOutcomesAreExclusive) {
  v1::WaitForTaskResponse response;
  response.mutable_retry_later()->set_retry_after_seconds(5);
  response.mutable_task()->set_round(1);  // replaces retry_later
  EXPECT_EQ(response.outcome_case(), v1::WaitForTaskResponse::kTask);
  EXPECT_FALSE(response.has_retry_later());
}

TEST(WireTest, JoinResponseCarriesTheRedactableRunConfig) {
  const Descriptor* join = v1::JoinResponse::descriptor();
  const auto* field = join->FindFieldByName("run_config");
  ASSERT_NE(field, nullptr);
  EXPECT_EQ(field->message_type(), v1::RunConfig::descriptor());
  for (const char* name : {"session_token", "limits", "client_id", "protocol_version"}) {
    EXPECT_NE(join->FindFieldByName(name), nullptr) << name;
  }
  // Identity never travels in the request body.
  const Descriptor* request = v1::JoinRequest::descriptor();
  for (int i = 0; i < request->field_count(); ++i) {
    EXPECT_THAT(request->field(i)->name(), ::testing::Not(::testing::HasSubstr("client_id")));
  }
}

TEST(WireTest, MetadataKeysAreValidGrpcKeys) {
  for (const std::string key : {kSessionMetadataKey, kClientIdMetadataKey}) {
    for (char c : key) {
      EXPECT_TRUE((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
                  c == '.')
          << key;
    }
    EXPECT_FALSE(key.ends_with("-bin")) << key << " would be treated as binary metadata";
  }
}

}  // namespace
}  // namespace fedlora
