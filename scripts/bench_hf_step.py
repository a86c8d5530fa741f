#!/usr/bin/env python3
"""One LoRA training step: fedlora against Hugging Face transformers + PEFT on PyPI's PyTorch.

  .venv-bench/bin/python scripts/bench_hf_step.py --build-dir build/default
      [--geometries minilm,base,smollm2] [--threads 2] [--steps 5] [--warmup 2] [--reps 1]
      [--fedlora-math fp32[,bf16]] [--hf-modes fp32,bf16] [--json-out FILE]

(bench/train/bench_hf_step.sh wraps this; `make bench-hf` sets up .venv-bench, builds and runs it.)
The baseline is what a user would pick: transformers' BertForSequenceClassification or
LlamaForCausalLM, wrapped by peft.get_peft_model, trained with torch.optim.AdamW in eager mode,
on PyTorch 2.x from PyPI (scripts/requirements-bench.txt, installed by `scripts/setup.sh --bench`),
in fp32 and with bf16 autocast around forward and loss (master weights fp32).

For each geometry both engines get the same random checkpoint (Hugging Face layout, fp32), the
same initial trainable values (LoRA r8, alpha 16 on query,value / q_proj,v_proj with B != 0, and
the classifier for the encoders) and the same batch of 8 x 128 tokens. A step is: zero grads,
forward, loss (encoders: cross-entropy on 2 labels; decoder: next-token loss on every token),
backward, global-norm clip at 1.0, AdamW (lr 1e-4, weight decay 0.01); dropout off. Every engine
and configuration runs in its own process with the same thread count (FEDLORA_NUM_THREADS,
OMP/MKL/OPENBLAS_NUM_THREADS, torch.set_num_threads).

Before timing, the fp32 first-step loss of fedlora and HF must agree (relative 1e-3) and so must
the pre-clip gradient norm (1e-2); bf16 losses are printed for information. The step time is the
median of --steps timed steps after --warmup untimed ones; with --reps N every configuration runs
N times (the order alternating between reps) and the table shows medians of the reps. GFLOP/s
divides one FLOP count per geometry (count_flops in bench_train_step.py for the encoders,
count_decoder_flops below) by each engine's step time; the OpenBLAS sgemm rate at the FFN shape is
measured by fedlora's binary in the same run. Peak RSS is each child process's VmHWM.
"""

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import bench_train_step
from bench_train_step import BATCH, SEQ, RANK, ALPHA, LABELS, count_flops, make_inputs, peft_name, time_steps
from proc_memory import peak_rss_mb
import safetensors_np  # tests/model, on the path through bench_train_step

ENCODERS = {"minilm": bench_train_step.GEOMETRIES["minilm"], "base": bench_train_step.GEOMETRIES["base"]}
# SmolLM2-135M: 30 layers, hidden 576, 9 query heads and 3 key/value heads of 64, FFN 1536,
# vocabulary 49152 with the output head tied to the embedding.
DECODERS = {"smollm2": dict(layers=30, hidden=576, heads=9, kv_heads=3, head_dim=64, intermediate=1536,
                            vocab=49152, rope_theta=100000.0, rms_eps=1e-5, max_pos=8192)}
DECODER_TARGETS = ("q_proj", "v_proj")


def count_decoder_flops(g, batch=BATCH, seq=SEQ, rank=RANK):
    """FLOPs of one decoder step: forward + backward without frozen weight gradients.

    Per layer, with T = batch*seq tokens, H hidden, K = kv_heads*head_dim, I FFN width, S seq:
      forward:  Q, O projections 2 * 2THH; K, V projections 2 * 2THK; gate, up, down 3 * 2THI;
                attention scores QK^T and PV 2 * 2BSSH (the full S x S, no causal halving);
                LoRA on q (H -> H) and v (H -> K): 2Tr(H + H) + 2Tr(H + K)
      backward: input gradients of the same projections; attention 4 * 2BSSH; LoRA twice its
                forward (dA, dB, and the input gradient through B and A)
    Output head (tied, frozen) on every token: 2TVH forward and 2TVH for its input gradient.
    Layer 0 needs no gradient w.r.t. its input (frozen embeddings): minus 2THH + 2 * 2THK (Q, K, V).
    RMSNorm, RoPE, SiLU, softmax, the loss and the optimizer are left out (< 1%).
    """
    t, h, i, layers, v = batch * seq, g["hidden"], g["intermediate"], g["layers"], g["vocab"]
    k = g["kv_heads"] * g["head_dim"]
    proj = 2 * t * (2 * h * h + 2 * h * k + 3 * h * i)
    attn = 4 * batch * seq * seq * h
    lora = 2 * t * rank * (h + h) + 2 * t * rank * (h + k)
    per_layer = (proj + attn + lora) + (proj + 2 * attn + 2 * lora)
    head = 2 * (2 * t * v * h)
    return layers * per_layer + head - (2 * t * h * h + 4 * t * h * k)


