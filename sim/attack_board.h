// The board of the attacks that read a round's honest updates (simulation.attack LITTLE_IS_ENOUGH
// and MIN_MAX, sim/attacks.h). Threat model: the full-knowledge (omniscient) adversary of the
// papers. In a round with a malicious client, every selected client that trains publishes the
// delta it trained here; each malicious client (after training, its pooled model released)
// waits until all of them have published, then sends the forgery computed from all of them (its
// own honest delta included). The round's malicious clients all send the same forgery.
//
// The wait is bounded: it ends when the simulation stops (Cancelled), and at 3/4 of the time left
// before the round's deadline, so that the forgery can still be uploaded; the forgery is then
// computed from what was published (at least the attacker's own delta), with a warning logged.
// Memory: a round's honest deltas (n x adapter) are freed once its forgery is made; the forgery
// when a later round starts on the board.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <vector>

#include "absl/status/statusor.h"
#include "core/named_tensor.h"
#include "fedlora/v1/config.pb.h"
#include "sim/attacks.h"

namespace fedlora::sim {

class AttackBoard {
 public:
  // What the simulator knows of a server round while it trains: the selected clients that will
  // train (not the dropouts), and the milliseconds left before its deadline.
  struct Cohort {
    std::set<int> trainers;
    int64_t ms_left = 0;
  };
  // The cohort of a round; nullopt once the round is no longer open.
  using CohortOf = std::function<std::optional<Cohort>(uint64_t round)>;

  AttackBoard(const v1::RunConfig& config, CohortOf cohort_of)
      : config_(config), cohort_of_(std::move(cohort_of)) {}

  // What virtual client `client` sends in server round `round` in place of the honest `delta`
  // (rewritten in place): the own-delta attacks of ForgeUpdate; under LITTLE_IS_ENOUGH or MIN_MAX
  // the exchange above, n and f being the round's trainers and the malicious ones among them.
  // Cancelled when the board stops during the wait.
  absl::Status Apply(uint64_t round, int client, std::vector<NamedTensor>& delta);

  // Ends every wait, now and later (the simulation is stopping).
  void Stop();

  // The steps of Apply (tests). Publish: client `client`'s honest delta in `round`; ignored once
  // the round's forgery is being made. AwaitForgery: waits until every client of `expected`
  // published for `round`, `until` passes, or Stop; then the round's forgery, made by `forge`
  // from what was published by the first waiter to stop waiting, and shared with the others.
  // `*complete`: whether all of `expected` had published by then.
  using Forge = std::function<absl::StatusOr<std::vector<NamedTensor>>(const ClientDeltas&)>;
  void Publish(uint64_t round, int client, std::vector<NamedTensor> delta);
  absl::StatusOr<std::vector<NamedTensor>> AwaitForgery(uint64_t round,
                                                        const std::set<int>& expected,
                                                        std::chrono::steady_clock::time_point until,
                                                        const Forge& forge, bool* complete);
  // Rounds on the board, and the honest deltas it holds (tests: what is freed when).
  size_t rounds_held() const;
  size_t deltas_held() const;

 private:
  struct Round {
    ClientDeltas published;
    bool sealed = false;  // the forgery is being made or made: publishing is over
    bool complete = false;
    std::optional<absl::StatusOr<std::vector<NamedTensor>>> forged;
    int waiters = 0;
  };
  // Erases the rounds before `round` that no one waits on (the server has moved past them).
  void DropEarlierLocked(uint64_t round);

  const v1::RunConfig& config_;
  const CohortOf cohort_of_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopped_ = false;
  std::map<uint64_t, Round> rounds_;
};

}  // namespace fedlora::sim
