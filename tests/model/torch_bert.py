"""An independent PyTorch implementation of BERT sequence classification with LoRA adapters.

Written from the math (Devlin et al. 2019; Hu et al. 2021) and the Hugging Face checkpoint layout,
without importing transformers or peft, so that it can check the C++ model (model/bert.cc). It runs
in float64 by default: the C++ model computes in float32, so the difference measured by the tests is
the C++ rounding error alone.

  embeddings  x0 = LN(word[ids] + pos[0..S) + type[tt])
  layer       q,k,v = x W^T + b (+ LoRA);  P = softmax(q k^T / sqrt(d) + mask_bias);  c = P v
              h = LN(x + c Wo^T + bo (+ LoRA));  y = LN(h + gelu(h Wi^T + bi (+ LoRA)) Wo2^T + bo2 (+ LoRA))
  head        pooled = tanh(y[:, 0] Wp^T + bp);  logits = pooled Wc^T + bc
  LoRA        W x + (alpha / r) * B (A x)
Padding positions (attention_mask == 0) get a large negative bias before the softmax, as in HF.

RoBERTa (model_type "roberta"): position of token j is pad + (number of non-pad ids up to j),
pads get pad (fairseq's make_positions); the head is tanh(y[:, 0] Wd^T + bd) Wo^T + bo with its
own trainable dense layer instead of the pooler. Names start with "roberta." instead of "bert.".
"""

import json
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_np  # noqa: E402

# PEFT target-module name -> (weight path inside a layer).
MODULE_PATHS = {
    "query": "attention.self.query",
    "key": "attention.self.key",
    "value": "attention.self.value",
    "attn_out": "attention.output.dense",
    "intermediate": "intermediate.dense",
    "output": "output.dense",
}


def load_checkpoint(model_dir, dtype=torch.float64):
    """Returns (config dict, {bare name: tensor}); "bert." prefixes are stripped."""
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    raw = safetensors_np.read(os.path.join(model_dir, "model.safetensors"))
    weights = {}
    for name, arr in raw.items():
        for prefix in ("bert.", "roberta."):
            if name.startswith(prefix):
                name = name[len(prefix) :]
        if arr.dtype.kind == "f":
            weights[name] = torch.tensor(arr.astype(np.float64), dtype=dtype)
    return cfg, weights


def _layer_norm(x, w, b, eps):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * w + b


def _gelu(x):
    # Exact (erf) GELU, BERT's "gelu".
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


class TorchBert:
    """lora: {PEFT module prefix (e.g. "encoder.layer.0.attention.self.query"): (A [r,in], B [out,r])}."""

    def __init__(self, cfg, weights, lora=None, lora_scale=2.0, classifier=None, head_dense=None):
        self.cfg = cfg
        self.w = weights
        self.lora = lora or {}
        self.lora_scale = lora_scale
        self.classifier = classifier  # (W [labels, hidden], b [labels]) or None
        self.head_dense = head_dense  # RoBERTa: (W [hidden, hidden], b [hidden])
        self.roberta = cfg.get("model_type") in ("roberta", "xlm-roberta")

    def _linear(self, x, path):
        y = x @ self.w[path + ".weight"].T + self.w[path + ".bias"]
        if path in self.lora:
            a, b = self.lora[path]
            y = y + self.lora_scale * ((x @ a.T) @ b.T)
        return y

    def encode(self, ids, token_type, mask):
        """Returns the last hidden state [B, S, H]."""
        cfg = self.cfg
        eps = cfg.get("layer_norm_eps", 1e-12)
        bsz, seq = ids.shape
        heads = cfg["num_attention_heads"]
        hidden = cfg["hidden_size"]
        dh = hidden // heads
        w = self.w
        if self.roberta:
            pad = cfg["pad_token_id"]
            real = (ids != pad).long()
            positions = torch.cumsum(real, dim=1) * real + pad
        else:
            positions = torch.arange(seq)[None, :].expand(bsz, seq)
        x = (w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][positions]
             + w["embeddings.token_type_embeddings.weight"][token_type])
        x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], eps)
        # HF uses finfo(dtype).min as the bias; any value that makes exp() underflow to 0 is the same.
        bias = (1.0 - mask.to(x.dtype))[:, None, None, :] * -1e30
        for i in range(cfg["num_hidden_layers"]):
            p = f"encoder.layer.{i}."

            def split(t):
                return t.view(bsz, seq, heads, dh).transpose(1, 2)

            q = split(self._linear(x, p + MODULE_PATHS["query"]))
            k = split(self._linear(x, p + MODULE_PATHS["key"]))
            v = split(self._linear(x, p + MODULE_PATHS["value"]))
            scores = q @ k.transpose(-1, -2) / math.sqrt(dh) + bias
            probs = torch.softmax(scores, dim=-1)
            ctx = (probs @ v).transpose(1, 2).reshape(bsz, seq, hidden)
            h = _layer_norm(x + self._linear(ctx, p + MODULE_PATHS["attn_out"]),
                            w[p + "attention.output.LayerNorm.weight"], w[p + "attention.output.LayerNorm.bias"], eps)
            inter = _gelu(self._linear(h, p + MODULE_PATHS["intermediate"]))
            x = _layer_norm(h + self._linear(inter, p + MODULE_PATHS["output"]),
                            w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"], eps)
        return x

    def logits(self, ids, token_type, mask):
        x = self.encode(ids, token_type, mask)
        if self.roberta:
            wd, bd = self.head_dense
            pooled = torch.tanh(x[:, 0] @ wd.T + bd)
        else:
            pooled = torch.tanh(self._linear(x[:, 0], "pooler.dense"))
        wc, bc = self.classifier
        return pooled @ wc.T + bc

    def mean_pooled(self, ids, token_type, mask):
        x = self.encode(ids, token_type, mask)
        m = mask.to(x.dtype)[:, :, None]
        return (x * m).sum(1) / m.sum(1).clamp(min=1e-9)
