// `fedlora server` stopped by signals, as separate processes: SIGTERM in the middle of a run of the
// real all-MiniLM-L6-v2 LoRA adapters, with two `fedlora client` processes training and a health
// Watch stream open, must turn health NOT_SERVING, exit 0 within a bound and say where the run
// stopped; a restart on the same store resumes the run and finishes it, the clients riding out the
// restart. A second SIGTERM during the shutdown exits at once. Skips when the model or data have
// not been fetched (scripts/setup.sh).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/lifecycle/health_client.h"
#include "tests/server/federation_test_util.h"

namespace fedlora {
namespace {

using testing::CheckHealth;
using ::testing::HasSubstr;
using testing::HealthWatch;
using testing::kHealthNotServing;
using testing::kHealthServing;

// How long a stopped server may take to exit: its shutdown gives calls in flight 2 s, after the
// round driver's current tick (which may be aggregating and evaluating a round).
constexpr int64_t kExitBoundMs = 30'000;

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

int64_t MsUntil(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(t - std::chrono::steady_clock::now())
      .count();
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void CopyLines(const std::string& from, const std::string& to, int first, int count) {
  std::ifstream in(from);
  std::ofstream out(to);
  std::string line;
  for (int i = 0; std::getline(in, line) && i < first + count; ++i) {
    if (i >= first) out << line << "\n";
  }
}

// A child process running `args`, stdout into a pipe (read with ReadLine/ReadRest), stderr into
// `stderr_path`. Killed with SIGKILL if still running at destruction.
class Process {
 public:
  Process(const std::vector<std::string>& args, const std::string& stderr_path) {
    int out[2];
    if (pipe2(out, O_CLOEXEC) != 0) return;
    const int err = open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    pid_ = fork();
    if (pid_ == 0) {  // only async-signal-safe calls until exec
      dup2(out[1], STDOUT_FILENO);
      if (err >= 0) dup2(err, STDERR_FILENO);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(out[1]);
    if (err >= 0) close(err);
    out_ = out[0];
  }
  ~Process() {
    if (pid_ > 0 && !status_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (out_ >= 0) close(out_);
  }
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }

  // The next line of stdout (without the newline), waiting up to `timeout_ms`; nullopt at EOF or
  // timeout.
  std::optional<std::string> ReadLine(int64_t timeout_ms) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (true) {
      if (const size_t nl = buffer_.find('\n'); nl != std::string::npos) {
        std::string line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        return line;
      }
      const int64_t left = MsUntil(until);
      if (left <= 0 || !Fill(static_cast<int>(left))) return std::nullopt;
    }
  }
  // Everything left on stdout, until EOF (or `timeout_ms`).
  std::string ReadRest(int64_t timeout_ms) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (true) {
      const int64_t left = MsUntil(until);
      if (left <= 0 || !Fill(static_cast<int>(left))) break;
    }
    return std::exchange(buffer_, "");
  }

  // The wait status once the process exited within `timeout_ms`; nullopt if it is still running.
  std::optional<int> Wait(int64_t timeout_ms) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (!status_) {
      int status = 0;
      const pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        status_ = status;
      } else if (r < 0 || std::chrono::steady_clock::now() >= until) {
        break;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    return status_;
  }

 private:
  bool Fill(int timeout_ms) {
    pollfd p{out_, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) <= 0) return false;
    char buf[4096];
    const ssize_t n = read(out_, buf, sizeof(buf));
    if (n <= 0) return false;
    buffer_.append(buf, static_cast<size_t>(n));
    return true;
  }

  pid_t pid_ = -1;
  int out_ = -1;
  std::string buffer_;
  std::optional<int> status_;
};

std::string DescribeWaitStatus(const std::optional<int>& status) {
  if (!status) return "still running";
  if (WIFEXITED(*status)) return "exited with " + std::to_string(WEXITSTATUS(*status));
  if (WIFSIGNALED(*status)) return std::string("killed by ") + strsignal(WTERMSIG(*status));
  return "status " + std::to_string(*status);
}

// fedlora_rounds_committed_total from the metrics endpoint on 127.0.0.1:`port`; -1 when it cannot
// be read.
int64_t ScrapeRoundsCommitted(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string request = "GET /metrics HTTP/1.0\r\n\r\n";
    if (write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
      char buf[4096];
      ssize_t n;
      while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
    }
  }
  close(fd);
  std::smatch m;
  if (!std::regex_search(out, m, std::regex("\nfedlora_rounds_committed_total ([0-9]+)\n")))
    return -1;
  return std::stoll(m.str(1));
}

class ServerSignalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* src = std::getenv("FEDLORA_SOURCE_DIR");
    ASSERT_NE(src, nullptr);
    model_ = std::string(src) + "/models/all-MiniLM-L6-v2";
    const std::string data = std::string(src) + "/data/fortunes";
    if (!std::filesystem::exists(model_ + "/model.safetensors") ||
        !std::filesystem::exists(data + "/train.jsonl")) {
      GTEST_SKIP() << "model or fortunes data not fetched (scripts/setup.sh)";
    }
    d_ = dir_.path() + "/";
    store_ = d_ + "store";
    CopyLines(data + "/test.jsonl", d_ + "eval.jsonl", 0, 16);
    CopyLines(data + "/train.jsonl", d_ + "a.jsonl", 0, 32);
    CopyLines(data + "/train.jsonl", d_ + "b.jsonl", 32, 32);
    // retry_after_seconds: a long poll released by the shutdown comes back after the stopped server
    // has closed its port, rather than into its 2 s grace period (where gRPC answers CANCELLED,
    // which the client SDK retries too).
    std::ofstream(d_ + "run.json") << R"({
      "run_id": "lifecycle", "seed": 5,
      "model": {"path": ")" << model_
                                   << R"(", "max_seq_len": 32},
      "task": {"labels": ["computers","definitions","men-women","politics","science","songs-poems","work","zippy"]},
      "training": {"local_steps": 1, "batch_size": 8, "learning_rate": 0.001},
      "selection": {"clients_per_round": 2, "over_selection": 1.0, "min_clients": 2, "retry_after_seconds": 5,
                    "heartbeat_interval_seconds": 2},
      "rounds": 3,
      "data": {"eval_path": ")" << d_
                                   << R"(eval.jsonl", "eval_batch_size": 16},
      "server": {"listen_address": "127.0.0.1:0", "metrics_address": "127.0.0.1:0", "store_dir": ")"
                                   << store_ << R"("}
    })";
  }

  // Starts `fedlora server` (plaintext on loopback) and reads its first line; `listen` overrides
  // the config's address.
  std::unique_ptr<Process> StartServer(const std::string& name, const std::string& listen = "") {
    std::vector<std::string> args = {
        FEDLORA_BINARY_PATH, "server",           "--config", d_ + "run.json",
        "--insecure",        "--linger-seconds", "3"};
    if (!listen.empty()) args.insert(args.end(), {"--listen", listen});
    auto p = std::make_unique<Process>(args, d_ + name + ".err");
    const std::optional<std::string> line = p->ReadLine(120'000);
    std::smatch m;
    const std::regex listening(
        "listening on (127\\.0\\.0\\.1:([0-9]+)) \\(metrics on port ([0-9]+)\\)");
    if (!line || !std::regex_search(*line, m, listening)) {
      ADD_FAILURE() << "server printed '" << line.value_or("")
                    << "'; stderr: " << ReadFile(d_ + name + ".err");
      return nullptr;
    }
    address_ = m.str(1);
    port_ = m.str(2);
    metrics_port_ = std::stoi(m.str(3));
    return p;
  }

  std::unique_ptr<Process> StartClient(const std::string& id) {
    return std::make_unique<Process>(
        std::vector<std::string>{FEDLORA_BINARY_PATH, "client", "--server", address_, "--insecure",
                                 "--id", "site-" + id, "--model", model_, "--data",
                                 d_ + id + ".jsonl", "--threads", "1"},
        d_ + "client-" + id + ".err");
  }

  testing::TempDir dir_;
  std::string d_, model_, store_;
  std::string address_, port_;
  int metrics_port_ = 0;
};

