#!/usr/bin/env python3
"""Compressed updates on the default simulation task: each pipeline against the uncompressed run.

  scripts/compression_results.py [--fedlora build/default/tools/fedlora] [--seeds 17,18,19]
                                 [--pipelines none,topk10_q8_zstd,...] [--out runs/compression]

Runs `fedlora simulate --config configs/default.json --seed S` once per pipeline and seed, with
only `codec` (and, for the ".down" pipelines, `downlink_codec`) changed, then prints one table:
bytes up and down per round (medians over the rounds and seeds), the upload and download
compression ratios against the uncompressed run (download: against what the same run's downloads
stand for as full adapters), the final accuracy
(mean and spread over the seeds), the accuracy difference against the uncompressed run of the
same seed (mean over seeds), and the first round whose held-out accuracy reached the
uncompressed run's final accuracy of the same seed. A run already in --out (its summary.json) is
read instead of run again, so an interrupted sweep resumes.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from config_paths import absolute_paths  # noqa: E402  (scripts/ is on sys.path when run)


Q2_ZSTD = [{"id": "QUANT", "quant": {"bits": 2}}, {"id": "ZSTD"}]

# Each pipeline: the run config's codec.stages, or (up, down): codec.stages and downlink_codec.stages.
PIPELINES = {
    "none": [],
    "bf16_zstd": [{"id": "BF16"}, {"id": "ZSTD"}],
    "q4_zstd": [{"id": "QUANT", "quant": {"bits": 4}}, {"id": "ZSTD"}],
    "q2_zstd": [{"id": "QUANT", "quant": {"bits": 2}}, {"id": "ZSTD"}],
    "q2_ef_zstd": [{"id": "QUANT", "quant": {"bits": 2, "error_feedback": True}}, {"id": "ZSTD"}],
    "topk10_q8_zstd": [{"id": "TOPK", "top_k": {"fraction": 0.1}}, {"id": "QUANT"}, {"id": "ZSTD"}],
    "topk5_q8_zstd": [{"id": "TOPK", "top_k": {"fraction": 0.05}}, {"id": "QUANT"}, {"id": "ZSTD"}],
    "topk1_q8_zstd": [{"id": "TOPK", "top_k": {"fraction": 0.01}}, {"id": "QUANT"}, {"id": "ZSTD"}],
    "randk10_q8_zstd": [{"id": "RANDOMK", "random_k": {"fraction": 0.1}}, {"id": "QUANT"}, {"id": "ZSTD"}],
    "lowrank2_q8_zstd": [{"id": "LOWRANK", "low_rank": {"rank": 2}}, {"id": "QUANT"}, {"id": "ZSTD"}],
    "lowrank2_q2n_zstd": [{"id": "LOWRANK", "low_rank": {"rank": 2}},
                          {"id": "QUANT", "quant": {"bits": 2, "stochastic": False}}, {"id": "ZSTD"}],
    "q2_zstd.down_q8n_zstd": (Q2_ZSTD, [{"id": "QUANT", "quant": {"bits": 8, "stochastic": False}}, {"id": "ZSTD"}]),
    "q2_zstd.down_q4n_zstd": (Q2_ZSTD, [{"id": "QUANT", "quant": {"bits": 4, "stochastic": False}}, {"id": "ZSTD"}]),
    "q2_zstd.down_q2n_zstd": (Q2_ZSTD, [{"id": "QUANT", "quant": {"bits": 2, "stochastic": False}}, {"id": "ZSTD"}]),
}


def run(fedlora, pipeline, seed, out_root):
    out = os.path.join(out_root, f"{pipeline}-s{seed}")
    summary = os.path.join(out, "summary.json")
    if not os.path.exists(summary):
        with open(os.path.join(ROOT, "configs", "default.json")) as f:
            config = absolute_paths(json.load(f))
        config["run_id"] = f"compression-{pipeline}"
        spec = PIPELINES[pipeline]
        up, down = spec if isinstance(spec, tuple) else (spec, [])
        config["codec"] = {"stages": up}
        if down:
            config["downlink_codec"] = {"stages": down}
        os.makedirs(out, exist_ok=True)
        config_path = os.path.join(out_root, f"{pipeline}.json")
        with open(config_path, "w") as f:
            json.dump(config, f, indent=2)
        cmd = [fedlora, "simulate", "--config", config_path, "--seed", str(seed), "--out", out, "--progress=false"]
        print("+", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    with open(summary) as f:
        return json.load(f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fedlora", default=os.path.join(ROOT, "build", "default", "tools", "fedlora"))
    ap.add_argument("--seeds", default="17,18,19")
    ap.add_argument("--pipelines", default="none,topk10_q8_zstd,q2_zstd")
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", "compression"))
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    pipelines = args.pipelines.split(",")
    for p in pipelines:
        if p not in PIPELINES:
            print(f"unknown pipeline {p}; known: {', '.join(PIPELINES)}", file=sys.stderr)
            return 2
    if "none" not in pipelines:
        pipelines.insert(0, "none")
    os.makedirs(args.out, exist_ok=True)
    results = {(p, s): run(args.fedlora, p, s, args.out) for p in pipelines for s in seeds}

    def trained_rounds(r):
        return [x for x in r["rounds"] if x["round"] > 0]

    def per_round(p, key):
        return statistics.median(x[key] for s in seeds for x in trained_rounds(results[(p, s)]))

    base_up = per_round("none", "bytes_up")
    print(f"\nconfigs/default.json, seeds {args.seeds}; bytes are medians over rounds and seeds")
    print("| pipeline | bytes up / round | bytes down / round | upload ratio | download ratio "
          "| final accuracy (mean, min-max) | vs uncompressed (mean of paired differences) "
          "| first round at the uncompressed final accuracy |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for p in pipelines:
        accs = [results[(p, s)]["final_accuracy"] for s in seeds]
        deltas = [results[(p, s)]["final_accuracy"] - results[("none", s)]["final_accuracy"] for s in seeds]
        reach = []
        for s in seeds:
            target = results[("none", s)]["final_accuracy"]
            hit = [x["round"] for x in trained_rounds(results[(p, s)])
                   if x.get("eval_accuracy") is not None and x["eval_accuracy"] >= target]
            reach.append(str(hit[0]) if hit else "-")
        up = per_round(p, "bytes_up")
        down = sum(x["bytes_down"] for s in seeds for x in trained_rounds(results[(p, s)]))
        down_full = sum(x.get("bytes_down_full", 0) for s in seeds for x in trained_rounds(results[(p, s)]))
        down_ratio = f"{down_full / down:.1f}x" if down_full and down else "-"
        print(f"| {p} | {up:,.0f} | {per_round(p, 'bytes_down'):,.0f} | {base_up / up:.1f}x | {down_ratio} | "
              f"{statistics.mean(accs):.4f} ({min(accs):.4f}-{max(accs):.4f}) | {statistics.mean(deltas):+.4f} "
              f"({', '.join(f'{d:+.4f}' for d in deltas)}) | {', '.join(reach)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
