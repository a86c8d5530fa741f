// Fuzzes the aggregation server's RPC handlers (server/services.h and everything behind them) with
// messages built from the fuzz input, as a hostile or broken client would send them.
// Over 600 lines, not split: one harness (a script of calls over shared sites and links) built
// three ways; the certificate and call helpers would move to fuzz/ headers only for it.
//
// One fedlora Server per process (Server::Create, plaintext on 127.0.0.1 as the tests run it, the
// store on a private temporary directory), called over a loopback channel: Server does not expose
// its grpc::Server, so grpc::Server::InProcessChannel is out of reach, and the Admin service
// answers loopback peers only, which an in-process channel's "inproc" peer is not. The server runs
// in this process, so ASan and UBSan watch its handler threads too.
//
// Each input is a short script of calls (FuzzedDataProvider): which RPC, which of a few sites
// (client ids) or a fuzzed identity, the session token or a fuzzed one, and the request, parsed
// from input bytes as a serialized message and then, when the input says so, given the values a
// real client would know (its task id and round, the adapter hash, chunk hashes). Uploads can be
// honest (an encoded update of the adapter's shapes, sealed to the run's key, chunked as the
// server asks), or carry fuzzed bytes, sealed or not, with fuzzed headers and chunks. Raw bytes
// are also sent to every method unparsed (grpc::GenericStub), so that the server's own message
// parsing sees garbage. Every call has a deadline.
//
// The sites keep their sessions and tasks from one input to the next, as the server keeps its
// state: an input that makes the server fail may need the ones before it to do so again.
//
// Built three times: fuzz_rpc runs a plain FedAvg federation; fuzz_rpc_private
// (FEDLORA_FUZZ_RPC_PRIVATE) runs SecAgg+ with distributed DP, so that SecureAggregation requests,
// the refusals of plaintext uploads and metrics, and the clipped, equally weighted path are what
// the calls meet, and it opens the plaintext health port too, which gets raw health requests;
// fuzz_rpc_tls (FEDLORA_FUZZ_RPC_TLS) runs the plain federation over mutual TLS: each site calls
// with its own certificate (the claimed id in the metadata is then ignored), strangers with a
// certificate of an id no site uses, and fuzzed identities with the operator's certificate.
#include <fuzzer/FuzzedDataProvider.h>
#include <google/protobuf/stubs/logging.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <sanitizer/common_interface_defs.h>
#include <sanitizer/lsan_interface.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "compression/codec.h"
#include "compression/update_io.h"
#include "config/config_io.h"
#include "core/file.h"
#include "core/logging.h"
#include "core/sha256.h"
#include "crypto/certs.h"
#include "crypto/sealed_update.h"
#include "fedlora/v1/admin.grpc.pb.h"
#include "fedlora/v1/federation.grpc.pb.h"
#include "fuzz/fuzz_util.h"
#include "proto/wire.h"
#include "server/options.h"
#include "server/server.h"

