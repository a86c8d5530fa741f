// UploadAdmission alone: an upload header and a hand-built snapshot of the coordinator in, the
// decision out, with no server, no store and no lock. One admitted upload, the replays, and one
// refusal per check, each asserted by its status code and a fragment of its message.
#include "server/upload_admission.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fedlora {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kChunk = 4096;
constexpr uint64_t kUpdateBytes = 10000;  // three chunks

// The manifest's SHA-256.
std::string Blob() { return std::string(64, 'a'); }

UploadLimits Limits() {
  UploadLimits l;
  l.max_upload_bytes = 1 << 20;
  l.chunk_bytes = kChunk;
  l.max_client_uploads_in_flight = 2;
  l.max_client_uploads_per_round = 4;
  l.max_client_bytes_per_round = 4 << 20;
  l.min_free_disk_bytes = 1 << 20;
  return l;
}

v1::TensorSpec* AddTensor(v1::AdapterManifest* m, const std::string& name,
                          std::vector<int64_t> shape) {
  v1::TensorSpec* t = m->add_tensors();
  t->set_name(name);
  t->set_dtype("F32");
  for (int64_t d : shape) t->add_shape(d);
  return t;
}

// Client "alice"'s first upload of round 3, as the client SDK would send it.
v1::UploadHeader Header() {
  v1::UploadHeader h;
  h.set_upload_id("u1");
  h.set_round(3);
  h.set_task_id("r3-alice");
  h.set_num_examples(10);
  h.set_base_adapter_sha256("base-hash");
  v1::EncryptionSpec* enc = h.mutable_encryption();
  enc->set_scheme(v1::EncryptionSpec::X25519_HKDF_AES256GCM);
  enc->set_server_key_id("key-3");
  enc->set_ephemeral_public_key(std::string(32, 'e'));
  v1::AdapterManifest* m = h.mutable_manifest();
  m->set_sha256(Blob());
  m->set_total_bytes(kUpdateBytes);
  m->set_chunk_size_bytes(kChunk);
  m->set_num_chunks(3);
  AddTensor(m, "b", {1, 2});  // the manifest's order is free
  AddTensor(m, "a", {2});
  return h;
}

// An accepted upload row of `client` for the header's blob.
UploadRecord Accepted(const std::string& client) {
  UploadRecord r;
  r.upload_id = "u1";
  r.run_id = "run";
  r.round = 3;
  r.client_id = client;
  r.state = UploadState::kAccepted;
  r.blob_hash = Blob();
  r.chunks_received = 3;
  r.bytes = static_cast<int64_t>(kUpdateBytes);
  return r;
}

class UploadAdmissionTest : public ::testing::Test {
 protected:
  // Round 3 in training, alice selected with task r3-alice, nothing streaming, plenty of disk.
  UploadSnapshot Snapshot() {
    UploadSnapshot s;
    s.free_disk_bytes = 100 << 20;
    s.restored = true;
    s.run_id = "run";
    s.now_ms = 1000;
    UploadSnapshot::Round& r = s.round.emplace();
    r.round = 3;
    r.state = RoundState::kTraining;
    r.deadline_ms = 5000;
    r.selected = true;
    r.task_id = "r3-alice";
    r.trains_from = "base-hash";
    r.key_id = "key-3";
    s.last_committed_round = 2;
    s.spec = &spec_;
    s.client = UploadQuota{3, 0, 0, 0};
    return s;
  }

  UploadDecision Decide(const std::function<void(UploadSnapshot&, v1::UploadHeader&)>& change,
                        UploadLimits limits = Limits()) {
    UploadSnapshot s = Snapshot();
    v1::UploadHeader h = Header();
    change(s, h);
    return UploadAdmission(limits).Decide("alice", h, s);
  }

  const std::vector<TensorSpec> spec_ = {{"a", {2}}, {"b", {1, 2}}};  // sorted by name
};

