#!/usr/bin/env python3
"""Frozen-embedding baseline: logistic regression on the frozen encoder's pooled embeddings.

What LoRA fine-tuning must beat besides TF-IDF (scripts/baseline_tfidf.py): the same encoder,
not trained at all, used as a feature extractor. `fedlora embed` writes the mean-pooled last
hidden states (sentence-transformers' pooling for all-MiniLM-L6-v2) of --train and --test; the
embeddings are L2-normalised (as the sentence-transformers model does), standardised, and a
multinomial logistic regression is fit on --train with C chosen by 5-fold cross-validation on
--train only, then scored on --test. Prints one line of JSON:
{"accuracy": ..., "macro_f1": ..., "C": ..., "n_train": ..., "n_test": ..., "dim": ...}.

  /usr/bin/python3 scripts/baseline_frozen_embeddings.py --fedlora build/default/tools/fedlora \
      --model models/all-MiniLM-L6-v2 --train data/fortunes/train.jsonl --test data/fortunes/test.jsonl

Deterministic: the embeddings are, and lbfgs and the unshuffled stratified folds have no randomness.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
from sklearn.linear_model import LogisticRegressionCV
from sklearn.metrics import accuracy_score, f1_score
from sklearn.preprocessing import StandardScaler

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def embed(args, data, out_dir, name):
    emb, labels = os.path.join(out_dir, name + "_emb.npy"), os.path.join(out_dir, name + "_labels.npy")
    if os.path.exists(emb) and os.path.exists(labels):
        return np.load(emb), np.load(labels)
    cmd = [args.fedlora, "embed", "--model", args.model, "--data", data, "--out", emb, "--labels-out", labels,
           "--pooling", args.pooling, "--max-seq-len", str(args.max_seq_len), "--threads", str(args.threads)]
    if args.label_names:
        cmd += ["--label-names", args.label_names]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"baseline: fedlora embed failed ({result.returncode}): {result.stderr.strip()}")
    return np.load(emb), np.load(labels)


def main(argv):
    p = argparse.ArgumentParser(description="logistic regression on frozen pooled embeddings")
    p.add_argument("--fedlora", default=os.path.join(ROOT, "build/default/tools/fedlora"))
    p.add_argument("--model", default=os.path.join(ROOT, "models/all-MiniLM-L6-v2"))
    p.add_argument("--train", default=os.path.join(ROOT, "data/fortunes/train.jsonl"))
    p.add_argument("--test", default=os.path.join(ROOT, "data/fortunes/test.jsonl"))
    p.add_argument("--label-names", default=os.path.join(ROOT, "data/fortunes/labels.txt"),
                   help="fixes the label order of both splits ('' to use each file's sorted labels)")
    p.add_argument("--pooling", default="mean", choices=["mean", "cls"])
    p.add_argument("--max-seq-len", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--cache-dir", help="keep the embeddings here and reuse them when present")
    args = p.parse_args(argv)
    if args.label_names and not os.path.exists(args.label_names):
        args.label_names = ""
    if args.cache_dir:
        os.makedirs(args.cache_dir, exist_ok=True)
        train_x, train_y = embed(args, args.train, args.cache_dir, "train")
        test_x, test_y = embed(args, args.test, args.cache_dir, "test")
    else:
        with tempfile.TemporaryDirectory(prefix="fedlora_frozen_") as d:
            train_x, train_y = embed(args, args.train, d, "train")
            test_x, test_y = embed(args, args.test, d, "test")

    def normalise(x):
        return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)

    scaler = StandardScaler().fit(normalise(train_x))
    clf = LogisticRegressionCV(Cs=[0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0], cv=5, max_iter=5000)
    clf.fit(scaler.transform(normalise(train_x)), train_y)
    predicted = clf.predict(scaler.transform(normalise(test_x)))
    print(json.dumps({
        "accuracy": round(float(accuracy_score(test_y, predicted)), 4),
        "macro_f1": round(float(f1_score(test_y, predicted, average="macro")), 4),
        "C": float(clf.C_[0]),
        "pooling": args.pooling,
        "n_train": int(len(train_y)),
        "n_test": int(len(test_y)),
        "dim": int(train_x.shape[1]),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
