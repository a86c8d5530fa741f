#!/usr/bin/env python3
"""Writes a tiny random BERT checkpoint (config.json + model.safetensors) in the Hugging Face layout.

  make_random_checkpoint.py OUT_DIR [--seed 0] [--bare] [--dtype F32|F16|BF16] [--no-pooler] [--roberta]
                            [--layers 2 --hidden 32 --heads 4 --intermediate 64 --vocab 100]

--bare writes names without the "bert." prefix, as sentence-transformers checkpoints do.
--roberta writes a RoBERTa checkpoint ("roberta." prefix, pad_token_id 1, one token type, two
extra positions for the pad offset, no pooler). Weights
are N(0, 0.2) and LayerNorm gains 1 + N(0, 0.1), larger than HF's 0.02 init so that every layer
changes its input visibly and a wrong gradient anywhere shows up in the comparison.
"""

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_np  # noqa: E402


def make_config(args):
    if getattr(args, "roberta", False):  # callers may pass a namespace without it
        return {
            "architectures": ["RobertaForMaskedLM"],
            "model_type": "roberta",
            "hidden_size": args.hidden,
            "num_hidden_layers": args.layers,
            "num_attention_heads": args.heads,
            "intermediate_size": args.intermediate,
            "hidden_act": "gelu",
            "hidden_dropout_prob": 0.1,
            "attention_probs_dropout_prob": 0.1,
            "layer_norm_eps": 1e-05,
            "max_position_embeddings": args.max_pos + 2,
            "type_vocab_size": 1,
            "vocab_size": args.vocab,
            "pad_token_id": 1,
            "bos_token_id": 0,
            "eos_token_id": 2,
            "initializer_range": 0.02,
        }
    return {
        "architectures": ["BertForMaskedLM"],
        "model_type": "bert",
        "hidden_size": args.hidden,
        "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads,
        "intermediate_size": args.intermediate,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
        "layer_norm_eps": 1e-12,
        "max_position_embeddings": args.max_pos,
        "type_vocab_size": 2,
        "vocab_size": args.vocab,
        "pad_token_id": 0,
        "initializer_range": 0.02,
    }


def make_weights(cfg, rng, prefix, pooler):
    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    w = {}

    def normal(*shape, std=0.2):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def ln(name):
        w[name + ".weight"] = (1.0 + normal(h, std=0.1)).astype(np.float32)
        w[name + ".bias"] = normal(h, std=0.1)

    def linear(name, out_f, in_f):
        # 1/sqrt(in) keeps activations O(1) through the layers.
        w[name + ".weight"] = normal(out_f, in_f, std=1.0 / np.sqrt(in_f))
        w[name + ".bias"] = normal(out_f, std=0.1)

    e = prefix + "embeddings."
    w[e + "word_embeddings.weight"] = normal(cfg["vocab_size"], h, std=0.5)
    w[e + "position_embeddings.weight"] = normal(cfg["max_position_embeddings"], h, std=0.5)
    w[e + "token_type_embeddings.weight"] = normal(cfg["type_vocab_size"], h, std=0.5)
    w[e + "position_ids"] = np.arange(cfg["max_position_embeddings"], dtype=np.int64)[None, :]
    ln(e + "LayerNorm")
    for i in range(cfg["num_hidden_layers"]):
        l = f"{prefix}encoder.layer.{i}."
        for m in ("query", "key", "value"):
            linear(l + "attention.self." + m, h, h)
        linear(l + "attention.output.dense", h, h)
        ln(l + "attention.output.LayerNorm")
        linear(l + "intermediate.dense", inter, h)
        linear(l + "output.dense", h, inter)
        ln(l + "output.LayerNorm")
    if pooler:
        linear(prefix + "pooler.dense", h, h)
    return w


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out_dir")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bare", action="store_true")
    p.add_argument("--no-pooler", action="store_true")
    p.add_argument("--roberta", action="store_true")
    p.add_argument("--dtype", default="F32", choices=["F32", "F16", "BF16"])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--intermediate", type=int, default=64)
    p.add_argument("--vocab", type=int, default=100)
    p.add_argument("--max-pos", type=int, default=64)
    args = p.parse_args()
    cfg = make_config(args)
    rng = np.random.default_rng(args.seed)
    prefix = "" if args.bare else ("roberta." if args.roberta else "bert.")
    weights = make_weights(cfg, rng, prefix, not (args.no_pooler or args.roberta))
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    dtypes = {k: args.dtype for k, v in weights.items() if v.dtype == np.float32}
    safetensors_np.write(os.path.join(args.out_dir, "model.safetensors"), weights, dtypes, {"format": "pt"})


if __name__ == "__main__":
    main()
