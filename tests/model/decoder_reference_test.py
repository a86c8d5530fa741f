#!/usr/bin/env python3
"""Checks fedlora's decoder against transformers' LlamaForCausalLM / Qwen2ForCausalLM with PEFT LoRA.

  .venv/bin/python tests/model/decoder_reference_test.py build/x/tests/model/decoder_reference_dump

Small random checkpoints, written by this test, with LoRA (r 4, alpha 8) on all seven projections
and nonzero B matrices (PEFT's zero init would hide every A gradient):
  1. LLaMA (grouped-query heads, tied embeddings) as safetensors; the same with
     recompute_activations;
  2. Qwen2 (q/k/v biases, separate output head) as safetensors; its adapter, saved by fedlora,
     loads with peft.PeftModel.from_pretrained and gives the same logits;
  3. the LLaMA model as a GGUF written by PyPI's `gguf` (llama.cpp's writer) with F32 tensors and
     llama.cpp's Q/K row permutation, which the loader must undo;
  4. the same as Q8_0 (embeddings and projections) against transformers running on the Q8_0
     values dequantized by `gguf.quants.dequantize`; and Q4_1 likewise.
  5. when scripts/setup.sh has fetched it, the real SmolLM2-135M-Instruct Q4_1 GGUF, run by
     fedlora on its 4-bit base and by transformers on the same weights dequantized to fp32 by
     `gguf` (logits and loss only; LoRA B is zero there).
For 1-4: logits at every position, the loss (labels -100 on prompts and padding), and every LoRA
gradient. Case 3 also checks greedy generation: with the KV cache, without it, and transformers'
generate() agree token for token. Exits 77 (CTest: skipped) when torch, transformers, peft or gguf
is missing (scripts/setup.sh --tests installs them).
"""

import os
import subprocess
import sys
import tempfile

import numpy as np

SKIP = 77
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import safetensors_np  # noqa: E402

try:
    import torch
    import transformers
    import peft
    import gguf
except ImportError as e:  # pragma: no cover
    print(f"skipping: {e}")
    sys.exit(SKIP)

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
RANK, ALPHA = 4, 8.0
FAILURES = []


def check(tag, name, got, want, atol, rtol):
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        FAILURES.append(f"{tag} {name}: shape {got.shape} != {want.shape}")
        return
    err = np.abs(got - want)
    bound = atol + rtol * np.abs(want)
    if not np.all(err <= bound):
        i = int(np.argmax(err - bound))
        FAILURES.append(f"{tag} {name}: max error {err.max():.3g} (at flat {i}: {got.flat[i]:.6g} vs {want.flat[i]:.6g})")


def make_model(kind):
    torch.manual_seed(0 if kind == "llama" else 1)
    common = dict(vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, bos_token_id=1,
                  eos_token_id=2, attn_implementation="eager")
    if kind == "llama":
        cfg = transformers.LlamaConfig(rope_theta=10000.0, tie_word_embeddings=True, **common)
        model = transformers.LlamaForCausalLM(cfg)
    else:
        cfg = transformers.Qwen2Config(rope_theta=100000.0, tie_word_embeddings=False, **common)
        model = transformers.Qwen2ForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            elif "bias" in name:
                p.normal_(0.0, 0.1)
            else:
                p.normal_(0.0, 0.08)
    return model.float().eval()


def batch():
    rng = np.random.default_rng(5)
    B, S = 3, 12
    ids = rng.integers(3, 320, size=(B, S)).astype(np.int32)
    mask = np.ones((B, S), dtype=np.int32)
    mask[1, 9:] = 0
    mask[2, 5:] = 0
    ids[mask == 0] = 0
    labels = np.where(mask == 1, ids, -100).astype(np.int32)
    labels[0, :4] = -100  # a prompt: no loss on it
    return ids, mask, labels


def lora_values(model):
    """Wraps `model` in PEFT LoRA, sets B to nonzero values; returns (peft_model, {our name: array})."""
    pm = peft.get_peft_model(model, peft.LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0,
                                                     target_modules=TARGETS))
    torch.manual_seed(9)
    values = {}
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.05)
            if "lora_" in name:
                values[name.replace(".default", "")] = p.detach().numpy().copy()
    return pm, values


def reference(pm, ids, mask, labels):
    pm.zero_grad()
    out = pm(input_ids=torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask, dtype=torch.long),
             labels=torch.tensor(labels, dtype=torch.long))
    out.loss.backward()
    grads = {n.replace(".default", ""): p.grad.numpy().copy() for n, p in pm.named_parameters() if "lora_" in n}
    return out.logits.detach().numpy(), float(out.loss), grads


def run_dump(dump, model_path, tmp, tag, ids, mask, labels, values, extra=()):
    inp = os.path.join(tmp, f"{tag}_in.safetensors")
    out = os.path.join(tmp, f"{tag}_out.safetensors")
    tensors = {"input_ids": ids, "attention_mask": mask, "labels": labels,
               "lora_rank": np.array([RANK], np.float32), "lora_alpha": np.array([ALPHA], np.float32)}
    for name, v in values.items():
        tensors["value/" + name] = v.astype(np.float32)
    safetensors_np.write(inp, tensors)
    r = subprocess.run([dump, model_path, inp, out, *extra], capture_output=True, text=True)
    if r.returncode != 0:
        FAILURES.append(f"{tag}: decoder_reference_dump failed: {r.stderr.strip()}")
        return None
    return safetensors_np.read(out)


