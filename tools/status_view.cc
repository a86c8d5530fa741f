#include "tools/status_view.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace fedlora::tools {
namespace {

// An enum name without its prefix, in lower case: ROUND_PHASE_TRAINING -> "training".
std::string Word(std::string_view name, std::string_view prefix) {
  if (name.substr(0, prefix.size()) == prefix) name.remove_prefix(prefix.size());
  std::string out(name);
  for (char& c : out)
    c = c == '_' ? ' ' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string Bytes(uint64_t n) {
  if (n < 1024) return absl::StrCat(n, " B");
  if (n < (uint64_t{1} << 20)) return absl::StrFormat("%.1f KiB", n / 1024.0);
  if (n < (uint64_t{1} << 30)) return absl::StrFormat("%.1f MiB", n / 1048576.0);
  return absl::StrFormat("%.2f GiB", n / 1073741824.0);
}

// "12 s", "3 min", "2 h": how long from `then_ms` to `now_ms`.
std::string Ago(int64_t then_ms, int64_t now_ms) {
  if (then_ms <= 0) return "-";
  const int64_t s = std::max<int64_t>(0, (now_ms - then_ms) / 1000);
  if (s < 120) return absl::StrCat(s, " s");
  if (s < 7200) return absl::StrCat(s / 60, " min");
  return absl::StrCat(s / 3600, " h");
}

// The latest round that was evaluated, if any.
const v1::RoundSummary* LastEvaluated(const v1::GetStatusResponse& s) {
  for (int i = s.history_size() - 1; i >= 0; --i) {
    if (s.history(i).has_eval_loss() || s.history(i).has_eval_accuracy()) return &s.history(i);
  }
  return nullptr;
}

std::string RoundsTable(const v1::GetStatusResponse& s) {
  std::string out = absl::StrFormat("%5s  %7s  %7s  %8s  %10s  %10s  %10s  %9s  %8s  %7s\n",
                                    "round", "updates", "dropped", "examples", "upload", "download",
                                    "train loss", "eval loss", "accuracy", "epsilon");
  const int first = std::max(0, s.history_size() - kViewRounds);
  if (first > 0)
    absl::StrAppend(&out, "  (", first, " earlier rounds: --json lists every round)\n");
  auto opt = [](bool has, double v, int decimals) {
    return has ? absl::StrFormat("%.*f", decimals, v) : std::string("-");
  };
  for (int i = first; i < s.history_size(); ++i) {
    const v1::RoundSummary& r = s.history(i);
    absl::StrAppend(
        &out, absl::StrFormat("%5d  %7s  %7d  %8d  %10s  %10s  %10s  %9s  %8s  %7s\n", r.round(),
                              absl::StrCat(r.updates_accepted(), "/", r.clients_selected()),
                              r.clients_dropped(), r.examples(), Bytes(r.upload_bytes()),
                              Bytes(r.download_bytes()),
                              opt(r.mean_train_loss() > 0, r.mean_train_loss(), 4),
                              opt(r.has_eval_loss(), r.eval_loss(), 4),
                              opt(r.has_eval_accuracy(), r.eval_accuracy(), 4),
                              opt(r.has_dp_epsilon(), r.dp_epsilon(), 3)));
  }
  return out;
}

// The site's task with its training progress when the server knows it ("r3-...  12/40 steps").
std::string TaskText(const v1::ClientInfo& c) {
  if (c.current_task_id().empty()) return "-";
  if (c.steps_total() == 0) return c.current_task_id();
  return absl::StrFormat("%s  %d/%d steps", c.current_task_id(), c.steps_done(), c.steps_total());
}

}  // namespace

std::string StatusView(const v1::GetStatusResponse& s, int64_t now_ms) {
  std::string out = absl::StrCat("run ", s.run_id(), ": ");
  if (s.phase() == v1::ROUND_PHASE_FINISHED) {
    absl::StrAppend(
        &out, "finished after round ", s.current_round(), " of ", s.total_rounds(),
        s.privacy_budget_spent() ? " (the privacy budget could not afford another round)" : "",
        "\n");
  } else {
    absl::StrAppend(&out, "round ", s.current_round(), " of ", s.total_rounds(), ", ",
                    Word(v1::RoundPhase_Name(s.phase()), "ROUND_PHASE_"));
    if (s.round_start_unix_ms() > 0)
      absl::StrAppend(&out, " (started ", Ago(s.round_start_unix_ms(), now_ms), " ago)");
    if (s.phase() == v1::ROUND_PHASE_TRAINING) {
      absl::StrAppend(&out, ", ", s.updates_accepted_this_round(), " update",
                      s.updates_accepted_this_round() == 1 ? "" : "s", " in");
    }
    absl::StrAppend(&out, "\n");
  }
  absl::StrAppend(&out, "sites: ", s.connected_clients(), " connected, ", s.active_tasks(),
                  " holding a task\n");
  if (const v1::RoundSummary* r = LastEvaluated(s)) {
    absl::StrAppend(&out, "last evaluation (round ", r->round(), "):");
    if (r->has_eval_accuracy())
      absl::StrAppend(&out, absl::StrFormat(" accuracy %.4f", r->eval_accuracy()));
    if (r->has_eval_loss()) absl::StrAppend(&out, absl::StrFormat(" loss %.4f", r->eval_loss()));
    const std::map<std::string, double> others(r->eval_metrics().begin(),
                                               r->eval_metrics().end());  // sorted
    for (const auto& [name, value] : others)
      absl::StrAppend(&out, absl::StrFormat(" %s %.4g", name, value));
    absl::StrAppend(&out, "\n");
  }
  if (s.has_dp_epsilon()) {
    absl::StrAppend(
        &out, absl::StrFormat("privacy: epsilon %.3f spent", s.dp_epsilon()),
        s.has_dp_max_epsilon() ? absl::StrFormat(" of %.3f", s.dp_max_epsilon()) : "",
        absl::StrFormat(" at delta %g, clip norm %g\n", s.dp_target_delta(), s.dp_clip_norm()));
  }
  absl::StrAppend(&out, "global adapter: round ", s.global_adapter().round(), ", sha256 ",
                  s.global_adapter().sha256().substr(0, 16), ", ",
                  Bytes(s.global_adapter().total_bytes()), "\n");
  if (s.history_size() > 0) absl::StrAppend(&out, "\n", RoundsTable(s));
  return out;
}

std::string ClientsView(const std::vector<v1::ClientInfo>& clients, int64_t now_ms) {
  size_t width = 4;
  for (const v1::ClientInfo& c : clients) width = std::max(width, c.client_id().size());
  std::string out = absl::StrFormat("%-*s  %-12s  %6s  %8s  %9s  %s\n", width, "site", "state",
                                    "rounds", "rejected", "last seen", "task");
  for (const v1::ClientInfo& c : clients) {
    std::string state = Word(v1::ClientState_Name(c.state()), "CLIENT_STATE_");
    if (c.blocked()) state = "blocked";
    absl::StrAppend(&out, absl::StrFormat("%-*s  %-12s  %6d  %8d  %9s  %s\n", width, c.client_id(),
                                          state, c.rounds_participated(), c.updates_rejected(),
                                          Ago(c.last_seen_unix_ms(), now_ms) +
                                              (c.last_seen_unix_ms() > 0 ? " ago" : ""),
                                          TaskText(c)));
    if (!c.failure().empty()) absl::StrAppend(&out, std::string(width + 2, ' '), c.failure(), "\n");
  }
  if (clients.empty()) absl::StrAppend(&out, "(no site has joined)\n");
  return out;
}

}  // namespace fedlora::tools