namespace fedlora {
namespace {

constexpr int kSites = 4;
constexpr int kMaxCallsPerInput = 8;
constexpr int64_t kDeadlineMs = 2000;
constexpr int64_t kUploadDeadlineMs = 5000;
constexpr int64_t kWatchDeadlineMs = 100;
constexpr int kChunkBytes = 1024;

// The adapter the run federates: small, so that an update is ~9 chunks.
std::vector<UpdateTensor> InitialAdapter() {
  std::vector<UpdateTensor> a = {{"classifier.weight", {3, 64}, {}},
                                 {"layer.0.query.lora_A.weight", {16, 64}, {}},
                                 {"layer.0.query.lora_B.weight", {64, 16}, {}}};
  for (UpdateTensor& t : a) {
    t.values.resize(static_cast<size_t>(t.shape[0] * t.shape[1]));
    for (size_t i = 0; i < t.values.size(); ++i)
      t.values[i] = 0.01f * static_cast<float>((i * 37) % 17) - 0.08f;
  }
  return a;
}

struct Site {
  std::string id;
  std::string session;
  v1::JoinResponse join;
  std::optional<v1::TrainTask> task;
  std::vector<std::string> upload_ids;  // ids this site has used, to resume or repeat
};

// One connection to the server and its stubs.
struct Link {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Federation::Stub> stub;
  std::unique_ptr<v1::Admin::Stub> admin;
  std::unique_ptr<grpc::GenericStub> generic;
};

// links[i < kSites]: site i's own (TLS only); links[kStranger]: everyone else's without TLS, a
// stranger's certificate with it; links[kOperator]: the operator's certificate (TLS only).
constexpr int kStranger = kSites;
constexpr int kOperator = kSites + 1;

struct Federation {
  std::string dir;
  std::unique_ptr<Server> server;
  Link links[kSites + 2];
  std::shared_ptr<grpc::Channel> health_channel;  // the health port, where there is one
  std::unique_ptr<grpc::GenericStub> health;
  Site sites[kSites];
  std::vector<std::string> adapter_hashes;  // every adapter hash the server has named
};

Federation* g = nullptr;

// At exit: the server stops (its threads must not outlive the globals they use), its store goes,
// and LeakSanitizer looks for what the run leaked; a leak fails the process (exit 1). scripts/fuzz.sh
// runs this harness with libFuzzer's per-input leak check off (-detect_leaks=0, which also turns
// off LSan's own check at exit): the server's threads allocate beside each input, so libFuzzer would
// re-run nearly every input under a full heap scan. A crashing process skips this; see MakeStoreDir.
void Stop() {
  if (g == nullptr) return;
  // FEDLORA_FUZZ_MEMPROFILE=1: where the live heap is, by allocation stack, before the server stops
  // (to tell the server's own state from the fuzzer's when the RSS grows over a long run).
  if (const char* p = std::getenv("FEDLORA_FUZZ_MEMPROFILE"); p != nullptr && *p == '1') {
    __sanitizer_print_memory_profile(90, 20);
  }
  g->health.reset();
  g->health_channel.reset();
  for (Link& l : g->links) l = Link{};
  if (g->server != nullptr) g->server->Shutdown();
  g->server.reset();
  std::error_code ec;
  if (!g->dir.empty()) std::filesystem::remove_all(g->dir, ec);
  if (__lsan_do_recoverable_leak_check() != 0) {
    std::fprintf(stderr,
                 "fuzz_rpc: LeakSanitizer found leaks after the server shut down (report above)\n");
    std::_Exit(1);
  }
}

// A private directory for the store under fuzz::ScratchBase(). Its name holds the pid: a process
// that crashed cannot remove its own, so each start removes those of dead ones.
std::string MakeStoreDir() {
  const std::string base = fedlora::fuzz::ScratchBase();
  const std::string prefix = "fedlora_fuzz_rpc_";
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(base, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string pid =
        name.substr(prefix.size(), name.find('_', prefix.size()) - prefix.size());
    if (!pid.empty() && !std::filesystem::exists("/proc/" + pid))
      std::filesystem::remove_all(entry.path(), ec);
  }
  std::string tmpl = base + "/" + prefix + std::to_string(getpid()) + "_XXXXXX";
  FUZZ_CHECK(mkdtemp(tmpl.data()) != nullptr, "mkdtemp " + tmpl);
  return tmpl;
}

#ifdef FEDLORA_FUZZ_RPC_TLS
// The certificate's id of links[i].
std::string CertName(int i) {
  if (i < kSites) return "site-" + std::to_string(i);
  return i == kStranger ? "stranger" : "ops";
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A CA, the server's certificate for 127.0.0.1, and one client certificate per link, as PEM files
// in `dir` (fedlora's own certificate tooling, as `fedlora certs dev` makes them).
void MakeCertificates(const std::string& dir) {
  std::filesystem::create_directories(dir);
  const int64_t until = static_cast<int64_t>(std::time(nullptr)) + 30 * 86'400;
  auto ca = crypto::CreateCertificateAuthority({.common_name = "fuzz-ca",
                                                .dns_names = {},
                                                .ip_addresses = {},
                                                .not_before_unix_s = 0,
                                                .not_after_unix_s = until});
  FUZZ_CHECK(ca.ok(), ca.status());
  auto write = [&](const std::string& name, const crypto::PemPair& pair) {
    FUZZ_CHECK(WriteFileAtomically(dir + "/" + name + ".pem", pair.cert_pem).ok(),
               "writing " + name + ".pem");
    FUZZ_CHECK(WriteFileAtomically(dir + "/" + name + ".key", pair.key_pem).ok(),
               "writing " + name + ".key");
  };
  write("ca", *ca);
  auto server = crypto::IssueServerCertificate(*ca, {.common_name = "localhost",
                                                     .dns_names = {"localhost"},
                                                     .ip_addresses = {"127.0.0.1"},
                                                     .not_before_unix_s = 0,
                                                     .not_after_unix_s = until});
  FUZZ_CHECK(server.ok(), server.status());
  write("server", *server);
  for (int i = 0; i < kSites + 2; ++i) {
    auto client = crypto::IssueClientCertificate(*ca, {.common_name = CertName(i),
                                                       .dns_names = {},
                                                       .ip_addresses = {},
                                                       .not_before_unix_s = 0,
                                                       .not_after_unix_s = until});
    FUZZ_CHECK(client.ok(), client.status());
    write(CertName(i), *client);
  }
}

std::shared_ptr<grpc::ChannelCredentials> ClientCredentials(const std::string& dir,
                                                            const std::string& name) {
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = ReadAll(dir + "/ca.pem");
  ssl.pem_cert_chain = ReadAll(dir + "/" + name + ".pem");
  ssl.pem_private_key = ReadAll(dir + "/" + name + ".key");
  return grpc::SslCredentials(ssl);
}
#endif

void Start() {
  g = new Federation();
  g->dir = MakeStoreDir();

  v1::RunConfig config;
  config.set_run_id("fuzz-run");
  config.set_seed(7);
  config.mutable_model()->set_path("unused");
  config.mutable_task()->add_labels("negative");
  config.mutable_task()->add_labels("positive");
  config.set_rounds(1'000'000);  // the run never finishes on its own
  config.mutable_selection()->set_clients_per_round(2);
  config.mutable_selection()->set_over_selection(1.0);
  config.mutable_selection()->set_min_clients(1);
  config.mutable_selection()->set_heartbeat_interval_seconds(1);
#ifdef FEDLORA_FUZZ_RPC_PRIVATE
  config.mutable_selection()->set_clients_per_round(3);
  config.mutable_selection()->set_min_clients(3);
  config.mutable_privacy()->set_secure_aggregation(true);
  config.mutable_aggregation()->clear_weight_by_examples();
  v1::DifferentialPrivacyConfig* dp = config.mutable_privacy()->mutable_dp();
  dp->set_enabled(true);
  dp->set_mode(v1::DifferentialPrivacyConfig::DISTRIBUTED);
  dp->set_clip_norm(1.0);
  dp->set_noise_multiplier(1.0);
  dp->set_target_delta(1e-5);
  dp->set_max_epsilon(1e9);
#endif
  ApplyRunConfigDefaults(&config);
  absl::Status valid = ValidateRunConfig(config);
  FUZZ_CHECK(valid.ok(), valid);

  ServerOptions o;
  o.listen_address = "127.0.0.1:0";
  o.metrics_address = "";  // not under test here
  o.insecure = true;
  o.data_dir = g->dir + "/store";
  o.min_free_disk_bytes = 0;
  o.max_upload_bytes = 64 << 10;
  o.max_client_bytes_per_round = 16 << 20;
  o.chunk_bytes = kChunkBytes;
  o.max_upload_chunk_bytes = kChunkBytes;
  o.upload_sync_bytes = 4 * kChunkBytes;
  o.upload_workers = 2;
  o.max_long_poll_ms = 5;
  o.round_deadline_ms = 3000;
  o.retry_after_ms = 100;
  o.selection_window_ms = 100;
  o.heartbeat_timeout_ms = 2000;
  o.heartbeat_interval_ms = 1000;
  o.tick_ms = 20;
#ifdef FEDLORA_FUZZ_RPC_PRIVATE
  o.health_address = "127.0.0.1:0";
#endif
#ifdef FEDLORA_FUZZ_RPC_TLS
  const std::string certs = g->dir + "/certs";
  MakeCertificates(certs);
  o.insecure = false;
  o.tls.cert_file = certs + "/server.pem";
  o.tls.key_file = certs + "/server.key";
  o.tls.client_ca_file = certs + "/ca.pem";
  o.operator_ids = {CertName(kOperator)};
#endif
  auto server = Server::Create(o, config, InitialAdapter());
  FUZZ_CHECK(server.ok(), server.status());
  g->server = *std::move(server);

  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(16 << 20);
  args.SetMaxReceiveMessageSize(16 << 20);
  auto connect = [&](Link& l, const std::shared_ptr<grpc::ChannelCredentials>& credentials) {
    l.channel = grpc::CreateCustomChannel(g->server->address(), credentials, args);
    l.stub = v1::Federation::NewStub(l.channel);
    l.admin = v1::Admin::NewStub(l.channel);
    l.generic = std::make_unique<grpc::GenericStub>(l.channel);
  };
#ifdef FEDLORA_FUZZ_RPC_TLS
  for (int i = 0; i < kSites + 2; ++i) connect(g->links[i], ClientCredentials(certs, CertName(i)));
#else
  connect(g->links[kStranger], grpc::InsecureChannelCredentials());
#endif
  if (g->server->health_port() > 0) {
    g->health_channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(g->server->health_port()),
                                            grpc::InsecureChannelCredentials());
    g->health = std::make_unique<grpc::GenericStub>(g->health_channel);
  }
  for (int i = 0; i < kSites; ++i) g->sites[i].id = "site-" + std::to_string(i);
  // Registered last, so that it runs before the destructors of gRPC's globals made above.
  std::atexit(Stop);
}

// gRPC refuses metadata values outside printable ASCII (and a client may abort on them), so
// fuzzed identities and tokens keep to it; the server's own checks are what is under test.
std::string Printable(std::string s) {
  for (char& c : s) c = static_cast<char>(0x20 + (static_cast<unsigned char>(c) % 0x5f));
  return s;
}

// Who a call comes from: one of the sites (with its session, or without, or with a fuzzed token),
// or a fuzzed identity.
struct Caller {
  Site* site = nullptr;  // null: a stranger
  std::string id;
  std::string session;
  int link = kStranger;  // whose connection (g->links) it calls on
};

// The stubs `c` calls with: its own connection where it has one (under TLS), else the shared one.
Link& L(const Caller& c) {
  return g->links[c.link].stub != nullptr ? g->links[c.link] : g->links[kStranger];
}

Caller PickCaller(FuzzedDataProvider& in) {
  Caller c;
  const int who = in.ConsumeIntegralInRange<int>(0, kSites + 1);
  if (who < kSites) {
    c.site = &g->sites[who];
    c.id = c.site->id;
    c.link = who;
  } else if (who == kSites) {
    c.id = "x" + std::to_string(in.ConsumeIntegral<uint8_t>());  // a valid id the sites do not use
  } else {
    c.id = Printable(in.ConsumeRandomLengthString(140));
    c.link = kOperator;
  }
  switch (in.ConsumeIntegralInRange<int>(0, 3)) {
    case 0:
      c.session = Printable(in.ConsumeRandomLengthString(80));
      break;
    case 1:
      break;  // no token
    default:
      if (c.site != nullptr) c.session = c.site->session;
      break;
  }
  return c;
}

void Trace(const char* rpc, const Caller& c, const grpc::Status& s, const std::string& more = "") {
  FUZZ_TRACE(
      "%s from '%s'%s: %d %s%s\n", rpc, c.id.substr(0, 40).c_str(),
      c.site != nullptr && c.session == c.site->session && !c.session.empty() ? " (session)" : "",
      static_cast<int>(s.error_code()), s.error_message().substr(0, 160).c_str(), more.c_str());
}

std::unique_ptr<grpc::ClientContext> Context(const Caller& c, int64_t deadline_ms = kDeadlineMs) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(deadline_ms));
  if (!c.id.empty()) ctx->AddMetadata(kClientIdMetadataKey, c.id);
  if (!c.session.empty()) ctx->AddMetadata(kSessionMetadataKey, c.session);
  return ctx;
}

