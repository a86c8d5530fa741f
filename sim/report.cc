#include "sim/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/file.h"
#include "core/status.h"

namespace fedlora::sim {
namespace {

nlohmann::json Num(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
}
// printf with a runtime format (tick labels); `fmt` takes one double.
std::string FormatDouble(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, v);
  return buf;
}

std::string XmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

constexpr double kMiB = 1024.0 * 1024.0;

// A "nice" upper bound and tick step for an axis that starts at 0: 1, 2 or 5 times a power of ten.
void NiceAxis(double max_value, double* top, double* step) {
  if (!(max_value > 0) || !std::isfinite(max_value)) max_value = 1;
  const double raw = max_value / 5;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double s = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * mag >= raw) {
      s = m * mag;
      break;
    }
  }
  *step = s;
  *top = std::ceil(max_value / s) * s;
}

// One panel: a frame at (x0, y0) of size w x h, x over [0, max_round], y over [0, y_top].
struct Panel {
  double x0, y0, w, h;
  double max_round, y_top;
  double X(double round) const { return x0 + (max_round > 0 ? round / max_round : 0.0) * w; }
  double Y(double v) const { return y0 + h - (y_top > 0 ? v / y_top : 0.0) * h; }
};

void Axes(std::string* svg, const Panel& p, double y_step, const std::string& y_label,
          const char* y_fmt) {
  absl::StrAppendFormat(
      svg, "<rect class=\"frame\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\"/>\n", p.x0,
      p.y0, p.w, p.h);
  for (double v = 0; v <= p.y_top + 1e-9; v += y_step) {
    const double y = p.Y(v);
    absl::StrAppendFormat(
        svg, "<line class=\"grid\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", p.x0, y,
        p.x0 + p.w, y);
    absl::StrAppendFormat(
        svg, "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", p.x0 - 6,
        y + 4, FormatDouble(y_fmt, v));
  }
  const int max_r = static_cast<int>(p.max_round);
  const int x_step = std::max(1, max_r / 10);
  for (int r = 0; r <= max_r; r += x_step) {
    absl::StrAppendFormat(
        svg, "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%d</text>\n",
        p.X(r), p.y0 + p.h + 16, r);
  }
  absl::StrAppendFormat(
      svg, "<text class=\"label\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">round</text>\n",
      p.x0 + p.w / 2, p.y0 + p.h + 34);
  absl::StrAppendFormat(svg,
                        "<text class=\"label\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" "
                        "transform=\"rotate(-90 %.1f %.1f)\">%s</text>\n",
                        p.x0 - 48, p.y0 + p.h / 2, p.x0 - 48, p.y0 + p.h / 2, XmlEscape(y_label));
}

// A polyline through `pts` with a marker at each point: a circle, or a square for `square`.
void Series(std::string* svg, const Panel& p, const std::vector<std::pair<double, double>>& pts,
            const char* cls, bool square = false) {
  if (pts.empty()) return;
  std::string d;
  for (const auto& [x, y] : pts)
    absl::StrAppendFormat(&d, "%s%.1f,%.1f", d.empty() ? "" : " ", p.X(x), p.Y(y));
  absl::StrAppendFormat(svg, "<polyline class=\"%s\" points=\"%s\"/>\n", cls, d);
  for (const auto& [x, y] : pts) {
    if (square) {
      absl::StrAppendFormat(svg,
                            "<rect class=\"%s\" x=\"%.1f\" y=\"%.1f\" width=\"6\" height=\"6\"/>\n",
                            cls, p.X(x) - 3, p.Y(y) - 3);
    } else {
      absl::StrAppendFormat(svg, "<circle class=\"%s\" cx=\"%.1f\" cy=\"%.1f\" r=\"3\"/>\n", cls,
                            p.X(x), p.Y(y));
    }
  }
}

// A dashed horizontal line across the panel at `value`, labelled at its right end.
void Reference(std::string* svg, const Panel& p, double value, const std::string& label,
               const char* cls) {
  if (!std::isfinite(value) || value < 0 || value > p.y_top) return;
  const double y = p.Y(value);
  absl::StrAppendFormat(svg,
                        "<line class=\"%s\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n",
                        cls, p.x0, y, p.x0 + p.w, y);
  absl::StrAppendFormat(
      svg, "<text class=\"note\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
      p.x0 + p.w - 4, y - 4, XmlEscape(label));
}

