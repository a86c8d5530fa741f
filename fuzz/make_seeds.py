#!/usr/bin/env python3
"""Writes fedlora's fuzz seed corpora, fuzz/corpus/<harness>/, from scratch and deterministically.

    python3 fuzz/make_seeds.py          # rewrites fuzz/corpus/ (commit the result)

Over 600 lines, not split: one writer per harness, each short and independent; a module per
harness would only add imports.

Every seed is small (well under a few KB per harness) and built here by hand, or copied from the
repository's own configs; no model or data set is read. The harnesses that read their input
through FuzzedDataProvider (tokenizer, sealed_update, rpc, peft) get seeds written by FdpWriter, which
mirrors the order in which each harness consumes its input (see the harness's source).
"""
import json
import os
import shutil
import struct
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "fuzz", "corpus")


class FdpWriter:
    """Builds an input that FuzzedDataProvider (LLVM's) reads back as the recorded values.

    Strings are read from the front (a backslash doubles; a backslash and another byte end the
    string), integers from the back, most significant byte first.
    """

    def __init__(self):
        self.front = bytearray()
        self.back = []  # in the order the integers are consumed

    def string(self, s, max_length):
        s = s.encode() if isinstance(s, str) else bytes(s)
        assert len(s) <= max_length
        for b in s:
            self.front += b"\\\\" if b == 0x5C else bytes([b])
        if len(s) < max_length:
            self.front += b"\\x"
        return self

    def integer(self, value, lo, hi, bits):
        span, n, offset = hi - lo, 0, 0
        while offset < bits and (span >> offset) > 0:
            n, offset = n + 1, offset + 8
        raw = value - lo
        assert 0 <= raw <= span
        for i in range(n - 1, -1, -1):
            self.back.append((raw >> (8 * i)) & 0xFF)
        return self

    def u8(self, v):
        return self.integer(v, 0, 255, 8)

    def u64(self, v):
        return self.integer(v, 0, 2**64 - 1, 64)

    def boolean(self, v):
        return self.u8(1 if v else 0)

    def rest(self, b):
        self.front += b
        return self

    def bytes(self):
        return bytes(self.front) + bytes(reversed(self.back))


def write(harness, name, data):
    d = os.path.join(CORPUS, harness)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


# ---- safetensors ------------------------------------------------------------------------------

DTYPES = {"F32": ("f", 4), "F64": ("d", 8), "F16": ("e", 2), "BF16": (None, 2), "I8": ("b", 1),
          "U8": ("B", 1), "I16": ("h", 2), "I32": ("i", 4), "I64": ("q", 8), "BOOL": ("?", 1)}


def safetensors(tensors, metadata=None, pad=True):
    """tensors: [(name, dtype, shape, raw bytes)] laid out in the given order."""
    header, offset, data = {}, 0, bytearray()
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        data += raw
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + bytes(data)


def f32(values):
    return struct.pack("<%df" % len(values), *values)


def safetensors_seeds():
    write("safetensors", "f32_2x3", safetensors([("w", "F32", [2, 3], f32([0.5, -1, 2, 0, 3.25, -0.125]))]))
    write("safetensors", "adapter", safetensors(
        [("layer.0.query.lora_A.weight", "F32", [2, 4], f32([0.01 * i for i in range(8)])),
         ("layer.0.query.lora_B.weight", "F32", [4, 2], f32([-0.02 * i for i in range(8)]))],
        {"format": "pt", "fedlora": "adapter"}))
    mixed = []
    for i, (dt, (code, size)) in enumerate(sorted(DTYPES.items(), key=lambda kv: -kv[1][1])):
        raw = bytes(((i + 1) * (j + 1)) & 0x7F for j in range(2 * size))
        mixed.append(("t_" + dt.lower(), dt, [2], raw))
    write("safetensors", "every_dtype", safetensors(mixed, {"k": "v"}))
    write("safetensors", "scalar_and_empty", safetensors(
        [("scalar", "F32", [], f32([1.5])), ("empty", "F32", [0, 4], b"")]))
    write("safetensors", "unpadded", safetensors([("x", "I64", [1], struct.pack("<q", -7))], pad=False))
    write("safetensors", "truncated", safetensors([("w", "F32", [4], f32([1, 2, 3, 4]))])[:-5])


# ---- gguf -------------------------------------------------------------------------------------
# Mirrors the spec (docs/gguf.md in ggml; core/gguf.h): little-endian, strings as u64 length + bytes.

GGUF_TYPES = {"u8": 0, "i8": 1, "u16": 2, "i16": 3, "u32": 4, "i32": 5, "f32": 6, "bool": 7, "str": 8, "arr": 9,
              "u64": 10, "i64": 11, "f64": 12}
GGUF_PACK = {"u8": "<B", "i8": "<b", "u16": "<H", "i16": "<h", "u32": "<I", "i32": "<i", "f32": "<f", "bool": "<?",
             "u64": "<Q", "i64": "<q", "f64": "<d"}
GGML = {"F32": (0, 1, 4), "F16": (1, 1, 2), "Q4_0": (2, 32, 18), "Q4_1": (3, 32, 20), "Q5_0": (6, 32, 22),
        "Q5_1": (7, 32, 24), "Q8_0": (8, 32, 34), "Q4_K": (12, 256, 144), "Q5_K": (13, 256, 176),
        "Q6_K": (14, 256, 210), "IQ2_XXS": (16, 256, 66), "BF16": (30, 1, 2)}


def gguf_str(s):
    s = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(s)) + s


def gguf_value(kind, v):
    """kind: a scalar name, "str", or ("arr", element kind) with v a list."""
    if isinstance(kind, tuple):
        elem = kind[1]
        return struct.pack("<IQ", GGUF_TYPES["arr"] if isinstance(elem, tuple) else GGUF_TYPES[elem], len(v)) + \
            b"".join(gguf_value(elem, e) for e in v)
    if kind == "str":
        return gguf_str(v)
    return struct.pack(GGUF_PACK[kind], v)


