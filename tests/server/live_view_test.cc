// The live view on the metrics listener (server/live_view.h): the page and /api/run.json from a real
// server with a committed round; the access rule (loopback without TLS, operator certificates
// under TLS over HTTPS); /metrics as before beside it.
#include "server/live_view.h"

#include <httplib.h>

#include <ctime>
#include <nlohmann/json.hpp>

#include "core/file.h"
#include "crypto/certs.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "tests/server/federation_test_util.h"

namespace fedlora {
namespace {

using ::testing::HasSubstr;
using testing::TempDir;

constexpr int64_t kDay = 86'400;

// An evaluator with fixed figures, so that the page has an accuracy and a loss to show.
class FixedEvaluator : public Evaluator {
 public:
  absl::StatusOr<std::map<std::string, double>> Evaluate(
      uint64_t, const std::vector<UpdateTensor>&) override {
    return std::map<std::string, double>{{"eval_accuracy", 0.625}, {"eval_loss", 0.4375}};
  }
};

TEST(LiveViewTest, ServesThePageAndTheRunOfARealServerWithACommittedRound) {
  TempDir dir;
  FixedEvaluator evaluator;
  auto server =
      Server::Create(testing::TestServerOptions(dir.path()), testing::TestRunConfig(1, 2, 2),
                     testing::InitialAdapter(), &evaluator);
  ASSERT_TRUE(server.ok()) << server.status();
  // A site that leaves on an error it cannot get past: FAILED, with its message.
  testing::RawClient broken((*server)->address(), "site-broken");
  ASSERT_TRUE(broken.Join().ok());
  {
    v1::LeaveRequest leave;
    leave.set_error("data file train.jsonl:3: no \"label\" field");
    v1::LeaveResponse left;
    auto ctx = broken.Context();
    ASSERT_TRUE(broken.stub()->Leave(ctx.get(), leave, &left).ok());
  }
  std::vector<std::unique_ptr<testing::DeterministicTrainer>> trainers;
  for (int c = 0; c < 2; ++c)
    trainers.push_back(std::make_unique<testing::DeterministicTrainer>(c));
  for (const auto& r : testing::RunClientsUntilDone((*server)->address(), trainers))
    ASSERT_TRUE(r.ok()) << r.status();

  httplib::Client http("127.0.0.1", (*server)->metrics_port());
  auto page = http.Get("/");
  ASSERT_TRUE(page) << httplib::to_string(page.error());
  EXPECT_EQ(page->status, 200) << page->body;
  EXPECT_THAT(page->get_header_value("Content-Type"), HasSubstr("text/html"));
  EXPECT_THAT(page->get_header_value("Content-Security-Policy"), HasSubstr("default-src 'none'"));
  for (const char* element : {"id=\"rounds\"", "id=\"sites\"", "id=\"acc-chart\"",
                              "id=\"loss-chart\"", "id=\"config\"", "fetch(\"/api/run.json\""}) {
    EXPECT_THAT(page->body, HasSubstr(element));
  }
  // No external assets: the machines are offline.
  EXPECT_THAT(page->body, ::testing::Not(HasSubstr("src=\"http")));
  EXPECT_THAT(page->body, ::testing::Not(HasSubstr("href=\"http")));

  auto run = http.Get("/api/run.json");
  ASSERT_TRUE(run);
  ASSERT_EQ(run->status, 200) << run->body;
  EXPECT_EQ(run->get_header_value("Content-Type"), "application/json");
  const nlohmann::json j = nlohmann::json::parse(run->body);
  EXPECT_EQ(j["run_id"], "test-run");
  EXPECT_EQ(j["current_round"], 1);
  EXPECT_EQ(j["total_rounds"], 1);
  EXPECT_EQ(j["phase"], "ROUND_PHASE_FINISHED");
  EXPECT_GT(j["now_unix_ms"].get<int64_t>(), 0);
  ASSERT_EQ(j["history"].size(), 1u);
  const nlohmann::json& round = j["history"][0];
  EXPECT_EQ(round["round"], 1);
  EXPECT_EQ(round["eval_accuracy"], 0.625);
  EXPECT_EQ(round["eval_loss"], 0.4375);
  EXPECT_EQ(round["updates_accepted"], 2);
  EXPECT_EQ(round["examples"], testing::ExamplesOf(0) + testing::ExamplesOf(1));
  EXPECT_GT(round["upload_bytes"].get<int64_t>(), 0);
  EXPECT_GT(round["download_bytes"].get<int64_t>(), 0);
  EXPECT_GE(round["committed_unix_ms"].get<int64_t>(), round["started_unix_ms"].get<int64_t>());
  std::map<std::string, nlohmann::json> sites;
  for (const nlohmann::json& c : j["clients"]) sites[c["client_id"]] = c;
  ASSERT_EQ(sites.size(), 3u) << j["clients"].dump();
  EXPECT_EQ(sites["site-0"]["rounds_participated"], 1);
  EXPECT_EQ(sites["site-1"]["rounds_participated"], 1);
  EXPECT_EQ(sites["site-broken"]["state"], "CLIENT_STATE_FAILED");
  EXPECT_THAT(sites["site-broken"]["failure"].get<std::string>(), HasSubstr("train.jsonl:3"));
  EXPECT_EQ(j["config"]["run_id"], "test-run");
  EXPECT_EQ(j["config"]["rounds"], 1);

  // /metrics as before, beside the view.
  auto metrics = http.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->status, 200);
  EXPECT_THAT(metrics->body, HasSubstr("fedlora_rounds_committed_total 1\n"));
  EXPECT_EQ(http.Get("/nothing-here")->status, 404);
  EXPECT_EQ(http.Post("/api/run.json", "", "text/plain")->status, 405);