// Legend entries in a row from the panel's top left: (css class, text) each.
void Legend(std::string* svg, const Panel& p,
            const std::vector<std::pair<std::string, std::string>>& entries) {
  double x = p.x0 + 10;
  for (const auto& [cls, text] : entries) {
    absl::StrAppendFormat(svg,
                          "<rect class=\"%s\" x=\"%.1f\" y=\"%.1f\" width=\"12\" height=\"4\"/>"
                          "<text x=\"%.1f\" y=\"%.1f\">%s</text>\n",
                          cls, x, p.y0 + 12, x + 18, p.y0 + 18, XmlEscape(text));
    x += 40 + 6.5 * static_cast<double>(text.size());
  }
}

}  // namespace

std::string RoundRecordToJson(const RoundRecord& r) {
  nlohmann::json j = {{"round", r.round},
                      {"server_round", r.server_round},
                      {"eval_accuracy", Num(r.eval_accuracy)},
                      {"eval_loss", Num(r.eval_loss)},
                      {"eval_macro_f1", Num(r.eval_macro_f1)},
                      {"eval_perplexity", Num(r.eval_perplexity)},
                      {"mean_train_loss", Num(r.mean_train_loss)},
                      {"bytes_up", r.bytes_up},
                      {"bytes_down", r.bytes_down},
                      {"bytes_up_fp32", r.bytes_up_fp32},
                      {"bytes_down_full", r.bytes_down_full},
                      {"dp_epsilon", Num(r.dp_epsilon)},
                      {"round_seconds", Num(r.round_seconds)},
                      {"elapsed_seconds", Num(r.elapsed_seconds)},
                      {"selected", r.selected},
                      {"reported", r.reported},
                      {"dropped", r.dropped},
                      {"stragglers", r.stragglers},
                      {"crashed", r.crashed}};
  return j.dump();
}

std::string RoundsToCsv(const std::vector<RoundRecord>& rounds) {
  std::string out =
      "round,server_round,eval_accuracy,eval_loss,eval_macro_f1,mean_train_loss,bytes_up,bytes_"
      "down,round_seconds,"
      "elapsed_seconds,selected,reported,dropped,stragglers,crashed,eval_perplexity,bytes_up_fp32,"
      "bytes_down_full,dp_epsilon\n";
  auto cell = [](double v) {
    return std::isfinite(v) ? absl::StrFormat("%.6g", v) : std::string();
  };
  for (const RoundRecord& r : rounds) {
    absl::StrAppend(&out, r.round, ",", r.server_round, ",", cell(r.eval_accuracy), ",",
                    cell(r.eval_loss), ",", cell(r.eval_macro_f1), ",", cell(r.mean_train_loss),
                    ",", r.bytes_up, ",", r.bytes_down, ",", cell(r.round_seconds), ",",
                    cell(r.elapsed_seconds), ",", r.selected, ",", r.reported, ",", r.dropped, ",",
                    r.stragglers, ",", r.crashed, ",", cell(r.eval_perplexity), ",",
                    r.bytes_up_fp32, ",", r.bytes_down_full, ",", cell(r.dp_epsilon), "\n");
  }
  return out;
}

