#!/usr/bin/env python3
"""`fedlora export --adapter DIR --gguf OUT` against llama.cpp's own GGUF reader (PyPI `gguf`).

  .venv/bin/python tests/tools/export_gguf_test.py build/default/tools/fedlora

PEFT adapters (r 4, alpha 8, LoRA on all seven projections, random nonzero B) of small random
LLaMA and Qwen2 models that this test writes, converted by fedlora, read back with
gguf.GGUFReader. Checks the keys llama.cpp's loader reads (general.type, adapter.type,
adapter.lora.alpha as FLOAT32, general.architecture), every tensor's name, shape (ggml ne) and
dtype, and that lora_b @ lora_a * alpha / r (llama.cpp's scale, r = lora_b's ne[0]) is PEFT's
delta B @ A * alpha / r for every module, with LLaMA's q/k rows in llama.cpp's converter order
(the order of a base GGUF that converter wrote). The base model is given three ways: --model
a safetensors directory, --model a GGUF (written by `gguf`, as llama.cpp's converter lays
out LLaMA), and adapter_config.json's base_model_name_or_path. Then refusals: a classifier's
adapter, a tensor llama.cpp has no name for, an adapter for another base, flags that do not go
together. Exits 77 (CTest:
skipped) when torch, transformers, peft or gguf is missing (scripts/setup.sh --tests).
"""

import json
import os
import subprocess
import sys
import tempfile

import numpy as np

SKIP = 77
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "model"))

try:
    import torch
    import peft
    import gguf
    import safetensors.torch
    import decoder_reference_test as ref  # make_model, write_gguf, permute_qk
except ImportError as e:  # pragma: no cover
    print(f"skipping: {e}")
    sys.exit(SKIP)

RANK, ALPHA = 4, 8.0
GG = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
      "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}
FAILURES = []


def expect(cond, what):
    if not cond:
        FAILURES.append(what)


def make_adapter(model, out_dir, base_name=""):
    """A PEFT adapter of `model` with random A and B, saved by PEFT itself."""
    cfg = peft.LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=list(GG), task_type="CAUSAL_LM")
    pm = peft.get_peft_model(model, cfg)
    torch.manual_seed(7)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_" in name:
                p.normal_(0.0, 0.2)
    pm.save_pretrained(out_dir)
    with open(os.path.join(out_dir, "adapter_config.json")) as f:
        config = json.load(f)
    config["base_model_name_or_path"] = base_name
    with open(os.path.join(out_dir, "adapter_config.json"), "w") as f:
        json.dump(config, f)
    weights = safetensors.torch.load_file(os.path.join(out_dir, "adapter_model.safetensors"))
    # Unload so the model can be wrapped again (the next adapter) and saved plain.
    pm.unload()
    return {k: v.numpy().astype(np.float64) for k, v in weights.items()}


def export(fedlora, adapter, out, model=None):
    cmd = [fedlora, "export", "--adapter", adapter, "--gguf", out] + (["--model", model] if model else [])
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout + p.stderr


def field(reader, key):
    f = reader.fields.get(key)
    if f is None:
        return None, None
    value = f.parts[f.data[0]]
    if f.types[0] == gguf.GGUFValueType.STRING:
        return bytes(value).decode(), f.types[0]
    return value[0].item(), f.types[0]