def compare(tag, got, logits, loss, grads):
    if got is None:
        return
    if len(grads) != 2 * len(TARGETS) * 2:
        FAILURES.append(f"{tag}: {len(grads)} LoRA gradients from PEFT, expected {4 * len(TARGETS)}")
    worst = max(float(np.abs(got["grad/" + n] - g).max() / max(1e-12, float(np.abs(g).max()))) for n, g in grads.items())
    print(f"{tag}: logits max |diff| {float(np.abs(got['logits'] - logits).max()):.2e} (max |logit| "
          f"{float(np.abs(logits).max()):.2f}), loss {float(got['loss'][0]):.6f} vs {loss:.6f}, "
          f"worst gradient error {worst:.2e} of its tensor's max")
    check(tag, "logits", got["logits"], logits, 2e-5, 1e-4)
    check(tag, "loss", got["loss"], [loss], 0, 1e-5)
    check(tag, "eval_loss", got["eval_loss"], [loss], 0, 1e-5)
    for name, g in grads.items():
        scale = max(1e-6, float(np.abs(g).max()))
        check(tag, "grad/" + name, got["grad/" + name], g, 1e-4 * scale, 1e-3)


def permute_qk(w, n_head):
    """llama.cpp convert_hf_to_gguf.py's LlamaModel.permute, on rows (works on quantized rows too)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path, model, qtype):
    """The LLaMA model as llama.cpp's converter writes it; matrices as qtype (F32, Q8_0 or Q4_1).
    Returns {hf name: the fp32 values the file stands for} for the quantized matrices."""
    cfg = model.config
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    sd = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    gg = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
          "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}
    for l in range(cfg.num_hidden_layers):
        names[f"model.layers.{l}.input_layernorm.weight"] = f"blk.{l}.attn_norm.weight"
        names[f"model.layers.{l}.post_attention_layernorm.weight"] = f"blk.{l}.ffn_norm.weight"
        for t in TARGETS:
            part = "self_attn" if t in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            names[f"model.layers.{l}.{part}.{t}.weight"] = f"blk.{l}.{gg[t]}.weight"
    dequantized = {}
    for hf, name in names.items():
        arr = sd[hf]
        heads = None
        if ".q_proj." in hf:
            heads = cfg.num_attention_heads
        elif ".k_proj." in hf:
            heads = cfg.num_key_value_heads
        if arr.ndim == 2 and qtype != gguf.GGMLQuantizationType.F32:
            q = gguf.quants.quantize(arr, qtype)
            dequantized[hf] = gguf.quants.dequantize(q, qtype).astype(np.float32).reshape(arr.shape)
            if heads:
                q = permute_qk(q, heads)
            w.add_tensor(name, q, raw_dtype=qtype)
        else:
            w.add_tensor(name, permute_qk(arr, heads) if heads else arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dequantized


SMOL = os.path.join(HERE, "..", "..", "models", "SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct.Q4_1.gguf")


def unpermute_qk(w, n_head):
    """The inverse of permute_qk."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def smollm2_as_transformers(gguf_path=SMOL, **config):
    """SmolLM2's GGUF as transformers' LlamaForCausalLM on its weights dequantized to fp32 by `gguf`
    (Q/K rows un-permuted). `config` adds LlamaConfig fields."""
    r = gguf.GGUFReader(gguf_path)
    meta = {k: f.parts[f.data[0]].tolist()[0] for k, f in r.fields.items()
            if f.data and f.types and f.types[0] in (gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32)}
    cfg = transformers.LlamaConfig(
        vocab_size=49152, hidden_size=meta["llama.embedding_length"], intermediate_size=meta["llama.feed_forward_length"],
        num_hidden_layers=meta["llama.block_count"], num_attention_heads=meta["llama.attention.head_count"],
        num_key_value_heads=meta["llama.attention.head_count_kv"], rope_theta=meta["llama.rope.freq_base"],
        rms_norm_eps=meta["llama.attention.layer_norm_rms_epsilon"], max_position_embeddings=8192,
        tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, **config)
    model = transformers.LlamaForCausalLM(cfg).float().eval()
    gg = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
          "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
          "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
    sd = model.state_dict()
    with torch.no_grad():
        for t in r.tensors:
            v = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32)
            v = v.reshape([int(d) for d in reversed(t.shape.tolist())])
            if t.name == "token_embd.weight":
                hf = "model.embed_tokens.weight"
            elif t.name == "output_norm.weight":
                hf = "model.norm.weight"
            else:
                _, layer, part, _ = t.name.split(".")
                hf = f"model.layers.{layer}.{gg[part]}.weight"
                if part == "attn_q":
                    v = unpermute_qk(v, cfg.num_attention_heads)
                elif part == "attn_k":
                    v = unpermute_qk(v, cfg.num_key_value_heads)
            sd[hf].copy_(torch.from_numpy(v))
    return model


