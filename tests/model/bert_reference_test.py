#!/usr/bin/env python3
"""Checks the C++ BERT + LoRA model against the independent PyTorch implementation (torch_bert.py).

  bert_reference_test.py HELPER [MODEL_DIR]

HELPER is the bert_reference_dump executable. For each case a tiny random checkpoint is written
(make_random_checkpoint.py), the helper runs one ForwardBackward and writes the batch, logits,
loss, LoRA/classifier values and gradients; PyTorch recomputes all of them with autograd from the
same checkpoint and parameter values, in float64, and every tensor must agree.

Cases: BERT with fp32 weights; BERT from a BF16 checkpoint held in bf16 (bf16_weights); the same
with bf16 math (bf16_math); RoBERTa.

Tolerance: |cpp - ref| <= 1e-4 * max|ref| per tensor (plus 1e-7 absolute for tiny tensors). The
C++ model computes in float32 (unit roundoff 6e-8) over dot products of at most 64 terms and two
layers; the observed error is ~1e-6 relative. A wrong gradient (a missing term, a transposed
matrix, a wrong scale or mask) is off by O(1) relative, and every gradient is checked to be
nonzero, so the test fails on any of them.

bf16 math rounds every activation that meets a frozen matrix to bf16 (8 significant bits, relative
error up to 2^-9 = 2e-3 per value), so its case is held to 2e-2 * max|ref|: ten times the rounding
of one value, still far below the O(1) error of a wrong gradient. Where the CPU has bf16 dot
products the case must also differ from the fp32-math case on the same weights by more than fp32
rounding (else the bf16 path did not run); elsewhere the fp32 path runs and the case says so.

With MODEL_DIR (models/all-MiniLM-L6-v2) it also checks the mean-pooled and [CLS] embeddings of
a fixed sentence on the real checkpoint (6 layers, hidden 384; same tolerance).
"""

import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import safetensors_np  # noqa: E402
import torch_bert  # noqa: E402

REL_TOL = 1e-4
BF16_MATH_REL_TOL = 2e-2
ABS_TOL = 1e-7
failures = []


def check(name, got, want, rel_tol=None):
    rel_tol = REL_TOL if rel_tol is None else rel_tol
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        failures.append(f"{name}: shape {got.shape} != {want.shape}")
        return
    scale = float(np.max(np.abs(want))) if want.size else 0.0
    err = float(np.max(np.abs(got - want))) if want.size else 0.0
    ok = err <= rel_tol * scale + ABS_TOL
    print(f"{'ok  ' if ok else 'FAIL'} {name}: max err {err:.3e}, max |ref| {scale:.3e}")
    if not ok:
        failures.append(f"{name}: max abs error {err:.3e} > {rel_tol} * {scale:.3e}")


def self_test():
    """The comparison must flag a gradient that is wrong in one entry by 1e-3 of the tensor's scale."""
    want = np.linspace(-1.0, 1.0, 64).reshape(8, 8)
    got = want.copy()
    got[3, 5] += 1e-3
    before = len(failures)
    check("self-test/perturbed (expected FAIL)", got, want)
    if len(failures) != before + 1:
        failures.append("self-test: a perturbed gradient was not detected")
    else:
        failures.pop()


