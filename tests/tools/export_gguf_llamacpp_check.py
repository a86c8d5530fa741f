#!/usr/bin/env python3
"""`fedlora export --gguf` run by llama.cpp itself (llama-cpp-python), on the real SmolLM2 Q4_1 GGUF.

  PY -m pip install llama-cpp-python   # builds llama.cpp from source (minutes); not in .venv
  PY tests/tools/export_gguf_llamacpp_check.py build/default/tools/fedlora \\
      build/default/tests/model/decoder_reference_dump

A random LoRA adapter (r 4, alpha 8, all seven projections) on SmolLM2-135M-Instruct.Q4_1.gguf is
saved by fedlora (decoder_reference_dump --save-adapter), which also gives fedlora's logits with
and without it; `fedlora export --adapter --gguf` converts it; llama.cpp computes the logits of the
same tokens with `lora_path` set and without. The adapter's effect on the logits (with minus
without) must agree between the two: llama.cpp multiplies with 8-bit activations, so the bound is
a few percent of the effect's size, far below what a wrong row order or scale gives.
Exits 77 when llama_cpp, numpy or the model is missing.
"""

import os
import subprocess
import sys
import tempfile

SKIP = 77
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "model"))
MODEL = os.path.join(HERE, "..", "..", "models", "SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct.Q4_1.gguf")

try:
    import numpy as np
    import llama_cpp
    import safetensors_np
except ImportError as e:  # pragma: no cover
    print(f"skipping: {e}")
    sys.exit(SKIP)

RANK, ALPHA = 4, 8.0
HIDDEN, Q, KV, FFN, LAYERS = 576, 576, 192, 1536, 30
SHAPES = {"self_attn.q_proj": (Q, HIDDEN), "self_attn.k_proj": (KV, HIDDEN), "self_attn.v_proj": (KV, HIDDEN),
          "self_attn.o_proj": (HIDDEN, Q), "mlp.gate_proj": (FFN, HIDDEN), "mlp.up_proj": (FFN, HIDDEN),
          "mlp.down_proj": (HIDDEN, FFN)}
TOKENS = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 30, 2, 198, 1, 4093, 198]


def fedlora_logits(dump, tmp, tag, values, extra=()):
    ids = np.array([TOKENS], np.int32)
    tensors = {"input_ids": ids, "attention_mask": np.ones_like(ids), "labels": ids,
               "lora_rank": np.array([RANK], np.float32), "lora_alpha": np.array([ALPHA], np.float32)}
    tensors.update({"value/" + n: v for n, v in values.items()})
    inp, out = os.path.join(tmp, tag + "_in.safetensors"), os.path.join(tmp, tag + "_out.safetensors")
    safetensors_np.write(inp, tensors)
    subprocess.run([dump, MODEL, inp, out, *extra], check=True, capture_output=True, text=True)
    return safetensors_np.read(out)["logits"][0].astype(np.float64)


def llama_logits(lora=None):
    kw = {"lora_path": lora} if lora else {}
    llm = llama_cpp.Llama(model_path=MODEL, n_ctx=64, logits_all=True, verbose=False, n_threads=2, **kw)
    llm.eval(TOKENS)
    return np.array(llm.scores[:len(TOKENS)], np.float64)


def main():
    if len(sys.argv) != 3 or not os.path.exists(MODEL):
        print(__doc__ if len(sys.argv) != 3 else f"skipping: {MODEL} missing")
        return 2 if len(sys.argv) != 3 else SKIP
    fedlora, dump = sys.argv[1], sys.argv[2]
    rng = np.random.default_rng(0)
    lora, zero = {}, {}
    for layer in range(LAYERS):
        for module, (out_dim, in_dim) in SHAPES.items():
            p = f"base_model.model.model.layers.{layer}.{module}."
            lora[p + "lora_A.weight"] = rng.normal(0, 0.05, (RANK, in_dim)).astype(np.float32)
            lora[p + "lora_B.weight"] = rng.normal(0, 0.05, (out_dim, RANK)).astype(np.float32)
            zero[p + "lora_A.weight"] = lora[p + "lora_A.weight"]
            zero[p + "lora_B.weight"] = np.zeros((out_dim, RANK), np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        adapter, gguf_path = os.path.join(tmp, "adapter"), os.path.join(tmp, "lora.gguf")
        ours_lora = fedlora_logits(dump, tmp, "lora", lora, ["--save-adapter", adapter])
        ours_base = fedlora_logits(dump, tmp, "base", zero)
        subprocess.run([fedlora, "export", "--adapter", adapter, "--gguf", gguf_path], check=True)
        theirs_base, theirs_lora = llama_logits(), llama_logits(gguf_path)
    ours, theirs = ours_lora - ours_base, theirs_lora - theirs_base
    size = np.abs(ours).max()
    err = np.abs(ours - theirs).max()
    corr = np.corrcoef(ours.ravel(), theirs.ravel())[0, 1]
    base_err = np.abs(ours_base - theirs_base).max()
    print(f"adapter's effect on the logits: max {size:.3f}; fedlora vs llama.cpp: max difference {err:.4f}, "
          f"correlation {corr:.6f} (bases differ by {base_err:.4f})")
    ok = corr > 0.999 and err < 0.05 * size
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
