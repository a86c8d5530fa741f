// The whole system as separate processes, secured as the README shows it: `fedlora certs dev`, then
// `fedlora server` with a run config and mutual TLS, two `fedlora client` processes training the real all-MiniLM-L6-v2 LoRA adapters on disjoint slices of the fortunes
// corpus (the built-in trainer), and `fedlora status`; the adapters `server --out` writes and
// `fedlora export` gives from the store. And a CAUSAL_LM federation of the real 4-bit
// SmolLM2 (plaintext on loopback): the server's perplexity evaluator and the clients' decoder
// trainer. Skips when the model or data have not been fetched (scripts/setup.sh).
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <tuple>
#include <utility>

#include "compression/update_io.h"
#include "core/file.h"
#include "core/gguf.h"
#include "core/json.h"
#include "core/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/bert.h"
#include "model/peft.h"
#include "server/blob_store.h"
#include "server/data_dir_lock.h"
#include "server/store.h"
#include "tests/server/federation_test_util.h"

namespace fedlora {
namespace {

using ::testing::HasSubstr;

std::string ReadAll(FILE* f) {
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
  return out;
}

void CopyLines(const std::string& from, const std::string& to, int first, int count) {
  std::ifstream in(from);
  std::ofstream out(to);
  std::string line;
  for (int i = 0; std::getline(in, line) && i < first + count; ++i) {
    if (i >= first) out << line << "\n";
  }
}

// Runs `command` and returns its exit code and stdout.
std::pair<int, std::string> RunCommand(const std::string& command) {
  FILE* f = popen(command.c_str(), "r");
  if (f == nullptr) return {-1, ""};
  std::string out = ReadAll(f);
  const int status = pclose(f);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// Starts `command` (a `fedlora server`) and reads the address (and the health and metrics ports,
// when it prints them) from its first line.
FILE* StartServer(const std::string& command, std::string* address,
                  std::string* health_port = nullptr, std::string* metrics_port = nullptr) {
  FILE* server = popen(command.c_str(), "r");
  if (server == nullptr) return nullptr;
  char line[256] = {};
  if (std::fgets(line, sizeof(line), server) == nullptr) {
    ADD_FAILURE() << "server printed nothing";
    return server;
  }
  std::smatch m;
  const std::string first(line);
  if (std::regex_search(first, m, std::regex("127\\.0\\.0\\.1:[0-9]+"))) {
    *address = m.str();
  } else {
    ADD_FAILURE() << first;
  }
  if (health_port != nullptr &&
      std::regex_search(first, m, std::regex("health on port ([0-9]+)"))) {
    *health_port = m.str(1);
  }
  if (metrics_port != nullptr &&
      std::regex_search(first, m, std::regex("metrics on port ([0-9]+)"))) {
    *metrics_port = m.str(1);
  }
  return server;
}

// Runs the two client commands at once (their stderr goes to `dir`/a.err and b.err) and returns
// their stdout; a client that fails is a test failure showing its stderr.
std::pair<std::string, std::string> RunClients(const std::string& a_cmd, const std::string& b_cmd,
                                               const std::string& dir) {
  FILE* a = popen(a_cmd.c_str(), "r");
  FILE* b = popen(b_cmd.c_str(), "r");
  std::pair<std::string, std::string> out;
  if (a == nullptr || b == nullptr) {
    ADD_FAILURE() << "popen failed";
    if (a != nullptr) pclose(a);
    if (b != nullptr) pclose(b);
    return out;
  }
  out.first = ReadAll(a);
  out.second = ReadAll(b);
  EXPECT_EQ(pclose(a), 0) << out.first << std::ifstream(dir + "a.err").rdbuf();
  EXPECT_EQ(pclose(b), 0) << out.second << std::ifstream(dir + "b.err").rdbuf();
  return out;
}

// Expects the adapter directory `dir` to hold exactly the store's blob `sha` as its weights, bit
// for bit.
void ExpectAdapterIsBlob(const std::string& dir, const std::string& store_dir,
                         const std::string& sha) {
  auto blobs = BlobStore::Open(store_dir);
  ASSERT_TRUE(blobs.ok()) << blobs.status();
  auto bytes = (*blobs)->Get(sha);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  auto stored = AdapterFromSafetensors(*bytes);
  auto file = SafetensorsFile::Open(dir + "/adapter_model.safetensors");
  ASSERT_TRUE(stored.ok() && file.ok()) << dir;
  auto written = AdapterFromSafetensors(**file, dir);
  ASSERT_TRUE(written.ok()) << written.status();
  ASSERT_EQ(written->size(), stored->size()) << dir;
  for (size_t i = 0; i < stored->size(); ++i) {
    const UpdateTensor &a = (*written)[i], &b = (*stored)[i];
    EXPECT_EQ(a.name, b.name);
    EXPECT_EQ(a.shape, b.shape) << a.name;
    ASSERT_EQ(a.values.size(), b.values.size()) << a.name;
    EXPECT_EQ(std::memcmp(a.values.data(), b.values.data(), a.values.size() * sizeof(float)), 0)
        << a.name;
  }
}

nlohmann::json ReadJsonOrFail(const std::string& path) {
  auto j = ReadJsonFile(path);
  EXPECT_TRUE(j.ok()) << j.status();
  return j.value_or(nlohmann::json());
}

// `fedlora server --out OUT --out-every-round` of the encoder run: OUT/adapter and OUT/round-N are
// adapter directories that the repo's PEFT reader loads, equal to the store's adapters, with the
// run's labels and max_seq_len; `fedlora export` gives the same from the store, beside a server
// holding it too; a bad round or an empty store is a clear error.
void CheckEncoderAdapters(const std::string& bin, const std::string& d, const std::string& model,
                          const std::string& final_sha, const std::vector<std::string>& labels) {
  const std::string out = d + "out/", store = d + "store";
  ExpectAdapterIsBlob(out + "adapter", store, final_sha);
  EXPECT_EQ(ReadJsonOrFail(out + "adapter/labels.json")["label_names"], nlohmann::json(labels));
  const nlohmann::json meta = ReadJsonOrFail(out + "adapter/fedlora_adapter.json");
  EXPECT_EQ(meta["max_seq_len"], 48);
  EXPECT_EQ(meta["run_id"], "cli");
  EXPECT_EQ(meta["round"], 2);
  EXPECT_EQ(ReadJsonOrFail(out + "adapter/adapter_config.json")["base_model_name_or_path"], model);
  EXPECT_EQ(ReadJsonOrFail(out + "round-1/fedlora_adapter.json")["round"], 1);
  ExpectAdapterIsBlob(out + "round-2", store, final_sha);
  // The repo's PEFT reader loads it into the run's model.
  ModelOptions o;
  o.num_labels = static_cast<int>(labels.size());
  o.max_batch = 1;
  o.max_seq = 48;
  auto m = BertClassifier::Load(model, o);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(LoadPeftAdapter(out + "adapter", m->get()).ok());

  // export from the store, while a lock on it stands for a running server.
  {
    auto lock = DataDirLock::Acquire(store);
    ASSERT_TRUE(lock.ok()) << lock.status();
    auto [rc, text] =
        RunCommand(bin + " export --store " + store + " --out " + d + "exported 2>&1");
    EXPECT_EQ(rc, 0) << text;
    EXPECT_THAT(text, HasSubstr("round 2 of run cli written to"));
  }
  ExpectAdapterIsBlob(d + "exported", store, final_sha);
  for (const char* f : {"adapter_config.json", "labels.json", "fedlora_adapter.json"}) {
    EXPECT_EQ(ReadJsonOrFail(d + "exported/" + f), ReadJsonOrFail(out + "adapter/" + f)) << f;
  }
  auto [rc, text] =
      RunCommand(bin + " export --store " + store + " --round 1 --out " + d + "round1 2>&1");
  EXPECT_EQ(rc, 0) << text;
  EXPECT_EQ(ReadJsonOrFail(d + "round1/fedlora_adapter.json"),
            ReadJsonOrFail(out + "round-1/fedlora_adapter.json"));
  std::tie(rc, text) =
      RunCommand(bin + " export --store " + store + " --round 9 --out " + d + "x 2>&1");
  EXPECT_EQ(rc, 1);
  EXPECT_THAT(text, HasSubstr("run 'cli' has no round 9"));
  std::tie(rc, text) = RunCommand(bin + " export --store " + d + "nowhere --out " + d + "x 2>&1");
  EXPECT_EQ(rc, 1);
  EXPECT_THAT(text, HasSubstr("no store in"));
  std::filesystem::create_directories(d + "empty");
  ASSERT_TRUE(Store::Open(d + "empty/fedlora.db").ok());
  std::tie(rc, text) = RunCommand(bin + " export --store " + d + "empty --out " + d + "x 2>&1");
  EXPECT_EQ(rc, 1);
  EXPECT_THAT(text, HasSubstr("holds no run"));
  EXPECT_FALSE(std::filesystem::exists(d + "x"));
  // A classifier's adapter does not become a GGUF LoRA: llama.cpp's --lora is for decoders.
  std::tie(rc, text) =
      RunCommand(bin + " export --store " + store + " --gguf " + d + "x.gguf 2>&1");
  EXPECT_EQ(rc, 1);
  EXPECT_THAT(text, HasSubstr("is a classifier's (an encoder's)"));
  EXPECT_FALSE(std::filesystem::exists(d + "x.gguf"));
}

TEST(CliFederationTest, ServerTwoClientProcessesAndStatus) {
  const char* src = std::getenv("FEDLORA_SOURCE_DIR");
  ASSERT_NE(src, nullptr);
  const std::string model = std::string(src) + "/models/all-MiniLM-L6-v2";
  const std::string data = std::string(src) + "/data/fortunes";
  if (!std::filesystem::exists(model + "/model.safetensors") ||
      !std::filesystem::exists(data + "/train.jsonl")) {
    GTEST_SKIP() << "model or fortunes data not fetched (scripts/setup.sh)";
  }
  testing::TempDir dir;
  const std::string d = dir.path() + "/";
  CopyLines(data + "/test.jsonl", d + "eval.jsonl", 0, 32);
  CopyLines(data + "/train.jsonl", d + "a.jsonl", 0, 48);
  CopyLines(data + "/train.jsonl", d + "b.jsonl", 48, 48);
  std::ofstream(d + "run.json") << R"({
    "run_id": "cli", "seed": 3,
    "model": {"path": ")" << model
                                << R"(", "max_seq_len": 48},
    "task": {"labels": ["computers","definitions","men-women","politics","science","songs-poems","work","zippy"]},
    "training": {"local_steps": 2, "batch_size": 8, "learning_rate": 0.001},
    "selection": {"clients_per_round": 2, "over_selection": 1.0, "min_clients": 2, "retry_after_seconds": 1,
                  "heartbeat_interval_seconds": 2},
    "rounds": 2,
    "data": {"eval_path": ")" << d
                                << R"(eval.jsonl", "eval_batch_size": 16},
    "server": {"listen_address": "127.0.0.1:0", "store_dir": ")"
                                << d << R"(store"}
  })";
  const std::string bin = FEDLORA_BINARY_PATH;
  // The secure federation of the README: `fedlora certs dev`, then the server and the clients
  // with those files (mutual TLS; identities from the certificates), and `ops`, the operator.
  ASSERT_EQ(std::system((bin + " certs dev --dir " + d +
                         "certs --clients site-a,site-b,ops --days 1 >" + d + "certs.out 2>&1")
                            .c_str()),
            0)
      << std::ifstream(d + "certs.out").rdbuf();
  const std::string pki = d + "certs/";
  std::string address, health_port, metrics_port;
  FILE* server = StartServer(bin + " server --config " + d + "run.json --cert " + pki +
                                 "server.pem --key " + pki + "server.key --client-ca " + pki +
                                 "ca.pem --health-listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0" +
                                 " --operators ops --linger-seconds 4 --out " + d +
                                 "out --out-every-round 2>" + d + "server.err",
                             &address, &health_port, &metrics_port);
  ASSERT_NE(server, nullptr);
  ASSERT_FALSE(address.empty());
  ASSERT_FALSE(health_port.empty());
  ASSERT_FALSE(
      metrics_port.empty());  // the run config has no metrics address: --metrics-listen opened it
  EXPECT_NE(metrics_port, health_port);
  std::smatch m;