TEST_F(UploadAdmissionTest, AdmitsANewUpload) {
  const UploadDecision d = Decide([](UploadSnapshot&, v1::UploadHeader&) {});
  ASSERT_TRUE(d.status.ok()) << d.status;
  EXPECT_FALSE(d.duplicate_ack.has_value());
  EXPECT_FALSE(d.quota_refused);
  EXPECT_EQ(d.quota_round, 3);
  EXPECT_TRUE(d.new_upload);
  EXPECT_EQ(d.reserved_bytes, static_cast<int64_t>(kUpdateBytes));
  EXPECT_EQ(d.record.upload_id, "u1");
  EXPECT_EQ(d.record.run_id, "run");
  EXPECT_EQ(d.record.round, 3);
  EXPECT_EQ(d.record.client_id, "alice");
  EXPECT_EQ(d.record.task_id, "r3-alice");
  EXPECT_EQ(d.record.num_examples, 10);
  EXPECT_EQ(d.record.state, UploadState::kReceiving);
}

TEST_F(UploadAdmissionTest, AResumeIsNotANewUpload) {
  const UploadDecision d = Decide([](UploadSnapshot& s, v1::UploadHeader& h) {
    UploadRecord row = Accepted("alice");
    row.state = UploadState::kReceiving;
    s.existing = row;
    s.client->uploads_this_round = 4;  // at the limit: a resume is not counted again
    s.client->bytes_this_round = (4 << 20) - 2000;
    h.set_start_chunk(2);  // the bytes already streamed are not counted again either
  });
  ASSERT_TRUE(d.status.ok()) << d.status;
  EXPECT_FALSE(d.new_upload);
}

TEST_F(UploadAdmissionTest, QuotasOfAnEarlierRoundStartAgain) {
  const UploadDecision d = Decide([](UploadSnapshot& s, v1::UploadHeader&) {
    s.client = UploadQuota{2, 4 << 20, 4, 1};
  });
  ASSERT_TRUE(d.status.ok()) << d.status;
  EXPECT_EQ(d.quota_round, 3);
}

TEST_F(UploadAdmissionTest, AReplayOfAnAcceptedUploadGetsItsAck) {
  // Even once its round has closed.
  const UploadDecision d = Decide([](UploadSnapshot& s, v1::UploadHeader&) {
    s.existing = Accepted("alice");
    s.round.reset();
    s.last_committed_round = 3;
  });
  ASSERT_TRUE(d.status.ok()) << d.status;
  ASSERT_TRUE(d.duplicate_ack.has_value());
  EXPECT_EQ(d.duplicate_ack->upload_id(), "u1");
  EXPECT_EQ(d.duplicate_ack->state(), v1::UPLOAD_STATE_ACCEPTED);
  EXPECT_EQ(d.duplicate_ack->chunks_acknowledged(), 3u);
  EXPECT_EQ(d.duplicate_ack->bytes_acknowledged(), kUpdateBytes);
  EXPECT_TRUE(d.duplicate_ack->duplicate());
  EXPECT_FALSE(d.quota_round.has_value());
}

TEST_F(UploadAdmissionTest, LimitsComeFromTheOptionsAndTheConfig) {
  ServerOptions options;
  v1::RunConfig config;
  config.mutable_privacy()->mutable_dp()->set_enabled(true);
  config.mutable_aggregation()->set_weight_by_examples(true);
  config.mutable_aggregation()->set_max_examples_per_client(7);
  const UploadLimits l = UploadLimitsFor(options, config);
  EXPECT_EQ(l.max_upload_bytes, options.max_upload_bytes);
  EXPECT_EQ(l.chunk_bytes, options.chunk_bytes);
  EXPECT_EQ(l.max_client_uploads_in_flight, options.max_client_uploads_in_flight);
  EXPECT_EQ(l.max_client_uploads_per_round, options.max_client_uploads_per_round);
  EXPECT_EQ(l.max_client_bytes_per_round, options.max_client_bytes_per_round);
  EXPECT_EQ(l.min_free_disk_bytes, options.min_free_disk_bytes);
  EXPECT_TRUE(l.one_example_each);
  EXPECT_TRUE(l.weight_by_examples);
  EXPECT_EQ(l.max_examples_per_client, 7u);
}