TEST_F(ServerSignalTest, SigtermMidRunExitsCleanlyAndARestartResumesAndFinishesTheRun) {
  std::unique_ptr<Process> server = StartServer("server1");
  ASSERT_NE(server, nullptr);
  auto channel = grpc::CreateChannel(address_, grpc::InsecureChannelCredentials());
  EXPECT_EQ(CheckHealth(channel, "").status, kHealthServing);
  std::unique_ptr<Process> a = StartClient("a");
  std::unique_ptr<Process> b = StartClient("b");

  // Mid-run: the first round committed, the second one under way.
  const auto started = std::chrono::steady_clock::now();
  int64_t committed = 0;
  while ((committed = ScrapeRoundsCommitted(metrics_port_)) < 1 && SecondsSince(started) < 240) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_GE(committed, 1) << "no round committed; server stderr: " << ReadFile(d_ + "server1.err");
  // A Watch stream in flight through the shutdown: it sees NOT_SERVING, and the server must not
  // wait for it longer than its grace period.
  auto watch = std::make_unique<HealthWatch>(channel, "fedlora.v1.Federation");
  ASSERT_TRUE(watch->WaitFor(kHealthServing, 10'000));

  const auto signalled = std::chrono::steady_clock::now();
  ASSERT_EQ(kill(server->pid(), SIGTERM), 0);
  EXPECT_TRUE(watch->WaitFor(kHealthNotServing, kExitBoundMs)) << "health never said NOT_SERVING";
  const std::optional<int> status = server->Wait(kExitBoundMs);
  const double exit_s = SecondsSince(signalled);
  ASSERT_TRUE(status.has_value()) << "the server did not exit within " << kExitBoundMs
                                  << " ms of SIGTERM";
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << DescribeWaitStatus(status);
  RecordProperty("sigterm_to_exit_ms", static_cast<int>(exit_s * 1000));
  std::printf("SIGTERM to exit: %.2f s\n", exit_s);
  watch.reset();

  const std::string said = server->ReadRest(5000);
  EXPECT_THAT(said, ::testing::Not(HasSubstr("run finished")));
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      said, m,
      std::regex("stopped at round ([0-9]+): ([0-9]+) rounds committed; the run resumes when "
                 "the server restarts on " +
                 store_ + "\n")))
      << said;
  const int stopped_round = std::stoi(m.str(1));
  const int stopped_committed = std::stoi(m.str(2));
  EXPECT_GE(stopped_committed, 1);
  EXPECT_LT(stopped_committed, 3);
  EXPECT_EQ(stopped_round, stopped_committed + 1);
  EXPECT_THAT(ReadFile(d_ + "server1.err"), HasSubstr("Terminated: shutting down"));

  // The same address and store: the clients, still retrying, find the server again.
  std::unique_ptr<Process> restarted = StartServer("server2", "127.0.0.1:" + port_);
  ASSERT_NE(restarted, nullptr);
  EXPECT_EQ(CheckHealth(channel, "").status, kHealthServing);

  const std::optional<int> a_status = a->Wait(240'000);
  const std::optional<int> b_status = b->Wait(60'000);
  const std::string out_a = a->ReadRest(5000);
  const std::string out_b = b->ReadRest(5000);
  EXPECT_TRUE(a_status && WIFEXITED(*a_status) && WEXITSTATUS(*a_status) == 0)
      << DescribeWaitStatus(a_status) << ": " << ReadFile(d_ + "client-a.err");
  EXPECT_TRUE(b_status && WIFEXITED(*b_status) && WEXITSTATUS(*b_status) == 0)
      << DescribeWaitStatus(b_status) << ": " << ReadFile(d_ + "client-b.err");

  const std::optional<int> restarted_status = restarted->Wait(60'000);
  EXPECT_TRUE(restarted_status && WIFEXITED(*restarted_status) &&
              WEXITSTATUS(*restarted_status) == 0)
      << DescribeWaitStatus(restarted_status);
  const std::string said_after = restarted->ReadRest(5000);
  const std::string err_after = ReadFile(d_ + "server2.err");
  EXPECT_THAT(err_after, HasSubstr("resuming round " + std::to_string(stopped_round)));
  const std::regex finished("run finished: 3 rounds committed, adapter ([0-9a-f]{64})\n");
  ASSERT_TRUE(std::regex_search(said_after, m, finished)) << said_after << "\n" << err_after;
  const std::string final_sha = m.str(1);
  for (const std::string* out : {&out_a, &out_b}) {
    EXPECT_THAT(*out, HasSubstr("\"final_round\":3"));
    EXPECT_THAT(*out, HasSubstr("\"final_adapter_sha256\":\"" + final_sha + "\""));
  }
}

TEST_F(ServerSignalTest, ASecondSigtermDuringTheShutdownExitsAtOnce) {
  std::unique_ptr<Process> server = StartServer("server");
  ASSERT_NE(server, nullptr);
  auto channel = grpc::CreateChannel(address_, grpc::InsecureChannelCredentials());
  // The open Watch stream holds the shutdown in its 2 s grace period for calls in flight.
  HealthWatch watch(channel, "");
  ASSERT_TRUE(watch.WaitFor(kHealthServing, 10'000));
  ASSERT_EQ(kill(server->pid(), SIGTERM), 0);
  ASSERT_TRUE(watch.WaitFor(kHealthNotServing, kExitBoundMs));
  ASSERT_EQ(kill(server->pid(), SIGTERM), 0);
  const std::optional<int> status = server->Wait(kExitBoundMs);
  ASSERT_TRUE(status.has_value()) << "the server did not exit after the second SIGTERM";
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 128 + SIGTERM)
      << DescribeWaitStatus(status);
  EXPECT_THAT(ReadFile(d_ + "server.err"),
              HasSubstr("stop signal during the shutdown: exiting without finishing it"));
  EXPECT_THAT(server->ReadRest(5000), ::testing::Not(HasSubstr("run finished")));
}

TEST_F(ServerSignalTest, SigintBeforeAnyRoundStopsAtRoundOne) {
  std::unique_ptr<Process> server = StartServer("server");
  ASSERT_NE(server, nullptr);
  ASSERT_EQ(kill(server->pid(), SIGINT), 0);
  const std::optional<int> status = server->Wait(kExitBoundMs);
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << DescribeWaitStatus(status);
  EXPECT_THAT(server->ReadRest(5000),
              HasSubstr("stopped at round 1: 0 rounds committed; the run resumes when the "
                        "server restarts on " +
                        store_ + "\n"));
  EXPECT_THAT(ReadFile(d_ + "server.err"), HasSubstr("Interrupt: shutting down"));
}

}  // namespace
}  // namespace fedlora