def grad_case(helper, tmp, tag, dtype, flag=None, roberta=False, rel_tol=None):
    ckpt = os.path.join(tmp, tag)
    subprocess.run([sys.executable, os.path.join(HERE, "make_random_checkpoint.py"), ckpt, "--seed", "3",
                    "--dtype", dtype] + (["--roberta"] if roberta else []), check=True)
    out = os.path.join(tmp, tag + "_out.safetensors")
    cmd = [helper, "grad", ckpt, out] + ([flag] if flag else [])
    subprocess.run(cmd, check=True)
    res = safetensors_np.read(out)

    cfg, weights = torch_bert.load_checkpoint(ckpt)
    scale = float(res["lora_scaling"][0])
    params = {}
    for key, arr in res.items():
        if key.startswith("value/"):
            params[key[len("value/"):]] = torch.tensor(arr.astype(np.float64), requires_grad=True)
    lora = {}
    prefix = "base_model.model.roberta." if roberta else "base_model.model.bert."
    for name, t in params.items():
        if name.endswith(".lora_A.weight"):
            path = name[len(prefix):-len(".lora_A.weight")]
            lora[path] = (t, params[name.replace("lora_A", "lora_B")])
    if len(lora) != 6 * cfg["num_hidden_layers"]:
        failures.append(f"{tag}: expected LoRA on 6 modules x {cfg['num_hidden_layers']} layers, got {len(lora)}")
    if roberta:
        head = "base_model.model.classifier."
        classifier = (params[head + "out_proj.weight"], params[head + "out_proj.bias"])
        head_dense = (params[head + "dense.weight"], params[head + "dense.bias"])
    else:
        classifier = (params["base_model.model.classifier.weight"], params["base_model.model.classifier.bias"])
        head_dense = None
    model = torch_bert.TorchBert(cfg, weights, lora, scale, classifier, head_dense)

    ids = torch.tensor(res["input_ids"].astype(np.int64))
    tt = torch.tensor(res["token_type_ids"].astype(np.int64))
    mask = torch.tensor(res["attention_mask"].astype(np.int64))
    labels = torch.tensor(res["labels"].astype(np.int64))
    logits = model.logits(ids, tt, mask)
    loss = torch.nn.functional.cross_entropy(logits, labels)
    loss.backward()
    check(f"{tag}/logits", res["logits"], logits.detach().numpy(), rel_tol)
    check(f"{tag}/loss", res["loss"], [loss.item()], rel_tol)
    with torch.no_grad():
        check(f"{tag}/mean_pooled", res["mean_pooled"], model.mean_pooled(ids, tt, mask).numpy(), rel_tol)
    for name, t in sorted(params.items()):
        want = t.grad.numpy()
        if not np.any(np.abs(want) > 1e-8):
            failures.append(f"{tag}/grad/{name}: reference gradient is zero; the case does not test it")
        check(f"{tag}/grad/{name}", res["grad/" + name], want, rel_tol)
    return res


def bf16_math_case(helper, tmp, fp32_math):
    """bf16 math on the bf16 case's weights: within the bf16 tolerance of float64, and, where the
    CPU multiplies in bf16, measurably different from fp32 math on the same weights."""
    res = grad_case(helper, tmp, "bf16_math", "BF16", "--bf16-math", rel_tol=BF16_MATH_REL_TOL)
    if int(res["bf16_math_active"][0]) == 0:
        print("bf16 math is not available on this CPU: its case ran the fp32 path")
        return
    diff = float(np.max(np.abs(res["logits"] - fp32_math["logits"])))
    scale = float(np.max(np.abs(fp32_math["logits"])))
    print(f"bf16 math vs fp32 math logits: max diff {diff:.3e} (max |logit| {scale:.3e})")
    if diff <= 1e-5 * scale:
        failures.append("bf16_math: the logits equal fp32 math's; the bf16 path did not run")


def minilm_case(helper, tmp, model_dir):
    vocab = {}
    with open(os.path.join(model_dir, "vocab.txt"), encoding="utf-8") as f:
        for i, line in enumerate(f):
            vocab[line.rstrip("\n")] = i
    words = "[CLS] the quick brown fox jumps over the lazy dog . [SEP]".split()
    ids = [vocab[w] for w in words]  # every word is a whole-word vocabulary entry
    out = os.path.join(tmp, "minilm.safetensors")
    subprocess.run([helper, "embed", model_dir, out, ",".join(map(str, ids))], check=True)
    res = safetensors_np.read(out)
    cfg, weights = torch_bert.load_checkpoint(model_dir)
    model = torch_bert.TorchBert(cfg, weights)
    t_ids = torch.tensor([ids])
    zeros = torch.zeros_like(t_ids)
    ones = torch.ones_like(t_ids)
    with torch.no_grad():
        check("minilm/mean_pooled", res["mean_pooled"], model.mean_pooled(t_ids, zeros, ones).numpy())
        check("minilm/cls", res["cls"], model.encode(t_ids, zeros, ones)[:, 0].numpy())


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    helper = sys.argv[1]
    model_dir = sys.argv[2] if len(sys.argv) > 2 else ""
    torch.set_num_threads(1)
    self_test()
    with tempfile.TemporaryDirectory() as tmp:
        grad_case(helper, tmp, "f32", "F32")
        fp32_math = grad_case(helper, tmp, "bf16", "BF16", "--bf16")
        bf16_math_case(helper, tmp, fp32_math)
        grad_case(helper, tmp, "roberta", "F32", roberta=True)
        if model_dir and os.path.exists(os.path.join(model_dir, "model.safetensors")):
            minilm_case(helper, tmp, model_dir)
        else:
            print(f"skipping the MiniLM case: {model_dir or '(no MODEL_DIR)'} has no model.safetensors")
    if failures:
        print("\n".join(["FAILED:"] + failures))
        return 1
    print("all reference checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