// A request: arbitrary wire bytes from the input (unparseable ones give an empty message).
template <class M>
M Fuzzed(FuzzedDataProvider& in, size_t max_bytes = 256) {
  M m;
  if (!m.ParseFromString(in.ConsumeRandomLengthString(max_bytes))) m.Clear();
  return m;
}

void Remember(const v1::AdapterManifest& m) {
  if (m.sha256().empty()) return;
  if (std::find(g->adapter_hashes.begin(), g->adapter_hashes.end(), m.sha256()) !=
      g->adapter_hashes.end())
    return;
  if (g->adapter_hashes.size() >= 16) g->adapter_hashes.erase(g->adapter_hashes.begin());
  g->adapter_hashes.push_back(m.sha256());
}

std::string KnownAdapterHash(FuzzedDataProvider& in, const Caller& c) {
  const bool task = in.ConsumeBool();
  const uint8_t index = in.ConsumeIntegral<uint8_t>();
  if (task && c.site != nullptr && c.site->task) return c.site->task->global_adapter().sha256();
  if (!g->adapter_hashes.empty()) return g->adapter_hashes[index % g->adapter_hashes.size()];
  return "";
}

void Join(FuzzedDataProvider& in, const Caller& c) {
  v1::JoinRequest req = Fuzzed<v1::JoinRequest>(in);
  if (in.ConsumeBool()) req.set_protocol_version(kProtocolVersion);
  v1::JoinResponse resp;
  auto ctx = Context(c);
  grpc::Status s = L(c).stub->Join(ctx.get(), req, &resp);
  Trace("Join", c, s);
  if (s.ok() && c.site != nullptr) {
    c.site->session = resp.session_token();
    c.site->join = resp;
    c.site->task.reset();
  }
}