def make_decoder_inputs(out_dir, g, seed, batch_size=BATCH, seq=SEQ):
    """A random Llama checkpoint of geometry `g` (weights N(0, 0.02), norm gains 1 + N(0, 0.1)),
    the initial LoRA values (PEFT names; B != 0 so that the adapters matter) and one batch."""
    rng = np.random.default_rng(seed)
    h, k, i = g["hidden"], g["kv_heads"] * g["head_dim"], g["intermediate"]
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": g["vocab"],
        "hidden_size": h, "intermediate_size": i, "num_hidden_layers": g["layers"],
        "num_attention_heads": g["heads"], "num_key_value_heads": g["kv_heads"], "head_dim": g["head_dim"],
        "max_position_embeddings": g["max_pos"], "rms_norm_eps": g["rms_eps"], "rope_theta": g["rope_theta"],
        "hidden_act": "silu", "tie_word_embeddings": True, "attention_bias": False, "mlp_bias": False,
        "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32",
    }

    def normal(*shape):
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float32)

    def gain():
        return (1.0 + 0.1 * rng.standard_normal(h)).astype(np.float32)

    weights = {"model.embed_tokens.weight": normal(g["vocab"], h), "model.norm.weight": gain()}
    for layer in range(g["layers"]):
        p = f"model.layers.{layer}."
        weights.update({
            p + "input_layernorm.weight": gain(), p + "post_attention_layernorm.weight": gain(),
            p + "self_attn.q_proj.weight": normal(h, h), p + "self_attn.k_proj.weight": normal(k, h),
            p + "self_attn.v_proj.weight": normal(k, h), p + "self_attn.o_proj.weight": normal(h, h),
            p + "mlp.gate_proj.weight": normal(i, h), p + "mlp.up_proj.weight": normal(i, h),
            p + "mlp.down_proj.weight": normal(h, i),
        })
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f)
    safetensors_np.write(os.path.join(out_dir, "model.safetensors"), weights, metadata={"format": "pt"})
    del weights
    init = {}
    for layer in range(g["layers"]):
        for target, out in (("q_proj", h), ("v_proj", k)):
            p = f"model.layers.{layer}.self_attn.{target}"
            init[peft_name(p + ".lora_A.weight")] = (rng.uniform(-1, 1, (RANK, h)) / np.sqrt(h)).astype(np.float32)
            init[peft_name(p + ".lora_B.weight")] = (rng.standard_normal((out, RANK)) * 0.02).astype(np.float32)
    safetensors_np.write(os.path.join(out_dir, "init.safetensors"), init)
    ids = rng.integers(0, g["vocab"], (batch_size, seq)).astype(np.int32)
    safetensors_np.write(os.path.join(out_dir, "batch.safetensors"), {"input_ids": ids})


