#!/usr/bin/env python3
"""Checks fedlora's byte-level BPE tokenizer and chat templates against Hugging Face.

Run with the project venv (PyPI `tokenizers`, `gguf`; Debian's python3-jinja2):

  .venv/bin/python tests/model/bpe_tokenizer_hf_check.py --tokenize build/x/tests/model/fedlora_bpe_tokenize

The vocabulary is SmolLM2-135M-Instruct's, read from its GGUF file (models/, fetched by
scripts/setup.sh): tokens, token types, merges and the chat template. Over that vocabulary the
script builds Hugging Face `tokenizers` tokenizers with the pre-tokenizers of each supported
family and saves each as a tokenizer.json:
  smollm    Sequence[Digits(individual_digits), ByteLevel(use_regex)]  (SmolLM2's own)
  gpt2      ByteLevel(use_regex)
  gpt2_ps   ByteLevel(add_prefix_space, use_regex), unk_token with fuse_unk (tokenizer.json only)
  llama3    Sequence[Split(LLaMA-3 regex), ByteLevel(use_regex=False)], ignore_merges, a BOS
            template
  qwen2     NFC, Sequence[Split(Qwen2 regex), ByteLevel(use_regex=False)]
The C++ helper loads each (a) from that tokenizer.json and (b) through BpeTokenizer::Create from
the GGUF-style data (the `pre` names smollm, gpt2, llama-bpe, qwen2), and the script compares:
  1. ids, for a sample of texts: Unicode (accents, decomposed marks, CJK, emoji, RTL, Indic),
     digits and numbers, runs of spaces/tabs/newlines, contractions, code, special tokens in
     text, invalid UTF-8 (given to HF decoded with errors="replace"), fortunes entries and seeded
     random strings; with and without add_special, and with parse_special off;
  2. the pre-tokenizer pieces of a probe string built around every Unicode code point (smollm,
     gpt2, llama3);
  3. ids of every code point, in chunks (with qwen2, also between a base letter and marks, for
     NFC);
  4. Decode of each sample's ids and of random id sequences, skipping special tokens or not;
  5. token offsets: each token's bytes are the input bytes its offsets name (smollm);
  6. chat templates: renders of the real Jinja templates (SmolLM2's from the GGUF, Qwen2's,
     LLaMA-3's, plain ChatML) by Jinja2 as transformers sets it up, against ChatTemplate, for
     several conversations; detection of each; refusal of templates we do not support; and the
     training encoding (HF's ids of the prompt and response parts; the masked tokens are the
     assistant contents).
Any difference is a failure (exit 1) listing the mismatches; exit 77 (CTest: skipped) when the
model file or a package is missing.
"""

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import unicodedata

SKIP = 77
GGUF = os.path.join("models", "SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct.Q4_1.gguf")

LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
            r"|\s*[\r\n]+|\s+(?!\S)|\s+")

# Chat templates as the models' tokenizer_config.json hold them (Jinja source).
QWEN2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}")
CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% endif %}")
# Templates that must be refused: tool calling (Qwen2.5 style), LLaMA-3.1's dated system prompt,
# another family, and ChatML with a different structure.
REFUSED_TEMPLATES = [
    "{%- if tools %}{{- '<|im_start|>system\\n' }}{%- endif %}{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}{%- endfor %}",
    "{{- bos_token }}{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}"
    "{{- 'Cutting Knowledge Date: December 2023\\n' }}{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim"
    " + '<|eot_id|>' }}{%- endfor %}",
    "{{ bos_token }}{% for message in messages %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% endfor %}",
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content']}}"
    "{% if loop.last %}{{ '<|im_end|>'}}{% else %}{{ '<|im_end|>\\n' }}{% endif %}{% endfor %}",
]

