// Per-round reports of a simulation: JSON lines, CSV, a hand-written SVG plot and a summary table.
//
//   std::vector<RoundRecord> rounds = ...;           // rounds[0] is the untuned start (round 0)
//   FEDLORA_RETURN_IF_ERROR(WriteRoundReports("runs/sim", rounds, "fortunes, Dirichlet 0.5"));
//   std::cout << SummaryTable(rounds);
//
// Files written (each atomically, so a reader never sees half a file): rounds.jsonl (one object
// per round, keys as in RoundRecordToJson), rounds.csv (same columns, a header row) and
// rounds.svg (three panels against the round: held-out accuracy, or perplexity when no round has an
// accuracy, with the untuned model and any reference as dashed lines; held-out and training loss;
// cumulative MiB up and down).
// Pure functions apart from WriteRoundReports; thread-safe.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace fedlora::sim {

struct RoundRecord {
  int round = 0;              // committed rounds so far: 0 = the initial adapter, then 1, 2, ...
  uint64_t server_round = 0;  // the server's round number (abandoned attempts also use numbers)
  // Held-out metrics of the global adapter after this round (NaN when not evaluated).
  double eval_accuracy = 0;
  double eval_loss = 0;
  double eval_macro_f1 = 0;
  // CAUSAL_LM: exp(eval_loss), the response perplexity (eval_accuracy is then the exact-match
  // rate when task.exact_match asks for it, and eval_macro_f1 NaN). NaN for a classifier.
  double eval_perplexity = std::nan("");
  // Mean over this round's reporting clients of their mean local step loss (NaN when none).
  double mean_train_loss = 0;
  // Wire bytes the server received in upload chunks / sent in download chunks since the previous
  // round's commit (a straggler's refused late upload lands in the round during which it arrived).
  int64_t bytes_up = 0;
  int64_t bytes_down = 0;
  // The accepted updates as dense fp32 values: bytes_up against it is the codec's saving.
  int64_t bytes_up_fp32 = 0;
  // What the completed downloads stand for as full adapters (a downlink delta chain counts the
  // adapter it rebuilds): bytes_down against it is the downlink codec's saving.
  int64_t bytes_down_full = 0;
  // With differential privacy: epsilon (at privacy.dp.target_delta) spent by the rounds committed
  // so far, from the server's accountant; NaN without it.
  double dp_epsilon = std::nan("");
  double round_seconds = 0;    // wall time since the previous commit (round 0: setup time)
  double elapsed_seconds = 0;  // wall time since the simulation started
  // Clients given a task for this round, updates the server accepted for it, and injected faults.
  int selected = 0;
  int reported = 0;
  int dropped = 0;     // vanished after selection
  int stragglers = 0;  // delayed by straggler_delay_seconds
  int crashed = 0;     // upload cut off midway (resumed later)
};

// One JSON object on one line (no trailing newline). NaN values are written as null.
std::string RoundRecordToJson(const RoundRecord& r);
// Header row plus one row per record; NaN as an empty cell.
std::string RoundsToCsv(const std::vector<RoundRecord>& rounds);
// A figure drawn across the quality panel for comparison, e.g. {"centralized", 0.7725}.
struct ReferenceLine {
  std::string label;
  double value = 0;
};

// A standalone SVG document (three panels, axes with ticks, legends). `title` and the references'
// labels are XML-escaped; a reference outside the panel's axis is left out.
std::string RoundsToSvg(const std::vector<RoundRecord>& rounds, const std::string& title,
                        const std::vector<ReferenceLine>& references = {});
// Fixed-width text table, one line per round, plus a totals line.
std::string SummaryTable(const std::vector<RoundRecord>& rounds);

// Writes rounds.jsonl, rounds.csv and rounds.svg into `dir` (which must exist).
absl::Status WriteRoundReports(const std::string& dir, const std::vector<RoundRecord>& rounds,
                               const std::string& title,
                               const std::vector<ReferenceLine>& references = {});

}  // namespace fedlora::sim