def gguf_type_id(kind):
    return GGUF_TYPES["arr"] if isinstance(kind, tuple) else GGUF_TYPES[kind]


def gguf_blocks(n_bytes, seed):
    """Deterministic block bytes; every 16-bit field then reads as a modest finite fp16 (0x3?..)."""
    return bytes(((seed * 31 + i * 7) & 0x3F) | 0x30 if i % 2 else (seed + i * 13) & 0xFF for i in range(n_bytes))


def gguf_file(kvs, tensors, version=3, alignment=32):
    """kvs: [(key, kind, value)]; tensors: [(name, ne innermost first, ggml type name)]."""
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs))
    for key, kind, v in kvs:
        out += gguf_str(key) + struct.pack("<I", gguf_type_id(kind)) + gguf_value(kind, v)
    offset, data = 0, b""
    for i, (name, ne, tname) in enumerate(tensors):
        type_id, block, block_bytes = GGML[tname]
        numel = 1
        for d in ne:
            numel *= d
        raw = gguf_blocks(numel // block * block_bytes, i + 1)
        out += gguf_str(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        out += struct.pack("<IQ", type_id, offset)
        data += raw + bytes(-len(raw) % alignment)
        offset += len(raw) + (-len(raw) % alignment)
    return out + bytes(-len(out) % alignment) + data


def gguf_seeds():
    tokens = ["<|endoftext|>", "<|im_start|>", "a", "b", "\u0120the", "\u0120a", "th", "e", "\u010a", "\u00e9"]
    llama = [("general.architecture", "str", "llama"), ("general.name", "str", "tiny"),
             ("llama.block_count", "u32", 1), ("llama.embedding_length", "u32", 64),
             ("llama.rope.freq_base", "f32", 10000.0), ("llama.attention.layer_norm_rms_epsilon", "f32", 1e-5),
             ("general.alignment", "u32", 32), ("tokenizer.ggml.model", "str", "gpt2"),
             ("tokenizer.ggml.tokens", ("arr", "str"), tokens),
             ("tokenizer.ggml.token_type", ("arr", "i32"), [3, 3] + [1] * 8),
             ("tokenizer.ggml.merges", ("arr", "str"), ["t h", "th e", "\u0120 a"]),
             ("tokenizer.ggml.add_bos_token", "bool", False), ("tokenizer.ggml.bos_token_id", "u32", 1)]
    tiny = [("token_embd.weight", [64, 4], "Q8_0"), ("blk.0.attn_norm.weight", [64], "F32"),
            ("blk.0.ffn_up.weight", [64, 2], "Q4_1")]
    write("gguf", "tiny_llama", gguf_file(llama, tiny))
    write("gguf", "every_tensor_type", gguf_file(
        [("general.architecture", "str", "x")],
        [(t.lower(), [GGML[t][1] * (2 if GGML[t][1] == 1 else 1)], t) for t in GGML if t != "IQ2_XXS"] +
        [("q4_0.3d", [32, 2, 2], "Q4_0"), ("f16.4d", [2, 1, 2, 2], "F16")]))
    scalars = [(k, k, v) for k, v in [("u8", 255), ("i8", -128), ("u16", 65535), ("i16", -32768), ("u32", 2**32 - 1),
                                       ("i32", -2**31), ("f32", 0.5), ("bool", True), ("u64", 2**64 - 1),
                                       ("i64", -2**63), ("f64", -1e300)]]
    arrays = [("a." + k, ("arr", k), vals) for k, vals in [
        ("u8", [0, 255]), ("i8", [-1, 1]), ("u16", [7]), ("i16", [-7]), ("u32", [1, 2, 3]), ("i32", [-1]),
        ("f32", [1.5, -2.5]), ("bool", [True, False]), ("u64", [2**63]), ("i64", [-5]), ("f64", [0.25]),
        ("str", ["", "x", "\u00e9\u00e8"])]]
    nested = [("a.nested", ("arr", ("arr", "i16")), [[1, 2], [], [3]]),
              ("a.deep", ("arr", ("arr", ("arr", ("arr", "u8")))), [[[[9]]]]), ("a.empty", ("arr", "str"), [])]
    write("gguf", "every_value_type", gguf_file([("s", "str", "value")] + scalars + arrays + nested, []))
    write("gguf", "v2_align64", gguf_file([("general.alignment", "u32", 64)],
                                          [("a", [32], "Q5_1"), ("b", [256, 2], "Q6_K")], version=2, alignment=64))
    write("gguf", "truncated", gguf_file(llama[:3], tiny)[:-40])
    write("gguf", "unsupported_type", gguf_file([("general.architecture", "str", "x")],
                                                [("blk.0.attn_q.weight", [256], "IQ2_XXS")]))


# ---- update wire format -----------------------------------------------------------------------

CODECS = {"f32": 1, "f16": 2, "bf16": 3}


def encode_values(codec, values):
    if codec == "f32":
        return struct.pack("<%df" % len(values), *values)
    if codec == "f16":
        return struct.pack("<%de" % len(values), *values)
    # bf16: the upper half of fp32 (the values below are exact in bf16)
    return b"".join(struct.pack("<I", struct.unpack("<I", struct.pack("<f", v))[0] >> 16)[:2] for v in values)


def encode_update(tensors, codec="f32", zstd=False):
    """tensors: [(name, shape, values)] -> the bytes of compression/codec.h's format."""
    body = bytearray(struct.pack("<I", len(tensors)))
    values = []
    for name, shape, vals in tensors:
        n = name.encode()
        body += struct.pack("<H", len(n)) + n + struct.pack("<B", len(shape))
        body += b"".join(struct.pack("<q", d) for d in shape)
        values += vals
    body += encode_values(codec, values)
    payload = bytes(body)
    if zstd:
        payload = subprocess.run(["zstd", "-q", "-c", "--content-size", "--check", "-3"], input=payload,
                                 stdout=subprocess.PIPE, check=True).stdout
    header = b"FLU1" + struct.pack("<HBBIIQQQ", 1, CODECS[codec], 1, 1 if zstd else 0, 0, len(values), len(body),
                                   len(payload))
    assert len(header) == 40
    return header + payload


def varint(v):
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def encode_update_v2(tensors, sections, codec=1, sparsifier=0, bits=0, block=0, zstd=False, rank=0):
    """Format version 2: tensors [(name, shape)], sections the bytes after the table, written by hand."""
    body = bytearray(struct.pack("<I", len(tensors)))
    elements = 0
    for name, shape in tensors:
        n = name.encode()
        body += struct.pack("<H", len(n)) + n + struct.pack("<B", len(shape))
        body += b"".join(struct.pack("<q", d) for d in shape)
        count = 1
        for d in shape:
            count *= d
        elements += count
    body += sections
    payload = bytes(body)
    if zstd:
        payload = subprocess.run(["zstd", "-q", "-c", "--content-size", "--check", "-3"], input=payload,
                                 stdout=subprocess.PIPE, check=True).stdout
    header = b"FLU1" + struct.pack("<HBBIIQQQ", 2, codec, 1, 1 if zstd else 0, 0, elements, len(body), len(payload))
    header += struct.pack("<BBHI", sparsifier, bits, rank, block)
    assert len(header) == 48
    return header + payload


def update_v2_seeds():
    # top-k: 3 of 16 entries (indices 1, 7, 8) in fp32
    topk = struct.pack("<Q", 3) + struct.pack("<Q", 3) + varint(1) + varint(5) + varint(0)
    topk += struct.pack("<3f", 2.0, -1.5, 0.25)
    write("update", "v2_topk_f32", encode_update_v2([("w", [4, 4])], topk, codec=1, sparsifier=1))
    # random-k: 2 of 8 entries from seed 42, in bf16 (1.0, -2.0)
    randk = struct.pack("<QQ", 2, 42) + struct.pack("<HH", 0x3F80, 0xC000)
    write("update", "v2_randomk_bf16", encode_update_v2([("v", [8])], randk, codec=3, sparsifier=2))
    # dense 2-bit quantization, block 8: one full block and a block of 2 (scale 1.0, codes 0..3)
    quant = struct.pack("<f", 1.0) + bytes([0b11100100, 0b00011011]) + struct.pack("<f", 0.5) + bytes([0b0110])
    write("update", "v2_quant2", encode_update_v2([("q", [10])], quant, codec=4, bits=2, block=8))
    # low-rank 1: a 4 x 8 matrix as P (4 x 1) and Q (8 x 1) in fp32, decoded as P Q^T
    lowrank = struct.pack("<Q", 12) + struct.pack("<12f", 1.0, -0.5, 0.25, 2.0, *[0.5 * i for i in range(8)])
    write("update", "v2_lowrank1_f32", encode_update_v2([("m", [4, 8])], lowrank, codec=1, sparsifier=3, rank=1))
    # top-k 2 of 8 + 8-bit quantization + zstd
    both = struct.pack("<QQ", 2, 2) + varint(0) + varint(6) + struct.pack("<f", 3.0) + bytes([255, 0])
    if shutil.which("zstd"):
        write("update", "v2_topk_quant8_zstd",
              encode_update_v2([("t", [8])], both, codec=4, sparsifier=1, bits=8, block=256, zstd=True))


def update_seeds():
    lora = [("layer.0.lora_A", [2, 3], [0.5, -0.25, 1.0, 0.0, -2.0, 0.125]),
            ("layer.0.lora_B", [3, 1], [1.5, -0.5, 0.75])]
    write("update", "f32", encode_update(lora, "f32"))
    write("update", "f16", encode_update(lora, "f16"))
    write("update", "bf16", encode_update(lora, "bf16"))
    write("update", "scalar_and_empty", encode_update([("s", [], [3.0]), ("e", [0, 5], [])], "f32"))
    if shutil.which("zstd"):
        write("update", "f32_zstd", encode_update(lora, "f32", zstd=True))
        write("update", "bf16_zstd", encode_update([("z", [64], [0.0] * 60 + [1.0, 2.0, 4.0, 8.0])], "bf16", zstd=True))
    else:
        print("make_seeds: zstd not found; no zstd seeds for the update harness", file=sys.stderr)
    update_v2_seeds()


# ---- downlink deltas and the metrics endpoint --------------------------------------------------

def downlink_seeds():
    # A control byte (bit 0: hold an adapter laid out as the delta; bit 1: hold values near FLT_MAX),
    # then the delta blob.
    fixed = [("lora_A", [2, 3], [0.5, -0.25, 1.0, 0.0, -2.0, 0.125]), ("lora_B", [3], [1.5, -0.5, 0.75])]
    write("downlink", "fixed_f32", b"\x00" + encode_update(fixed, "f32"))
    write("downlink", "fixed_bf16", b"\x00" + encode_update(fixed, "bf16"))
    write("downlink", "fixed_wrong_shape", b"\x00" + encode_update([("lora_A", [3, 2], [0.0] * 6), ("lora_B", [3], [1.0] * 3)]))
    write("downlink", "matched_f16", b"\x01" + encode_update([("w", [4], [1.0, -1.0, 0.5, 2.0])], "f16"))
    write("downlink", "overflow", b"\x03" + encode_update([("w", [2], [3.0e38, -3.0e38])], "f32"))
    topk = struct.pack("<Q", 3) + struct.pack("<Q", 3) + varint(1) + varint(5) + varint(0) + struct.pack("<3f", 2.0, -1.5, 0.25)
    write("downlink", "matched_topk", b"\x01" + encode_update_v2([("w", [4, 4])], topk, codec=1, sparsifier=1))
    quant = struct.pack("<f", 1.0) + bytes([0b11100100, 0b00011011]) + struct.pack("<f", 0.5) + bytes([0b0110])
    write("downlink", "matched_quant2", b"\x01" + encode_update_v2([("q", [10])], quant, codec=4, bits=2, block=8))
    if shutil.which("zstd"):
        write("downlink", "fixed_f32_zstd", b"\x00" + encode_update(fixed, "f32", zstd=True))


def metrics_http_seeds():
    # Raw request bytes, as a scraper (or anyone reaching the port) sends them.
    reqs = {
        "get": b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        "get_close": b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        "head": b"HEAD /metrics HTTP/1.0\r\n\r\n",
        "keepalive_two": b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\nGET /other HTTP/1.1\r\nHost: x\r\n\r\n",
        "post_body": b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello",
        "chunked": b"PUT /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        "range": b"GET /metrics HTTP/1.1\r\nHost: x\r\nRange: bytes=0-4,10-\r\n\r\n",
        "query": b"GET /metrics?a=1&b=%zz&c HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip, br\r\n\r\n",
        "trace": b"TRACE / HTTP/1.1\r\nHost: x\r\n\r\n",
        "multipart": (b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=b\r\n"
                      b"Content-Length: 44\r\n\r\n--b\r\nContent-Disposition: form-data; name=a\r\n\r\n1\r\n--b--"),
        "huge_length": b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n",
        "bad_version": b"GET /metrics HTTP/9.9\r\n\r\n",
        "expect": b"POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\nx",
    }
    for name, data in reqs.items():
        write("metrics_http", name, data)


# ---- PEFT adapters ----------------------------------------------------------------------------

def peft_seeds():
    # adapter_config.json (a FuzzedDataProvider string), then adapter_model.safetensors, for
    # fuzz_peft.cc's model: 2 layers, hidden 32, r 4 on query and value, 3 labels.
    config = {"peft_type": "LORA", "task_type": "SEQ_CLS", "r": 4, "lora_alpha": 8.0, "lora_dropout": 0.05,
              "target_modules": ["query", "value"], "modules_to_save": ["classifier"],
              "base_model_name_or_path": "tiny", "bias": "none", "fan_in_fan_out": False, "inference_mode": True}
    tensors = []
    for layer in range(2):
        for m in ("query", "value"):
            prefix = "base_model.model.bert.encoder.layer.%d.attention.self.%s." % (layer, m)
            tensors.append((prefix + "lora_A.weight", "F32", [4, 32], f32([0.01 * i for i in range(128)])))
            tensors.append((prefix + "lora_B.weight", "F16", [32, 4], struct.pack("<128e", *([0.5] * 128))))
    tensors.append(("base_model.model.classifier.weight", "F32", [3, 32], f32([0.1] * 96)))
    tensors.append(("base_model.model.classifier.bias", "F32", [3], f32([0.0, 1.0, -1.0])))
    weights = safetensors(tensors)
    text = json.dumps(config)
    write("peft", "valid", FdpWriter().string(text, 4096).rest(weights).bytes())
    bad = dict(config, r=8)
    write("peft", "wrong_rank", FdpWriter().string(json.dumps(bad), 4096).rest(weights).bytes())
    dora = dict(config, use_dora=True)
    write("peft", "dora", FdpWriter().string(json.dumps(dora), 4096).rest(weights).bytes())
    write("peft", "missing_tensor", FdpWriter().string(text, 4096).rest(safetensors(tensors[1:])).bytes())
    write("peft", "not_json", FdpWriter().string("{\"peft_type\": ", 4096).rest(b"").bytes())


# ---- server optimizer state and error-feedback residual files ----------------------------------

def state_files_seeds():
    # A control byte (bit 0: 0 optimizer state, 1 residual; bits 1-2: sgd, adam, yogi, adagrad),
    # then the file, for fuzz_state_files.cc's adapter: lora_A [2, 3], lora_B [3].
    def f64(values):
        return struct.pack("<%dd" % len(values), *values)
    shapes = [("lora_A", [2, 3]), ("lora_B", [3])]
    for kind_id, kind, moments in [(0, "sgd", "m"), (1, "adam", "mv"), (2, "yogi", "mv"), (3, "adagrad", "mv")]:
        tensors = [("%s/%s" % (p, n), "F64", shape, f64([0.125] * (6 if len(shape) == 2 else 3)))
                   for n, shape in shapes for p in moments]
        meta = {"fedlora.server_optimizer": kind, "fedlora.server_steps": "3"}
        write("state_files", "optimizer_" + kind, bytes([kind_id << 1]) + safetensors(tensors, meta))
    adam = [("%s/%s" % (p, n), "F64", shape, f64([0.5] * (6 if len(shape) == 2 else 3))) for n, shape in shapes for p in "mv"]
    write("state_files", "optimizer_adam_last_step",
          bytes([1 << 1]) + safetensors(adam, {"fedlora.server_optimizer": "adam", "fedlora.server_steps": "9223372036854775806"}))
    residual = [("lora_A", "F32", [2, 3], f32([0.5, -0.25, 1.0, 0.0, -2.0, 0.125])), ("lora_B", "F32", [3], f32([1.0, 2.0, 3.0])),
                ("low_rank_q/lora_A", "F32", [3], f32([1.0, 0.0, 0.0]))]
    write("state_files", "residual", b"\x01" + safetensors(residual, {"fedlora_run_id": "run-fuzz"}))
    write("state_files", "residual_other_run", b"\x01" + safetensors(residual, {"fedlora_run_id": "run-0"}))
    write("state_files", "residual_bf16", b"\x01" + safetensors([("lora_B", "BF16", [3], bytes(6))], {"fedlora_run_id": "run-fuzz"}))


# ---- sealed updates ---------------------------------------------------------------------------

def sealed_seeds():
    # raw mode (first byte odd): a blob of the right shape that cannot authenticate
    blob = bytes(range(32)) + b"FLSE\x01\x00\x00\x00" + bytes(12) + b"ciphertext bytes" + bytes(16)
    write("sealed_update", "raw_blob", b"\x01" + blob)
    write("sealed_update", "raw_short", b"\x01" + bytes(40))
    plain = encode_update([("w", [2], [1.0, -1.0])])

    def seal(name, ops, changes):
        w = FdpWriter()
        w.string("fuzz-run", 16).u64(3).string("site-0", 16).string("upload-1", 16).string(plain, 4096)
        w.integer(len(ops), 0, 4, 32)
        for kind, args in ops:
            w.integer(kind, 0, 2, 32)
            for a in args:
                a(w)
        for change in changes:  # run, round, client, upload: False keeps the sealed value
            w.boolean(change is not None)
            if change is not None:
                change(w)
        write("sealed_update", name, b"\x00" + w.bytes())

    seal("honest", [], [None] * 4)
    n = len(plain) + 32 + 36
    seal("flip_tag", [(0, [lambda w: w.integer(n - 1, 0, n - 1, 64), lambda w: w.integer(1, 1, 127, 8)])], [None] * 4)
    seal("truncate", [(1, [lambda w: w.integer(n - 3, 0, n, 64)])], [None] * 4)
    seal("moved_round", [], [None, lambda w: w.u64(4), None, None])


# ---- run config -------------------------------------------------------------------------------

def run_config_seeds():
    for src in ["configs/default.json", "configs/iid.json", "configs/two_sites.json", "proto/examples/full.json",
                "proto/examples/minimal.json"]:
        with open(os.path.join(ROOT, src), "rb") as f:
            write("run_config", src.replace("/", "_"), f.read())


# ---- tokenizer --------------------------------------------------------------------------------

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "!", "\"", "#", "'", "(", ")", ",", "-", ".", "/", ":",
         "?", "0", "1", "2", "a", "b", "c", "d", "e", "i", "o", "s", "t", "the", "how", "old", "are", "you", "am",
         "six", "hello", "world", "un", "##aff", "##able", "##s", "##ed", "##ing", "##e", "##o", "##t", "cafe",
         "naive", "\u4f60", "\u597d", "\u00e9", "##\u00e9", "fortune", "##s", "wise", "man", "says"]


def tokenizer_seed(kind, text, pair, max_length, file_bytes):
    w = FdpWriter()
    w.string(text, 1024)
    w.boolean(pair is not None)
    if pair is not None:
        w.string(pair, 1024)
    w.integer(max_length, -1, 64, 32)
    w.rest(file_bytes)
    return bytes([kind]) + w.bytes()


def tokenizer_seeds():
    vocab_txt = ("\n".join(VOCAB) + "\n").encode()
    vocab = {}
    for i, t in enumerate(VOCAB):
        vocab[t] = i  # a repeated token keeps its last line, as vocab.txt does
    tok_json = json.dumps({
        "version": "1.0",
        "added_tokens": [{"id": i, "content": t, "special": True} for i, t in enumerate(VOCAB[:5])],
        "normalizer": {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                       "strip_accents": None, "lowercase": True},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                  "max_input_chars_per_word": 100, "vocab": vocab},
    }, ensure_ascii=False, separators=(",", ":")).encode()
    write("tokenizer", "vocab_lower", tokenizer_seed(0, "How old are you?", "I am six.", 16, vocab_txt))
    write("tokenizer", "vocab_cased", tokenizer_seed(1, "Hello World [SEP] unaffable", None, -1, vocab_txt))
    write("tokenizer", "json_unicode", tokenizer_seed(2, "Caf\u00e9 na\u00efve \u4f60\u597d! The wise man says.",
                                                      "fortunes", 8, tok_json))
    write("tokenizer", "json_invalid_utf8", tokenizer_seed(2, b"ab\xff\xc3(\xe2\x82 \x00\t[MASK]", "x" * 20, 3,
                                                           tok_json))
    write("tokenizer", "vocab_crlf", tokenizer_seed(0, "the old man", None, 0, vocab_txt.replace(b"\n", b"\r\n")))


