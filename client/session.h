// One client's standing with the server: the transport, the session from Join, retries with
// backoff, and Stop(). Every stage of a task (client/*_stage.h) makes its calls through it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <random>
#include <string>

#include "absl/status/status.h"
#include "client/transport.h"
#include "fedlora/client.h"
#include "fedlora/v1/federation.pb.h"

namespace fedlora {

// Transient: worth retrying the same operation after a pause.
bool IsTransient(const absl::Status& s);

class Session {
 public:
  Session(const ClientOptions& options, std::unique_ptr<Transport> transport);

  Transport& transport() { return *transport_; }
  const ClientOptions& options() const { return options_; }
  // The last JoinResponse (run config, limits, identity).
  const v1::JoinResponse& join() const { return join_; }
  const std::string& run_id() const { return join_.run_config().run_id(); }
  // The call metadata: the session token and `deadline_ms`.
  CallMeta Meta(int64_t deadline_ms) const { return CallMeta{session_, deadline_ms}; }
  // For logs: the identity the server gave (under TLS, the certificate's), else the configured one.
  const std::string& Who() const;

  // One Join (no retry); the session and JoinResponse on success.
  absl::Status JoinOnce();

  // Runs `call` until it succeeds, fails permanently, or max_attempts are used. A lost session
  // (Unauthenticated) is re-joined once per attempt. With `busy_is_transient`, ResourceExhausted is
  // tried again too (a cap on calls open at once, not a quota spent).
  template <class F>
  absl::Status Retry(const char* what, F&& call, bool busy_is_transient = false) {
    absl::Status last;
    for (int attempt = 1; attempt <= options_.retry.max_attempts; ++attempt) {
      if (Stopped()) return absl::CancelledError("client stopped");
      last = call();
      if (last.ok()) return last;
      switch (AfterFailure(what, attempt, busy_is_transient, last)) {
        case Next::kReturn:
          return last;
        case Next::kAgainNow:
          continue;
        case Next::kAgainAfterPause:
          break;
      }
    }
    return GaveUp(what, last);
  }

  bool Stopped();
  // Sleeps up to `ms`; returns false when Stop() interrupted it.
  bool SleepFor(int64_t ms);
  void Stop();
  // The pause before attempt `attempt` + 1, with jitter.
  int64_t Backoff(int attempt);

  // The heartbeat interval: the server's last HeartbeatResponse.next_heartbeat_seconds, in ms;
  // 0 before any answer. Set from the heartbeat thread, read by the next task's.
  int64_t heartbeat_ms() const { return heartbeat_ms_.load(); }
  void set_heartbeat_ms(int64_t ms) { heartbeat_ms_.store(ms); }

 private:
  enum class Next { kReturn, kAgainNow, kAgainAfterPause };
  // What Retry does after `last` failed: return it (replaced by a better error where there is
  // one), re-join and try again at once, or pause (logged) and try again.
  Next AfterFailure(const char* what, int attempt, bool busy_is_transient, absl::Status& last);
  absl::Status GaveUp(const char* what, const absl::Status& last) const;
  // The pauses of one operation's retries, without jitter.
  int64_t RetryBudgetMs() const;

  const ClientOptions& options_;
  std::unique_ptr<Transport> transport_;
  std::mt19937_64 rng_;
  std::string session_;
  bool joined_ = false;
  v1::JoinResponse join_;
  std::atomic<int64_t> heartbeat_ms_{0};

  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
};

}  // namespace fedlora
