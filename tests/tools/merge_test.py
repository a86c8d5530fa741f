#!/usr/bin/env python3
"""`fedlora merge`: transformers on the merged directory, with no PEFT, against transformers + PEFT.

  .venv/bin/python tests/tools/merge_test.py build/default/tools/fedlora

Small random models written by this test, each with a PEFT adapter (random nonzero A and B) that
PEFT itself saves:
  1. LLaMA (grouped-query heads, tied embeddings) and Qwen2 (q/k/v biases) decoders, LoRA r 4
     alpha 8 on all seven projections: AutoModelForCausalLM on the merged directory gives the
     logits of PeftModel on base + adapter;
  2. a BERT classifier on a BertModel checkpoint (no "bert." prefix, like all-MiniLM-L6-v2), LoRA
     on query/value and the classifier head as modules_to_save, with a labels.json:
     AutoModelForSequenceClassification on the merged directory gives PEFT's logits and has the
     label names as id2label; the tokenizer files come along;
  3. refusals: a GGUF base (pointing to `export --gguf`), a classifier without labels.json, a
     directory of other files as --out, a non-finite adapter value.
Exits 77 (CTest: skipped) when torch, transformers, peft or gguf is missing.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

SKIP = 77
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "model"))

try:
    import torch
    import transformers
    import peft
    import gguf
    import decoder_reference_test as ref  # make_model, write_gguf
except ImportError as e:  # pragma: no cover
    print(f"skipping: {e}")
    sys.exit(SKIP)

FAILURES = []
LABELS = ["alpha", "beta", "gamma"]


def expect(cond, what):
    if not cond:
        FAILURES.append(what)


def close(tag, got, want):
    got, want = got.detach().numpy().astype(np.float64), want.detach().numpy().astype(np.float64)
    err = np.abs(got - want).max()
    expect(err <= 1e-4 * max(1.0, np.abs(want).max()), f"{tag}: logits differ by {err:.3g}")


def randomize_adapter(pm, seed):
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_" in name or "modules_to_save" in name:
                p.normal_(0.0, 0.2)


def merge(fedlora, adapter, out, model=None):
    cmd = [fedlora, "merge", "--adapter", adapter, "--out", out] + (["--model", model] if model else [])
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout + p.stderr


def decoder_case(fedlora, tmp, kind):
    base = os.path.join(tmp, kind)
    ref.make_model(kind).save_pretrained(base, safe_serialization=True)
    cfg = peft.LoraConfig(r=4, lora_alpha=8.0, lora_dropout=0.0, target_modules=ref.TARGETS, task_type="CAUSAL_LM")
    pm = peft.get_peft_model(transformers.AutoModelForCausalLM.from_pretrained(base), cfg)
    randomize_adapter(pm, 3)
    adapter = os.path.join(tmp, kind + "-lora")
    pm.save_pretrained(adapter)
    out = os.path.join(tmp, kind + "-merged")
    rc, text = merge(fedlora, adapter, out, base)
    expect(rc == 0, f"{kind}: exit {rc}: {text}")
    if rc != 0:
        return
    ids = torch.tensor([[1, 5, 9, 33, 200, 7, 64, 2]])
    want = peft.PeftModel.from_pretrained(transformers.AutoModelForCausalLM.from_pretrained(base), adapter).eval()
    got = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    expect(not isinstance(got, peft.PeftModel), f"{kind}: a PeftModel")
    with torch.no_grad():
        close(kind, got(ids).logits, want(ids).logits)
        plain = transformers.AutoModelForCausalLM.from_pretrained(base).eval()(ids).logits
    # The adapter changes the model: a merge that dropped it would not match.
    expect(np.abs((plain - want(ids).logits).detach().numpy()).max() > 1e-2, f"{kind}: the adapter changes nothing")


def write_bert_base(tmp):
    base = os.path.join(tmp, "bert")
    torch.manual_seed(5)
    cfg = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=48, max_position_embeddings=32)
    transformers.BertModel(cfg).save_pretrained(base, safe_serialization=True)  # BertModel: no "bert." prefix
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(59)]
    with open(os.path.join(base, "vocab.txt"), "w") as f:
        f.write("\n".join(words) + "\n")
    with open(os.path.join(base, "tokenizer_config.json"), "w") as f:
        json.dump({"do_lower_case": True, "tokenizer_class": "BertTokenizer"}, f)
    return base


def classifier_case(fedlora, tmp):
    base = write_bert_base(tmp)
    cfg = peft.LoraConfig(r=4, lora_alpha=8.0, lora_dropout=0.0, target_modules=["query", "value"], task_type="SEQ_CLS")
    load = lambda: transformers.AutoModelForSequenceClassification.from_pretrained(base, num_labels=3)  # noqa: E731
    pm = peft.get_peft_model(load(), cfg)
    randomize_adapter(pm, 4)
    adapter = os.path.join(tmp, "bert-lora")
    pm.save_pretrained(adapter)
    with open(os.path.join(adapter, "labels.json"), "w") as f:
        json.dump({"label_names": LABELS}, f)
    out = os.path.join(tmp, "bert-merged")
    rc, text = merge(fedlora, adapter, out, base)
    expect(rc == 0, f"bert: exit {rc}: {text}")
    if rc == 0:
        ids = torch.tensor([[2, 10, 11, 12, 3, 0], [2, 40, 41, 3, 0, 0]])
        mask = (ids != 0).long()
        want = peft.PeftModel.from_pretrained(load(), adapter).eval()
        got = transformers.AutoModelForSequenceClassification.from_pretrained(out).eval()
        with torch.no_grad():
            close("bert", got(input_ids=ids, attention_mask=mask).logits, want(input_ids=ids, attention_mask=mask).logits)
        expect(got.config.id2label == dict(enumerate(LABELS)), f"bert: id2label {got.config.id2label}")
        expect(got.config.label2id == {n: i for i, n in enumerate(LABELS)}, f"bert: label2id {got.config.label2id}")
        tok = transformers.AutoTokenizer.from_pretrained(out)
        expect(tok("w3 w4")["input_ids"] == [2, 8, 9, 3], f"bert: tokenizer {tok('w3 w4')}")
    # No labels.json: refused rather than LABEL_0, LABEL_1, ...
    os.remove(os.path.join(adapter, "labels.json"))
    rc, text = merge(fedlora, adapter, os.path.join(tmp, "nolabels"), base)
    expect(rc == 1 and "no labels.json" in text and "LABEL_0" in text, f"no labels: exit {rc}: {text}")
    expect(not os.path.exists(os.path.join(tmp, "nolabels")), "no labels: directory written")
    return adapter, base


def refusals(fedlora, tmp):
    llama = ref.make_model("llama")
    base_gguf = os.path.join(tmp, "llama.gguf")
    ref.write_gguf(base_gguf, llama, gguf.GGMLQuantizationType.F32)
    rc, text = merge(fedlora, os.path.join(tmp, "llama-lora"), os.path.join(tmp, "g"), base_gguf)
    expect(rc == 1 and "is a GGUF file" in text and "export --adapter" in text and "--gguf" in text,
           f"gguf base: exit {rc}: {text}")
    other = os.path.join(tmp, "other")
    os.makedirs(other)
    with open(os.path.join(other, "notes.txt"), "w") as f:
        f.write("keep me")
    rc, text = merge(fedlora, os.path.join(tmp, "llama-lora"), other, os.path.join(tmp, "llama"))
    expect(rc == 1 and "a directory of other files" in text, f"other dir: exit {rc}: {text}")
    expect(os.listdir(other) == ["notes.txt"], "other dir: touched")
    # A non-finite adapter value is refused, not merged into the weights.
    import safetensors.torch
    bad = os.path.join(tmp, "nan-lora")
    shutil.copytree(os.path.join(tmp, "llama-lora"), bad)
    tensors = safetensors.torch.load_file(os.path.join(bad, "adapter_model.safetensors"))
    name = sorted(tensors)[0]
    tensors[name][0, 0] = float("nan")
    safetensors.torch.save_file(tensors, os.path.join(bad, "adapter_model.safetensors"))
    rc, text = merge(fedlora, bad, os.path.join(tmp, "nan-merged"), os.path.join(tmp, "llama"))
    expect(rc == 1 and f"'{name}' has a non-finite value" in text, f"nan: exit {rc}: {text}")
    # A merged model is replaced whole on a second merge.
    rc, text = merge(fedlora, os.path.join(tmp, "llama-lora"), os.path.join(tmp, "llama-merged"), os.path.join(tmp, "llama"))
    expect(rc == 0, f"merge again: exit {rc}: {text}")


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    fedlora = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        decoder_case(fedlora, tmp, "llama")
        decoder_case(fedlora, tmp, "qwen2")
        classifier_case(fedlora, tmp)
        refusals(fedlora, tmp)
    for f in FAILURES:
        print("FAIL:", f)
    print(f"{'FAILED' if FAILURES else 'OK'}: {len(FAILURES)} failures")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