# ---- model config.json ------------------------------------------------------------------------

def bert_config_seeds():
    minilm = {"architectures": ["BertModel"], "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu",
              "hidden_dropout_prob": 0.1, "hidden_size": 384, "initializer_range": 0.02, "intermediate_size": 1536,
              "layer_norm_eps": 1e-12, "max_position_embeddings": 512, "model_type": "bert",
              "num_attention_heads": 12, "num_hidden_layers": 6, "pad_token_id": 0,
              "position_embedding_type": "absolute", "type_vocab_size": 2, "vocab_size": 30522}
    write("bert_config", "minilm", json.dumps(minilm, indent=2))
    roberta = dict(minilm, model_type="roberta", max_position_embeddings=514, pad_token_id=1, type_vocab_size=1,
                   vocab_size=50265, hidden_size=768, num_attention_heads=12, intermediate_size=3072,
                   classifier_dropout=None)
    write("bert_config", "roberta", json.dumps(roberta, indent=2))
    write("bert_config", "tiny", json.dumps({"model_type": "bert", "vocab_size": 10, "hidden_size": 4,
                                             "num_hidden_layers": 1, "num_attention_heads": 2,
                                             "intermediate_size": 8}))


# ---- server RPCs ------------------------------------------------------------------------------
# Mirrors fuzz_rpc.cc: per call, the RPC (0..10) and the caller (site 0..3; 4: "x<n>"; 5: fuzzed)
# with its session mode (0: fuzzed token, 1: none, 2-3: the site's own), then the call's input.

