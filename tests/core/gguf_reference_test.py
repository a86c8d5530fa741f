#!/usr/bin/env python3
"""Checks core/gguf.h and core/ggml_quant.h against llama.cpp's own Python package, gguf-py.

    .venv/bin/python tests/core/gguf_reference_test.py --dump build/x/tests/core/gguf_dump synthetic
    .venv/bin/python tests/core/gguf_reference_test.py --dump ... model models/.../SmolLM2-135M-Instruct.Q4_1.gguf

synthetic: gguf-py's GGUFWriter writes files with metadata of every value type its writer has and
random tensors of every type fedlora reads (F32 and F16 from numpy; BF16, Q8_0, Q4_0, Q4_1, Q5_0,
Q5_1 through gguf.quants.quantize; Q4_K, Q5_K, Q6_K as random blocks with finite scales, which
gguf-py can dequantize but not quantize). gguf_dump (the C++ reader) must give back the metadata
exactly as written and each tensor exactly (bit for bit) as gguf.quants.dequantize does and, for
F32/F16, as the numpy source is. A big-endian file must be refused.

model: the SmolLM2-135M-Instruct Q4_1 file (scripts/setup.sh fetches it): every metadata value
(the tokenizer's 49,152 tokens and 48,900 merges included) and every tensor's type, dims, offset
and size must match GGUFReader; all F32 tensors, the Q8_0 embedding and several Q4_1 matrices must
dequantize exactly as gguf.quants.dequantize does.

Exit status: 0 pass, 1 mismatch, 77 (CTest skip) when numpy/gguf or the model file is missing.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import gguf
    from gguf import GGMLQuantizationType as Q
    from gguf import GGUFValueType as V
    from gguf.quants import dequantize, quantize
except ImportError as e:  # not installed: scripts/setup.sh --tests makes the venv
    print(f"gguf_reference_test: skipped, gguf-py not importable ({e})")
    sys.exit(77)

FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("MISMATCH:", what)


def run_dump(dump, path, outdir, tensors=()):
    p = subprocess.run([dump, path, outdir, *tensors], capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"gguf_dump failed on {path} (exit {p.returncode}): {p.stderr.strip()}")
    with open(os.path.join(outdir, "dump.json")) as f:
        return json.load(f)


def ours_value(v):
    """A gguf_dump value object -> Python: ints, floats, bytes, bools, lists."""
    if v["type"] != "ARRAY":
        return scalar(v["type"], v["value"])
    if v["elem"] == "ARRAY":
        return [ours_value(e) for e in v["values"]]
    return [scalar(v["elem"], e) for e in v["values"]]


def scalar(type_name, x):
    return bytes.fromhex(x) if type_name == "STRING" else x


def ours_types(v):
    """The type path of a value: ["ARRAY", "ARRAY", "INT32"], as GGUFReader's field.types (for a
    nested array, the types of its first element)."""
    if v["type"] != "ARRAY":
        return [v["type"]]
    if v["elem"] == "ARRAY":
        return ["ARRAY"] + (ours_types(v["values"][0]) if v["values"] else ["ARRAY"])
    return ["ARRAY", v["elem"]]


def flatten(x):
    return [z for y in x for z in flatten(y)] if isinstance(x, list) else [x]


def reader_value(field):
    """GGUFReader's field -> Python (nested arrays come back flattened, as the reader keeps them)."""
    t = field.types
    if t[0] == V.STRING:
        return bytes(field.parts[field.data[0]])
    if t[0] != V.ARRAY:
        return field.parts[field.data[0]][0].item()
    if t[-1] == V.STRING:
        return [bytes(field.parts[i]) for i in field.data]
    return [field.parts[i][0].item() for i in field.data]


def compare_metadata(ours, reader, expected=None):
    """ours: dump.json; reader: GGUFReader; expected: {key: (types, value)} as written, or None."""
    fields = [(k, f) for k, f in reader.fields.items() if not k.startswith("GGUF.")]
    keys = [bytes.fromhex(m["key"]).decode() for m in ours["metadata"]]
    check(keys == [k for k, _ in fields], f"metadata keys/order: {keys} vs {[k for k, _ in fields]}")
    for m, (key, field) in zip(ours["metadata"], fields):
        v = m["value"]
        check(ours_types(v) == [t.name for t in field.types], f"{key}: type {ours_types(v)} vs {field.types}")
        mine = ours_value(v)
        theirs = reader_value(field)
        check((flatten(mine) if isinstance(mine, list) else mine) == theirs, f"{key}: value differs from GGUFReader")
        if expected is not None:
            types, value = expected[key]
            check(ours_types(v) == types, f"{key}: type {ours_types(v)} vs written {types}")
            check(mine == value, f"{key}: {mine!r} vs written {value!r}")
    if expected is not None:
        check(sorted(expected) == sorted(keys), f"keys {sorted(keys)} vs written {sorted(expected)}")


