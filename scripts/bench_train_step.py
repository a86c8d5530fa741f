#!/usr/bin/env python3
"""Training-step benchmark: fedlora's C++ engine against PyTorch, same checkpoint, same batch.

  scripts/bench_train_step.py --bench-bin build/default/bench/train/train_step_bench \
      [--threads 2] [--geometries minilm,base] [--steps 5] [--warmup 2]

(bench/train/bench_train_step.sh wraps this with the build directory.) For each geometry it
  1. writes a random checkpoint (tests/model/make_random_checkpoint.py's layout), the initial
     trainable values (LoRA r8 on query,value with B != 0 so the adapters matter, and the
     classifier), and one batch of 8 x 128 tokens;
  2. runs our engine (train_step_bench) and PyTorch (this script, `torch` mode, on the independent
     implementation in tests/model/torch_bert.py with PyTorch's native LayerNorm and GELU; eager
     mode, autograd, torch.optim.AdamW) in separate processes with the same thread
     count (FEDLORA_NUM_THREADS, OPENBLAS_NUM_THREADS, OMP_NUM_THREADS, torch.set_num_threads);
  3. validates: the first step's loss and pre-clip gradient norm must agree (both fp32, dropout
     off, same weights), then compares the median step time over --steps timed steps after
     --warmup untimed ones.

A step is: zero grads, forward, backward (no frozen-weight gradients), global-norm clip at 1.0,
AdamW. Its work in FLOPs is counted from the geometry (count_flops below), the same count for both
engines, so GFLOP/s compares like with like. The OpenBLAS sgemm rate at the FFN shape, measured in
the same run and the same thread count, bounds what either engine can reach.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from types import SimpleNamespace

import numpy as np

from proc_memory import peak_rss_mb

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "model"))
import make_random_checkpoint  # noqa: E402
import safetensors_np  # noqa: E402

GEOMETRIES = {
    # all-MiniLM-L6-v2: 6 layers, hidden 384, 12 heads, FFN 1536.
    "minilm": dict(layers=6, hidden=384, heads=12, intermediate=1536, vocab=30522, max_pos=512),
    # bert-base-uncased: 12 layers, hidden 768, 12 heads, FFN 3072.
    "base": dict(layers=12, hidden=768, heads=12, intermediate=3072, vocab=30522, max_pos=512),
}
BATCH, SEQ, RANK, ALPHA, LABELS = 8, 128, 8, 16.0, 2
TARGETS = ("query", "value")


def count_flops(g, batch=BATCH, seq=SEQ, rank=RANK):
    """FLOPs of one step: forward + backward without frozen weight gradients.

    Per layer, with T = batch*seq tokens, H hidden, I FFN width, S seq:
      forward:  Q,K,V,O projections 4 * 2THH; FFN 2 * 2THI; scores QK^T and PV 2 * 2BSSH;
                LoRA on 2 targets 2 * (2THr + 2TrH)
      backward: input gradients of the same GEMMs (4 * 2THH + 2 * 2THI); attention 4 * 2BSSH
                (dP, dV, dQ, dK); LoRA dA, dB and input gradients 2 * 4 * 2THr
    Layer 0 needs no gradient w.r.t. its input (frozen embeddings): minus 3 * 2THH (Q, K, V).
    Pooler/classifier (2BHH) and the elementwise ops are left out (< 0.1%).
    """
    t, h, i, layers = batch * seq, g["hidden"], g["intermediate"], g["layers"]
    lora_targets = len(TARGETS)
    fwd = 8 * t * h * h + 4 * t * h * i + 4 * batch * seq * seq * h + lora_targets * 4 * t * h * rank
    bwd = 8 * t * h * h + 4 * t * h * i + 8 * batch * seq * seq * h + lora_targets * 16 * t * h * rank
    return layers * (fwd + bwd) - 6 * t * h * h


def peft_name(path):
    return "base_model.model." + path


def make_inputs(out_dir, g, seed, batch_size=BATCH, seq=SEQ):
    args = SimpleNamespace(layers=g["layers"], hidden=g["hidden"], heads=g["heads"],
                           intermediate=g["intermediate"], vocab=g["vocab"], max_pos=g["max_pos"])
    cfg = make_random_checkpoint.make_config(args)
    rng = np.random.default_rng(seed)
    weights = make_random_checkpoint.make_weights(cfg, rng, "bert.", pooler=True)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f)
    safetensors_np.write(os.path.join(out_dir, "model.safetensors"), weights, metadata={"format": "pt"})
    del weights
    h = g["hidden"]
    init = {}
    for layer in range(g["layers"]):
        for target in TARGETS:
            p = f"bert.encoder.layer.{layer}.attention.self.{target}"
            init[peft_name(p + ".lora_A.weight")] = (rng.uniform(-1, 1, (RANK, h)) / np.sqrt(h)).astype(np.float32)
            # B is zero in PEFT's init; nonzero here so that the adapters change the loss.
            init[peft_name(p + ".lora_B.weight")] = (rng.standard_normal((h, RANK)) * 0.02).astype(np.float32)
    init[peft_name("classifier.weight")] = (rng.standard_normal((LABELS, h)) * 0.02).astype(np.float32)
    init[peft_name("classifier.bias")] = np.zeros(LABELS, np.float32)
    safetensors_np.write(os.path.join(out_dir, "init.safetensors"), init)
    ids = rng.integers(1000, g["vocab"], (batch_size, seq)).astype(np.int32)
    ids[:, 0], ids[:, -1] = 101, 102  # [CLS] ... [SEP]
    batch = {"input_ids": ids, "attention_mask": np.ones((batch_size, seq), np.int32),
             "labels": (np.arange(batch_size) % LABELS).astype(np.int32)}
    safetensors_np.write(os.path.join(out_dir, "batch.safetensors"), batch)


def rss_mb_now():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def time_steps(step, warmup, steps):
    """Runs step(True) once (it records the first loss), then `warmup` untimed and `steps` timed
    steps; returns the timed steps' seconds, sorted."""
    step(True)
    for _ in range(warmup):
        step(False)
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        step(False)
        times.append(time.perf_counter() - t)
    return sorted(times)