def varint(n):
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field(number, wire_type, payload):
    key = varint((number << 3) | wire_type)
    return key + (varint(payload) if wire_type == 0 else varint(len(payload)) + payload)


def double(number, value):
    return varint((number << 3) | 1) + struct.pack("<d", value)


class RpcScript:
    def __init__(self):
        self.w = FdpWriter()

    def call(self, rpc, site, session_mode=2):
        self.w.integer(rpc, 0, 10, 32).integer(site, 0, 5, 32)
        if site == 4:
            self.w.u8(7)
        elif site == 5:
            self.w.string("bad id!", 140)
        self.w.integer(session_mode, 0, 3, 32)
        if session_mode == 0:
            self.w.string("not-a-session-token", 80)
        return self.w

    def join(self, site, version=True):
        self.call(0, site).string(field(2, 2, b"0.1.0") + field(3, 2, field(2, 2, b"cpu")), 256)
        self.w.boolean(version)

    def wait(self, site):
        self.call(1, site).string(field(1, 0, 1), 16)

    def heartbeat(self, site):
        self.call(2, site).string(field(2, 0, 2) + field(3, 0, 5) + field(4, 0, 10), 64)
        self.w.boolean(True)

    def download(self, site, chunks=16):
        self.call(3, site).string(b"", 96)
        self.w.boolean(True).boolean(True).u8(0).integer(chunks, 0, 16, 32)

    def upload(self, site, honest=True, seal=True, upload=0, first=0, last=0, bad_chunk=255, bad_kind=2):
        w = self.call(4, site)
        w.boolean(honest)
        if honest:
            w.u8(upload)
        else:
            w.string(encode_update([("classifier.weight", [2], [0.5, 1.0])]), 8192)
        w.boolean(False)  # the task's codec
        w.boolean(False).u8(upload).integer(1, 0, 3, 32)  # a pool id: "<site>-u<upload % 32>"
        w.integer(10, 0, 1000, 64)  # num_examples
        w.boolean(seal)
        w.boolean(False)  # no fuzzed header fields
        w.u8(first).u8(last).u8(bad_chunk).integer(bad_kind, 0, 2, 32)
        if bad_kind < 2:
            w.string(field(3, 2, b"spoiled"), 256)
        w.integer(1, 0, 7, 32)  # the header first

    def status(self, site, upload=0):
        self.call(5, site).boolean(True).u8(upload).integer(1, 0, 3, 32)

    def report(self, site):
        report = double(3, 0.9) + double(4, 0.4) + field(5, 0, 100) + field(6, 0, 10)
        self.call(6, site).string(report, 512)
        self.w.boolean(True)

    def leave(self, site):
        self.call(7, site).string(field(1, 2, b"finished"), 64)

    def admin(self, status=True):
        self.call(8, 0).boolean(status)
        self.w.string(field(1, 0, 3) if status else field(1, 0, 1), 16)

    def raw(self, site, method, data):
        self.call(9, site).integer(method, 0, 10, 32)
        self.w.string(data, 1024)

    def bytes(self):
        return self.w.bytes()


