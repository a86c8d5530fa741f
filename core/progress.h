// Progress display for long jobs (training steps, file downloads, simulation rounds).
//
//   Progress p("train", /*total=*/num_steps);
//   for (int64_t s = 1; s <= num_steps; ++s) {
//     ...
//     p.Update(s, absl::StrFormat("loss=%.4f", loss));
//   }
//   p.Finish();
//
// On a terminal (stderr is a TTY) it redraws one line in place with a bar, rate and ETA:
//   train [=========>          ]  45.0% 450/1000 12.3 it/s elapsed 36s ETA 44s loss=0.3120
// Elsewhere (CI, files, containers) it logs that line (without the bar) through FEDLORA_LOG at
// most once per log_interval_s, plus a final line, so logs stay short.
// Thread-safe: Update may be called from several threads (the largest `done` wins).
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>

namespace fedlora {

struct ProgressOptions {
  // Minimum seconds between two logged lines when not on a terminal. 10 s keeps an hour-long job
  // to ~360 lines.
  double log_interval_s = 10.0;
  // Minimum seconds between two redraws on a terminal: 0.1 s is smooth to the eye and costs
  // nothing even when Update is called per token.
  double redraw_interval_s = 0.1;
  // Characters inside the bar's brackets (terminal mode only).
  int bar_width = 20;
  // Unit of `done` in the rate ("it/s", "tok/s", "MiB/s"...).
  std::string unit = "it";
  // Testing hooks. is_tty: -1 = ask isatty(stderr), 0 = no, 1 = yes. now_s: monotonic seconds
  // (default steady_clock). emit: receives the exact text to output; by default terminal text
  // goes to stderr and log lines to FEDLORA_LOG(INFO). terminal_width: 0 = ask the terminal
  // (lines longer than it are cut, so that '\r' can redraw them).
  int is_tty = -1;
  std::function<double()> now_s;
  std::function<void(std::string_view)> emit;
  int terminal_width = 0;
};

class Progress {
 public:
  // total <= 0 means unknown (no bar, percentage or ETA).
  Progress(std::string label, int64_t total, ProgressOptions options = {});
  // Calls Finish() if it has not been called.
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // Records that `done` units are complete; `extra_metrics` is appended verbatim ("loss=0.31").
  void Update(int64_t done, std::string_view extra_metrics = "");
  // Draws (or logs) the final state and ends the terminal line. Idempotent.
  void Finish();

 private:
  std::string Line(double now, int bar_width) const;  // requires mu_
  void Emit(std::string_view text);

  const std::string label_;
  const int64_t total_;
  ProgressOptions options_;
  bool tty_;
  double start_s_;

  std::mutex mu_;
  int64_t done_ = 0;
  std::string extra_;
  double last_output_s_;
  double done_s_;  // when done_ last grew
  bool finished_ = false;
};

// The text of one progress line, a pure function of its inputs. bar_width 0 leaves the bar out.
// elapsed_s is the time since start (seconds), since_last_s the time since `done` last grew: the
// rate is that of the completed units (elapsed_s - since_last_s), and the ETA counts down through
// the unit under way, so a job of long units (simulation rounds) shows an ETA that does not climb.
std::string FormatProgressLine(std::string_view label, int64_t done, int64_t total,
                               double elapsed_s, std::string_view extra_metrics, int bar_width = 0,
                               std::string_view unit = "it", double since_last_s = 0.0);
// "45s", "3m07s", "2h05m", "?" for a negative or non-finite duration.
std::string FormatDuration(double seconds);

}  // namespace fedlora