void WaitForTask(FuzzedDataProvider& in, const Caller& c) {
  v1::WaitForTaskRequest req = Fuzzed<v1::WaitForTaskRequest>(in, 16);
  v1::WaitForTaskResponse resp;
  auto ctx = Context(c);
  grpc::Status s = L(c).stub->WaitForTask(ctx.get(), req, &resp);
  Trace("WaitForTask", c, s,
        resp.has_task()          ? " task " + resp.task().task_id()
        : resp.has_retry_later() ? " retry"
                                 : "");
  if (!s.ok()) return;
  if (resp.has_task()) {
    Remember(resp.task().global_adapter());
    if (c.site != nullptr) c.site->task = resp.task();
  } else if (resp.has_run_finished()) {
    Remember(resp.run_finished().final_adapter());
  }
}

void Heartbeat(FuzzedDataProvider& in, const Caller& c) {
  v1::HeartbeatRequest req = Fuzzed<v1::HeartbeatRequest>(in, 64);
  if (in.ConsumeBool() && c.site != nullptr && c.site->task)
    req.set_task_id(c.site->task->task_id());
  v1::HeartbeatResponse resp;
  auto ctx = Context(c);
  grpc::Status s = L(c).stub->Heartbeat(ctx.get(), req, &resp);
  Trace("Heartbeat", c, s);
  if (s.ok() && c.site != nullptr && resp.action() == v1::HeartbeatResponse::CANCEL_TASK)
    c.site->task.reset();
}

