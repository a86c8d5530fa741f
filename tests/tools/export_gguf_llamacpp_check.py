#!/usr/bin/env python3
"""`fedlora export --gguf` run by llama.cpp itself (llama-cpp-python), on SmolLM2-135M-Instruct.

  .venv/bin/pip install --no-deps llama-cpp-python diskcache   # builds llama.cpp from source (minutes)
  .venv/bin/python tests/tools/export_gguf_llamacpp_check.py build/default/tools/fedlora \\
      build/default/tests/model/decoder_reference_dump

The base is the SmolLM2 Q4_1 GGUF dequantized to F32 by `gguf` (llama.cpp multiplies a Q4_1
matrix with 8-bit activations, whose noise would swamp the comparison). Random LoRA adapters
(r 4, alpha 8) are saved by fedlora (decoder_reference_dump --save-adapter), which also gives
fedlora's logits with and without them; `fedlora export --adapter --gguf` converts them; llama.cpp
computes the logits of the same tokens with `lora_path` and without. The adapter's effect on the
logits (with minus without) must agree: correlation > 0.999 and no logit off by more than 5% of
the largest effect. Two adapters: all seven projections, and q/k only (LLaMA's row order; with
HF's order instead, the correlation measured 0.28). Exits 77 when llama_cpp, gguf or the model is
missing.
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
    import gguf
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


def f32_copy(path):
    """The Q4_1 GGUF with every tensor dequantized to F32, metadata as it was."""
    r = gguf.GGUFReader(MODEL)
    w = gguf.GGUFWriter(path, "llama")
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.quantization_version"):
            continue
        t = f.types[0]
        if t == gguf.GGUFValueType.ARRAY:
            if f.types[1] == gguf.GGUFValueType.STRING:
                w.add_array(key, [bytes(f.parts[i]).decode("utf-8", errors="surrogateescape") for i in f.data])
            else:
                w.add_array(key, [f.parts[i][0].item() for i in f.data])
        elif t == gguf.GGUFValueType.STRING:
            w.add_string(key, bytes(f.parts[f.data[0]]).decode())
        else:
            w.add_key_value(key, 0 if key == "general.file_type" else f.parts[f.data[0]][0].item(), t)
    for t in r.tensors:
        values = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        w.add_tensor(t.name, values.reshape([int(d) for d in reversed(t.shape)]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def fedlora_logits(dump, model, tmp, tag, values, extra=()):
    ids = np.array([TOKENS], np.int32)
    tensors = {"input_ids": ids, "attention_mask": np.ones_like(ids), "labels": ids,
               "lora_rank": np.array([RANK], np.float32), "lora_alpha": np.array([ALPHA], np.float32)}
    tensors.update({"value/" + n: v for n, v in values.items()})
    inp, out = os.path.join(tmp, tag + "_in.safetensors"), os.path.join(tmp, tag + "_out.safetensors")
    safetensors_np.write(inp, tensors)
    subprocess.run([dump, model, inp, out, *extra], check=True, capture_output=True, text=True)
    return safetensors_np.read(out)["logits"][0].astype(np.float64)


def llama_logits(model, lora=None):
    kw = {"lora_path": lora} if lora else {}
    llm = llama_cpp.Llama(model_path=model, n_ctx=64, logits_all=True, verbose=False, n_threads=2, **kw)
    llm.eval(TOKENS)
    return np.array(llm.scores[:len(TOKENS)], np.float64)


def check(fedlora, dump, model, tmp, tag, modules, std):
    """Returns whether llama.cpp's effect of the adapter on the logits agrees with fedlora's."""
    rng = np.random.default_rng(0)
    lora, zero = {}, {}
    for layer in range(LAYERS):
        for module, (out_dim, in_dim) in SHAPES.items():
            p = f"base_model.model.model.layers.{layer}.{module}."
            lora[p + "lora_A.weight"] = rng.normal(0, std, (RANK, in_dim)).astype(np.float32)
            b = rng.normal(0, std, (out_dim, RANK)).astype(np.float32)
            lora[p + "lora_B.weight"] = b if module in modules else np.zeros_like(b)
            zero[p + "lora_A.weight"] = lora[p + "lora_A.weight"]
            zero[p + "lora_B.weight"] = np.zeros_like(b)
    adapter, gguf_path = os.path.join(tmp, tag), os.path.join(tmp, tag + ".gguf")
    ours = fedlora_logits(dump, model, tmp, tag, lora, ["--save-adapter", adapter])
    ours = ours - fedlora_logits(dump, model, tmp, tag + "-base", zero)
    subprocess.run([fedlora, "export", "--adapter", adapter, "--gguf", gguf_path], check=True, capture_output=True)
    theirs = llama_logits(model, gguf_path) - llama_logits(model)
    size, err = np.abs(ours).max(), np.abs(ours - theirs).max()
    corr = np.corrcoef(ours.ravel(), theirs.ravel())[0, 1]
    ok = corr > 0.999 and err < 0.05 * size
    print(f"{tag}: the adapter moves the logits by up to {size:.3f}; fedlora vs llama.cpp: max difference {err:.4f}, "
          f"correlation {corr:.6f}: {'OK' if ok else 'FAILED'}")
    return ok


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    if not os.path.exists(MODEL):
        print(f"skipping: {MODEL} missing")
        return SKIP
    fedlora, dump = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "smollm2-f32.gguf")
        f32_copy(model)
        ok = check(fedlora, dump, model, tmp, "all-seven", set(SHAPES), 0.02)
        ok &= check(fedlora, dump, model, tmp, "q-and-k", {"self_attn.q_proj", "self_attn.k_proj"}, 0.05)
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