def rpc_seeds():
    s = RpcScript()
    s.join(0), s.join(1), s.wait(0), s.wait(1), s.wait(0), s.wait(1), s.upload(0), s.upload(1)
    write("rpc", "round", s.bytes())
    s = RpcScript()
    s.wait(0), s.wait(1), s.heartbeat(0), s.download(0), s.upload(0, upload=1), s.report(0), s.status(0, 1)
    s.admin(True)
    write("rpc", "round_again", s.bytes())
    s = RpcScript()
    s.join(2), s.wait(2), s.upload(2, upload=2, first=0, last=130), s.status(2, 2), s.upload(2, upload=2, first=130)
    s.leave(2)
    write("rpc", "resume", s.bytes())
    s = RpcScript()
    s.join(3), s.wait(3), s.upload(3, honest=False, seal=True, upload=3), s.upload(3, seal=False, upload=4)
    s.upload(3, upload=5, bad_chunk=1, bad_kind=0), s.upload(3, upload=6, bad_chunk=0, bad_kind=1)
    s.admin(False)
    write("rpc", "hostile_uploads", s.bytes())
    s = RpcScript()
    s.call(0, 5, 0).string(b"", 256)
    s.w.boolean(False)
    s.call(1, 4, 1).string(b"", 16)
    s.raw(0, 0, field(1, 0, 99)), s.raw(1, 4, b"\xff\xff\xff"), s.raw(0, 10, b""), s.raw(0, 8, field(1, 0, 1))
    write("rpc", "strangers", s.bytes())