void Download(FuzzedDataProvider& in, const Caller& c) {
  v1::DownloadRequest req = Fuzzed<v1::DownloadRequest>(in, 96);
  if (in.ConsumeBool()) req.set_adapter_sha256(KnownAdapterHash(in, c));
  const int max_chunks = in.ConsumeIntegralInRange<int>(0, 16);
  auto ctx = Context(c);
  auto reader = L(c).stub->DownloadAdapter(ctx.get(), req);
  v1::DownloadChunk chunk;
  int n = 0;
  while (n < max_chunks && reader->Read(&chunk)) ++n;
  if (n == max_chunks) ctx->TryCancel();  // a client that stops reading halfway
  while (reader->Read(&chunk)) {
  }
  Trace("DownloadAdapter", c, reader->Finish(), " " + std::to_string(n) + " chunks");
}

// Values in [-8, 7] / 1024 for an update of the task's tensors: exact in every codec.
std::vector<UpdateTensor> HonestDelta(uint8_t seed, const v1::TrainTask& task) {
  std::vector<UpdateTensor> delta;
  for (const v1::TensorSpec& t : task.global_adapter().tensors()) {
    UpdateTensor u{t.name(), std::vector<int64_t>(t.shape().begin(), t.shape().end()), {}};
    int64_t n = 1;
    for (int64_t d : u.shape) n = d >= 0 && d <= (1 << 16) ? n * d : 0;
    if (n > (1 << 16)) n = 0;
    u.values.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
      u.values[i] = static_cast<float>(((i * 7 + seed) % 16) - 8) / 1024.0f;
    delta.push_back(std::move(u));
  }
  return delta;
}

// An upload id: one the site used before, a fuzzed string (mostly invalid), or one of a small pool
// per site and round, so that the server's partial files stay few over a long run. Consumes the same input
// whatever the site's state, so that seeds keep their meaning.
// Sealing costs milliseconds (a fresh X25519 key each time); inputs repeat honest uploads often, so
// the last few seals are kept, by plaintext and place (a sealed blob is valid for any number of
// uploads of that plaintext to that place).
absl::StatusOr<crypto::SealedBlob> Seal(const std::string& key, const crypto::UpdatePlace& place,
                                        const std::string& plain) {
  static std::map<std::string, crypto::SealedBlob>* cache =
      new std::map<std::string, crypto::SealedBlob>();
  std::string k = key;
  for (std::string_view part : {place.run_id, place.client_id, place.upload_id}) {
    k += std::to_string(part.size()) + ":" + std::string(part);
  }
  k += std::to_string(place.round) + ":" + plain;
  if (auto it = cache->find(k); it != cache->end()) return it->second;
  auto sealed = crypto::SealUpdateBlob(key, place, plain);
  if (!sealed.ok()) return sealed;
  if (cache->size() >= 64) cache->erase(cache->begin());
  cache->emplace(std::move(k), *sealed);
  return sealed;
}