  // A name in Host is refused without TLS (a page elsewhere rebinding its name to 127.0.0.1).
  auto rebound = http.Get("/api/run.json", httplib::Headers{{"Host", "attacker.example:8000"}});
  ASSERT_TRUE(rebound);
  EXPECT_EQ(rebound->status, 403);
  EXPECT_THAT(rebound->body, HasSubstr("attacker.example"));
  EXPECT_EQ(http.Get("/", httplib::Headers{{"Host", "localhost:1234"}})->status, 200);
}

HttpPageRequest Request(const std::string& peer) {
  HttpPageRequest r;
  r.path = "/";
  r.host = "127.0.0.1:9464";
  r.peer_address = peer;
  return r;
}

TEST(LiveViewAccessTest, WithoutTlsOnlyLoopbackPeersGetTheView) {
  const LiveViewAccess plaintext;
  for (const char* peer : {"127.0.0.1", "127.4.5.6", "::1", "::ffff:127.0.0.1"}) {
    EXPECT_TRUE(CheckLiveViewAccess(Request(peer), plaintext).ok()) << peer;
  }
  for (const char* peer : {"10.0.0.5", "192.168.1.9", "::ffff:10.0.0.5", "2001:db8::1", ""}) {
    const absl::Status s = CheckLiveViewAccess(Request(peer), plaintext);
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << peer;
    EXPECT_THAT(s.message(), HasSubstr("loopback callers only without TLS")) << peer;
  }
}

bool Write(const std::string& path, const std::string& text) {
  return WriteFileAtomically(path, text).ok();
}

// ca.pem, server.pem/key (127.0.0.1), and <name>.pem/key per client; `revoked` also goes on crl.pem.
bool MakeCertificates(const std::string& dir, const std::vector<std::string>& clients,
                      const std::string& revoked) {
  const std::string d = dir + "/";
  const int64_t now = static_cast<int64_t>(std::time(nullptr));
  auto ca = crypto::CreateCertificateAuthority({.common_name = "test-ca",
                                                .dns_names = {},
                                                .ip_addresses = {},
                                                .not_before_unix_s = 0,
                                                .not_after_unix_s = now + kDay});
  if (!ca.ok() || !Write(d + "ca.pem", ca->cert_pem)) return false;
  auto server = crypto::IssueServerCertificate(*ca, {.common_name = "localhost",
                                                     .dns_names = {"localhost"},
                                                     .ip_addresses = {"127.0.0.1"},
                                                     .not_before_unix_s = 0,
                                                     .not_after_unix_s = now + kDay});
  if (!server.ok() || !Write(d + "server.pem", server->cert_pem) ||
      !Write(d + "server.key", server->key_pem)) {
    return false;
  }
  for (const std::string& c : clients) {
    auto cert = crypto::IssueClientCertificate(*ca, {.common_name = c,
                                                     .dns_names = {},
                                                     .ip_addresses = {},
                                                     .not_before_unix_s = 0,
                                                     .not_after_unix_s = now + kDay});
    if (!cert.ok() || !Write(d + c + ".pem", cert->cert_pem) ||
        !Write(d + c + ".key", cert->key_pem))
      return false;
    if (c == revoked) {
      auto crl = crypto::RevokeCertificates(*ca, "", {cert->cert_pem}, kDay);
      if (!crl.ok() || !Write(d + "crl.pem", *crl)) return false;
    }
  }
  return true;
}

TEST(LiveViewTlsTest, UnderTlsTheListenerIsHttpsAndOnlyAnOperatorCertificateGetsTheView) {
  TempDir dir;
  const std::string d = dir.path() + "/";
  ASSERT_TRUE(MakeCertificates(dir.path(), {"ops", "ops-revoked", "site-a"}, "ops-revoked"));
  ServerOptions o = testing::TestServerOptions(d + "store");
  o.insecure = false;
  o.tls.cert_file = d + "server.pem";
  o.tls.key_file = d + "server.key";
  o.tls.client_ca_file = d + "ca.pem";
  o.tls.crl_file = d + "crl.pem";
  o.operator_ids = {"ops", "ops-revoked"};
  auto server = Server::Create(o, testing::TestRunConfig(1, 1, 1), testing::InitialAdapter());
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->metrics_port();
  auto as = [&](const std::string& who) {
    auto c = who.empty() ? std::make_unique<httplib::SSLClient>("127.0.0.1", port)
                         : std::make_unique<httplib::SSLClient>("127.0.0.1", port, d + who + ".pem",
                                                                d + who + ".key");
    c->set_ca_cert_path(d + "ca.pem");
    c->enable_server_certificate_verification(true);
    return c;
  };

  auto page = as("ops")->Get("/");
  ASSERT_TRUE(page) << httplib::to_string(page.error());
  EXPECT_EQ(page->status, 200) << page->body;
  EXPECT_THAT(page->body, HasSubstr("id=\"rounds\""));
  auto run = as("ops")->Get("/api/run.json");
  ASSERT_TRUE(run);
  ASSERT_EQ(run->status, 200) << run->body;
  EXPECT_EQ(nlohmann::json::parse(run->body)["run_id"], "test-run");

  // A site's certificate, a revoked operator's, and none: 403 with the reason.
  auto site = as("site-a")->Get("/api/run.json");
  ASSERT_TRUE(site);
  EXPECT_EQ(site->status, 403);
  EXPECT_THAT(site->body, HasSubstr("'site-a' is not one"));
  auto revoked = as("ops-revoked")->Get("/");
  ASSERT_TRUE(revoked);
  EXPECT_EQ(revoked->status, 403);
  EXPECT_THAT(revoked->body, HasSubstr("revoked"));
  auto nobody = as("")->Get("/");
  ASSERT_TRUE(nobody);
  EXPECT_EQ(nobody->status, 403);
  EXPECT_THAT(nobody->body, HasSubstr("no client certificate"));

  // /metrics stays open to any scraper, over HTTPS now; plaintext HTTP is told to use HTTPS.
  auto metrics = as("")->Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->status, 200);
  EXPECT_THAT(metrics->body, HasSubstr("fedlora_rounds_committed_total 0\n"));
  httplib::Client plain("127.0.0.1", port);
  plain.set_read_timeout(3, 0);
  auto cleartext = plain.Get("/metrics");
  ASSERT_TRUE(cleartext) << httplib::to_string(cleartext.error());
  EXPECT_EQ(cleartext->status, 400);
  EXPECT_THAT(cleartext->body, HasSubstr("use https://"));
}

}  // namespace
}  // namespace fedlora
