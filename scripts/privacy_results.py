#!/usr/bin/env python3
"""Secure aggregation and differential privacy on the default simulation task.

  scripts/privacy_results.py [--fedlora build/default/tools/fedlora] [--seeds 17,18,19]
                             [--variants secagg,secagg_dp_z0.5] [--out runs/privacy]

Each variant is configs/default.json with min_clients 3 (secure aggregation needs 3), equal
weights (weight_by_examples false: secure aggregation and DP both need them) and:
  plain_equal       no privacy setting, aggregation.max_update_norm 50: the same run as `secagg`
                    without secure aggregation
  secagg            privacy.secure_aggregation, each update clipped to L2 norm 50
                    (aggregation.max_update_norm: a bound for the fixed point, far above this
                    task's update norms, so that nothing is clipped)
  secagg_dp_zZ      privacy.secure_aggregation and DISTRIBUTED DP, clip norm 1, noise multiplier Z,
                    delta 1e-5 (accounted at sampling rate 1)
Runs `fedlora simulate --mtls` once per variant and seed (mutual TLS, sealed updates, and the
variant's privacy all on) and prints one row each: final accuracy, epsilon at delta 1e-5, bytes up
per round, wall time. A run already in --out (its summary.json) is read instead of run again.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from config_paths import absolute_paths  # noqa: E402  (scripts/ is on sys.path when run)


def variant_config(name, seed):
    with open(os.path.join(ROOT, "configs", "default.json")) as f:
        c = absolute_paths(json.load(f))
    c["seed"] = seed
    c["run_id"] = f"{name}-{seed}"
    c["selection"]["min_clients"] = 3
    c["aggregation"]["weight_by_examples"] = False
    c.setdefault("privacy", {})["secure_aggregation"] = name != "plain_equal"
    if name in ("secagg", "plain_equal"):
        c["aggregation"]["max_update_norm"] = 50.0
    elif name.startswith("secagg_dp_z"):
        z = float(name[len("secagg_dp_z"):])
        c["privacy"]["dp"] = {"enabled": True, "mode": "DISTRIBUTED", "clip_norm": 1.0, "noise_multiplier": z,
                              "target_delta": 1e-5}
    else:
        sys.exit(f"unknown variant {name}")
    return c


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fedlora", default=os.path.join(ROOT, "build/default/tools/fedlora"))
    ap.add_argument("--seeds", default="17,18,19")
    ap.add_argument("--variants", default="plain_equal,secagg,secagg_dp_z0.5")
    ap.add_argument("--out", default=os.path.join(ROOT, "runs/privacy"))
    args = ap.parse_args()
    rows = []
    for name in args.variants.split(","):
        for seed in [int(s) for s in args.seeds.split(",")]:
            out = os.path.join(args.out, f"{name}-{seed}")
            summary = os.path.join(out, "summary.json")
            if not os.path.exists(summary):
                os.makedirs(out, exist_ok=True)
                config = os.path.join(out, "config.json")
                with open(config, "w") as f:
                    json.dump(variant_config(name, seed), f, indent=1)
                subprocess.run([args.fedlora, "simulate", "--config", config, "--out", out, "--mtls",
                                "--progress=false"], check=True)
            with open(summary) as f:
                s = json.load(f)
            ups = [r["bytes_up"] for r in s["rounds"][1:]]
            rows.append((name, seed, s["final_accuracy"], s.get("dp_epsilon"), statistics.median(ups), s["seconds"]))
    print("| variant | seed | final accuracy | epsilon (delta 1e-5) | bytes up / round | seconds |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, seed, acc, eps, up, secs in rows:
        eps_text = "-" if eps is None else f"{eps:.2f}"
        print(f"| {name} | {seed} | {acc:.4f} | {eps_text} | {up:,.0f} | {secs:.0f} |")


if __name__ == "__main__":
    main()