// One refusal per check, in the order Decide makes them.
struct Refusal {
  std::string name;
  std::function<void(UploadSnapshot&, v1::UploadHeader&)> change;
  absl::StatusCode code;
  std::string fragment;
  bool quota = false;  // counted as a quota refusal
};

std::vector<Refusal> Refusals() {
  using S = UploadSnapshot;
  using H = v1::UploadHeader;
  using C = absl::StatusCode;
  const int64_t round_bytes = 4 << 20;
  return {
      {"restoring", [](S& s, H&) { s.restored = false; }, C::kUnavailable,
       "server is restoring its state; retry"},
      {"another client's upload_id", [](S& s, H&) { s.existing = Accepted("bob"); },
       C::kPermissionDenied, "upload_id 'u1' belongs to another client"},
      {"another run's upload_id",
       [](S& s, H&) {
         UploadRecord r = Accepted("alice");
         r.run_id = "old-run";
         s.existing = r;
       },
       C::kPermissionDenied, "belongs to another client"},
      {"accepted for another blob",
       [](S& s, H& h) {
         s.existing = Accepted("alice");
         h.mutable_manifest()->set_sha256(std::string(64, 'b'));
       },
       C::kAlreadyExists, "upload_id 'u1' was accepted for blob aaaa"},
      {"refused before",
       [](S& s, H&) {
         s.rejected = S::Rejection{"alice", "tampered"};
       },
       C::kFailedPrecondition, "upload 'u1' was rejected: tampered"},
      {"refused before, another client's",
       [](S& s, H&) {
         s.rejected = S::Rejection{"bob", "tampered"};
       },
       C::kPermissionDenied, "belongs to another client"},
      {"run finished", [](S& s, H&) { s.finished = true; }, C::kFailedPrecondition,
       "the run is finished; no more updates are accepted"},
      {"stale round", [](S&, H& h) { h.set_round(2); }, C::kFailedPrecondition,
       "update is for round 2 but the current round is 3; it is stale"},
      {"no open round",
       [](S& s, H&) {
         s.round.reset();
         s.last_committed_round = 7;
       },
       C::kFailedPrecondition, "update is for round 3 but the current round is 7"},
      {"round aggregating", [](S& s, H&) { s.round->state = RoundState::kAggregating; },
       C::kFailedPrecondition, "round 3 is aggregating and no longer accepts updates"},
      {"not selected", [](S& s, H&) { s.round->selected = false; }, C::kPermissionDenied,
       "client 'alice' was not selected for round 3"},
      {"another task", [](S&, H& h) { h.set_task_id("r3-bob"); }, C::kPermissionDenied,
       "task 'r3-bob' of round 3 was not assigned to client 'alice'"},
      {"deadline passed", [](S& s, H&) { s.now_ms = 5000; }, C::kFailedPrecondition,
       "round 3 passed its deadline; the update is stale"},
      {"already accepted", [](S& s, H&) { s.round->accepted_upload = "u0"; }, C::kAlreadyExists,
       "client 'alice' already has update 'u0' accepted for round 3"},
      {"another base adapter", [](S&, H& h) { h.set_base_adapter_sha256("old-hash"); },
       C::kFailedPrecondition,
       "update is a delta from adapter old-hash but round 3 trains from base-hash"},
      {"no examples", [](S&, H& h) { h.set_num_examples(0); }, C::kInvalidArgument,
       "num_examples 0 is outside [1, "},
      {"not sealed", [](S&, H& h) { h.mutable_encryption()->set_scheme(v1::EncryptionSpec::NONE); },
       C::kInvalidArgument, "update is not sealed (encryption scheme NONE)"},
      {"sealed to another key",
       [](S&, H& h) { h.mutable_encryption()->set_server_key_id("key-2"); }, C::kInvalidArgument,
       "update is sealed to key 'key-2'; round 3's aggregation key is 'key-3'"},
      {"short ephemeral key",
       [](S&, H& h) { h.mutable_encryption()->set_ephemeral_public_key(std::string(31, 'e')); },
       C::kInvalidArgument, "encryption.ephemeral_public_key has 31 bytes, not 32"},
      {"manifest hash", [](S&, H& h) { h.mutable_manifest()->set_sha256("ABC"); },
       C::kInvalidArgument, "manifest.sha256 is not 64 lowercase hex digits"},
      {"too large", [](S&, H& h) { h.mutable_manifest()->set_total_bytes(2 << 20); },
       C::kResourceExhausted, "update of 2097152 bytes exceeds the limit of 1048576 bytes"},
      {"too small",
       [](S&, H& h) {
         h.mutable_manifest()->set_total_bytes(10);
         h.mutable_manifest()->set_num_chunks(1);
       },
       C::kInvalidArgument, "update of 10 bytes is shorter than a sealed 40-byte codec header"},
      {"chunk size", [](S&, H& h) { h.mutable_manifest()->set_chunk_size_bytes(1024); },
       C::kInvalidArgument, "manifest.chunk_size_bytes is 1024; this server uses 4096"},
      {"chunk count", [](S&, H& h) { h.mutable_manifest()->set_num_chunks(2); },
       C::kInvalidArgument, "manifest.num_chunks is 2 for 10000 bytes in chunks of 4096"},
      {"tensor count", [](S&, H& h) { h.mutable_manifest()->mutable_tensors()->RemoveLast(); },
       C::kInvalidArgument, "manifest lists 1 tensors; the adapter has 2"},
      {"unknown tensor", [](S&, H& h) { h.mutable_manifest()->mutable_tensors(0)->set_name("c"); },
       C::kInvalidArgument, "manifest tensor 'c' is not one of the tensors this run aggregates"},
      {"lora_A under lora.freeze_a",
       [](S&, H& h) {
         v1::TensorSpec* a = h.mutable_manifest()->add_tensors();
         a->set_name("q.lora_A.weight");
         a->set_dtype("F32");
       },
       C::kInvalidArgument,
       "manifest tensor 'q.lora_A.weight' is not one of the tensors this run aggregates (with "
       "lora.freeze_a no lora_A is uploaded: each stays at the initial adapter's values)"},
      {"tensor shape",
       [](S&, H& h) {
         v1::TensorSpec* b = h.mutable_manifest()->mutable_tensors(0);
         b->set_shape(0, 2);
         b->set_shape(1, 1);
       },
       C::kInvalidArgument, "tensor 'b' has shape [2,1]; the adapter's is [1,2]"},
      {"tensor dtype", [](S&, H& h) { h.mutable_manifest()->mutable_tensors(1)->set_dtype("F16"); },
       C::kInvalidArgument, "tensor 'a' is declared F16; decoded updates are F32"},
      {"codec",
       [](S&, H& h) {
         h.mutable_codec()->add_stages()->set_id(v1::CodecStage::ZSTD);
         h.mutable_codec()->add_stages()->set_id(v1::CodecStage::FP16);
       },
       C::kInvalidArgument, "codec stage 0: ZSTD must be the last stage"},
      {"already streaming", [](S& s, H&) { s.streaming = true; }, C::kAborted,
       "upload 'u1' is already streaming on another call; retry later"},
      {"unknown client", [](S& s, H&) { s.client.reset(); }, C::kUnauthenticated,
       "unknown client 'alice'"},
      {"uploads in flight", [](S& s, H&) { s.client->uploads_in_flight = 2; },
       C::kResourceExhausted, "client 'alice' already streams 2 uploads; the limit is 2", true},
      {"uploads per round", [](S& s, H&) { s.client->uploads_this_round = 4; },
       C::kResourceExhausted, "client 'alice' began 4 uploads in round 3; the limit is 4", true},
      {"bytes per round", [=](S& s, H&) { s.client->bytes_this_round = round_bytes - 9999; },
       C::kResourceExhausted,
       "client 'alice' streamed 4184305 bytes in round 3; this upload would pass the limit of "
       "4194304",
       true},
      {"free-disk watermark", [](S& s, H&) { s.free_disk_bytes = (1 << 20) + 9999; },
       C::kResourceExhausted,
       "the store's disk has 1058575 bytes free, 0 of them reserved for uploads streaming; an "
       "update of 10000 bytes would leave less than the watermark of 1048576",
       true},
      {"free disk reserved for other streams",
       [](S& s, H&) {
         s.free_disk_bytes = (1 << 20) + 10000;
         s.disk_reserved = 1;
       },
       C::kResourceExhausted, "1 of them reserved for uploads streaming", true},
  };
}