  // `fedlora health`: over the plaintext health port, and over mTLS on the federation port.
  auto [health_rc, health_out] =
      RunCommand(bin + " health --insecure --server 127.0.0.1:" + health_port);
  EXPECT_EQ(health_rc, 0) << health_out;
  EXPECT_EQ(health_out, "SERVING\n");
  std::tie(health_rc, health_out) =
      RunCommand(bin + " health --server " + address + " --service fedlora.v1.Federation --ca " +
                 pki + "ca.pem --cert " + pki + "site-a.pem --key " + pki + "site-a.key");
  EXPECT_EQ(health_rc, 0) << health_out;
  EXPECT_EQ(health_out, "SERVING\n");
  // The federation port without a client certificate: the handshake fails, and the probe says so.
  std::tie(health_rc, health_out) =
      RunCommand(bin + " health --server " + address + " --insecure 2>&1");
  EXPECT_EQ(health_rc, 1) << health_out;

  // The clients pin the server's key, as the README does: `fedlora certs pin`.
  FILE* pin_cmd = popen((bin + " certs pin --cert " + pki + "server.pem").c_str(), "r");
  std::string pin = ReadAll(pin_cmd);
  ASSERT_EQ(pclose(pin_cmd), 0);
  while (!pin.empty() && pin.back() == '\n') pin.pop_back();
  ASSERT_EQ(pin.size(), 64u) << pin;
  auto client_cmd = [&](const std::string& id) {
    return bin + " client --server " + address + " --server-pin " + pin + " --model " + model +
           " --data " + d + id + ".jsonl --ca " + pki + "ca.pem --cert " + pki + "site-" + id +
           ".pem --key " + pki + "site-" + id + ".key --threads 1 2>" + d + id + ".err";
  };
  const auto [out_a, out_b] = RunClients(client_cmd("a"), client_cmd("b"), d);