EDGE_CASES = [
    "", " ", "  ", "   ", "\t", "\n", "\n\n", "\n\n\n", "\t\n", " \n", "\n ", "\r\n", "\r\n\r\n", " \r\n ",
    "Hello world", " Hello world", "Hello World", " Hello World", " Hello World!", "Hello, world!",
    " this is 🦙.cpp", "w048 7tuijk dsdfhu", "нещо на Български", "ááá", "Héllo wörld café naïve",
    "Crème brûlée à la carte; jalapeño piñata; São Paulo; Łódź; Dvořák; İstanbul; Ǆemal",
    "Tiếng Việt có dấu, Nguyễn, Đà Nẵng", "Ελληνικά: Καλημέρα κόσμε· ΟΔΥΣΣΕΥΣ", "Русский текст: Ёжик в тумане",
    "中文文本测试：我爱自然语言处理。", "日本語のテキスト、カタカナとひらがな。", "한국어 텍스트 처리 안녕하세요",
    "mixed中文and english詞語", "Emoji: 😀 👍🏽 ❤️ 👨‍👩‍👧 🇫🇷 smile😀face 🚀 (normal) 😶‍🌫️ (multiple) ✅",
    "Combining: e\u0301 a\u0300 n\u0303 o\u0308 A\u030a \u1100\u1161\u11a8 (decomposed)",
    "Arabic: مرحبا بالعالم، كيف حالك؟ ١٢٣٤٥", "Hebrew: שלום עולם", "Hindi: नमस्ते दुनिया। ०१२३",
    "Thai: สวัสดีชาวโลก", "Math: ∑ ∫ √ ∂ ∇ ∈ ∉ ⊂ ∪ ∩ ℝ ℕ ℤ ½ ¾ ² ³ Ⅷ ⅷ", "Ohm Ω Kelvin K Angstrom Å ﬁ ﬂ",
    "Fullwidth ＡＢＣ１２３ and halfwidth ｶﾀｶﾅ", "Symbols: © ® ™ € £ ¥ § ¶ † ‡ • … ‰ ← → ∞ ≠ ≤ ≥ ± × ÷",
    "Quotes: “double” ‘single’ «guillemets» „low“ — em – en",
    "3", "33", "333", "3333", "33333", "333333", "3333333", "33333333", "333333333",
    "Numbers: 3.14159, 1,000,000, 42nd, 1st, 2e10, -17, 0x1F, 12:30pm, 50%, 1234567890",
    "I'm can't won't y'all rock'n'roll we'll they've she'd he's I'M CAN'T WE'LL THEY'VE SHE'D HE'S",
    "it'ſ x'K 'S 'T 'RE 'Ve 'mM 'Ll 'D ''s '''", "don't stop-believing!!! (really?) [maybe] {never}",
    "def f(x):\n    return x**2  # square\n\n\tif x > 0:\n\t\tprint(f'{x}')\n",
    "int main() {\n  std::vector<int> v{1, 2, 3};\n  for (auto& x : v) x *= 2;\n  return 0;\n}\n",
    '{"key": [1, 2.5, "three", null, true], "nested": {"a": "b"}}',
    "<html><body><p class=\"x\">Hi &amp; bye</p></body></html>",
    "URLs: https://www.example.com/path?query=1&b=two#frag user@example.org C:\\Program Files\\x",
    "Tabs\tand\nnewlines\r\nand\x0bvertical\x0cform feed\x1cfile sep\x85next line",
    "Spaces:  two   three    four     five      six\u00a0nbsp\u2009thin\u3000ideographic\u2028ls\u2029ps",
    "Zero width\u200bspace\u200djoiner\ufeffbom\u00adsoft\u180emongolian",
    "Control\x00chars\x01here\x07and\x1bthere\x7f",
    "   leading and trailing   ", "\n\n\nnewlines before", "after newlines\n\n\n", " \t \n \r\n mixed \t\n",
    "Special tokens inline: <|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|><|endoftext|>x<|im_start|><|im_end|> <|im_start|> <|im_end|><|im_start",
    "almost <|im_star|> <|im_start|| <|IM_START|> <repo_name>x<reponame>y<file_sep>",
    "a" * 300, "ab" * 200, " " * 100 + "x", "\n" * 50 + "x", "1" * 100, "😀" * 40,
    "The quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX JUMPS!",
    "!!!???...,,,;;;:::---___===+++***&&&^^^%%%$$$###@@@~~~```", "a+b=c; x^2 <= y|z ~ w` a_b a-b a.b a,b",
]