def check_file(tag, path, arch, cfg, weights):
    r = gguf.GGUFReader(path)
    expect(field(r, "general.type") == ("adapter", gguf.GGUFValueType.STRING), f"{tag}: general.type {field(r, 'general.type')}")
    expect(field(r, "adapter.type") == ("lora", gguf.GGUFValueType.STRING), f"{tag}: adapter.type {field(r, 'adapter.type')}")
    expect(field(r, "adapter.lora.alpha") == (ALPHA, gguf.GGUFValueType.FLOAT32),
           f"{tag}: adapter.lora.alpha {field(r, 'adapter.lora.alpha')}")
    expect(field(r, "general.architecture") == (arch, gguf.GGUFValueType.STRING),
           f"{tag}: general.architecture {field(r, 'general.architecture')}")
    tensors = {t.name: t for t in r.tensors}
    want_names = set()
    for layer in range(cfg.num_hidden_layers):
        for hf, gg in GG.items():
            part = "self_attn" if hf in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            peft_name = f"base_model.model.model.layers.{layer}.{part}.{hf}"
            A, B = weights[peft_name + ".lora_A.weight"], weights[peft_name + ".lora_B.weight"]
            name = f"blk.{layer}.{gg}.weight"
            want_names |= {name + ".lora_a", name + ".lora_b"}
            if name + ".lora_a" not in tensors or name + ".lora_b" not in tensors:
                continue
            ta, tb = tensors[name + ".lora_a"], tensors[name + ".lora_b"]
            out_dim, in_dim = B.shape[0], A.shape[1]
            # ggml ne, innermost first: llama.cpp wants a.ne[0] == the weight's ne[0] (in),
            # b.ne[1] == its ne[1] (out), a.ne[1] == b.ne[0] (the rank).
            expect(list(ta.shape) == [in_dim, RANK], f"{tag} {name}.lora_a: ne {list(ta.shape)}")
            expect(list(tb.shape) == [RANK, out_dim], f"{tag} {name}.lora_b: ne {list(tb.shape)}")
            for t in (ta, tb):
                expect(t.tensor_type == gguf.GGMLQuantizationType.F32, f"{tag} {t.name}: type {t.tensor_type}")
            a = np.asarray(ta.data, dtype=np.float64).reshape(RANK, in_dim)
            b = np.asarray(tb.data, dtype=np.float64).reshape(out_dim, RANK)
            got = b @ a * (ALPHA / tb.shape[0])  # llama.cpp: alpha / rank, rank = lora_b's ne[0]
            want = B @ A * (ALPHA / RANK)  # PEFT's delta
            if arch == "llama" and hf in ("q_proj", "k_proj"):
                heads = cfg.num_attention_heads if hf == "q_proj" else cfg.num_key_value_heads
                want = ref.permute_qk(want, heads)
            err = np.abs(got - want).max()
            expect(err <= 1e-5 + 1e-5 * np.abs(want).max(), f"{tag} {name}: delta off by {err:.3g}")
    expect(set(tensors) == want_names, f"{tag}: tensors {sorted(set(tensors) ^ want_names)} differ")


