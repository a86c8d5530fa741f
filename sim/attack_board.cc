#include "sim/attack_board.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/logging.h"

namespace fedlora::sim {

absl::Status AttackBoard::Apply(uint64_t round, int client, std::vector<NamedTensor>& delta) {
  if (!AttackReadsTheRound(config_)) {
    ForgeUpdate(config_, round, client, delta);
    return absl::OkStatus();
  }
  const std::optional<Cohort> cohort = cohort_of_(round);
  const bool malicious = IsMalicious(config_, client);
  int attackers = 0;
  if (cohort.has_value()) {
    for (int c : cohort->trainers) attackers += IsMalicious(config_, c) ? 1 : 0;
  }
  if (!malicious && attackers == 0) return absl::OkStatus();  // nobody reads this round's deltas
  Publish(round, client, delta);
  if (!malicious) return absl::OkStatus();

  const std::set<int> expected = cohort.has_value() ? cohort->trainers : std::set<int>{client};
  const int64_t wait_ms = cohort.has_value() ? std::max<int64_t>(0, cohort->ms_left * 3 / 4) : 0;
  const int n = static_cast<int>(expected.size());
  const int f = std::max(1, attackers);
  bool complete = false;
  absl::StatusOr<std::vector<NamedTensor>> forged = AwaitForgery(
      round, expected, std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms),
      [&](const ClientDeltas& honest) {
        return ForgeFromRound(config_.simulation().attack(), honest, n, f);
      },
      &complete);
  if (!forged.ok()) return forged.status();
  if (!complete || !cohort.has_value()) {
    FEDLORA_LOG(WARNING) << "simulate: round " << round << ": client " << client << " forged "
                         << v1::SimulationAttack::Kind_Name(config_.simulation().attack().kind())
                         << " before every honest update of the round was published"
                         << (cohort.has_value() ? " (its wait ran out)" : " (the round closed)");
  }
  delta = *std::move(forged);
  return absl::OkStatus();
}

void AttackBoard::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
  }
  cv_.notify_all();
}

void AttackBoard::Publish(uint64_t round, int client, std::vector<NamedTensor> delta) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    DropEarlierLocked(round);
    Round& r = rounds_[round];
    if (r.sealed) return;
    r.published[client] = std::move(delta);
  }
  cv_.notify_all();
}

absl::StatusOr<std::vector<NamedTensor>> AttackBoard::AwaitForgery(
    uint64_t round, const std::set<int>& expected, std::chrono::steady_clock::time_point until,
    const Forge& forge, bool* complete) {
  std::unique_lock<std::mutex> lock(mu_);
  DropEarlierLocked(round);
  Round& r = rounds_[round];  // stays put: waiters > 0 keeps it on the board
  ++r.waiters;
  auto all_in = [&] {
    return std::all_of(expected.begin(), expected.end(),
                       [&](int c) { return r.published.count(c) != 0; });
  };
  cv_.wait_until(lock, until, [&] { return stopped_ || r.sealed || all_in(); });
  if (!stopped_ && !r.sealed) {
    r.sealed = true;
    r.complete = all_in();
    lock.unlock();  // nobody writes a sealed round's deltas
    absl::StatusOr<std::vector<NamedTensor>> made = forge(r.published);
    lock.lock();
    r.forged = std::move(made);
    ClientDeltas().swap(r.published);  // the honest deltas are no longer needed
    cv_.notify_all();
  }
  cv_.wait(lock, [&] { return stopped_ || r.forged.has_value(); });
  --r.waiters;
  if (!r.forged.has_value()) return absl::CancelledError("simulation stopping");
  if (complete != nullptr) *complete = r.complete;
  return *r.forged;
}

size_t AttackBoard::rounds_held() const {
  std::lock_guard<std::mutex> lock(mu_);
  return rounds_.size();
}

size_t AttackBoard::deltas_held() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& [round, r] : rounds_) n += r.published.size();
  return n;
}

void AttackBoard::DropEarlierLocked(uint64_t round) {
  for (auto it = rounds_.begin(); it != rounds_.end() && it->first < round;) {
    it = it->second.waiters == 0 ? rounds_.erase(it) : std::next(it);
  }
}

}  // namespace fedlora::sim
