// The live view's page (server/live_view.h): one HTML document with its style, an inline SVG
// chart drawn by one inline script, and no external assets (the machines it runs on are offline).
// The script polls /api/run.json every 3 s and redraws; the elements it fills carry ids and
// data- attributes that scripts/live_view_check.sh looks for.
#include "server/live_view.h"

namespace fedlora {

const char* LiveViewPage() {
  return R"page(
<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>fedlora · live view</title>
<style>
:root{--bg:#f4f5f7;--card:#fff;--ink:#1b2130;--mute:#687086;--line:#e2e5eb;--acc:#2563eb;--loss:#d97706;--train:#9333ea;--bad:#b91c1c}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;background:var(--bg);color:var(--ink)}
header{display:flex;align-items:center;gap:14px;flex-wrap:wrap;padding:12px 24px;background:#111827;color:#f9fafb}
header h1{font-size:18px;margin:0;font-weight:650;letter-spacing:.01em}
.mono,header .run{font-family:ui-monospace,"DejaVu Sans Mono",monospace}
header .run{color:#cbd5e1}
.phase{padding:2px 10px;border-radius:999px;background:#4b5563;font-size:12px;text-transform:uppercase;letter-spacing:.05em}
.phase.training{background:#1d4ed8}.phase.aggregating,.phase.evaluating,.phase.checkpointing{background:#7c3aed}
.phase.finished{background:#15803d}.phase.waiting.for.clients,.phase.restoring{background:#b45309}
header .upd{margin-left:auto;color:#9ca3af;font-size:12px}
#err{color:#fca5a5}
main{padding:16px 24px 24px;display:grid;gap:14px;max-width:1320px;margin:0 auto}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(190px,1fr));gap:12px}
.card,section{background:var(--card);border:1px solid var(--line);border-radius:8px}
.card{padding:10px 14px}
.card .k{color:var(--mute);font-size:11px;text-transform:uppercase;letter-spacing:.06em}
.card .v{font-size:22px;font-weight:650;margin-top:1px;font-variant-numeric:tabular-nums}
.card .s{color:var(--mute);font-size:12px}
.bar{height:5px;background:var(--line);border-radius:3px;margin-top:6px;overflow:hidden}
.bar i{display:block;height:100%;background:var(--acc)}
section{padding:12px 16px;min-width:0}
h2{font-size:13px;margin:0 0 8px;font-weight:650;color:#374151}
.row{display:grid;grid-template-columns:1fr 1fr;gap:14px}
.row.wide{grid-template-columns:3fr 2fr}
table{border-collapse:collapse;width:100%;font-variant-numeric:tabular-nums}
th,td{padding:4px 8px;border-bottom:1px solid var(--line);text-align:right;white-space:nowrap}
th{color:var(--mute);font-weight:500;font-size:12px}
th:first-child,td:first-child,.l{text-align:left}
tbody tr:hover{background:#f8fafc}
.scroll{max-height:330px;overflow:auto}
.state{display:inline-block;padding:0 8px;border-radius:999px;font-size:12px;background:#e0e7ff;color:#3730a3}
.state.idle{background:#f1f5f9;color:#334155}.state.training,.state.downloading,.state.uploading{background:#dbeafe;color:#1e40af}
.state.left{background:#dcfce7;color:#166534}.state.disconnected{background:#fef3c7;color:#92400e}
.state.failed,.state.blocked{background:#fee2e2;color:var(--bad)}
tr.fail td{color:var(--bad);text-align:left;white-space:normal;font-size:12px;padding-top:0}
tr.has-fail td{border-bottom:0}
.muted{color:var(--mute)}
svg{width:100%;height:auto;display:block}
svg text{font-size:11px;fill:var(--mute)}
.legend{font-size:12px;color:var(--mute)}.legend b{display:inline-block;width:10px;height:3px;vertical-align:middle;margin:0 4px 0 10px}
pre{margin:0;max-height:330px;overflow:auto;background:#f8fafc;border:1px solid var(--line);border-radius:6px;padding:8px;font-size:12px}
@media (max-width:900px){.row,.row.wide{grid-template-columns:1fr}}
</style>
</head>
<body>
<header><h1>fedlora</h1><span class="run" id="run">run …</span><span class="phase" id="phase">loading</span>
<span id="round"></span><span class="upd"><span id="err"></span> <span id="updated"></span></span></header>
<main>
<div class="cards" id="cards"></div>
<div class="row">
<section><h2>Accuracy per round</h2><svg id="acc-chart" viewBox="0 0 600 210" role="img" aria-label="accuracy per round"></svg></section>
<section><h2>Loss per round <span class="legend"><b style="background:var(--loss)"></b>eval <span id="train-legend"><b style="background:var(--train)"></b>train (mean of the sites)</span></span></h2>
<svg id="loss-chart" viewBox="0 0 600 210" role="img" aria-label="loss per round"></svg></section>
</div>
<section><h2>Rounds</h2><div class="scroll"><table id="rounds"><thead><tr><th>round</th><th>accuracy</th><th>eval loss</th>
<th>train loss</th><th>updates</th><th>dropped</th><th>examples</th><th>bytes up</th><th>bytes down</th><th id="eps-h">&epsilon;</th>
<th>took</th><th>committed</th></tr></thead><tbody></tbody></table></div></section>
<div class="row wide">
<section><h2>Sites</h2><div class="scroll"><table id="sites"><thead><tr><th>site</th><th class="l">state</th><th>rounds</th>
<th>rejected</th><th>last seen</th><th class="l">task</th><th>progress</th></tr></thead><tbody></tbody></table></div></section>
<section><h2>Run config</h2><pre id="config"></pre></section>
</div>
<noscript>This page draws with a small script; <a href="/api/run.json">/api/run.json</a> holds the same data.</noscript>
</main>
<script>
"use strict";
const $ = id => document.getElementById(id);
const esc = s => String(s).replace(/[&<>"']/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"})[c]);
const word = (s, prefix) => String(s || "").replace(prefix, "").toLowerCase().replace(/_/g, " ");
const fix = (v, d) => v === undefined || v === null ? "–" : Number(v).toFixed(d);
function bytes(n) {
  n = Number(n || 0); const u = ["B", "KiB", "MiB", "GiB", "TiB"]; let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : n) + " " + u[i];
}
function span(ms) {
  if (!(ms >= 0)) return "–"; const s = ms / 1000;
  return s < 120 ? s.toFixed(s < 10 ? 1 : 0) + " s" : s < 7200 ? (s / 60).toFixed(1) + " min" : (s / 3600).toFixed(1) + " h";
}
const ago = (t, now) => t > 0 ? span(Math.max(0, now - t)) + " ago" : "–";
const clock = t => t > 0 ? new Date(t).toLocaleTimeString() : "–";
const card = (k, v, s, bar) => `<div class="card"><div class="k">${esc(k)}</div><div class="v">${esc(v)}</div>` +
  `<div class="s">${esc(s || "\u00a0")}</div>${bar === undefined ? "" : `<div class="bar"><i style="width:${(100 * bar).toFixed(1)}%"></i></div>`}</div>`;

// A round step of about a quarter of `max`: 1, 2, 2.5 or 5 times a power of ten.
function tick(max) {
  const raw = max / 4, p = Math.pow(10, Math.floor(Math.log10(raw))), f = raw / p;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 2.5 ? 2.5 : f <= 5 ? 5 : 10) * p;
}

// A line chart of series {name, color, points: [[round, value], ...]}; y from 0 to yMax (or the data's).
function chart(svg, series, yMax) {
  const W = 600, H = 210, L = 46, R = 14, T = 10, B = 26;
  const pts = series.flatMap(s => s.points);
  if (!pts.length) { svg.innerHTML = `<text x="${W / 2}" y="${H / 2}" text-anchor="middle">no evaluated round yet</text>`; return; }
  const x0 = Math.min(...pts.map(p => p[0])), x1 = Math.max(...pts.map(p => p[0]));
  const step = tick(yMax || Math.max(...pts.map(p => p[1])) || 1);
  const top = yMax || step * Math.ceil(Math.max(...pts.map(p => p[1])) / step) || 1;
  const X = r => x1 === x0 ? (L + W - R) / 2 : L + (r - x0) * (W - L - R) / (x1 - x0);
  const Y = v => T + (1 - v / top) * (H - T - B);
  let g = "";
  for (let v = 0; v <= top + step / 2; v += step) {
    g += `<line x1="${L}" x2="${W - R}" y1="${Y(v)}" y2="${Y(v)}" stroke="#e2e5eb"/><text x="${L - 6}" y="${Y(v) + 4}" text-anchor="end">${+v.toFixed(3)}</text>`;
  }
  const every = Math.max(1, Math.ceil((x1 - x0 + 1) / 12));
  for (let r = x0; r <= x1; r += every) g += `<text x="${X(r)}" y="${H - 8}" text-anchor="middle">${r}</text>`;
  for (const s of series) {
    if (!s.points.length) continue;
    g += `<polyline fill="none" stroke="${s.color}" stroke-width="2" points="${s.points.map(p => X(p[0]) + "," + Y(p[1])).join(" ")}"/>`;
    for (const p of s.points) g += `<circle cx="${X(p[0])}" cy="${Y(p[1])}" r="3" fill="${s.color}"><title>${esc(s.name)} round ${p[0]}: ${p[1].toFixed(4)}</title></circle>`;
  }
  svg.innerHTML = g;
}

function render(d) {
  const now = d.now_unix_ms, hist = d.history || [], sites = d.clients || [];
  const phase = word(d.phase, "ROUND_PHASE_");
  $("run").textContent = "run " + d.run_id;
  $("phase").textContent = phase; $("phase").className = "phase " + phase;
  $("round").textContent = `round ${d.current_round} of ${d.total_rounds}`;
  $("updated").textContent = "updated " + clock(now);
  const evald = hist.filter(r => r.eval_accuracy !== undefined || r.eval_loss !== undefined);
  const last = evald[evald.length - 1];
  const done = hist.length ? hist[hist.length - 1].round : 0;
  const live = sites.filter(c => !["CLIENT_STATE_LEFT", "CLIENT_STATE_FAILED", "CLIENT_STATE_DISCONNECTED"].includes(c.state)).length;
  const failed = sites.filter(c => c.state === "CLIENT_STATE_FAILED").length;
  let cards = card("round", `${d.current_round} / ${d.total_rounds}`,
      phase === "finished" ? "finished" : `${phase}${d.round_start_unix_ms > 0 ? ", started " + ago(d.round_start_unix_ms, now) : ""}`,
      d.total_rounds ? done / d.total_rounds : 0);
  cards += card("sites", `${d.connected_clients} connected`, `${sites.length} known, ${d.active_tasks} holding a task` + (failed ? `, ${failed} failed` : ""));
  cards += card("accuracy", last && last.eval_accuracy !== undefined ? fix(last.eval_accuracy, 4) : "–", last ? "round " + last.round : "not evaluated yet");
  cards += card("eval loss", last && last.eval_loss !== undefined ? fix(last.eval_loss, 4) : "–", last ? "round " + last.round : "");
  if (d.dp_epsilon !== undefined) {
    cards += card("privacy: epsilon", fix(d.dp_epsilon, 3), (d.dp_max_epsilon !== undefined ? `of ${fix(d.dp_max_epsilon, 3)}, ` : "") +
        `delta ${Number(d.dp_target_delta).toExponential(0)}`,
        d.dp_max_epsilon ? Math.min(1, d.dp_epsilon / d.dp_max_epsilon) : undefined);
  }
  const up = hist.reduce((a, r) => a + (r.upload_bytes || 0), 0), down = hist.reduce((a, r) => a + (r.download_bytes || 0), 0);
  cards += card("traffic", bytes(up) + " up", bytes(down) + " down, committed rounds");
  $("cards").innerHTML = cards;

  chart($("acc-chart"), [{name: "accuracy", color: "var(--acc)", points: evald.filter(r => r.eval_accuracy !== undefined).map(r => [r.round, r.eval_accuracy])}], 1);
  $("train-legend").style.display = hist.some(r => r.mean_train_loss > 0) ? "" : "none";
  chart($("loss-chart"), [
    {name: "eval loss", color: "var(--loss)", points: evald.filter(r => r.eval_loss !== undefined).map(r => [r.round, r.eval_loss])},
    {name: "train loss", color: "var(--train)", points: hist.filter(r => r.mean_train_loss > 0).map(r => [r.round, r.mean_train_loss])}], 0);

  const dp = d.dp_epsilon !== undefined;
  $("eps-h").style.display = dp ? "" : "none";
  $("rounds").tBodies[0].innerHTML = hist.slice().reverse().map(r =>
    `<tr data-round="${r.round}"><td>${r.round}</td><td class="acc">${fix(r.eval_accuracy, 4)}</td><td class="loss">${fix(r.eval_loss, 4)}</td>` +
    `<td>${r.mean_train_loss > 0 ? fix(r.mean_train_loss, 4) : "–"}</td><td>${r.updates_accepted} / ${r.clients_selected}</td><td>${r.clients_dropped}</td>` +
    `<td>${r.examples}</td><td>${bytes(r.upload_bytes)}</td><td>${bytes(r.download_bytes)}</td>` +
    `<td${dp ? "" : ' style="display:none"'}>${fix(r.dp_epsilon, 3)}</td><td>${span(r.committed_unix_ms - r.started_unix_ms)}</td><td>${clock(r.committed_unix_ms)}</td></tr>`).join("") ||
    `<tr><td colspan="12" class="muted l">no round committed yet</td></tr>`;

  $("sites").tBodies[0].innerHTML = sites.map(c => {
    const state = c.blocked ? "blocked" : word(c.state, "CLIENT_STATE_");
    return `<tr data-site="${esc(c.client_id)}"${c.failure ? ' class="has-fail"' : ""}><td class="mono">${esc(c.client_id)}</td>` +
      `<td class="l"><span class="state ${state}">${state}</span></td><td>${c.rounds_participated}</td><td>${c.updates_rejected}</td>` +
      `<td>${ago(c.last_seen_unix_ms, now)}</td><td class="l mono">${esc(c.current_task_id || "–")}</td>` +
      `<td>${c.current_task_id && c.steps_total > 0 ? `${c.steps_done} / ${c.steps_total} steps` : "–"}</td></tr>` +
      (c.failure ? `<tr class="fail"><td colspan="7">${esc(c.failure)}</td></tr>` : "");
  }).join("") || `<tr><td colspan="7" class="muted l">no site has joined</td></tr>`;
  $("config").textContent = JSON.stringify(d.config, null, 2);
}

async function poll() {
  try {
    const r = await fetch("/api/run.json", {cache: "no-store"});
    if (!r.ok) throw new Error(r.status + ": " + (await r.text()).trim());
    render(await r.json());
    $("err").textContent = "";
  } catch (e) {
    $("err").textContent = "update failed (" + e.message + ")";
  }
  setTimeout(poll, 3000);
}
poll();
</script>
</body>
</html>
)page";
}

}  // namespace fedlora