std::string NewUploadId(FuzzedDataProvider& in, Site* site, uint64_t round) {
  const bool reuse = in.ConsumeBool();
  const uint8_t index = in.ConsumeIntegral<uint8_t>();
  const bool fuzzed = in.ConsumeIntegralInRange<int>(0, 3) == 0;
  const std::string text = fuzzed ? in.ConsumeRandomLengthString(140) : "";
  if (reuse && site != nullptr && !site->upload_ids.empty())
    return site->upload_ids[index % site->upload_ids.size()];
  if (fuzzed) return text;
  std::string id = (site != nullptr ? site->id : std::string("x")) + "-r" + std::to_string(round) +
                   "-u" + std::to_string(index % 32);
  if (site != nullptr &&
      std::find(site->upload_ids.begin(), site->upload_ids.end(), id) == site->upload_ids.end()) {
    if (site->upload_ids.size() >= 64) site->upload_ids.erase(site->upload_ids.begin());
    site->upload_ids.push_back(id);
  }
  return id;
}

void Upload(FuzzedDataProvider& in, const Caller& c) {
  const v1::TrainTask task = c.site != nullptr && c.site->task ? *c.site->task : v1::TrainTask();
  const uint64_t chunk = c.site != nullptr && c.site->join.limits().chunk_size_bytes() > 0
                             ? c.site->join.limits().chunk_size_bytes()
                             : kChunkBytes;
  // The plaintext: an honest encoding of the task's shapes, or fuzzed bytes.
  std::string plain;
  v1::CodecSpec codec = task.codec();
  if (in.ConsumeBool()) {
    auto options = CodecOptionsFromSpec(codec);
    CodecOptions o = options.ok() ? *options : CodecOptions{};
    auto encoded = EncodeUpdate(HonestDelta(in.ConsumeIntegral<uint8_t>(), task), o);
    if (encoded.ok()) plain = *std::move(encoded);
  } else {
    plain = in.ConsumeRandomLengthString(8 * kChunkBytes);
  }
  if (in.ConsumeBool()) codec = Fuzzed<v1::CodecSpec>(in, 32);

  v1::UploadHeader h;
  const std::string upload_id = NewUploadId(in, c.site, task.round());
  h.set_upload_id(upload_id);
  h.set_round(task.round());
  h.set_task_id(task.task_id());
  h.set_num_examples(in.ConsumeIntegralInRange<uint64_t>(0, 1000));
  *h.mutable_codec() = codec;
  std::string blob = plain;
  const bool seal = in.ConsumeBool();
  if (seal && c.site != nullptr) {
    const v1::JoinResponse& join = c.site->join;
    const crypto::UpdatePlace place{join.run_config().run_id(), task.round(), c.id, upload_id,
                                    h.num_examples()};
    auto sealed = Seal(task.aggregation_key().public_key(), place, plain);
    if (sealed.ok()) {
      blob = sealed->blob;
      h.mutable_encryption()->set_ephemeral_public_key(sealed->ephemeral_public_key);
    }
    h.mutable_encryption()->set_scheme(v1::EncryptionSpec::X25519_HKDF_AES256GCM);
    h.mutable_encryption()->set_server_key_id(task.aggregation_key().key_id());
  }
  h.set_base_adapter_sha256(task.global_adapter().sha256());
  v1::AdapterManifest* m = h.mutable_manifest();
  for (const v1::TensorSpec& t : task.global_adapter().tensors()) *m->add_tensors() = t;
  m->set_total_bytes(blob.size());
  m->set_sha256(Sha256Hex(blob));
  m->set_chunk_size_bytes(static_cast<uint32_t>(chunk));
  const uint32_t num_chunks = static_cast<uint32_t>((blob.size() + chunk - 1) / chunk);
  m->set_num_chunks(num_chunks);
  m->set_round(task.round());
  // Fuzzed fields over the honest ones (protobuf merge: set fields replace, repeated ones append).
  if (in.ConsumeBool()) (void)h.MergeFromString(in.ConsumeRandomLengthString(128));

  // Which chunks to send (a resume starts later, a broken stream stops early), and at most one
  // chunk to spoil. Fixed-width reads, so that the input means the same whatever the blob's size.
  const uint8_t first_byte = in.ConsumeIntegral<uint8_t>();
  const uint8_t last_byte = in.ConsumeIntegral<uint8_t>();
  const uint32_t first = first_byte < 128 ? 0 : first_byte % (num_chunks + 1);
  const uint32_t last = last_byte < 128 ? num_chunks : first + last_byte % (num_chunks - first + 1);
  h.set_start_chunk(first);
  const uint8_t bad_chunk = in.ConsumeIntegral<uint8_t>();  // >= num_chunks: none
  const int bad_kind = in.ConsumeIntegralInRange<int>(0, 2);
  const std::string bad_bytes = bad_kind < 2 ? in.ConsumeRandomLengthString(256) : "";

  v1::UploadAck ack;
  auto ctx = Context(c, kUploadDeadlineMs);
  auto writer = L(c).stub->UploadUpdate(ctx.get(), &ack);
  v1::UploadChunk msg;
  if (in.ConsumeIntegralInRange<int>(0, 7) != 0) {
    *msg.mutable_header() = h;
  } else {
    msg = Fuzzed<v1::UploadChunk>(in, 512);  // anything first, even data
  }
  bool ok = writer->Write(msg);
  for (uint32_t i = first; ok && i < last; ++i) {
    msg.Clear();
    v1::UploadData* d = msg.mutable_data();
    d->set_chunk_index(i);
    d->set_offset_bytes(i * chunk);
    d->set_data(blob.substr(std::min<size_t>(blob.size(), i * chunk), chunk));
    d->set_sha256(Sha256Hex(d->data()));
    if (i == bad_chunk) {
      if (bad_kind == 0) {
        (void)d->MergeFromString(bad_bytes);  // fuzzed fields over the chunk's
      } else if (bad_kind == 1) {
        if (!msg.ParseFromString(bad_bytes)) msg.Clear();  // a second header, or garbage
      } else {
        ok = writer->Write(msg);  // the same chunk twice
      }
    }
    if (ok) ok = writer->Write(msg);
  }
  if (ok) writer->WritesDone();
  grpc::Status s = writer->Finish();
  Trace("UploadUpdate", c, s,
        " " + upload_id.substr(0, 40) + " chunks [" + std::to_string(first) + ", " +
            std::to_string(last) + ") of " + std::to_string(num_chunks) + " state " +
            std::to_string(ack.state()));
}

