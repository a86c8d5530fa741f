#!/usr/bin/env python3
"""TF-IDF + logistic regression baseline for a JSONL text-classification corpus.

The number the LoRA fine-tuned encoder has to beat: word unigrams and bigrams (sublinear TF,
IDF from the training split), a multinomial logistic regression, fit on --train, scored on --test.
Prints one line of JSON: {"accuracy": ..., "macro_f1": ..., "n_train": ..., "n_test": ...}.

Run with Debian's python3 (scikit-learn from the python3-sklearn package):
  /usr/bin/python3 scripts/baseline_tfidf.py --train data/fortunes/train.jsonl \
      --test data/fortunes/test.jsonl
Deterministic: the solver (lbfgs) has no randomness.
"""

import argparse
import json
import sys

from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import accuracy_score, f1_score


def load(path):
    texts, labels = [], []
    with open(path, encoding="utf-8") as f:
        for line_number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                texts.append(row["text"])
                labels.append(str(row["label"]))
            except (ValueError, KeyError) as e:
                raise SystemExit(f"{path}:{line_number}: {e}")
    if not texts:
        raise SystemExit(f"{path}: no examples")
    return texts, labels


def main(argv):
    parser = argparse.ArgumentParser(description="TF-IDF + logistic regression baseline")
    parser.add_argument("--train", default="data/fortunes/train.jsonl")
    parser.add_argument("--test", default="data/fortunes/test.jsonl")
    parser.add_argument("--C", type=float, default=10.0,
                        help="inverse L2 regularization strength of the logistic regression")
    args = parser.parse_args(argv)

    train_x, train_y = load(args.train)
    test_x, test_y = load(args.test)
    vectorizer = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, min_df=1, lowercase=True)
    train_features = vectorizer.fit_transform(train_x)
    classifier = LogisticRegression(C=args.C, max_iter=2000)
    classifier.fit(train_features, train_y)
    predicted = classifier.predict(vectorizer.transform(test_x))
    result = {
        "accuracy": round(float(accuracy_score(test_y, predicted)), 4),
        "macro_f1": round(float(f1_score(test_y, predicted, average="macro")), 4),
        "n_train": len(train_x),
        "n_test": len(test_x),
        "n_features": len(vectorizer.vocabulary_),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