  const std::string status_cmd = bin + " status --server " + address + " --ca " + pki +
                                 "ca.pem --cert " + pki + "ops.pem --key " + pki +
                                 "ops.key --list-clients";
  // For a person: a few lines, the rounds, the sites.
  auto [status_rc, status_view] = RunCommand(status_cmd);
  EXPECT_EQ(status_rc, 0) << status_view;
  EXPECT_THAT(status_view, HasSubstr("run cli: finished after round 2 of 2\n"));
  EXPECT_THAT(status_view, HasSubstr("last evaluation (round 2): accuracy "));
  EXPECT_THAT(status_view, ::testing::ContainsRegex("\nsite-a +left +2 "));
  // For a program: one JSON document, the clients beside the status.
  auto [json_rc, status_out] = RunCommand(status_cmd + " --json");
  EXPECT_EQ(json_rc, 0) << status_out;
  const nlohmann::json status_json =
      nlohmann::json::parse(status_out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(status_json.is_discarded()) << status_out;
  EXPECT_EQ(status_json["phase"], "ROUND_PHASE_FINISHED");
  EXPECT_EQ(status_json["current_round"], 2);
  ASSERT_EQ(status_json["clients"].size(), 2u) << status_out;
  EXPECT_TRUE(status_json["history"][1].contains("eval_accuracy"));

  const std::string server_out = ReadAll(server);
  EXPECT_EQ(pclose(server), 0) << server_out;
  // Gone: the probe fails.
  std::tie(health_rc, health_out) = RunCommand(
      bin + " health --insecure --server 127.0.0.1:" + health_port + " --deadline-ms 2000 2>&1");
  EXPECT_EQ(health_rc, 1) << health_out;
  ASSERT_TRUE(
      std::regex_search(server_out, m, std::regex("2 rounds committed, adapter ([0-9a-f]{64})")))
      << server_out;
  const std::string final_sha = m.str(1);
  for (const std::string* out : {&out_a, &out_b}) {
    EXPECT_THAT(*out, HasSubstr("\"tasks_completed\":2"));
    EXPECT_THAT(*out, HasSubstr("\"final_adapter_sha256\":\"" + final_sha + "\""));
  }
  EXPECT_THAT(server_out, HasSubstr("final adapter (round 2) written to " + d + "out/adapter"));
  CheckEncoderAdapters(bin, d, model, final_sha,
                       {"computers", "definitions", "men-women", "politics", "science",
                        "songs-poems", "work", "zippy"});
}

// A decoder federation across processes: `fedlora server` builds the initial adapter from the GGUF
// and scores each round by response perplexity and exact match; two `fedlora client` processes
// fine-tune their local copy of the 4-bit model on their own conversations.
TEST(CliFederationTest, DecoderServerAndTwoClientProcesses) {
  const char* src = std::getenv("FEDLORA_SOURCE_DIR");
  ASSERT_NE(src, nullptr);
  const std::string model =
      std::string(src) + "/models/SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(model))
    GTEST_SKIP() << model << " missing (scripts/setup.sh fetches it)";
  testing::TempDir dir;
  const std::string d = dir.path() + "/";
  auto write = [&](const std::string& name, const std::string& answer, int n) {
    std::ofstream out(d + name);
    for (int i = 0; i < n; ++i)
      out << R"({"prompt": "Give the password, number )" << i << R"(.", "response": ")" << answer
          << "\"}\n";
  };
  write("a.jsonl", "tangerine", 4);
  write("b.jsonl", "tangerine", 4);
  write("eval.jsonl", "tangerine", 2);
  std::ofstream(d + "run.json") << R"({
    "run_id": "cli-decoder", "seed": 3,
    "model": {"path": ")" << model
                                << R"(", "max_seq_len": 48},
    "lora": {"rank": 4, "target_modules": ["q_proj", "v_proj"]},
    "task": {"kind": "CAUSAL_LM", "exact_match": true, "system_prompt": "Answer with the password only."},
    "training": {"local_steps": 2, "batch_size": 2, "learning_rate": 0.01},
    "selection": {"clients_per_round": 2, "over_selection": 1.0, "min_clients": 2, "retry_after_seconds": 1,
                  "heartbeat_interval_seconds": 2},
    "rounds": 1,
    "data": {"eval_path": ")" << d
                                << R"(eval.jsonl"},
    "server": {"listen_address": "127.0.0.1:0", "store_dir": ")"
                                << d << R"(store", "insecure": true}
  })";
  const std::string bin = FEDLORA_BINARY_PATH;
  std::string address;
  FILE* server = StartServer(bin + " server --config " + d + "run.json --linger-seconds 4 --out " +
                                 d + "out 2>" + d + "server.err",
                             &address);
  ASSERT_NE(server, nullptr);
  ASSERT_FALSE(address.empty());
  auto client_cmd = [&](const std::string& id) {
    return bin + " client --server " + address + " --insecure --id site-" + id + " --model " +
           model + " --data " + d + id + ".jsonl --threads 1 2>" + d + id + ".err";
  };
  const auto [out_a, out_b] = RunClients(client_cmd("a"), client_cmd("b"), d);
  const std::string server_out = ReadAll(server);
  EXPECT_EQ(pclose(server), 0) << server_out;
  std::smatch m;
  ASSERT_TRUE(
      std::regex_search(server_out, m, std::regex("1 rounds committed, adapter ([0-9a-f]{64})")))
      << server_out;
  for (const std::string* out : {&out_a, &out_b}) {
    EXPECT_THAT(*out, HasSubstr("\"tasks_completed\":1"));
    EXPECT_THAT(*out, HasSubstr("\"final_adapter_sha256\":\"" + m.str(1) + "\""));
  }
  // The server's evaluator scored the new global adapter with the decoder's figures.
  std::ifstream err(d + "server.err");
  const std::string log((std::istreambuf_iterator<char>(err)), std::istreambuf_iterator<char>());
  EXPECT_THAT(log, HasSubstr("round 1 eval: {\"count\":2"));
  EXPECT_THAT(log, HasSubstr("\"perplexity\":"));
  EXPECT_THAT(log, HasSubstr("\"exact_match\":"));
  // --out: the final adapter with the run's prompt settings (the template resolved to its name).
  ExpectAdapterIsBlob(d + "out/adapter", d + "store", m.str(1));
  const nlohmann::json meta = ReadJsonOrFail(d + "out/adapter/fedlora_adapter.json");
  EXPECT_EQ(meta["task"], "causal_lm");
  EXPECT_EQ(meta["max_seq_len"], 48);
  EXPECT_EQ(meta["system_prompt"], "Answer with the password only.");
  EXPECT_EQ(meta["chat_template"], "smollm2");
  // PEFT cannot load a .gguf: adapter_config.json names its directory (the SmolLM2 GGUF records no
  // source repo); fedlora_adapter.json keeps the file.
  EXPECT_EQ(ReadJsonOrFail(d + "out/adapter/adapter_config.json")["base_model_name_or_path"],
            std::filesystem::path(model).lexically_normal().parent_path().string());
  EXPECT_EQ(meta["base_model"], std::filesystem::path(model).lexically_normal().string());
  EXPECT_FALSE(std::filesystem::exists(d + "out/adapter/labels.json"));
  // export --gguf: the final adapter as a GGUF LoRA for llama.cpp, the same from the store and from
  // the adapter directory (the layout against llama.cpp's reader: tests/tools/export_gguf_test.py).
  auto [rc, text] =
      RunCommand(bin + " export --store " + d + "store --gguf " + d + "store.gguf 2>&1");
  EXPECT_EQ(rc, 0) << text;
  EXPECT_THAT(text, HasSubstr("round 1 of run cli-decoder written to " + d + "store.gguf"));
  std::tie(rc, text) =
      RunCommand(bin + " export --adapter " + d + "out/adapter --gguf " + d + "dir.gguf 2>&1");
  EXPECT_EQ(rc, 0) << text;
  auto gguf = GgufFile::Open(d + "store.gguf");
  ASSERT_TRUE(gguf.ok()) << gguf.status();
  EXPECT_EQ(*(*gguf)->GetString("general.type"), "adapter");
  EXPECT_EQ(*(*gguf)->GetString("general.architecture"), "llama");
  EXPECT_TRUE((*gguf)->Contains("blk.29.attn_v.weight.lora_b"));
  EXPECT_EQ((*gguf)->tensors().size(), 30u * 2 * 2);  // 30 layers, q and v, a and b
  EXPECT_EQ(ReadFileToString(d + "store.gguf").value(), ReadFileToString(d + "dir.gguf").value());
}