# ---- dataset, chat_template, decoder_config -----------------------------------------------------

def dataset_seeds():
    # Byte 0: the loader (0 .jsonl, 1 .csv, 2 .tsv, 3 labels.txt, 4 LM .jsonl); byte 1: options
    # (fuzz_dataset.cc); then the file.
    def w(name, loader, flags, text):
        write("dataset", name, bytes([loader, flags]) + (text.encode() if isinstance(text, str) else text))
    w("jsonl_names", 0, 0, '{"text": "good film", "label": "positive"}\n{"text": "dull", "text_pair": null, "label": "negative"}\n')
    w("jsonl_indices", 0, 0, '{"text": "a", "text_pair": "b", "label": 2}\n\n{"text": "c", "label": 0}')
    w("jsonl_given_names", 0, 1, '{"text": "x", "label": "positive"}\r\n{"text": "y", "label": 1}\r\n')
    w("jsonl_mixed_labels", 0, 0, '{"text": "a", "label": 1}\n{"text": "b", "label": "one"}\n')
    w("jsonl_bad_line", 0, 0, '{"text": "a", "label": "x"}\n[1, 2]\n{"text": ')
    w("jsonl_too_long", 0, 2, '{"text": "more than sixteen bytes of text", "label": "x"}\n')
    w("csv_quoted", 1, 0, 'text,text_pair,label\r\n"a, ""quoted""\nline",,pos\r\nplain,pair,neg\r\n')
    w("csv_bom_decimal", 1, 0, b"\xef\xbb\xbftext,label\n\xc3\xa9t\xc3\xa9,10\nhiver,2\n")
    w("csv_unclosed", 1, 0, 'text,label\n"never closed,1\n')
    w("csv_text_after_quote", 1, 0, 'text,label\n"a"b,1\n')
    w("tsv_glue", 2, 0, 'sentence\tlabel\ttext\n"quotes stay"\t1\tit is fine\n')
    w("tsv_pairs", 2, 1, 'text\ttext_pair\tlabel\nq\t\tpositive\nq2\tp2\tnegative')
    w("tsv_short_row", 2, 0, 'text\tlabel\nonly one field\n')
    w("labels", 3, 0, 'negative\npositive \r\n\n neutral\t\n')
    w("labels_twice", 3, 0, 'a\nb\na\n')
    w("lm_messages", 4, 64 | 40, json.dumps({"messages": [{"role": "system", "content": "Be kind."},
        {"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Bye"}, {"role": "assistant", "content": "See you."}]}) + "\n")
    w("lm_prompt_response", 4, 64 | 32, '{"prompt": "2+2?", "response": "4"}\n{"prompt": "3+3?", "response": 6}\n')
    w("lm_label_field", 4, 128 | 20, '{"prompt": "Is it good?", "label": "yes"}\n')
    w("lm_cut_middle", 4, 8, json.dumps({"prompt": "a long prompt " * 8, "response": "ok"}) + "\n")
    w("lm_ends_with_user", 4, 64, '{"messages": [{"role": "user", "content": "Hi"}]}\n')
    w("lm_bad_message", 4, 64, '{"messages": [{"role": "user", "content": 3}]}\n')


