#!/usr/bin/env python3
"""Builds the fortunes text-classification corpus from Debian's `fortunes` package.

Each fortune file in /usr/share/games/fortunes is one category; the task is to tell from the text
of a fortune which file it came from. Eight files are kept, chosen for size (each has more than 500
usable entries, so every class can be capped at the same 500) and for distinct subject matter:

  computers     programming, hackers, hardware
  definitions   mock dictionary entries ("X, n.: ..."), a distinct register
  men-women     love, marriage and the sexes
  politics      government, elections, politicians
  science       scientists, physics, mathematics
  songs-poems   verse and song lyrics, distinct by form
  work          jobs, bosses, offices
  zippy         Zippy the Pinhead's non sequiturs, a distinct voice

Left out: the catch-all files (fortunes, cookie, people, miscellaneous, knghtbrd), files that
overlap a kept topic (linux and perl overlap computers; wisdom and platitudes overlap each other
and everything), and files with fewer than 500 usable entries (law, literature, art, education...).

Processing: entries are separated by lines holding only "%"; backspace overstriking (x\\bx, _\\bx)
is removed; runs of whitespace become one space; entries shorter than 20 or longer than 1000
characters are dropped; an entry that occurs twice is kept once, and an entry that occurs in two
categories is dropped (its label would be ambiguous). Each class is capped at --max-per-class
entries (a seeded sample), then split train/test 80/20 per class (stratified).

Outputs under --out: train.jsonl and test.jsonl ({"text": ..., "label": category}, one object a
line), labels.txt (one category a line, sorted), stats.json (entries per class per split).
Deterministic: the same --seed and input files give byte-identical outputs. Standard library only.
"""

import argparse
import collections
import json
import os
import random
import re
import sys

CATEGORIES = (
    "computers",
    "definitions",
    "men-women",
    "politics",
    "science",
    "songs-poems",
    "work",
    "zippy",
)
MIN_CHARS = 20
MAX_CHARS = 1000
TEST_FRACTION = 0.2

_SEPARATOR = re.compile(r"^%[ \t]*$", re.MULTILINE)
_OVERSTRIKE = re.compile(r".\x08")


def read_entries(path):
    """Returns the normalized entries of one fortune file, in file order."""
    with open(path, "rb") as f:
        raw = f.read()
    # The Debian files are UTF-8; decode leniently so that one stray byte cannot stop the build.
    text = raw.decode("utf-8", errors="replace")
    entries = []
    for entry in _SEPARATOR.split(text):
        entry = _OVERSTRIKE.sub("", entry).replace("\x08", "")
        entry = " ".join(entry.split())
        if MIN_CHARS <= len(entry) <= MAX_CHARS:
            entries.append(entry)
    return entries


def build(source_dir, seed, max_per_class):
    """Returns {category: (train_entries, test_entries)}."""
    per_category = {}
    owners = collections.defaultdict(set)
    for category in CATEGORIES:
        path = os.path.join(source_dir, category)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path}: missing; install the Debian package 'fortunes'")
        unique = sorted(set(read_entries(path)))
        per_category[category] = unique
        for entry in unique:
            owners[entry].add(category)

    splits = {}
    for category in CATEGORIES:
        entries = [e for e in per_category[category] if len(owners[e]) == 1]
        # A per-class generator so that changing one class never reshuffles another.
        rng = random.Random(f"{seed}:{category}")
        rng.shuffle(entries)
        entries = entries[:max_per_class]
        n_test = round(len(entries) * TEST_FRACTION)
        splits[category] = (entries[n_test:], entries[:n_test])
    return splits


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for text, label in rows:
            f.write(json.dumps({"text": text, "label": label}, ensure_ascii=False) + "\n")


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="data/fortunes", help="output directory")
    parser.add_argument("--seed", type=int, default=1234, help="sampling and split seed")
    parser.add_argument("--source", default="/usr/share/games/fortunes",
                        help="directory of the fortune files")
    parser.add_argument("--max-per-class", type=int, default=500,
                        help="cap on entries per class, before the split")
    args = parser.parse_args(argv)

    splits = build(args.source, args.seed, args.max_per_class)
    os.makedirs(args.out, exist_ok=True)
    stats = {"seed": args.seed, "max_per_class": args.max_per_class, "classes": {}}
    for split_index, split_name in enumerate(("train", "test")):
        rows = [(text, category) for category in CATEGORIES
                for text in splits[category][split_index]]
        # Interleave the classes so that a reader that takes a prefix still sees all of them.
        random.Random(f"{args.seed}:{split_name}").shuffle(rows)
        write_jsonl(os.path.join(args.out, f"{split_name}.jsonl"), rows)
    for category in CATEGORIES:
        train, test = splits[category]
        stats["classes"][category] = {"train": len(train), "test": len(test)}
    stats["total"] = {
        "train": sum(len(splits[c][0]) for c in CATEGORIES),
        "test": sum(len(splits[c][1]) for c in CATEGORIES),
    }
    with open(os.path.join(args.out, "labels.txt"), "w", encoding="utf-8", newline="\n") as f:
        f.write("".join(c + "\n" for c in sorted(CATEGORIES)))
    with open(os.path.join(args.out, "stats.json"), "w", encoding="utf-8", newline="\n") as f:
        json.dump(stats, f, indent=2, sort_keys=True)
        f.write("\n")
    print(json.dumps(stats["total"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