void GetUploadStatus(FuzzedDataProvider& in, const Caller& c) {
  v1::UploadStatusRequest req;
  req.set_upload_id(
      NewUploadId(in, c.site, c.site != nullptr && c.site->task ? c.site->task->round() : 0));
  v1::UploadStatusResponse resp;
  auto ctx = Context(c);
  Trace("GetUploadStatus", c, L(c).stub->GetUploadStatus(ctx.get(), req, &resp),
        " state " + std::to_string(resp.state()));
}

void ReportMetrics(FuzzedDataProvider& in, const Caller& c) {
  v1::MetricsReport req = Fuzzed<v1::MetricsReport>(in, 512);
  if (in.ConsumeBool() && c.site != nullptr && c.site->task) {
    req.set_round(c.site->task->round());
    req.set_task_id(c.site->task->task_id());
  }
  v1::MetricsAck resp;
  auto ctx = Context(c);
  Trace("ReportMetrics", c, L(c).stub->ReportMetrics(ctx.get(), req, &resp));
}

void Leave(FuzzedDataProvider& in, const Caller& c) {
  v1::LeaveRequest req = Fuzzed<v1::LeaveRequest>(in, 64);
  v1::LeaveResponse resp;
  auto ctx = Context(c);
  grpc::Status s = L(c).stub->Leave(ctx.get(), req, &resp);
  Trace("Leave", c, s);
  if (s.ok() && c.site != nullptr) {
    c.site->session.clear();
    c.site->task.reset();
  }
}

void Admin(FuzzedDataProvider& in, const Caller& c) {
  auto ctx = Context(c);
  if (in.ConsumeBool()) {
    v1::GetStatusRequest req = Fuzzed<v1::GetStatusRequest>(in, 16);
    v1::GetStatusResponse resp;
    grpc::Status s = L(c).admin->GetStatus(ctx.get(), req, &resp);
    Trace("GetStatus", c, s, " round " + std::to_string(resp.current_round()));
    if (s.ok()) Remember(resp.global_adapter());
  } else {
    v1::ListClientsRequest req = Fuzzed<v1::ListClientsRequest>(in, 16);
    v1::ListClientsResponse resp;
    Trace("ListClients", c, L(c).admin->ListClients(ctx.get(), req, &resp));
  }
}