TEST_F(UploadAdmissionTest, RefusesEachCheck) {
  for (const Refusal& r : Refusals()) {
    SCOPED_TRACE(r.name);
    const UploadDecision d = Decide(r.change);
    EXPECT_EQ(d.status.code(), r.code) << d.status;
    EXPECT_THAT(d.status.message(), HasSubstr(r.fragment));
    EXPECT_EQ(d.quota_refused, r.quota);
    EXPECT_FALSE(d.duplicate_ack.has_value());
    EXPECT_EQ(d.reserved_bytes, 0);
  }
}

TEST_F(UploadAdmissionTest, EqualWeightsClaimOneExample) {
  UploadLimits limits = Limits();
  limits.one_example_each = true;
  UploadDecision d = Decide([](UploadSnapshot&, v1::UploadHeader&) {}, limits);
  EXPECT_EQ(d.status.code(), absl::StatusCode::kInvalidArgument) << d.status;
  EXPECT_THAT(d.status.message(),
              HasSubstr("num_examples 10: under secure aggregation or differential privacy"));
  d = Decide([](UploadSnapshot&, v1::UploadHeader& h) { h.set_num_examples(1); }, limits);
  EXPECT_TRUE(d.status.ok()) << d.status;
}

TEST_F(UploadAdmissionTest, TheQuotaRoundStartsOnlyOnceTheQuotasAreReached) {
  // Refused before the quotas: the client's counters are left alone.
  UploadDecision d = Decide([](UploadSnapshot& s, v1::UploadHeader&) {
    s.client = UploadQuota{2, 0, 0, 0};
    s.streaming = true;
  });
  EXPECT_FALSE(d.quota_round.has_value());
  d = Decide([](UploadSnapshot& s, v1::UploadHeader&) { s.client->uploads_in_flight = 2; });
  EXPECT_FALSE(d.quota_round.has_value());
  // Refused at a per-round quota: they count round 3 from now on, as when admitted.
  d = Decide([](UploadSnapshot& s, v1::UploadHeader&) { s.free_disk_bytes = 0; });
  EXPECT_EQ(d.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(d.quota_round, 3);
}

TEST_F(UploadAdmissionTest, TheFirstFailingCheckDecides) {
  // Not selected, with a bad manifest and no disk: the round binding comes first.
  const UploadDecision d = Decide([](UploadSnapshot& s, v1::UploadHeader& h) {
    s.round->selected = false;
    h.mutable_manifest()->set_sha256("ABC");
    s.free_disk_bytes = 0;
  });
  EXPECT_EQ(d.status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(d.status.message(), HasSubstr("was not selected"));
  EXPECT_FALSE(d.quota_refused);
}

}  // namespace
}  // namespace fedlora