namespace {

// The series of the three panels.
struct SvgSeries {
  std::vector<std::pair<double, double>> acc, ppl, eval_loss, train_loss, up, down;
  double max_round = 1, max_ppl = 0, max_loss = 0, cum_up = 0, cum_down = 0;
};

SvgSeries SeriesOf(const std::vector<RoundRecord>& rounds) {
  SvgSeries s;
  for (const RoundRecord& r : rounds) {
    s.max_round = std::max(s.max_round, static_cast<double>(r.round));
    if (std::isfinite(r.eval_accuracy)) s.acc.emplace_back(r.round, r.eval_accuracy);
    if (std::isfinite(r.eval_perplexity)) {
      s.ppl.emplace_back(r.round, r.eval_perplexity);
      s.max_ppl = std::max(s.max_ppl, r.eval_perplexity);
    }
    if (std::isfinite(r.eval_loss) && r.eval_loss > 0) {
      s.eval_loss.emplace_back(r.round, r.eval_loss);
      s.max_loss = std::max(s.max_loss, r.eval_loss);
    }
    if (std::isfinite(r.mean_train_loss) && r.mean_train_loss > 0) {
      s.train_loss.emplace_back(r.round, r.mean_train_loss);
      s.max_loss = std::max(s.max_loss, r.mean_train_loss);
    }
    s.cum_up += static_cast<double>(r.bytes_up) / kMiB;
    s.cum_down += static_cast<double>(r.bytes_down) / kMiB;
    s.up.emplace_back(r.round, s.cum_up);
    s.down.emplace_back(r.round, s.cum_down);
  }
  return s;
}

// Top panel: accuracy on [0, 1] (perplexity when no round has an accuracy), with the untuned model
// (round 0) and the caller's references as dashed lines.
void QualityPanel(std::string* svg, const SvgSeries& s,
                  const std::vector<ReferenceLine>& references, double width) {
  const bool perplexity = s.acc.empty() && !s.ppl.empty();
  double top = 1.0, step = 0.2;
  if (perplexity) NiceAxis(s.max_ppl, &top, &step);
  for (const ReferenceLine& r : references) {
    if (perplexity && std::isfinite(r.value) && r.value > top) NiceAxis(r.value, &top, &step);
  }
  Panel p{80, 50, width - 120, 190, s.max_round, top};
  const auto& pts = perplexity ? s.ppl : s.acc;
  absl::StrAppend(svg, perplexity ? "<g id=\"perplexity\">\n" : "<g id=\"accuracy\">\n");
  Axes(svg, p, step, perplexity ? "held-out perplexity" : "held-out accuracy",
       perplexity ? "%g" : "%.1f");
  if (!pts.empty() && pts.front().first == 0)
    Reference(svg, p, pts.front().second, "untuned (round 0)", "untuned");
  for (const ReferenceLine& r : references) Reference(svg, p, r.value, r.label, "reference");
  Series(svg, p, pts, "acc");
  absl::StrAppend(svg, "</g>\n");
}

// Middle panel: held-out loss and the clients' mean training loss per round.
void LossPanel(std::string* svg, const SvgSeries& s, double width) {
  double top = 1, step = 0.2;
  NiceAxis(s.max_loss, &top, &step);
  Panel p{80, 290, width - 120, 150, s.max_round, top};
  absl::StrAppend(svg, "<g id=\"loss\">\n");
  Axes(svg, p, step, "loss", "%g");
  Series(svg, p, s.eval_loss, "evalloss");
  Series(svg, p, s.train_loss, "trainloss", /*square=*/true);
  Legend(svg, p, {{"evalloss", "held-out"}, {"trainloss", "clients' training (mean)"}});
  absl::StrAppend(svg, "</g>\n");
}

// Bottom panel: cumulative MiB up (solid, circles) and down (dashed, squares): the two lines
// coincide when every byte uploaded is downloaded again, and stay told apart.
void BytesPanel(std::string* svg, const SvgSeries& s, double width) {
  double top = 1, step = 0.2;
  NiceAxis(std::max(s.cum_up, s.cum_down), &top, &step);
  Panel p{80, 490, width - 120, 150, s.max_round, top};
  absl::StrAppend(svg, "<g id=\"bytes\">\n");
  Axes(svg, p, step, "cumulative MiB", "%g");
  Series(svg, p, s.up, "up");
  Series(svg, p, s.down, "down", /*square=*/true);
  Legend(svg, p,
         {{"up", absl::StrFormat("uploaded %.3g MiB", s.cum_up)},
          {"down", absl::StrFormat("downloaded %.3g MiB (dashed)", s.cum_down)}});
  absl::StrAppend(svg, "</g>\n");
}

}  // namespace

