#!/usr/bin/env python3
"""Writes the first N examples of each label of a JSONL file, in file order.

    scripts/fortunes_subset.py --per-class 16 data/fortunes/train.jsonl runs/subsets/train128.jsonl

Used for small-budget decoder runs on fortunes (docs/results.md), where a full pass over 3200
conversations takes hours on two CPU cores.
"""
import argparse
import collections
import json
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-class", type=int, required=True)
    ap.add_argument("--label-field", default="label")
    ap.add_argument("input")
    ap.add_argument("output")
    args = ap.parse_args()
    if args.per_class < 1:
        ap.error("--per-class must be >= 1")
    taken = collections.Counter()
    rows = []
    with open(args.input, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            if args.label_field not in row:
                print(f"{args.input}:{n}: no {args.label_field!r} field", file=sys.stderr)
                return 1
            label = row[args.label_field]
            if taken[label] < args.per_class:
                taken[label] += 1
                rows.append(line if line.endswith("\n") else line + "\n")
    with open(args.output, "w", encoding="utf-8") as f:
        f.writelines(rows)
    print(json.dumps({"examples": len(rows), "per_class": dict(sorted(taken.items()))}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
