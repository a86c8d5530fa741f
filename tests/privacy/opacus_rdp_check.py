#!/usr/bin/env python3
"""Checks fedlora's RDP accountant against Opacus's RDP analysis on a fixed pseudo-random grid.

Run with the project venv (PyPI `opacus`, made by `scripts/setup.sh`):

  .venv/bin/python tests/privacy/opacus_rdp_check.py --epsilon build/x/tests/privacy/rdp_epsilon

Only opacus/accountants/analysis/rdp.py (numpy + scipy) is loaded, by file path: `import opacus`
needs a newer torch than Debian's. For each setting (noise multiplier, sampling rate, steps, delta)
Opacus's epsilon over its DEFAULT_ALPHAS is compared with rdp_epsilon's; any relative error over
1e-6 fails (exit 1) and the worst cases are printed. Exits 77 (CTest: skipped) when opacus, numpy or
scipy is missing.
"""

import argparse
import importlib.util
import math
import os
import random
import subprocess
import sys
import warnings

SKIP = 77
REL_TOL = 1e-6
SETTINGS = 200
ALPHAS = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))  # Opacus's DEFAULT_ALPHAS


def load_opacus_rdp():
    """Opacus's rdp.py as a standalone module, or None when it is not installed."""
    try:
        spec = importlib.util.find_spec("opacus")  # finds the package without importing it
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        path = os.path.join(root, "accountants", "analysis", "rdp.py")
        if os.path.isfile(path):
            module_spec = importlib.util.spec_from_file_location("opacus_rdp", path)
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)  # imports numpy and scipy
            return module
    return None


def settings():
    """The fixed grid: log-uniform draws plus the edges (rate 0 and 1) and Opacus's own test."""
    rng = random.Random(20240803)
    out = [(1.5, 0.04, int(90 / 0.04), 1e-5), (1.0, 0.0, 100, 1e-5), (2.0, 1.0, 50, 1e-6)]
    while len(out) < SETTINGS:
        noise = float(f"{10 ** rng.uniform(math.log10(0.3), 1):.4g}")
        rate = 1.0 if rng.random() < 0.05 else float(f"{10 ** rng.uniform(-4, 0):.4g}")
        steps = int(10 ** rng.uniform(0, 5))
        delta = float(f"{10 ** rng.uniform(-10, -2):.3g}")
        out.append((noise, rate, steps, delta))
    return out


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epsilon", required=True, help="path of the rdp_epsilon helper binary")
    args = parser.parse_args(argv)
    try:
        rdp = load_opacus_rdp()
    except ImportError as e:
        print(f"SKIP: {e} (scripts/setup.sh)")
        return SKIP
    if rdp is None:
        print("SKIP: the `opacus` package is missing (scripts/setup.sh)")
        return SKIP

    grid = settings()
    text = "".join(f"{n!r} {q!r} {s} {d!r}\n" for n, q, s, d in grid)
    run = subprocess.run([args.epsilon], input=text, capture_output=True, text=True, check=False)
    if run.returncode != 0:
        print(f"FAIL: {args.epsilon} exited {run.returncode}: {run.stderr}")
        return 1
    ours = [tuple(float(v) for v in line.split()) for line in run.stdout.splitlines()]
    if len(ours) != len(grid):
        print(f"FAIL: {len(ours)} results for {len(grid)} settings")
        return 1

    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "optimal order is the largest alpha"
        for (n, q, s, d), (eps, order) in zip(grid, ours):
            r = rdp.compute_rdp(q=q, noise_multiplier=n, steps=s, orders=ALPHAS)
            want, want_order = rdp.get_privacy_spent(orders=ALPHAS, rdp=r, delta=d)
            want, want_order = float(want), float(want_order)
            err = abs(eps - want) / abs(want) if want != 0 else abs(eps)
            if not math.isfinite(err):
                err = 0.0 if eps == want else math.inf
            rows.append((err, (n, q, s, d), eps, want, order, want_order))

    rows.sort(key=lambda row: row[0], reverse=True)
    bad = [row for row in rows if not row[0] <= REL_TOL]
    moved = sum(1 for row in rows if row[4] != row[5])
    print(f"{len(rows)} settings compared; worst relative error {rows[0][0]:.3g}; "
          f"{moved} with a different optimal order; {len(bad)} over {REL_TOL:g}")
    for err, setting, eps, want, order, want_order in (bad or rows)[:10]:
        print(f"  noise, rate, steps, delta = {setting}: ours {eps!r} (order {order:g}), "
              f"opacus {want!r} (order {want_order:g}), relative error {err:.3g}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