def smollm2_case(dump, tmp):
    model = smollm2_as_transformers(attn_implementation="eager")
    rng = np.random.default_rng(11)
    ids = rng.integers(0, 49152, size=(2, 16)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[1, 10:] = 0
    labels = np.where(mask == 1, ids, -100).astype(np.int32)
    with torch.no_grad():
        out = model(input_ids=torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask, dtype=torch.long),
                    labels=torch.tensor(labels, dtype=torch.long))
    logits, loss = out.logits.numpy(), float(out.loss)
    del model
    got = run_dump(dump, SMOL, tmp, "smollm2", ids, mask, labels, {}, [])
    if got is None:
        return
    diff = float(np.abs(got["logits"] - logits).max())
    print(f"SmolLM2 Q4_1: logits max |diff| {diff:.2e} (max |logit| {float(np.abs(logits).max()):.1f}), "
          f"loss {float(got['loss'][0]):.5f} vs {loss:.5f}")
    # 30 layers of fp32 with different summation orders: 1e-3 on logits of magnitude ~20.
    check("SmolLM2", "logits", got["logits"], logits, 2e-3, 1e-4)
    check("SmolLM2", "loss", got["loss"], [loss], 0, 1e-5)
    if not np.array_equal(got["logits"].argmax(-1), logits.argmax(-1)):
        FAILURES.append("SmolLM2: a different most likely next token somewhere")


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    dump = sys.argv[1]
    ids, mask, labels = batch()
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("llama", "qwen2"):
            model = make_model(kind)
            mdir = os.path.join(tmp, kind)
            model.save_pretrained(mdir, safe_serialization=True)
            pm, values = lora_values(model)
            logits, loss, grads = reference(pm, ids, mask, labels)
            adapter = os.path.join(tmp, f"{kind}_adapter")
            got = run_dump(dump, mdir, tmp, kind, ids, mask, labels, values, ["--save-adapter", adapter])
            compare(kind, got, logits, loss, grads)
            if kind == "qwen2" and got is not None:
                loaded = peft.PeftModel.from_pretrained(make_model(kind), adapter).eval()
                with torch.no_grad():
                    pl = loaded(input_ids=torch.tensor(ids, dtype=torch.long),
                                attention_mask=torch.tensor(mask, dtype=torch.long)).logits.numpy()
                check("qwen2 adapter via PeftModel.from_pretrained", "logits", pl, got["logits"], 2e-5, 1e-4)
            if kind == "llama":
                compare("llama recompute",
                        run_dump(dump, mdir, tmp, "llama_rc", ids, mask, labels, values, ["--recompute"]),
                        logits, loss, grads)
                # GGUF, F32: the same numbers; plus generation.
                path = os.path.join(tmp, "llama_f32.gguf")
                write_gguf(path, make_model("llama"), gguf.GGMLQuantizationType.F32)
                got = run_dump(dump, path, tmp, "gguf_f32", ids, mask, labels, values, ["--generate", "8"])
                compare("gguf F32", got, logits, loss, grads)
                if got is not None:
                    prompt = ids[0:1, :]
                    hf = pm.generate(input_ids=torch.tensor(prompt, dtype=torch.long), max_new_tokens=8,
                                     do_sample=False, attention_mask=torch.ones_like(torch.tensor(prompt)),
                                     pad_token_id=0, eos_token_id=None)
                    want = hf[0, prompt.shape[1]:].numpy().tolist()
                    cached, uncached = got["generated_cached"].tolist(), got["generated_uncached"].tolist()
                    if not (cached == uncached == want):
                        FAILURES.append(f"generation: cached {cached}, uncached {uncached}, transformers {want}")
                # Quantized GGUFs against transformers on the dequantized values.
                for qtype in (gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_1):
                    qname = qtype.name
                    qpath = os.path.join(tmp, f"llama_{qname}.gguf")
                    deq = write_gguf(qpath, make_model("llama"), qtype)
                    qmodel = make_model("llama")
                    with torch.no_grad():
                        sd = qmodel.state_dict()
                        for hf_name, v in deq.items():
                            sd[hf_name].copy_(torch.from_numpy(v))
                    qpm, _ = lora_values(qmodel)
                    with torch.no_grad():  # the same adapter values as the others
                        for name, p in qpm.named_parameters():
                            if "lora_" in name:
                                p.copy_(torch.from_numpy(values[name.replace(".default", "")]))
                    ql, qloss, qgrads = reference(qpm, ids, mask, labels)
                    compare(f"gguf {qname}", run_dump(dump, qpath, tmp, f"gguf_{qname}", ids, mask, labels, values),
                            ql, qloss, qgrads)
        if os.path.exists(SMOL):
            smollm2_case(dump, tmp)
        else:
            print(f"note: {SMOL} missing (scripts/setup.sh fetches it); real-model case not run")
    if FAILURES:
        print("\n".join(FAILURES))
        print(f"FAILED: {len(FAILURES)} mismatches")
        return 1
    print("decoder reference: all cases agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