def hf_main(args):
    """Runs in its own process: one configuration of the HF side; prints one JSON line."""
    import torch
    import transformers
    import peft

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    decoder = args.geometry in DECODERS
    t0 = time.perf_counter()
    if decoder:
        model = transformers.LlamaForCausalLM.from_pretrained(
            args.dir, local_files_only=True, dtype=torch.float32, attention_dropout=0.0)
        lora = peft.LoraConfig(task_type=peft.TaskType.CAUSAL_LM, r=RANK, lora_alpha=ALPHA, lora_dropout=0.0,
                               target_modules=list(DECODER_TARGETS))
    else:
        model = transformers.BertForSequenceClassification.from_pretrained(
            args.dir, local_files_only=True, dtype=torch.float32, num_labels=LABELS,
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, classifier_dropout=0.0)
        lora = peft.LoraConfig(task_type=peft.TaskType.SEQ_CLS, r=RANK, lora_alpha=ALPHA, lora_dropout=0.0,
                               target_modules=["query", "value"])
    device = torch.device(args.device)
    model = peft.get_peft_model(model, lora).to(device)
    model.train()
    # Start from the init file's values: PEFT's names carry the adapter name ("default") and
    # the classifier's modules_to_save wrapper, the file's are those of a saved adapter.
    init = safetensors_np.read(os.path.join(args.dir, "init.safetensors"))
    params = []
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.requires_grad:
                key = name.replace(".modules_to_save", "").replace(".default", "")
                p.copy_(torch.from_numpy(init.pop(key)).to(device))
                params.append(p)
    if init:
        raise SystemExit(f"bench: init tensors without a trainable PEFT parameter: {sorted(init)[:4]}")
    batch = {k: torch.from_numpy(v.astype(np.int64)).to(device)
             for k, v in safetensors_np.read(os.path.join(args.dir, "batch.safetensors")).items()}
    if decoder:
        batch["labels"] = batch["input_ids"]  # next-token loss on every token
    else:
        batch["token_type_ids"] = torch.zeros_like(batch["input_ids"])
    load_s = time.perf_counter() - t0
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01)
    first = {}

    def autocast():
        if args.hf_mode == "bf16":
            return torch.autocast(device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def step(record):
        opt.zero_grad(set_to_none=True)
        with autocast():
            loss = model(**batch).loss
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()  # the step's wall time includes its kernels
        if record:
            first["loss"], first["norm"] = loss.item(), norm.item()

    times = time_steps(step, args.warmup, args.steps)
    print(json.dumps({
        "engine": "hf", "mode": args.hf_mode, "threads": torch.get_num_threads(), "load_s": load_s,
        "first_loss": first["loss"], "first_grad_norm": first["norm"],
        "trainable_params": sum(p.numel() for p in params),
        "step_median_s": times[len(times) // 2], "step_min_s": times[0], "steps": args.steps,
        "peak_rss_mb": peak_rss_mb(), "attn_implementation": model.config._attn_implementation,
        "device": args.device,
        "peak_device_mb": torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else None,
        "torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__,
    }))


def run_child(cmd, threads):
    env = dict(os.environ, FEDLORA_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads),
               OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"bench: {' '.join(cmd[:3])} ... failed ({out.returncode}):\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def accepts_math(binary):
    """Whether fedlora's bench binary has the --math flag (its help text names it)."""
    out = subprocess.run([binary, "--help"], capture_output=True, text=True)
    return "--math" in out.stdout + out.stderr


def fedlora_cmd(args, geo, d, math):
    common = ["--threads", str(args.threads), "--steps", str(args.steps), "--warmup", str(args.warmup),
              "--rank", str(RANK), "--init", os.path.join(d, "init.safetensors"),
              "--batch", os.path.join(d, "batch.safetensors")]
    if geo in DECODERS:
        weights = {"bf16": "bf16", "int8": "q8"}.get(math, "f32")
        cmd = [args.decoder_bin, "--model", d, "--weights", weights, "--generate", "0",
               "--targets", ",".join(DECODER_TARGETS)] + common
    else:
        cmd = [args.encoder_bin, "--model", d, "--alpha", str(ALPHA)] + common
    if math != "fp32":  # fp32 is the default; the flag is passed only where it is needed
        cmd += ["--math", math]
    if args.device != "cpu":
        cmd += ["--device", args.device]
    return cmd


def hf_cmd(args, geo, d, mode):
    return [sys.executable, os.path.abspath(__file__), "hf", "--dir", d, "--geometry", geo, "--hf-mode", mode,
            "--threads", str(args.threads), "--steps", str(args.steps), "--warmup", str(args.warmup),
            "--device", args.device]


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-12)


def run_geometry(args, geo):
    """All configurations of one geometry, --reps times; returns the row for the table and JSON."""
    configs = [("fedlora", m) for m in args.fedlora_math] + [("hf", m) for m in args.hf_modes]
    runs = {c: [] for c in configs}
    with tempfile.TemporaryDirectory(prefix=f"fedlora_bench_hf_{geo}_") as d:
        t0 = time.perf_counter()
        if geo in DECODERS:
            make_decoder_inputs(d, DECODERS[geo], args.seed, args.batch, args.seq)
        else:
            make_inputs(d, ENCODERS[geo], args.seed, args.batch, args.seq)
        print(f"[{geo}] inputs written in {time.perf_counter() - t0:.1f} s", flush=True)
        for rep in range(args.reps):
            for engine, mode in (configs if rep % 2 == 0 else configs[::-1]):
                cmd = fedlora_cmd(args, geo, d, mode) if engine == "fedlora" else hf_cmd(args, geo, d, mode)
                r = run_child(cmd, args.threads)
                if "step_s_median" in r:  # decoder_step_bench's name for it
                    r["step_median_s"] = r["step_s_median"]
                runs[(engine, mode)].append(r)
                print(f"[{geo}] rep {rep} {engine} {mode}: step {r['step_median_s'] * 1e3:.0f} ms, "
                      f"first loss {r['first_loss']:.6f}, grad norm {r['first_grad_norm']:.6f}, "
                      f"peak RSS {r['peak_rss_mb']:.0f} MB", flush=True)

    # Validation: fp32 against fp32, every rep (the first step is deterministic on both sides).
    valid = True
    checks = []
    if ("fedlora", "fp32") in runs and ("hf", "fp32") in runs:
        for ours, theirs in zip(runs[("fedlora", "fp32")], runs[("hf", "fp32")]):
            loss_rel = rel(ours["first_loss"], theirs["first_loss"])
            norm_rel = rel(ours["first_grad_norm"], theirs["first_grad_norm"])
            ok = (loss_rel < 1e-3 and norm_rel < 1e-2 and ours["trainable_params"] == theirs["trainable_params"])
            checks.append({"loss_rel_diff": loss_rel, "grad_norm_rel_diff": norm_rel, "ok": ok})
            valid &= ok
        c = checks[0]
        print(f"[{geo}] fp32 check: loss rel diff {c['loss_rel_diff']:.1e}, grad norm rel diff "
              f"{c['grad_norm_rel_diff']:.1e}, trainable params {runs[('fedlora', 'fp32')][0]['trainable_params']} vs "
              f"{runs[('hf', 'fp32')][0]['trainable_params']}: {'ok' if valid else 'MISMATCH'}", flush=True)

    flops = (count_decoder_flops(DECODERS[geo], args.batch, args.seq) if geo in DECODERS
             else count_flops(ENCODERS[geo], args.batch, args.seq))
    med = lambda c, k: statistics.median(r[k] for r in runs[c])  # noqa: E731
    row = {"geometry": geo, "threads": args.threads, "batch": args.batch, "seq": args.seq, "rank": RANK,
           "device": args.device,
           "gflop_per_step": flops / 1e9, "valid": valid, "checks": checks, "reps": args.reps,
           "steps": args.steps, "warmup": args.warmup, "configs": []}
    hf_fp32 = med(("hf", "fp32"), "step_median_s") if ("hf", "fp32") in runs else None
    hf_bf16 = med(("hf", "bf16"), "step_median_s") if ("hf", "bf16") in runs else None
    for c in configs:
        step = med(c, "step_median_s")
        entry = {"engine": c[0], "math": c[1], "step_s": step, "gflops": flops / step / 1e9,
                 "tokens_per_s": args.batch * args.seq / step,
                 "mfu": flops / step / 1e9 / args.gemm_peak if args.gemm_peak else None,
                 "peak_rss_mb": med(c, "peak_rss_mb"), "first_loss": runs[c][0]["first_loss"],
                 "first_grad_norm": runs[c][0]["first_grad_norm"],
                 "ratio_over_hf_fp32": step / hf_fp32 if hf_fp32 else None,
                 "ratio_over_hf_bf16": step / hf_bf16 if hf_bf16 else None, "runs": runs[c]}
        if c[0] == "fedlora" and args.device == "cpu":
            entry["sgemm_gflops"] = med(c, "sgemm_gflops")
            entry["sgemm_shape"] = runs[c][0]["sgemm_shape"]
        else:
            for k in ("torch", "transformers", "peft", "attn_implementation"):
                row[k] = runs[c][0][k]
        row["configs"].append(entry)
    return row


def print_table(rows, args):
    where = f"{args.threads} threads" if args.device == "cpu" else f"on {args.device_name}"
    if args.gemm_peak:
        where += f", cuBLAS bf16 GEMM peak {args.gemm_peak / 1e3:.0f} TFLOP/s (MFU is against it)"
    print(f"\nbatch {args.batch} x {args.seq}, LoRA r{RANK} alpha {ALPHA:g}, {where}, medians of "
          f"{args.reps} run(s) of {args.steps} timed steps after {args.warmup} warmup steps")
    hf = next((r for r in rows if "torch" in r), None)
    if hf:
        print(f"HF side: torch {hf['torch']}, transformers {hf['transformers']}, peft {hf['peft']}, "
              f"attention {hf['attn_implementation']}")
    gpu = args.device != "cpu"
    extra = " | tokens/s | MFU" if gpu else " | OpenBLAS sgemm GFLOP/s"
    print("\n| geometry | GFLOP/step | engine | math | step (ms) | step / HF fp32 | step / HF bf16 | GFLOP/s"
          f"{extra} | peak RSS (MB) | first loss | valid |")
    print("| --- " * (12 if gpu else 11) + "| --- |")
    fmt = lambda x: "–" if x is None else f"{x:.2f}"  # noqa: E731
    for r in rows:
        for c in r["configs"]:
            math = c["math"] + (" autocast" if c["engine"] == "hf" and c["math"] == "bf16" else "")
            if gpu:
                mfu = "–" if c["mfu"] is None else f"{100 * c['mfu']:.1f}%"
                cols = f"{c['tokens_per_s']:.0f} | {mfu}"
            else:
                cols = f"{c['sgemm_gflops']:.1f}" if "sgemm_gflops" in c else "–"
            print(f"| {r['geometry']} | {r['gflop_per_step']:.0f} | {'fedlora' if c['engine'] == 'fedlora' else 'HF+PEFT'} "
                  f"| {math} | {c['step_s'] * 1e3:.0f} | {fmt(c['ratio_over_hf_fp32'])} | {fmt(c['ratio_over_hf_bf16'])} "
                  f"| {c['gflops']:.1f} | {cols} | {c['peak_rss_mb']:.0f} | {c['first_loss']:.6f} "
                  f"| {'yes' if r['valid'] else 'NO'} |")


def cublas_bf16_peak_gflops(device):
    """GFLOP/s of an 8192^3 bf16 matrix product through PyTorch (cuBLAS): the mean of 10 products
    after 3 warm-ups, random inputs. MFU is measured against this, in the same run."""
    import torch
    n = 8192
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        a @ b
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1e3 / 10
    return 2 * n**3 / seconds / 1e9, torch.cuda.get_device_name(device)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", nargs="?", default="compare", choices=["compare", "hf"])
    p.add_argument("--build-dir", default=os.path.join(bench_train_step.ROOT, "build", "default"))
    p.add_argument("--geometries", default="minilm,base,smollm2")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fedlora-math", default="fp32",
                   help="fedlora's math modes to run: fp32, bf16, int8 (decoders: a Q8_0 base), comma-separated")
    p.add_argument("--hf-modes", default="fp32,bf16", help="HF modes: fp32 and/or bf16 (autocast)")
    p.add_argument("--json-out", help="also write the results here as JSON")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                   help="where both engines train; cuda adds tokens/s and MFU against a bf16 GEMM peak")
    p.add_argument("--batch", type=int, default=BATCH, help="sequences per step")
    p.add_argument("--seq", type=int, default=SEQ, help="tokens per sequence")
    # The HF child's arguments.
    p.add_argument("--dir", help=argparse.SUPPRESS)
    p.add_argument("--geometry", help=argparse.SUPPRESS)
    p.add_argument("--hf-mode", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.mode == "hf":
        return hf_main(args)

    args.fedlora_math = args.fedlora_math.split(",")
    args.hf_modes = args.hf_modes.split(",")
    geometries = args.geometries.split(",")
    for name, values, allowed in (("--fedlora-math", args.fedlora_math, ("fp32", "bf16", "int8")),
                                  ("--hf-modes", args.hf_modes, ("fp32", "bf16")),
                                  ("--geometries", geometries, (*ENCODERS, *DECODERS))):
        if not values or any(v not in allowed for v in values):
            raise SystemExit(f"bench: {name} takes a comma-separated list of {', '.join(allowed)}")
    if "int8" in args.fedlora_math and any(g in ENCODERS for g in geometries):
        raise SystemExit("bench: --fedlora-math int8 is for decoder geometries (a Q8_0 base): "
                         f"{', '.join(DECODERS)}")
    if args.batch < 1 or args.seq < 4:
        raise SystemExit("bench: --batch must be >= 1 and --seq >= 4")
    args.gemm_peak, args.device_name = None, "cpu"
    if args.device == "cuda":
        args.gemm_peak, args.device_name = cublas_bf16_peak_gflops("cuda")
        print(f"{args.device_name}: bf16 GEMM 8192^3 at {args.gemm_peak / 1e3:.0f} TFLOP/s", flush=True)
    args.encoder_bin = os.path.join(args.build_dir, "bench", "train", "train_step_bench")
    args.decoder_bin = os.path.join(args.build_dir, "bench", "train", "decoder_step_bench")
    needed = {args.encoder_bin for g in geometries if g in ENCODERS} | {args.decoder_bin for g in geometries
                                                                        if g in DECODERS}
    for binary in sorted(needed):
        if not os.access(binary, os.X_OK):
            raise SystemExit(f"bench: {binary} not found; build the train_step_bench and decoder_step_bench targets")
        if any(m != "fp32" for m in args.fedlora_math) and not accepts_math(binary):
            raise SystemExit(f"bench: {binary} has no --math flag, so this build of fedlora has no bf16 or int8 "
                             "math mode; run with --fedlora-math fp32")
    rows = []
    for geo in geometries:
        rows.append(run_geometry(args, geo))
    print_table(rows, args)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(rows, f, indent=2)
    return 0 if all(r["valid"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