def torch_main(args):
    import torch
    import torch_bert

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    # torch_bert.py spells LayerNorm and GELU out from the math (it is a reference); for timing,
    # use PyTorch's native kernels, which compute the same functions (GELU: exact erf form).
    torch_bert._layer_norm = lambda x, w, b, eps: torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, eps)
    torch_bert._gelu = torch.nn.functional.gelu
    t0 = time.perf_counter()
    with open(os.path.join(args.dir, "config.json")) as f:
        cfg = json.load(f)
    weights = {}
    for name, arr in safetensors_np.read(os.path.join(args.dir, "model.safetensors")).items():
        if arr.dtype == np.float32:
            weights[name[len("bert."):] if name.startswith("bert.") else name] = torch.from_numpy(arr)
    init = {k: torch.from_numpy(v).requires_grad_(True)
            for k, v in safetensors_np.read(os.path.join(args.dir, "init.safetensors")).items()}
    lora = {}
    for layer in range(cfg["num_hidden_layers"]):
        for target in TARGETS:
            p = f"encoder.layer.{layer}.attention.self.{target}"
            full = peft_name("bert." + p)
            lora[p] = (init[full + ".lora_A.weight"], init[full + ".lora_B.weight"])
    classifier = (init[peft_name("classifier.weight")], init[peft_name("classifier.bias")])
    model = torch_bert.TorchBert(cfg, weights, lora=lora, lora_scale=ALPHA / RANK, classifier=classifier)
    batch = safetensors_np.read(os.path.join(args.dir, "batch.safetensors"))
    ids = torch.from_numpy(batch["input_ids"].astype(np.int64))
    mask = torch.from_numpy(batch["attention_mask"].astype(np.int64))
    labels = torch.from_numpy(batch["labels"].astype(np.int64))
    token_type = torch.zeros_like(ids)
    load_s = time.perf_counter() - t0
    params = list(init.values())
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01)
    first = {}

    def step(record):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model.logits(ids, token_type, mask), labels)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if record:
            first["loss"], first["norm"] = float(loss), float(norm)

    times = time_steps(step, args.warmup, args.steps)
    print(json.dumps({
        "engine": "torch", "torch": torch.__version__, "threads": torch.get_num_threads(), "load_s": load_s,
        "first_loss": first["loss"], "first_grad_norm": first["norm"],
        "trainable_params": sum(p.numel() for p in params),
        "step_median_s": times[len(times) // 2], "step_min_s": times[0], "steps": args.steps,
        "rss_after_mb": rss_mb_now(),
        "peak_rss_mb": peak_rss_mb(),
    }))


def run_child(cmd, threads):
    env = dict(os.environ, FEDLORA_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads),
               OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"bench: {' '.join(cmd[:2])} failed ({out.returncode}):\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", nargs="?", default="compare", choices=["compare", "torch"])
    p.add_argument("--bench-bin", default=os.path.join(ROOT, "build/default/bench/train/train_step_bench"))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--geometries", default="minilm,base")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dir", help="torch mode: the directory compare mode wrote")
    p.add_argument("--json-out", help="also write the results here as JSON")
    args = p.parse_args()
    if args.mode == "torch":
        return torch_main(args)
    if not os.access(args.bench_bin, os.X_OK):
        raise SystemExit(f"bench: {args.bench_bin} not found; build the train_step_bench target first")
    results = []
    ok = True
    for geo in args.geometries.split(","):
        g = GEOMETRIES[geo]
        with tempfile.TemporaryDirectory(prefix=f"fedlora_bench_{geo}_") as d:
            make_inputs(d, g, args.seed)
            ours = run_child([args.bench_bin, "--model", d, "--init", os.path.join(d, "init.safetensors"),
                              "--batch", os.path.join(d, "batch.safetensors"), "--threads", str(args.threads),
                              "--steps", str(args.steps), "--warmup", str(args.warmup), "--rank", str(RANK),
                              "--alpha", str(ALPHA)], args.threads)
            theirs = run_child([sys.executable, os.path.abspath(__file__), "torch", "--dir", d,
                                "--threads", str(args.threads), "--steps", str(args.steps),
                                "--warmup", str(args.warmup)], args.threads)
        flops = count_flops(g)
        # Tolerances: both engines run fp32 with different summation orders through up to 12
        # LayerNorm'd layers; relative differences of ~1e-5 are expected, 1e-3 (loss) and 1e-2
        # (gradient norm, a sum over ~300k squared terms) flag a real disagreement.
        loss_rel = abs(ours["first_loss"] - theirs["first_loss"]) / max(abs(theirs["first_loss"]), 1e-12)
        norm_rel = abs(ours["first_grad_norm"] - theirs["first_grad_norm"]) / max(theirs["first_grad_norm"], 1e-12)
        valid = loss_rel < 1e-3 and norm_rel < 1e-2 and ours["trainable_params"] == theirs["trainable_params"]
        ok &= valid
        row = {
            "geometry": geo, "threads": args.threads, "batch": BATCH, "seq": SEQ, "rank": RANK,
            "valid": valid, "loss_ours": ours["first_loss"], "loss_torch": theirs["first_loss"],
            "loss_rel_diff": loss_rel, "grad_norm_rel_diff": norm_rel,
            "step_s_ours": ours["step_median_s"], "step_s_torch": theirs["step_median_s"],
            "ratio_ours_over_torch": ours["step_median_s"] / theirs["step_median_s"],
            "gflop_per_step": flops / 1e9,
            "gflops_ours": flops / ours["step_median_s"] / 1e9,
            "gflops_torch": flops / theirs["step_median_s"] / 1e9,
            "sgemm_gflops": ours["sgemm_gflops"], "sgemm_shape": ours["sgemm_shape"],
            "peak_rss_mb_ours": ours["peak_rss_mb"], "peak_rss_mb_torch": theirs["peak_rss_mb"],
            "rss_after_mb_ours": ours.get("rss_after_mb"), "rss_after_mb_torch": theirs["rss_after_mb"],
            "torch": theirs["torch"],
        }
        results.append(row)
        print(f"[{geo}] valid={valid} loss ours {ours['first_loss']:.6f} torch {theirs['first_loss']:.6f} "
              f"(rel {loss_rel:.1e}), grad norm rel {norm_rel:.1e}")
        print(f"[{geo}] step: ours {row['step_s_ours'] * 1e3:.1f} ms, torch {row['step_s_torch'] * 1e3:.1f} ms, "
              f"ours/torch {row['ratio_ours_over_torch']:.2f}; {row['gflop_per_step']:.1f} GFLOP/step -> "
              f"ours {row['gflops_ours']:.1f} GFLOP/s, torch {row['gflops_torch']:.1f} GFLOP/s, "
              f"OpenBLAS sgemm {row['sgemm_gflops']:.1f} GFLOP/s at {row['sgemm_shape']}")
        print(f"[{geo}] peak RSS: ours {row['peak_rss_mb_ours']:.0f} MB, torch {row['peak_rss_mb_torch']:.0f} MB; "
              f"after the steps: ours {row['rss_after_mb_ours']:.0f} MB, torch {row['rss_after_mb_torch']:.0f} MB",
              flush=True)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(results, f, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