# Invalid UTF-8 (bytes), which HF sees as the text decoded with errors="replace".
INVALID_UTF8 = [
    b"\xff", b"\xfe\xff", b"abc\x80def", b"\xc3", b"\xc3(", b"\xe2\x82", b"\xe2\x82x", b"\xf0\x9f\x98",
    b"\xf0\x9f\x98 ok", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80", b"\xf8\x88\x80\x80\x80",
    b"caf\xe9 cr\xe8me", b"\x80\x80\x80", b"<|im_start|>\xffuser", b"12\xff34", b" \xff ",
    "ok 😀".encode() + b"\xf0\x9f" + " tail".encode(),
]

VARIANTS = {  # name: GGUF pre name for Create (None: tokenizer.json only)
    "smollm": "smollm", "gpt2": "gpt2", "gpt2_ps": None, "llama3": "llama-bpe", "qwen2": "qwen2",
}


def load_gguf(path):
    from gguf import GGUFReader

    r = GGUFReader(path)

    def arr(key, conv):
        f = r.fields[key]
        return [conv(f.parts[i]) for i in f.data]

    def scalar(key):
        f = r.fields[key]
        return f.parts[f.data[0]]

    return {
        "tokens": arr("tokenizer.ggml.tokens", lambda p: bytes(p).decode("utf-8")),
        "token_types": arr("tokenizer.ggml.token_type", lambda p: int(p[0])),
        "merges": arr("tokenizer.ggml.merges", lambda p: bytes(p).decode("utf-8")),
        "bos_id": int(scalar("tokenizer.ggml.bos_token_id")[0]),
        "eos_id": int(scalar("tokenizer.ggml.eos_token_id")[0]),
        "unk_id": int(scalar("tokenizer.ggml.unknown_token_id")[0]),
        "pad_id": int(scalar("tokenizer.ggml.padding_token_id")[0]),
        "chat_template": bytes(scalar("tokenizer.chat_template")).decode("utf-8"),
    }


def build_hf(variant, g):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    vocab = {t: i for i, t in enumerate(g["tokens"])}
    merges = [tuple(m.split(" ")) for m in g["merges"]]
    # SmolLM2's vocabulary lacks 21 byte characters (0xF1, 0xFF, ...): they are dropped
    # (unk_token null, as Create does by default), or become unk (gpt2_ps, fused).
    unk = g["tokens"][g["unk_id"]] if variant == "gpt2_ps" else None
    bpe = models.BPE(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=(variant == "gpt2_ps"),
                     ignore_merges=(variant == "llama3"))
    tok = Tokenizer(bpe)
    if variant == "smollm":
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    elif variant in ("gpt2", "gpt2_ps"):
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=(variant == "gpt2_ps"), use_regex=True)
    else:
        regex = LLAMA3_RE if variant == "llama3" else QWEN2_RE
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    if variant == "qwen2":
        tok.normalizer = normalizers.NFC()
    if variant == "llama3":
        bos = g["tokens"][g["bos_id"]]
        tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, g["bos_id"])])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(g["tokens"], g["token_types"]) if ty == 3])
    return tok


