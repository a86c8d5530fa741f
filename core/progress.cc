#include "core/progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/logging.h"
#include "core/strings.h"

namespace fedlora {

std::string FormatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const int64_t s = static_cast<int64_t>(std::llround(seconds));
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%dh%02dm", s / 3600, (s % 3600) / 60);
}

std::string FormatProgressLine(std::string_view label, int64_t done, int64_t total,
                               double elapsed_s, std::string_view extra_metrics, int bar_width,
                               std::string_view unit, double since_last_s) {
  std::string line(label);
  const absl::string_view u = ToAbsl(unit);
  if (total > 0) {
    const double frac =
        std::clamp(static_cast<double>(done) / static_cast<double>(total), 0.0, 1.0);
    if (bar_width > 0) {
      const int filled = static_cast<int>(frac * bar_width);
      std::string bar(static_cast<size_t>(bar_width), ' ');
      std::fill(bar.begin(), bar.begin() + filled, '=');
      if (filled < bar_width) bar[static_cast<size_t>(filled)] = '>';
      absl::StrAppend(&line, " [", bar, "]");
    }
    absl::StrAppend(&line, absl::StrFormat(" %5.1f%% %d/%d", 100.0 * frac, done, total));
  } else {
    absl::StrAppend(&line, " ", done, " ", u);
  }
  // The rate up to the last completed unit: time spent on the unit under way is not yet work done,
  // and counting it would make the ETA climb while a long unit (a round) runs.
  since_last_s = std::clamp(since_last_s, 0.0, std::max(elapsed_s, 0.0));
  const double busy_s = elapsed_s - since_last_s;
  const double rate = busy_s > 0 ? static_cast<double>(done) / busy_s : 0.0;
  if (rate >= 1.0) {
    absl::StrAppend(&line, absl::StrFormat(" %.1f %s/s", rate, u));
  } else if (rate > 0.0) {
    absl::StrAppend(&line,
                    absl::StrFormat(" %.2f s/%s", 1.0 / rate, u));  // slow jobs: time per unit
  }
  absl::StrAppend(&line, " elapsed ", FormatDuration(elapsed_s));
  if (total > 0 && done < total) {
    // Counts down through the unit under way, and never below what the units after it need.
    const double left = static_cast<double>(total - done);
    const double eta = rate > 0 ? std::max(left / rate - since_last_s, (left - 1) / rate) : -1.0;
    absl::StrAppend(&line, " ETA ", FormatDuration(eta));
  }
  if (!extra_metrics.empty()) absl::StrAppend(&line, " ", ToAbsl(extra_metrics));
  return line;
}

Progress::Progress(std::string label, int64_t total, ProgressOptions options)
    : label_(std::move(label)), total_(total), options_(std::move(options)) {
  if (!options_.now_s) {
    options_.now_s = [] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
          .count();
    };
  }
  tty_ = options_.is_tty < 0 ? ::isatty(STDERR_FILENO) == 1 : options_.is_tty == 1;
  if (tty_ && options_.terminal_width <= 0) {
    struct winsize ws {};
    options_.terminal_width =
        ::ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0 ? ws.ws_col : 80;
  }
  start_s_ = options_.now_s();
  last_output_s_ = start_s_;
  done_s_ = start_s_;
}

Progress::~Progress() { Finish(); }

void Progress::Emit(std::string_view text) {
  if (options_.emit) {
    options_.emit(text);
  } else if (tty_) {
    ssize_t unused = ::write(STDERR_FILENO, text.data(), text.size());
    (void)unused;
  } else {
    FEDLORA_LOG(INFO) << text;
  }
}

std::string Progress::Line(double now, int bar_width) const {
  std::string line = FormatProgressLine(label_, done_, total_, now - start_s_, extra_, bar_width,
                                        options_.unit, now - done_s_);
  // Keep a terminal line shorter than the terminal: a wrapped line cannot be redrawn with '\r'.
  if (tty_ && options_.terminal_width > 1 &&
      line.size() >= static_cast<size_t>(options_.terminal_width)) {
    line.resize(static_cast<size_t>(options_.terminal_width - 1));
  }
  return line;
}

void Progress::Update(int64_t done, std::string_view extra_metrics) {
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_) return;
  const double now = options_.now_s();
  if (done >= done_) {
    if (done > done_) done_s_ = now;
    done_ = done;
    extra_.assign(extra_metrics.data(), extra_metrics.size());
  }
  const double interval = tty_ ? options_.redraw_interval_s : options_.log_interval_s;
  if (now - last_output_s_ < interval) return;
  last_output_s_ = now;
  if (tty_) {
    // '\r' returns to column 0; ESC[K clears what a longer previous line left behind.
    Emit(absl::StrCat("\r", Line(now, options_.bar_width), "\x1b[K"));
  } else {
    Emit(Line(now, 0));
  }
}

void Progress::Finish() {
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_) return;
  finished_ = true;
  const double now = options_.now_s();
  if (tty_) {
    Emit(absl::StrCat("\r", Line(now, options_.bar_width), "\x1b[K\n"));
  } else {
    Emit(absl::StrCat(Line(now, 0), " (done)"));
  }
}

}  // namespace fedlora