std::string RoundsToSvg(const std::vector<RoundRecord>& rounds, const std::string& title,
                        const std::vector<ReferenceLine>& references) {
  constexpr double kWidth = 760, kHeight = 690;
  const SvgSeries s = SeriesOf(rounds);
  std::string svg = absl::StrFormat(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d "
      "%d\">\n"
      "<style>\n"
      "  text { font-family: sans-serif; font-size: 12px; fill: #222; }\n"
      "  .title { font-size: 15px; font-weight: bold; }\n"
      "  .note { font-size: 11px; fill: #555; }\n"
      "  .frame { fill: none; stroke: #444; }\n"
      "  .grid { stroke: #ddd; }\n"
      "  polyline { fill: none; stroke-width: 2; }\n"
      "  .acc { stroke: #1b6ac9; fill: #1b6ac9; }\n"
      "  .evalloss { stroke: #7048e8; fill: #7048e8; }\n"
      "  .trainloss { stroke: #868e96; fill: #868e96; }\n"
      "  .up { stroke: #d9480f; fill: #d9480f; }\n"
      "  .down { stroke: #2b8a3e; fill: #2b8a3e; }\n"
      "  polyline.down { stroke-dasharray: 6 4; }\n"
      "  .untuned { stroke: #888; stroke-dasharray: 2 3; }\n"
      "  .reference { stroke: #c92a2a; stroke-dasharray: 6 4; }\n"
      "  polyline.acc, polyline.evalloss, polyline.trainloss, polyline.up, polyline.down { fill: "
      "none; }\n"
      "</style>\n"
      "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
      "<text class=\"title\" x=\"%d\" y=\"24\" text-anchor=\"middle\">%s</text>\n",
      static_cast<int>(kWidth), static_cast<int>(kHeight), static_cast<int>(kWidth),
      static_cast<int>(kHeight), static_cast<int>(kWidth / 2), XmlEscape(title));
  QualityPanel(&svg, s, references, kWidth);
  LossPanel(&svg, s, kWidth);
  BytesPanel(&svg, s, kWidth);
  absl::StrAppend(&svg, "</svg>\n");
  return svg;
}

std::string SummaryTable(const std::vector<RoundRecord>& rounds) {
  std::string out =
      absl::StrFormat("%5s %8s %8s %10s %10s %6s %6s %6s %5s %5s %10s %10s %8s\n", "round",
                      "accuracy", "loss", "perplexity", "train_loss", "select", "report", "drop",
                      "strag", "crash", "MiB_up", "MiB_down", "seconds");
  int64_t up = 0, down = 0;
  int selected = 0, reported = 0, dropped = 0, strag = 0, crashed = 0;
  double seconds = 0;
  auto f = [](double v, const char* fmt) {
    return std::isfinite(v) ? FormatDouble(fmt, v) : std::string("-");
  };
  for (const RoundRecord& r : rounds) {
    absl::StrAppendFormat(&out, "%5d %8s %8s %10s %10s %6d %6d %6d %5d %5d %10.3f %10.3f %8.1f\n",
                          r.round, f(r.eval_accuracy, "%.4f"), f(r.eval_loss, "%.4f"),
                          f(r.eval_perplexity, "%.3f"), f(r.mean_train_loss, "%.4f"), r.selected,
                          r.reported, r.dropped, r.stragglers, r.crashed,
                          static_cast<double>(r.bytes_up) / kMiB,
                          static_cast<double>(r.bytes_down) / kMiB, r.round_seconds);
    up += r.bytes_up;
    down += r.bytes_down;
    selected += r.selected;
    reported += r.reported;
    dropped += r.dropped;
    strag += r.stragglers;
    crashed += r.crashed;
    seconds = r.elapsed_seconds;
  }
  absl::StrAppendFormat(&out, "%5s %8s %8s %10s %10s %6d %6d %6d %5d %5d %10.3f %10.3f %8.1f\n",
                        "total", "", "", "", "", selected, reported, dropped, strag, crashed,
                        static_cast<double>(up) / kMiB, static_cast<double>(down) / kMiB, seconds);
  return out;
}

absl::Status WriteRoundReports(const std::string& dir, const std::vector<RoundRecord>& rounds,
                               const std::string& title,
                               const std::vector<ReferenceLine>& references) {
  std::string jsonl;
  for (const RoundRecord& r : rounds) absl::StrAppend(&jsonl, RoundRecordToJson(r), "\n");
  FEDLORA_RETURN_IF_ERROR(WriteFileAtomically(dir + "/rounds.jsonl", jsonl));
  FEDLORA_RETURN_IF_ERROR(WriteFileAtomically(dir + "/rounds.csv", RoundsToCsv(rounds)));
  return WriteFileAtomically(dir + "/rounds.svg", RoundsToSvg(rounds, title, references));
}

}  // namespace fedlora::sim
