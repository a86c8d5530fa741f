#!/usr/bin/env python3
"""Builds the WordNet "define X" instruction-tuning corpus from Debian's `wordnet-base` package.

Each example asks for the definition of one word: {"prompt": "Define \"ammonite\".", "response":
"one of the coiled chambered fossil shells of extinct mollusks", "lexname": "noun.animal"}. The
response is the synset's gloss without its quoted usage examples. The `lexname` is WordNet's
lexicographer file (its semantic domain), the key a federated run partitions by, so that each
site knows the words of its own domains only: a naturally skewed federation.

Kept: the eight domains in DOMAINS, distinct in vocabulary and in the style of their glosses.
Only monosemous words are used (the word names exactly one synset across nouns, verbs, adjectives
and adverbs), so that a prompt has one right answer; the word is the synset's first lemma, in
lower case, spaces for underscores; glosses shorter than 15 or longer than 200 characters are
dropped. Each domain is capped by a seeded sample, then split train/test per domain.

Outputs under --out: train.jsonl, test.jsonl, test_small.jsonl (the first --small-per-domain test
examples of each domain, in file order: the held-out set of configs/wordnet_smollm2.json) and
stats.json (examples per domain per split).
Deterministic: the same --seed and input files give byte-identical outputs. Standard library only.
"""

import argparse
import collections
import json
import os
import random
import sys

# WordNet 3.0's lexicographer files, by number (lexnames(5WN)).
LEXNAMES = (
    "adj.all adj.pert adv.all noun.Tops noun.act noun.animal noun.artifact noun.attribute "
    "noun.body noun.cognition noun.communication noun.event noun.feeling noun.food noun.group "
    "noun.location noun.motive noun.object noun.person noun.phenomenon noun.plant noun.possession "
    "noun.process noun.quantity noun.relation noun.shape noun.state noun.substance noun.time "
    "verb.body verb.change verb.cognition verb.communication verb.competition verb.consumption "
    "verb.contact verb.creation verb.emotion verb.motion verb.perception verb.possession "
    "verb.social verb.stative verb.weather adj.ppl"
).split()

DOMAINS = (
    "noun.animal", "noun.plant", "noun.food", "noun.body",
    "noun.artifact", "noun.person", "noun.location", "noun.substance",
)

POS_FILES = ("noun", "verb", "adj", "adv")


def parse_data_file(path):
    """Yields (lexname, [lemmas], gloss) for every synset line of a WordNet data.* file."""
    with open(path, encoding="utf-8", errors="strict") as f:
        for line in f:
            if line.startswith("  "):  # the license header
                continue
            head, sep, gloss = line.partition(" | ")
            if not sep:
                raise ValueError(f"{path}: a synset line without a gloss: {line[:60]!r}")
            fields = head.split()
            lex_filenum = int(fields[1])
            w_cnt = int(fields[3], 16)
            lemmas = [fields[4 + 2 * i] for i in range(w_cnt)]
            yield LEXNAMES[lex_filenum], lemmas, gloss.strip()


def definition_of(gloss):
    """The gloss without its usage examples ("...; \"an example\"")."""
    cut = gloss.find('"')
    text = gloss if cut < 0 else gloss[:cut]
    return text.strip().rstrip(";").strip()


def word_of(lemma):
    # Adjective lemmas may carry a syntactic marker: "galore(ip)".
    if "(" in lemma:
        lemma = lemma[: lemma.index("(")]
    return lemma.replace("_", " ").lower()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--wordnet", default="/usr/share/wordnet")
    parser.add_argument("--out", required=True)
    parser.add_argument("--per-domain", type=int, default=250, help="examples kept per domain")
    parser.add_argument("--test-per-domain", type=int, default=50)
    parser.add_argument("--small-per-domain", type=int, default=10)
    parser.add_argument("--seed", type=int, default=20261202)
    args = parser.parse_args()
    if args.test_per_domain >= args.per_domain:
        sys.exit("--test-per-domain must be below --per-domain")

    synsets = []
    senses = collections.Counter()
    for pos in POS_FILES:
        for lexname, lemmas, gloss in parse_data_file(os.path.join(args.wordnet, "data." + pos)):
            synsets.append((lexname, lemmas, gloss))
            for lemma in lemmas:
                senses[word_of(lemma)] += 1

    by_domain = collections.defaultdict(list)
    for lexname, lemmas, gloss in synsets:
        if lexname not in DOMAINS:
            continue
        word = word_of(lemmas[0])
        definition = definition_of(gloss)
        if senses[word] != 1 or not 15 <= len(definition) <= 200:
            continue
        by_domain[lexname].append({"prompt": f'Define "{word}".', "response": definition, "lexname": lexname})

    rng = random.Random(args.seed)
    train, test, stats = [], [], {}
    for domain in DOMAINS:
        pool = sorted(by_domain[domain], key=lambda e: e["prompt"])
        if len(pool) < args.per_domain:
            sys.exit(f"{domain}: only {len(pool)} usable synsets, fewer than --per-domain {args.per_domain}")
        picked = rng.sample(pool, args.per_domain)
        test += picked[: args.test_per_domain]
        train += picked[args.test_per_domain :]
        stats[domain] = {"usable": len(pool), "train": args.per_domain - args.test_per_domain,
                         "test": args.test_per_domain}
    rng.shuffle(train)
    rng.shuffle(test)

    os.makedirs(args.out, exist_ok=True)
    taken = collections.Counter()
    small = []
    for row in test:
        if taken[row["lexname"]] < args.small_per_domain:
            taken[row["lexname"]] += 1
            small.append(row)
    for name, rows in (("train", train), ("test", test), ("test_small", small)):
        with open(os.path.join(args.out, name + ".jsonl"), "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    with open(os.path.join(args.out, "stats.json"), "w", encoding="utf-8") as f:
        json.dump(stats, f, indent=2, sort_keys=True)
        f.write("\n")
    print(f"wordnet: {len(train)} train / {len(test)} test examples in {len(DOMAINS)} domains -> {args.out}")


if __name__ == "__main__":
    main()