SMOLLM2_JINJA = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
                 "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
                 "' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n"
                 "' + message['content'] + '<|im_end|>' + '\n"
                 "'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n"
                 "' }}{% endif %}")
QWEN2_JINJA = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
               "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
               "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
               "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
LLAMA3_JINJA = ("{% set loop_messages = messages %}{% for message in loop_messages %}"
                "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
                "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
                "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
                "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}")


def chat_template_seeds():
    # fuzz_chat_template.cc: a template choice (0-3 by name, 4: Detect on a Jinja string), then
    # the messages: a count, and for each a role (0-3 known, 4: a string) and its content.
    roles = ["system", "user", "assistant", "tool"]

    def w(name, choice, messages, jinja=None):
        f = FdpWriter().integer(choice, 0, 4, 32)
        if jinja is not None:
            f.string(jinja, 4096)
        f.integer(len(messages), 0, 8, 64)
        for role, content in messages:
            if role in roles:
                f.integer(roles.index(role), 0, 4, 64)
            else:
                f.integer(4, 0, 4, 64).string(role, 16)
            f.string(content, 256)
        write("chat_template", name, f.bytes())
    talk = [("user", "Hi!"), ("assistant", "Hello. How can I help?"), ("user", "Bye"), ("assistant", "See you.")]
    w("chatml_system", 0, [("system", "Be brief.")] + talk)
    w("smollm2_no_system", 1, talk)
    w("qwen2_unicode", 2, [("user", "Zürich → 東京? 🚆"), ("assistant", "e\u0301 (NFD) and \u00e9 (NFC)")])
    w("llama3_strip", 3, [("user", "\u3000 padded \u00a0\n"), ("assistant", "\t\u2028answer\u0085 ")])
    w("llama3_specials_in_content", 3, [("user", "<|eot_id|><|start_header_id|>"), ("assistant", "<|im_end|> x <|eot_id|>")])
    w("custom_role", 0, [("narrator", "Once upon a time"), ("assistant", "")])
    w("invalid_utf8", 2, [("user", b"\xff\xc3"), ("assistant", b"ok \xe2\x82")])
    w("no_messages", 1, [])
    w("detect_smollm2", 4, talk, SMOLLM2_JINJA)
    w("detect_qwen2", 4, talk, QWEN2_JINJA)
    w("detect_llama3", 4, talk, LLAMA3_JINJA)
    w("detect_chatml_tools", 4, talk, QWEN2_JINJA.replace("{% for", "{% if tools %}{{ tools }}{% endif %}{% for", 1))
    w("detect_llama31_dated", 4, talk, "{{ 'Cutting Knowledge Date: December 2023' }}" + LLAMA3_JINJA)
    w("detect_other_prompt", 4, talk, QWEN2_JINJA.replace("You are a helpful assistant.", "You are a pirate."))
    w("detect_name", 4, talk, "llama3")
    w("detect_nothing", 4, talk, "{{ messages }}")


DECODER_KEYS = ["general.architecture", ".block_count", ".embedding_length", ".feed_forward_length",
                ".attention.head_count", ".attention.head_count_kv", ".context_length",
                ".attention.layer_norm_rms_epsilon", ".rope.freq_base", ".attention.key_length",
                ".attention.value_length", ".rope.dimension_count", ".rope.scaling.type", ".rope.scaling.factor",
                ".vocab_size", "tokenizer.ggml.tokens", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                "tokenizer.ggml.padding_token_id", "general.alignment", "general.name"]  # fuzz_decoder_config.cc kKeys