def refuse(tag, fedlora, adapter, out, fragments, model=None):
    rc, text = export(fedlora, adapter, out, model)
    expect(rc == 1, f"{tag}: exit {rc}: {text}")
    for frag in fragments:
        expect(frag in text, f"{tag}: {frag!r} not in {text!r}")
    expect(not os.path.exists(out), f"{tag}: {out} written")


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    fedlora = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        llama, qwen2 = ref.make_model("llama"), ref.make_model("qwen2")
        llama_dir, qwen2_dir = os.path.join(tmp, "llama"), os.path.join(tmp, "qwen2")
        llama_gguf = os.path.join(tmp, "llama.gguf")
        llama.save_pretrained(llama_dir, safe_serialization=True)
        qwen2.save_pretrained(qwen2_dir, safe_serialization=True)
        ref.write_gguf(llama_gguf, llama, gguf.GGMLQuantizationType.F32)
        llama_adapter, qwen2_adapter = os.path.join(tmp, "llama-lora"), os.path.join(tmp, "qwen2-lora")
        llama_w = make_adapter(llama, llama_adapter)
        qwen2_w = make_adapter(qwen2, qwen2_adapter, base_name=qwen2_dir)

        # The file's directory is created.
        cases = [("llama safetensors", llama_adapter, llama_dir, "llama", llama, llama_w),
                 ("llama gguf", llama_adapter, llama_gguf, "llama", llama, llama_w),
                 ("qwen2 from adapter_config", qwen2_adapter, None, "qwen2", qwen2, qwen2_w)]
        for i, (tag, adapter, model, arch, m, w) in enumerate(cases):
            out = os.path.join(tmp, "new", f"out{i}.gguf")
            rc, text = export(fedlora, adapter, out, model)
            expect(rc == 0, f"{tag}: exit {rc}: {text}")
            expect(f"written to {out}" in text, f"{tag}: {text}")
            if rc == 0:
                check_file(tag, out, arch, m.config, w)

        # A classifier's adapter (task_type SEQ_CLS): llama.cpp's --lora is for decoders.
        cls = os.path.join(tmp, "cls")
        os.makedirs(cls)
        with open(os.path.join(llama_adapter, "adapter_config.json")) as f:
            config = json.load(f)
        with open(os.path.join(cls, "adapter_config.json"), "w") as f:
            json.dump(dict(config, task_type="SEQ_CLS"), f)
        refuse("classifier", fedlora, cls, os.path.join(tmp, "cls.gguf"), ["classifier's", "decoders"], llama_dir)
        # A tensor llama.cpp has no name for (PEFT's modules_to_save of the head).
        extra = os.path.join(tmp, "extra")
        os.makedirs(extra)
        tensors = safetensors.torch.load_file(os.path.join(llama_adapter, "adapter_model.safetensors"))
        tensors["base_model.model.lm_head.weight"] = torch.zeros(320, 64)
        safetensors.torch.save_file(tensors, os.path.join(extra, "adapter_model.safetensors"))
        with open(os.path.join(extra, "adapter_config.json"), "w") as f:
            json.dump(config, f)
        refuse("lm_head", fedlora, extra, os.path.join(tmp, "extra.gguf"),
               ["'base_model.model.lm_head.weight'", "llama.cpp's GGUF LoRA has no name for it"], llama_dir)
        # The LLaMA adapter against a base with a narrower MLP: another base.
        narrow = os.path.join(tmp, "narrow")
        os.makedirs(narrow)
        with open(os.path.join(llama_dir, "config.json")) as f:
            base_config = json.load(f)
        with open(os.path.join(narrow, "config.json"), "w") as f:
            json.dump(dict(base_config, intermediate_size=48), f)
        refuse("another base", fedlora, llama_adapter, os.path.join(tmp, "narrow.gguf"),
               ["down_proj.lora_A.weight' has shape [4, 96], expected [4, 48]", "another base"], narrow)
        # Flags that do not go together are usage errors (exit 2).
        for args, frag in ([["--gguf", "x.gguf"], "name one source"],
                           [["--adapter", llama_adapter, "--store", tmp, "--gguf", "x.gguf"], "name one source"],
                           [["--adapter", llama_adapter], "--out DIR and/or --gguf FILE"],
                           [["--adapter", llama_adapter, "--out", tmp + "/o", "--gguf", "x.gguf"], "use --gguf"],
                           [["--adapter", llama_adapter, "--round", "1", "--gguf", "x.gguf"], "--round picks from a store"]):
            p = subprocess.run([fedlora, "export"] + args, capture_output=True, text=True, timeout=60)
            expect(p.returncode == 2 and frag in p.stderr, f"usage {args}: exit {p.returncode}: {p.stderr}")
        # --gguf naming a directory is refused, the directory untouched.
        rc, text = export(fedlora, llama_adapter, tmp, llama_dir)
        expect(rc == 1 and "is a directory: --gguf names the file to write" in text, f"dir target: exit {rc}: {text}")
        # No base recorded and no --model.
        refuse("no base", fedlora, llama_adapter, os.path.join(tmp, "nobase.gguf"), ["records no base model", "--model"])

    for f in FAILURES:
        print("FAIL:", f)
    print(f"{'FAILED' if FAILURES else 'OK'}: {len(FAILURES)} failures")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