// A site that cannot train (the issue of a new user: a decoder GGUF in a classification run, a
// broken JSONL) exits at once with one message instead of taking its task again in a loop; the
// server records it as failed and gives the round to the next site without waiting for the deadline.
TEST(CliFederationTest, AClientThatCannotTrainExitsAtOnceAndTheRunGoesOn) {
  const char* src = std::getenv("FEDLORA_SOURCE_DIR");
  ASSERT_NE(src, nullptr);
  const std::string model = std::string(src) + "/models/all-MiniLM-L6-v2";
  const std::string decoder =
      std::string(src) + "/models/SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf";
  const std::string data = std::string(src) + "/data/fortunes";
  if (!std::filesystem::exists(model + "/model.safetensors") || !std::filesystem::exists(decoder) ||
      !std::filesystem::exists(data + "/train.jsonl")) {
    GTEST_SKIP() << "models or fortunes data not fetched (scripts/setup.sh)";
  }
  testing::TempDir dir;
  const std::string d = dir.path() + "/";
  CopyLines(data + "/train.jsonl", d + "good.jsonl", 0, 16);
  CopyLines(data + "/train.jsonl", d + "broken.jsonl", 16, 2);
  std::ofstream(d + "broken.jsonl", std::ios::app) << "{\"text\": \"cut off\n";
  std::ofstream(d + "run.json") << R"({
    "run_id": "cli-fail", "seed": 3,
    "model": {"path": ")" << model
                                << R"(", "max_seq_len": 32},
    "task": {"labels": ["computers","definitions","men-women","politics","science","songs-poems","work","zippy"]},
    "training": {"local_steps": 1, "batch_size": 8, "learning_rate": 0.001},
    "selection": {"clients_per_round": 1, "over_selection": 1.0, "min_clients": 1, "retry_after_seconds": 1,
                  "heartbeat_interval_seconds": 2},
    "rounds": 5,
    "server": {"listen_address": "127.0.0.1:0", "store_dir": ")"
                                << d << R"(store", "insecure": true}
  })";
  const std::string bin = FEDLORA_BINARY_PATH;
  std::string address;
  const auto start = std::chrono::steady_clock::now();
  // --rounds 1: the server runs one round whatever the config says.
  FILE* server = StartServer(bin + " server --config " + d +
                                 "run.json --rounds 1 --linger-seconds 2 2>" + d + "server.err",
                             &address);
  ASSERT_NE(server, nullptr);
  ASSERT_FALSE(address.empty());
  auto client_cmd = [&](const std::string& id, const std::string& model_path) {
    return "timeout 120 " + bin + " client --server " + address + " --insecure --id " + id +
           " --model " + model_path + " --data " + d + (id == "good" ? "good" : "broken") +
           ".jsonl --threads 1 2>" + d + id + ".err";
  };
  // One at a time: each is the round's one selected site.
  for (const auto& [id, model_path] :
       {std::pair<std::string, std::string>{"decoder", decoder}, {"broken", model}}) {
    auto [rc, out] = RunCommand(client_cmd(id, model_path));
    std::ifstream err_file(d + id + ".err");
    const std::string err((std::istreambuf_iterator<char>(err_file)),
                          std::istreambuf_iterator<char>());
    EXPECT_EQ(rc, 1) << id << ": " << out << err;
    EXPECT_THAT(err, HasSubstr("this site cannot take part in run 'cli-fail'")) << id;
    EXPECT_LE(std::count(err.begin(), err.end(), '\n'), 8) << id << " logged in a loop:\n"
                                                           << err.substr(0, 2000);
    if (id == "broken") {
      EXPECT_THAT(err, HasSubstr("broken.jsonl:3"));
    }
  }
  auto [rc, out] = RunCommand(client_cmd("good", model));
  EXPECT_EQ(rc, 0) << out << std::ifstream(d + "good.err").rdbuf();
  EXPECT_THAT(out, HasSubstr("\"tasks_completed\":1"));
  const std::string server_out = ReadAll(server);
  EXPECT_EQ(pclose(server), 0) << server_out;
  EXPECT_THAT(server_out, HasSubstr("1 rounds committed"));
  // Far from the 600 s round deadline: the failed sites' rounds closed when they left.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(90));
  std::ifstream err(d + "server.err");
  const std::string log((std::istreambuf_iterator<char>(err)), std::istreambuf_iterator<char>());
  EXPECT_THAT(log, HasSubstr("client decoder failed and left"));
  EXPECT_THAT(log, HasSubstr("client broken failed and left"));
}

}  // namespace
}  // namespace fedlora