def compare_tensor_infos(ours, reader):
    check(len(ours["tensors"]) == len(reader.tensors), "tensor count")
    check(ours["data_offset"] == reader.data_offset, f"data offset {ours['data_offset']} vs {reader.data_offset}")
    check(ours["alignment"] == reader.alignment, "alignment")
    for t, r in zip(ours["tensors"], reader.tensors):
        name = bytes.fromhex(t["name"]).decode()
        check(name == r.name, f"tensor name {name} vs {r.name}")
        check(t["type_id"] == int(r.tensor_type) and t["type"] == r.tensor_type.name, f"{name}: type")
        check(t["ne"] == [int(d) for d in r.shape], f"{name}: ne {t['ne']} vs {list(r.shape)}")
        check(t["offset"] == r.data_offset - reader.data_offset, f"{name}: offset")
        check(t["size"] == r.n_bytes, f"{name}: size {t['size']} vs {r.n_bytes}")
        check(t["rows"] * t["ne"][0] == r.n_elements, f"{name}: rows")


def ours_floats(outdir, t):
    return np.fromfile(os.path.join(outdir, t["file"]), dtype="<f4")


def same_bits(a, b):
    a = np.ascontiguousarray(a, dtype=np.float32).reshape(-1)
    b = np.ascontiguousarray(b, dtype=np.float32).reshape(-1)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def compare_tensor_data(ours, reader, outdir, sources=None):
    n = 0
    by_name = {r.name: r for r in reader.tensors}
    for t in ours["tensors"]:
        if "file" not in t:
            continue
        name = bytes.fromhex(t["name"]).decode()
        r = by_name[name]
        mine = ours_floats(outdir, t)
        ref = dequantize(r.data, r.tensor_type)
        check(same_bits(mine, ref), f"{name} ({r.tensor_type.name}): dequantized values differ from gguf-py")
        if sources is not None and name in sources:
            check(same_bits(mine, sources[name]), f"{name}: differs from the written values")
        n += 1
    return n


# --- synthetic files ---------------------------------------------------------------------------------

def finite_k_blocks(rng, qtype, n_blocks):
    """Random K-quant blocks whose fp16 scale fields are finite (the rest of the bytes is random)."""
    _, type_size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    fields = {Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [type_size - 2]}[qtype]
    for off in fields:
        scales = rng.uniform(-2, 2, size=n_blocks).astype(np.float16)
        blocks[:, off:off + 2] = scales.view(np.uint8).reshape(n_blocks, 2)
    return blocks