// A SecureAggregation step as a cohort member (or anyone) might send it: a fuzzed request, given
// the caller's task and round when the input says so.
void SecureAggregation(FuzzedDataProvider& in, const Caller& c) {
  v1::SecureAggregationRequest req = Fuzzed<v1::SecureAggregationRequest>(in, 768);
  if (in.ConsumeBool() && c.site != nullptr && c.site->task) {
    req.set_round(c.site->task->round());
    req.set_task_id(c.site->task->task_id());
  }
  v1::SecureAggregationResponse resp;
  auto ctx = Context(c);
  Trace("SecureAggregation", c, L(c).stub->SecureAggregation(ctx.get(), req, &resp));
}

// Raw bytes to a method, unparsed: the server's deserialization of each request type. Streaming
// methods get a unary call, which the server must refuse or handle. Health methods go to the
// health port where there is one.
void Raw(FuzzedDataProvider& in, const Caller& c) {
  static const char* const kMethods[] = {
      "/fedlora.v1.Federation/Join",          "/fedlora.v1.Federation/WaitForTask",
      "/fedlora.v1.Federation/Heartbeat",     "/fedlora.v1.Federation/DownloadAdapter",
      "/fedlora.v1.Federation/UploadUpdate",  "/fedlora.v1.Federation/GetUploadStatus",
      "/fedlora.v1.Federation/ReportMetrics", "/fedlora.v1.Federation/Leave",
      "/fedlora.v1.Admin/GetStatus",          "/fedlora.v1.Admin/ListClients",
      "/fedlora.v1.Federation/NoSuchMethod",  "/fedlora.v1.Federation/SecureAggregation",
      "/fedlora.v1.Admin/BlockClient",        "/grpc.health.v1.Health/Check",
      "/grpc.health.v1.Health/Watch",
  };
  const char* method = kMethods[in.ConsumeIntegralInRange<size_t>(0, std::size(kMethods) - 1)];
  const std::string bytes = in.ConsumeRandomLengthString(1024);
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  // Health/Watch answers at once and then keeps the stream open until the client goes: with the
  // usual deadline each such call would hold the input for 2 s (most of this harness's time).
  const bool watch = std::string_view(method).ends_with("/Watch");
  auto ctx = Context(c, watch ? kWatchDeadlineMs : kDeadlineMs);
  grpc::CompletionQueue cq;
  const bool health_port =
      g->health != nullptr && std::string_view(method).rfind("/grpc.health", 0) == 0;
  auto call =
      (health_port ? g->health : L(c).generic)->PrepareUnaryCall(ctx.get(), method, request, &cq);
  call->StartCall();
  grpc::Status status;
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  FUZZ_CHECK(cq.Next(&tag, &ok), "completion queue shut down");
  Trace(method, c, status);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
}

}  // namespace
}  // namespace fedlora

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  setenv("GRPC_VERBOSITY", "ERROR", 0);
  // Fuzzed strings are often invalid UTF-8, which protobuf logs on every (de)serialization.
  google::protobuf::SetLogHandler(
      [](google::protobuf::LogLevel level, const char* file, int line, const std::string& m) {
        if (level >= google::protobuf::LOGLEVEL_FATAL)
          std::fprintf(stderr, "[protobuf %s:%d] %s\n", file, line, m.c_str());
      });
  if (std::getenv("FEDLORA_LOG_LEVEL") == nullptr) fedlora::SetLogLevel(fedlora::LogLevel::kError);
  fedlora::Start();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fedlora;
  FuzzedDataProvider in(data, size);
  for (int call = 0; call < kMaxCallsPerInput && in.remaining_bytes() > 0; ++call) {
    const int rpc = in.ConsumeIntegralInRange<int>(0, 11);
    const Caller caller = PickCaller(in);
    switch (rpc) {
      case 0:
        Join(in, caller);
        break;
      case 1:
        WaitForTask(in, caller);
        break;
      case 2:
        Heartbeat(in, caller);
        break;
      case 3:
        Download(in, caller);
        break;
      case 4:
        Upload(in, caller);
        break;
      case 5:
        GetUploadStatus(in, caller);
        break;
      case 6:
        ReportMetrics(in, caller);
        break;
      case 7:
        Leave(in, caller);
        break;
      case 8:
        Admin(in, caller);
        break;
      case 9:
        SecureAggregation(in, caller);
        break;
      default:
        Raw(in, caller);
        break;
    }
  }
  return 0;
}