def bytes_to_unicode():
    """GPT-2's byte -> character map."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


BYTE_OF_CHAR = {c: b for b, c in bytes_to_unicode().items()}


def token_bytes(token):
    """The input bytes a token stands for (added tokens: their own UTF-8)."""
    if all(c in BYTE_OF_CHAR for c in token):
        return bytes(BYTE_OF_CHAR[c] for c in token)
    return token.encode("utf-8")


def run_cli(binary, args, requests):
    proc = subprocess.run([binary, *args], input="".join(json.dumps(r) + "\n" for r in requests).encode(),
                          capture_output=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"FAIL: {binary} {' '.join(args)} exited {proc.returncode}: "
                         f"{proc.stderr.decode(errors='replace')[-2000:]}")
    out = proc.stdout.decode("utf-8").split("\n")  # not splitlines: U+2028 may be in a line
    if out and out[-1] == "":
        out.pop()
    if len(out) != len(requests):
        raise SystemExit(f"FAIL: {binary} printed {len(out)} lines for {len(requests)} inputs")
    return [json.loads(line) for line in out]


def load_fortunes(source_dir, n):
    path = os.path.join(source_dir, "data", "fortunes", "test.jsonl")
    texts = []
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            for line in f:
                texts.append(json.loads(line)["text"])
                if len(texts) == n:
                    break
    return texts


def random_texts(n, seed=1234):
    """Seeded random strings mixing the character classes the regexes care about."""
    rng = random.Random(seed)
    pools = ["abcXYZ", "0123456789", " ", "  \t", "\n\r", "'", "sStTlLdDmMvVrReE", ".,;:!?-_()[]{}<>",
             "éüßñÅØ", "中文字", "😀👍🏽", "\u0301\u0308", "١٢٣", "\u00a0\u3000\u2028", "½²Ⅷ", "ſK",
             "<|im_start|>", "<|im_end|>", "\x1c\x85"]
    out = []
    for _ in range(n):
        length = rng.randint(1, 60)
        out.append("".join(rng.choice(rng.choice(pools)) for _ in range(length)))
    return out


def code_points():
    return [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]


def probe(c):
    ch = chr(c)
    return f"a{ch}b {ch}{ch}1{ch} {ch}\n{ch}'s"


def check_variant(binary, variant, tok_json, vocab_json, hf, texts, invalid, do_code_points, mismatches):
    counts = {"encode": 0, "decode": 0, "pieces": 0, "offsets": 0}
    loaders = [("tokenizer.json", ["--tokenizer_json", tok_json])]
    if vocab_json:
        loaders.append(("Create", ["--vocab_json", vocab_json]))
    hf_bl = hf.pre_tokenizer
    byte_in_vocab = {b for b, ch in bytes_to_unicode().items() if hf.token_to_id(ch) is not None}
    # Requests: (label, our request, hf text)
    reqs = []
    for t in texts:
        for add_special in (False, True):
            reqs.append(({"text": t, "add_special": add_special}, t, add_special, True))
        reqs.append(({"text": t, "parse_special": False}, t, False, False))
    for b in invalid:
        reqs.append(({"hex": b.hex(), "add_special": True}, b.decode("utf-8", errors="replace"), True, True))
    if do_code_points:
        cps = code_points()
        for i in range(0, len(cps), 512):
            chunk = "".join(chr(c) + ("a", " ", "1", "", "\n", "'s")[j % 6] for j, c in enumerate(cps[i:i + 512]))
            reqs.append(({"text": chunk}, chunk, False, True))
            if hf.normalizer is not None:  # NFC: each code point after a base letter, among marks
                chunk = "".join("e" + chr(c) + "\u0334\u0301" + chr(c) + " " for c in cps[i:i + 512])
                reqs.append(({"text": chunk}, chunk, False, True))
    for label, args in loaders:
        ours = run_cli(binary, args, [r[0] for r in reqs])
        decode_reqs, decode_want = [], []
        for (req, text, add_special, parse_special), got in zip(reqs, ours):
            hf.encode_special_tokens = not parse_special
            want = hf.encode(text, add_special_tokens=add_special).ids
            hf.encode_special_tokens = False
            counts["encode"] += 1
            if got["ids"] != want:
                mismatches.append(f"[{variant}/{label}] encode {req}\n    hf:   {want}\n    ours: {got['ids']}")
            for skip in (False, True):
                decode_reqs.append({"ids": want, "skip_special": skip})
                decode_want.append(hf.decode(want, skip_special_tokens=skip))
            if variant == "smollm" and "hex" not in req:
                raw = text.encode("utf-8")
                for tid, (b, e) in zip(got["ids"], got["offsets"]):
                    counts["offsets"] += 1
                    # A token may span bytes the vocabulary lacks (dropped, merged across).
                    covered = bytes(x for x in raw[b:e] if x in byte_in_vocab)
                    if token_bytes(hf.id_to_token(tid)) != covered:
                        mismatches.append(f"[{variant}/{label}] offsets ({b}, {e}) of token {tid} in {req}")
        rng = random.Random(7)
        for _ in range(300):
            ids = [rng.randrange(-5, hf.get_vocab_size() + 5) for _ in range(rng.randint(0, 12))]
            ids = [i for i in ids if i >= 0]  # HF's decode takes unsigned ids
            for skip in (False, True):
                decode_reqs.append({"ids": ids, "skip_special": skip})
                decode_want.append(hf.decode(ids, skip_special_tokens=skip))
        decoded = run_cli(binary, args + ["--mode", "decode"], decode_reqs)
        for req, want, got in zip(decode_reqs, decode_want, decoded):
            counts["decode"] += 1
            if got["text"] != want:
                mismatches.append(f"[{variant}/{label}] decode {req}\n    hf:   {want!r}\n    ours: {got['text']!r}")
        # Pieces per code point for the three distinct pre-tokenizers (qwen2's regex differs
        # from llama3's only in \p{N}, gpt2_ps from gpt2 only in the prefix space).
        if do_code_points and label == "tokenizer.json" and variant in ("smollm", "gpt2", "llama3"):
            cps = code_points()
            preq = [{"text": probe(c)} for c in cps]
            pieces = run_cli(binary, args + ["--mode", "pretokenize"], preq)
            for c, got in zip(cps, pieces):
                want = [p for p, _ in hf_bl.pre_tokenize_str(probe(c))]
                counts["pieces"] += 1
                if got["pieces"] != want:
                    mismatches.append(f"[{variant}] pieces U+{c:04X} ({unicodedata.category(chr(c))}): "
                                      f"hf {want!r} ours {got['pieces']!r}")
    return counts


def check_chat(binary, tok_json, g, hf, mismatches):
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    templates = {"smollm2": g["chat_template"], "qwen2": QWEN2_TEMPLATE, "llama3": LLAMA3_TEMPLATE,
                 "chatml": CHATML_TEMPLATE}
    conversations = [
        [{"role": "user", "content": "Hello!"}],
        [{"role": "user", "content": "Hello!"}, {"role": "assistant", "content": "Hi, how can I help?"}],
        [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "2+2?"},
         {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3?"},
         {"role": "assistant", "content": "6."}],
        [{"role": "assistant", "content": "I speak first."}, {"role": "user", "content": "ok"}],
        [{"role": "user", "content": "  padded\n\n"}, {"role": "assistant", "content": "\n\t answer with spaces \u3000\x1c"}],
        [{"role": "user", "content": ""}, {"role": "assistant", "content": ""}],
        [{"role": "user", "content": "Unicode: 中文 😀 e\u0301 مرحبا 123456"},
         {"role": "assistant", "content": "Code:\n```python\nprint('hi')\n```\n"}],
        [{"role": "user", "content": "Inject <|im_end|> and <|eot_id|> here"},
         {"role": "assistant", "content": "Sure <|im_start|>x"}],
        [{"role": "tool", "content": "{\"r\": 1}"}, {"role": "assistant", "content": "done"}],
        [],
    ]
    cases, reqs = [], []
    for name, source in templates.items():
        compiled = env.from_string(source)
        for conv in conversations:
            for gen in (False, True):
                want = compiled.render(messages=conv, add_generation_prompt=gen, bos_token="<|begin_of_text|>",
                                       eos_token="<|im_end|>")
                for spec in (name, source):
                    cases.append((name, spec, conv, gen, want))
                    reqs.append({"template": spec, "messages": conv, "add_generation_prompt": gen})
    results = run_cli(binary, ["--tokenizer_json", tok_json, "--mode", "chat"], reqs)
    same_as_whole = [0]
    for (name, spec, conv, gen, want), got in zip(cases, results):
        if "error" in got:
            mismatches.append(f"[chat {name}] refused {spec[:60]!r}: {got['error']}")
            continue
        if got["text"] != want:
            mismatches.append(f"[chat {name}] conv {conv} gen={gen}\n    jinja: {want!r}\n    ours:  {got['text']!r}")
            continue
        if gen or spec != name:
            continue
        # The ids are HF's for the prompt and response parts, encoded one after the other, and the
        # masked ones decode to the responses.
        raw = want.encode()
        cuts = [0] + [x for span in got["spans"] for x in span] + [len(raw)]
        parts = [raw[a:b].decode() for a, b in zip(cuts, cuts[1:])]
        expected = [i for p in parts if p for i in hf.encode(p, add_special_tokens=False).ids]
        if got["ids"] != expected:
            mismatches.append(f"[chat {name}] ids of {want!r}")
        if expected == hf.encode(want, add_special_tokens=False).ids:
            same_as_whole[0] += 1
        spans = b"".join(raw[b:e] for b, e in got["spans"])
        masked = b"".join(token_bytes(hf.id_to_token(i)) for i, m in zip(got["ids"], got["mask"]) if m)
        if masked != spans:
            mismatches.append(f"[chat {name}] masked tokens {masked!r} != responses {spans!r}")
    n = len(cases)
    print(f"chat templates: {same_as_whole[0]} of {len(conversations) * len(templates)} training encodings equal "
          f"the encoding of the whole text")
    for source in REFUSED_TEMPLATES:
        got = run_cli(binary, ["--tokenizer_json", tok_json, "--mode", "chat"],
                      [{"template": source, "messages": [{"role": "user", "content": "x"}]}])[0]
        n += 1
        if "error" not in got or "explicitly" not in got["error"]:
            mismatches.append(f"[chat] not refused: {source[:80]!r}: {got}")
    return n


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokenize", required=True, help="path of the fedlora_bpe_tokenize helper binary")
    parser.add_argument("--source-dir", default=os.environ.get("FEDLORA_SOURCE_DIR", "."))
    parser.add_argument("--skip-code-points", action="store_true", help="skip the per-code-point checks")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset")
    args = parser.parse_args(argv)
    try:
        import gguf  # noqa: F401
        import jinja2  # noqa: F401
        import tokenizers  # noqa: F401
    except ImportError as e:
        print(f"SKIP: {e} (scripts/setup.sh --tests)")
        return SKIP
    path = os.path.join(args.source_dir, GGUF)
    if not os.path.exists(path):
        print(f"SKIP: {path} is missing (scripts/setup.sh)")
        return SKIP
    g = load_gguf(path)
    texts = EDGE_CASES + load_fortunes(args.source_dir, 300) + random_texts(400)
    mismatches = []
    totals = {}
    with tempfile.TemporaryDirectory(prefix="fedlora_bpe_") as tmp:
        for variant in args.variants.split(","):
            hf = build_hf(variant, g)
            tok_json = os.path.join(tmp, f"{variant}.tokenizer.json")
            hf.save(tok_json)
            vocab_json = None
            if VARIANTS[variant]:
                vocab_json = os.path.join(tmp, f"{variant}.vocab.json")
                with open(vocab_json, "w", encoding="utf-8") as f:
                    json.dump({"model": "gpt2", "pre": VARIANTS[variant], "tokens": g["tokens"],
                               "token_types": g["token_types"], "merges": g["merges"], "bos_id": g["bos_id"],
                               "eos_id": g["eos_id"], "unk_id": g["unk_id"], "pad_id": g["pad_id"],
                               "add_bos": variant == "llama3"}, f)
            before = len(mismatches)
            counts = check_variant(args.tokenize, variant, tok_json, vocab_json, hf, texts, INVALID_UTF8,
                                   not args.skip_code_points, mismatches)
            print(f"{variant}: {counts['encode']} encodings, {counts['decode']} decodes, {counts['pieces']} "
                  f"code-point probes, {counts['offsets']} offsets compared; {len(mismatches) - before} mismatches",
                  flush=True)
            for k, v in counts.items():
                totals[k] = totals.get(k, 0) + v
            if variant == "smollm":
                before = len(mismatches)
                n = check_chat(args.tokenize, tok_json, g, hf, mismatches)
                print(f"chat templates: {n} renders compared; {len(mismatches) - before} mismatches", flush=True)
    print(f"total: {totals}")
    if mismatches:
        for m in mismatches[:100]:
            print("MISMATCH", m)
        if len(mismatches) > 100:
            print(f"... and {len(mismatches) - 100} more")
        print(f"FAIL: {len(mismatches)} mismatches against Hugging Face")
        return 1
    print("OK: identical to Hugging Face tokenizers and Jinja2")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