def decoder_config_seeds():
    # Byte 0: 0 config.json, 1 GGUF metadata records, 2 a whole .gguf (fuzz_decoder_config.cc).
    smollm2 = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 49152, "hidden_size": 576,
               "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
               "max_position_embeddings": 8192, "rms_norm_eps": 1e-05, "rope_theta": 100000, "hidden_act": "silu",
               "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2,
               "rope_scaling": None, "attention_bias": False, "mlp_bias": False, "pretraining_tp": 1, "torch_dtype": "bfloat16"}
    qwen2 = {"model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864,
             "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2, "max_position_embeddings": 32768,
             "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "tie_word_embeddings": True, "use_sliding_window": False,
             "sliding_window": 32768, "bos_token_id": 151643, "eos_token_id": [151643, 151645], "attention_dropout": 0.0}
    tiny = {"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
            "num_attention_heads": 4, "head_dim": 8}

    def j(name, cfg):
        write("decoder_config", name, b"\x00" + (json.dumps(cfg) if isinstance(cfg, dict) else cfg).encode())
    j("json_smollm2", smollm2)
    j("json_qwen2", qwen2)
    j("json_tiny", tiny)
    j("json_rope_scaling", dict(smollm2, rope_scaling={"type": "llama3", "factor": 8.0}))
    j("json_gelu", dict(tiny, hidden_act="gelu"))
    j("json_odd_head_dim", dict(tiny, head_dim=7))
    j("json_kv_not_divisor", dict(tiny, num_key_value_heads=3))
    j("json_huge", dict(tiny, hidden_size=2**40))
    j("json_eos_outside", dict(tiny, eos_token_id=[1, 64]))
    j("json_sliding_window", dict(qwen2, use_sliding_window=True))
    j("json_mistral", dict(tiny, model_type="mistral"))
    j("json_missing_field", {k: v for k, v in tiny.items() if k != "intermediate_size"})
    j("json_truncated", json.dumps(tiny)[:40])

    def rec(key, kind, v):
        k = bytes([DECODER_KEYS.index(key)]) if key in DECODER_KEYS else b"\xff" + bytes([len(key)]) + key.encode()
        if kind == "str":
            body = bytes([len(v)]) + v.encode()
        elif isinstance(kind, tuple):
            body = bytes([GGUF_TYPES[kind[1]], len(v)]) + b"".join(
                bytes([len(e)]) + e.encode() if kind[1] == "str" else struct.pack(GGUF_PACK[kind[1]], e) for e in v)
        else:
            body = struct.pack(GGUF_PACK[kind], v)
        return k + bytes([GGUF_TYPES["arr" if isinstance(kind, tuple) else kind]]) + body

    def llama_meta(arch="llama", **over):
        fields = {"general.architecture": ("str", arch), ".block_count": ("u32", 2), ".embedding_length": ("u32", 32),
                  ".feed_forward_length": ("u32", 48), ".attention.head_count": ("u32", 4),
                  ".attention.head_count_kv": ("u32", 2), ".context_length": ("u32", 128),
                  ".attention.layer_norm_rms_epsilon": ("f32", 1e-5), ".rope.freq_base": ("f32", 10000.0),
                  ".rope.dimension_count": ("u32", 8), "tokenizer.ggml.tokens": (("arr", "str"), ["<s>", "</s>", "a", "b"]),
                  "tokenizer.ggml.bos_token_id": ("u32", 0), "tokenizer.ggml.eos_token_id": ("u32", 1)}
        fields.update(over)
        return b"".join(rec(k, *kv) for k, kv in fields.items() if kv is not None)

    def m(name, flags, body):
        write("decoder_config", name, b"\x01" + bytes([flags]) + body)
    m("meta_llama_tied", 0, llama_meta())
    m("meta_qwen2_untied", 1, llama_meta("qwen2", **{".vocab_size": ("u64", 151936), "tokenizer.ggml.tokens": None,
                                                      ".attention.key_length": ("u32", 64), ".attention.value_length": ("u32", 64),
                                                      ".embedding_length": ("u32", 896), ".attention.head_count": ("u32", 14),
                                                      ".rope.dimension_count": ("u32", 64)}))
    m("meta_partial_rotary", 0, llama_meta(**{".rope.dimension_count": ("u32", 4)}))
    m("meta_rope_scaling", 0, llama_meta(**{".rope.scaling.type": ("str", "linear")}))
    m("meta_signed_and_f64", 0, llama_meta(**{".block_count": ("i64", 2), ".rope.freq_base": ("f64", 5e5),
                                               "tokenizer.ggml.padding_token_id": ("i32", -1)}))
    m("meta_negative_count", 0, llama_meta(**{".block_count": ("i32", -2)}))
    m("meta_wrong_type", 0, llama_meta(**{".attention.layer_norm_rms_epsilon": ("str", "1e-5")}))
    m("meta_missing_eps", 0, llama_meta(**{".attention.layer_norm_rms_epsilon": None}))
    m("meta_falcon", 0, llama_meta("falcon"))
    m("meta_value_length", 0, llama_meta(**{".attention.value_length": ("u32", 16)}))
    m("meta_custom_key", 0, llama_meta(**{"llama.expert_count": ("u32", 8)}))

    def g(name, kvs, tensors=()):
        write("decoder_config", name, b"\x02" + gguf_file(kvs, list(tensors)))
    whole = [("general.architecture", "str", "llama"), ("llama.block_count", "u32", 1),
             ("llama.embedding_length", "u32", 32), ("llama.feed_forward_length", "u32", 64),
             ("llama.attention.head_count", "u32", 2), ("llama.context_length", "u32", 64),
             ("llama.attention.layer_norm_rms_epsilon", "f32", 1e-6), ("llama.vocab_size", "u32", 10),
             ("tokenizer.ggml.eos_token_id", "u32", 9)]
    g("gguf_tied", whole)
    g("gguf_untied", whole, [("output.weight", [32, 10], "F32")])
    g("gguf_eos_outside", whole[:-1] + [("tokenizer.ggml.eos_token_id", "u32", 10)])
    g("gguf_truncated", whole[:4])
    write("decoder_config", "gguf_cut", b"\x02" + gguf_file(whole, [])[:-90])


GENERATED = ["safetensors", "gguf", "update", "downlink", "metrics_http", "peft", "state_files", "sealed_update", "run_config", "tokenizer", "bert_config", "rpc", "dataset", "chat_template", "decoder_config"]


def main():
    # Regenerates the seeds of the harnesses below. Reproducers of fixed findings (regress_*) and
    # the corpora this script does not make (bpe_tokenizer's, written by hand) stay.
    for h in GENERATED:
        d = os.path.join(CORPUS, h)
        for f in os.listdir(d) if os.path.isdir(d) else []:
            if not f.startswith("regress_"):
                os.remove(os.path.join(d, f))
    safetensors_seeds()
    gguf_seeds()
    update_seeds()
    downlink_seeds()
    metrics_http_seeds()
    peft_seeds()
    state_files_seeds()
    sealed_seeds()
    run_config_seeds()
    tokenizer_seeds()
    bert_config_seeds()
    rpc_seeds()
    dataset_seeds()
    chat_template_seeds()
    decoder_config_seeds()
    for h in sorted(os.listdir(CORPUS)):
        files = os.listdir(os.path.join(CORPUS, h))
        size = sum(os.path.getsize(os.path.join(CORPUS, h, f)) for f in files)
        print(f"{h}: {len(files)} seeds, {size} bytes")


if __name__ == "__main__":
    main()
