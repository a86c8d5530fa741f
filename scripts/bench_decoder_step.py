#!/usr/bin/env python3
"""One LoRA training step and greedy generation at SmolLM2-135M geometry: fedlora vs transformers + PEFT.

  .venv/bin/python scripts/bench_decoder_step.py --bench-bin build/default/bench/train/decoder_step_bench
      [--threads 2] [--reps 3] [--steps 3] [--batch 4] [--seq 256]

Both engines train the same model (SmolLM2-135M-Instruct; PyTorch gets its Q4_1 weights
dequantized to fp32, written once as a Hugging Face checkpoint and loaded with from_pretrained)
on the same random batch: LoRA r8, alpha 16 on q/k/v/o/gate/up/down, dropout off, loss on every
token, global-norm clip 1.0, AdamW (lr 1e-4, weight decay 0.01), the same thread count. fedlora
runs with its 4-bit base (q4) and widened to fp32 (f32), with and without recomputing
activations. Each configuration is its own process (peak RSS is per process); --reps repeats the
whole set and the table shows medians. Generation: 64 greedy new tokens after the batch's first 32
tokens, KV cache on both sides. PyTorch is the .venv's (Debian's python3-torch 1.13 with
transformers 4.44.2 and PEFT 0.12.0 from scripts/requirements-tests.txt).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from proc_memory import peak_rss_mb

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "model"))
SMOL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct.Q4_1.gguf")
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def write_hf_checkpoint(out_dir):
    """SmolLM2's GGUF dequantized to an fp32 Hugging Face checkpoint (Q/K rows un-permuted)."""
    from decoder_reference_test import smollm2_as_transformers

    smollm2_as_transformers(SMOL).save_pretrained(out_dir, safe_serialization=True)


def torch_half(args):
    """Runs in its own process: prints one JSON line like decoder_step_bench's."""
    import torch
    import transformers
    import peft
    import safetensors_np

    torch.set_num_threads(args.threads)
    ids = torch.tensor(safetensors_np.read(args.batch_file)["input_ids"], dtype=torch.long)
    t0 = time.perf_counter()
    model = transformers.LlamaForCausalLM.from_pretrained(args.hf_dir, torch_dtype=torch.float32)
    model = peft.get_peft_model(model, peft.LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=TARGETS))
    load_s = time.perf_counter() - t0
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, weight_decay=0.01)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
        opt.step()
        return float(loss)

    first = step()
    for _ in range(args.warmup):
        step()
    times = []
    for _ in range(args.steps):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    times.sort()
    model.eval()
    with torch.no_grad():
        t = time.perf_counter()
        out = model.generate(input_ids=ids[:1, :32], attention_mask=torch.ones_like(ids[:1, :32]), max_new_tokens=64,
                             min_new_tokens=64, do_sample=False, pad_token_id=2)
        gen_tps = (out.shape[1] - 32) / (time.perf_counter() - t)
    rss = peak_rss_mb()
    print(json.dumps({"engine": "pytorch", "weights": "f32", "recompute": False, "threads": args.threads,
                      "load_s": round(load_s, 2), "first_loss": first, "step_s_median": times[len(times) // 2],
                      "step_s_min": times[0], "steps": args.steps, "gen_tokens_per_s": gen_tps,
                      "peak_rss_mb": rss, "torch": torch.__version__, "transformers": transformers.__version__,
                      "peft": peft.__version__}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench-bin")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--torch-half", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--hf-dir", help=argparse.SUPPRESS)
    ap.add_argument("--batch-file", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.torch_half:
        torch_half(args)
        return 0
    if not os.path.exists(SMOL):
        print(f"{SMOL} is missing: run scripts/setup.sh", file=sys.stderr)
        return 1
    import safetensors_np

    with tempfile.TemporaryDirectory() as tmp:
        hf_dir = os.path.join(tmp, "smollm2-f32")
        write_hf_checkpoint(hf_dir)
        batch_file = os.path.join(tmp, "batch.safetensors")
        ids = np.random.default_rng(0).integers(0, 49152, size=(args.batch, args.seq)).astype(np.int32)
        safetensors_np.write(batch_file, {"input_ids": ids})
        configs = [("pytorch", None, False), ("fedlora", "f32", False), ("fedlora", "q4", False),
                   ("fedlora", "q4", True)]
        results = {c: [] for c in configs}
        for rep in range(args.reps):
            for c in configs:
                engine, weights, recompute = c
                if engine == "pytorch":
                    cmd = [sys.executable, __file__, "--torch-half", "--hf-dir", hf_dir, "--batch-file", batch_file,
                           "--threads", str(args.threads), "--steps", str(args.steps), "--warmup", str(args.warmup)]
                else:
                    cmd = [args.bench_bin, "--model", SMOL, "--batch", batch_file, "--weights", weights,
                           "--threads", str(args.threads), "--steps", str(args.steps), "--warmup", str(args.warmup)]
                    if recompute:
                        cmd.append("--recompute")
                r = subprocess.run(cmd, capture_output=True, text=True)
                if r.returncode != 0:
                    print(r.stderr, file=sys.stderr)
                    return 1
                line = json.loads(r.stdout.strip().splitlines()[-1])
                results[c].append(line)
                print(json.dumps(line), flush=True)
    med = lambda c, k: statistics.median(x[k] for x in results[c])
    base, f32 = configs[0], configs[1]
    # Validate: every engine trained the same model on the same batch (the first step's loss).
    for c in configs[1:]:
        for r, b in zip(results[c], results[base]):
            if abs(r["first_loss"] - b["first_loss"]) > 1e-3 * abs(b["first_loss"]):
                print(f"first-step loss {r['first_loss']} of {c} differs from PyTorch's {b['first_loss']}",
                      file=sys.stderr)
                return 1
    print(f"\nbatch {args.batch} x {args.seq}, {args.threads} threads, medians of {args.reps} runs "
          f"({args.steps} timed steps each)")
    print("| engine | base weights | recompute | step (s) | step / PyTorch | step / fedlora fp32 | gen tokens/s | gen / PyTorch | peak RSS (MB) | RSS / PyTorch | first loss |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for c in configs:
        engine, weights, recompute = c
        print(f"| {engine} | {weights or 'f32'} | {'yes' if recompute else 'no'} | {med(c, 'step_s_median'):.2f} | "
              f"{med(c, 'step_s_median') / med(base, 'step_s_median'):.2f} | "
              f"{med(c, 'step_s_median') / med(f32, 'step_s_median'):.2f} | {med(c, 'gen_tokens_per_s'):.1f} | "
              f"{med(c, 'gen_tokens_per_s') / med(base, 'gen_tokens_per_s'):.2f} | {med(c, 'peak_rss_mb'):.0f} | "
              f"{med(c, 'peak_rss_mb') / med(base, 'peak_rss_mb'):.2f} | {med(c, 'first_loss'):.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