def write_synthetic(path, rng, alignment=None):
    w = gguf.GGUFWriter(path, arch="fedlora-test")
    expected = {"general.architecture": (["STRING"], b"fedlora-test")}

    def put(kind, key, value, types, stored=None):
        getattr(w, "add_" + kind)(key, value)
        expected[key] = (types, value if stored is None else stored)

    if alignment is not None:
        w.add_custom_alignment(alignment)
        expected["general.alignment"] = (["UINT32"], alignment)
    f32 = float(np.float32(rng.standard_normal()))
    put("uint8", "t.u8", 255, ["UINT8"])
    put("int8", "t.i8", -128, ["INT8"])
    put("uint16", "t.u16", 65535, ["UINT16"])
    put("int16", "t.i16", -32768, ["INT16"])
    put("uint32", "t.u32", 2**32 - 1, ["UINT32"])
    put("int32", "t.i32", -2**31, ["INT32"])
    put("float32", "t.f32", f32, ["FLOAT32"])
    put("bool", "t.true", True, ["BOOL"])
    put("bool", "t.false", False, ["BOOL"])
    put("string", "t.str", "h\u00e9llo w\u00f6rld \u2713", ["STRING"], "h\u00e9llo w\u00f6rld \u2713".encode())
    put("uint64", "t.u64", 2**64 - 1, ["UINT64"])
    put("int64", "t.i64", -2**63, ["INT64"])
    put("float64", "t.f64", float(rng.standard_normal()) * 1e200, ["FLOAT64"])
    ints = [int(x) for x in rng.integers(-2**31, 2**31, size=257)]
    put("array", "t.ints", ints, ["ARRAY", "INT32"])
    floats = [float(np.float32(x)) for x in rng.standard_normal(100)]
    put("array", "t.floats", floats, ["ARRAY", "FLOAT32"])
    put("array", "t.bools", [True, False, True], ["ARRAY", "BOOL"])
    strs = ["", "a", "\u0120the", "\u00e9\u00e8 x", "z" * 300]
    put("array", "t.strs", strs, ["ARRAY", "STRING"], [s.encode() for s in strs])
    put("array", "t.bytes", b"\x00\x01\xfe\xff", ["ARRAY", "UINT8"], [0, 1, 254, 255])
    put("array", "t.nested", [[1, 2, 3], [-4], [5, 6]], ["ARRAY", "ARRAY", "INT32"])
    put("array", "t.nested_strs", [["x", "yy"], ["zzz"]], ["ARRAY", "ARRAY", "STRING"],
        [[b"x", b"yy"], [b"zzz"]])

    sources = {}
    shapes = [(3, 64), (2, 2, 96), (2, 2, 2, 32)]
    for i, shape in enumerate(shapes):
        x = (rng.standard_normal(shape) * 3).astype(np.float32)
        w.add_tensor(f"f32.{i}", x)
        sources[f"f32.{i}"] = x
        h = x.astype(np.float16)
        w.add_tensor(f"f16.{i}", h)
        sources[f"f16.{i}"] = h.astype(np.float32)
        for qt in (Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1):
            w.add_tensor(f"{qt.name.lower()}.{i}", quantize(x, qt), raw_dtype=qt)
    # A 1-d tensor, a tensor with a constant block (d = 0) and one with large values.
    w.add_tensor("q8_0.vector", quantize(np.linspace(-1, 1, 64, dtype=np.float32), Q.Q8_0), raw_dtype=Q.Q8_0)
    w.add_tensor("q4_1.flat", quantize(np.full((2, 32), 0.75, dtype=np.float32), Q.Q4_1), raw_dtype=Q.Q4_1)
    w.add_tensor("q4_0.big", quantize((rng.standard_normal((1, 64)) * 3e4).astype(np.float32), Q.Q4_0),
                 raw_dtype=Q.Q4_0)
    for qt in (Q.Q4_K, Q.Q5_K, Q.Q6_K):
        for rows, blocks in ((1, 1), (3, 2)):
            b = finite_k_blocks(rng, qt, rows * blocks).reshape(rows, -1)
            w.add_tensor(f"{qt.name.lower()}.{rows}x{blocks}", b, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return expected, sources


def synthetic(dump):
    rng = np.random.default_rng(20240601)
    tensors = 0
    with tempfile.TemporaryDirectory() as tmp:
        for alignment in (None, 64):
            path = os.path.join(tmp, f"synthetic_{alignment}.gguf")
            expected, sources = write_synthetic(path, rng, alignment)
            out = os.path.join(tmp, f"out_{alignment}")
            os.makedirs(out)
            ours = run_dump(dump, path, out)
            reader = gguf.GGUFReader(path)
            check(ours["version"] == 3, "version")
            compare_metadata(ours, reader, expected)
            compare_tensor_infos(ours, reader)
            n = compare_tensor_data(ours, reader, out, sources)
            check(n == len(reader.tensors) and n > 0, f"{n} of {len(reader.tensors)} tensors dumped")
            tensors += n
        # A big-endian file (gguf-py can write one) is refused with a clear error.
        path = os.path.join(tmp, "big_endian.gguf")
        w = gguf.GGUFWriter(path, arch="be", endianess=gguf.GGUFEndian.BIG)
        w.add_uint32("x", 1)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        p = subprocess.run([dump, path, tmp], capture_output=True, text=True)
        check(p.returncode == 1 and "big-endian" in p.stderr, f"big-endian file: exit {p.returncode}, {p.stderr}")
    print(f"gguf_reference_test: synthetic: 2 files, {tensors} tensors compared")


# --- the SmolLM2 model -------------------------------------------------------------------------------

def model(dump, path):
    if not os.path.exists(path):
        print(f"gguf_reference_test: skipped, {path} is missing (scripts/setup.sh fetches it)")
        sys.exit(77)
    reader = gguf.GGUFReader(path)
    by_type = {}
    for r in reader.tensors:
        by_type.setdefault(r.tensor_type.name, []).append(r.name)
    q41 = by_type.get("Q4_1", [])
    chosen = by_type.get("F32", []) + by_type.get("Q8_0", []) + q41[:7] + q41[-3:]
    with tempfile.TemporaryDirectory() as tmp:
        ours = run_dump(dump, path, tmp, chosen)
        check(ours["version"] == int(reader.fields["GGUF.version"].parts[0][0]), "version")
        compare_metadata(ours, reader)
        compare_tensor_infos(ours, reader)
        n = compare_tensor_data(ours, reader, tmp)
    tokens = next(m for m in ours["metadata"] if bytes.fromhex(m["key"]) == b"tokenizer.ggml.tokens")
    merges = next(m for m in ours["metadata"] if bytes.fromhex(m["key"]) == b"tokenizer.ggml.merges")
    print(f"gguf_reference_test: model: {len(ours['metadata'])} kv pairs ({len(tokens['value']['values'])} "
          f"tokens, {len(merges['value']['values'])} merges), {len(ours['tensors'])} tensor infos, {n} tensors "
          f"compared ({', '.join(f'{k}: {len(v)}' for k, v in sorted(by_type.items()))} in the file)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dump", required=True, help="the gguf_dump binary")
    ap.add_argument("part", choices=["synthetic", "model"])
    ap.add_argument("model_path", nargs="?")
    args = ap.parse_args()
    if args.part == "synthetic":
        synthetic(args.dump)
    else:
        if not args.model_path:
            ap.error("model needs the path of the GGUF file")
        model(args.dump, args.model_path)
    if FAILURES:
        print(f"gguf_reference_test: {len(FAILURES)} mismatches")
        return 1
    print("gguf_reference_test: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
