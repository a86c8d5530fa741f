"""A small safetensors reader/writer in numpy, so the model tests need no extra Python package.

Format (https://github.com/huggingface/safetensors): 8-byte little-endian header length N, N bytes
of JSON {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}, then the
raw little-endian tensor bytes. BF16 has no numpy dtype: it is read as uint16 and widened to
float32 (the upper 16 bits of an IEEE float), and written by rounding float32 to nearest even.
"""

import json
import struct

import numpy as np

_NP_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}


def bf16_bits_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(x):
    """Round-to-nearest-even float32 -> bfloat16 bit pattern (NaN inputs are not expected here)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounding = ((u >> 16) & 1) + 0x7FFF
    return ((u + rounding) >> 16).astype(np.uint16)


def read(path):
    """Returns {name: np.ndarray}; BF16 tensors come back as float32."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = data[base + begin : base + end]
        shape = info["shape"]
        if info["dtype"] == "BF16":
            arr = bf16_bits_to_f32(np.frombuffer(raw, dtype="<u2")).reshape(shape)
        else:
            arr = np.frombuffer(raw, dtype=np.dtype(_NP_DTYPES[info["dtype"]]).newbyteorder("<"))
            arr = arr.reshape(shape).copy()
        out[name] = arr
    return out


def write(path, tensors, dtypes=None, metadata=None):
    """tensors: {name: np.ndarray}. dtypes optionally maps a name to "BF16"/"F16"/"F32"/..."""
    dtypes = dtypes or {}
    header = {}
    chunks = []
    offset = 0
    for name in sorted(tensors):
        arr = np.asarray(tensors[name])
        dtype = dtypes.get(name)
        if dtype is None:
            dtype = {v: k for k, v in _NP_DTYPES.items()}[arr.dtype.type]
        if dtype == "BF16":
            raw = f32_to_bf16_bits(arr).astype("<u2").tobytes()
        else:
            raw = np.ascontiguousarray(arr, dtype=np.dtype(_NP_DTYPES[dtype]).newbyteorder("<")).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = metadata
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the spec pads the header so tensor data is 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for raw in chunks:
            f.write(raw)
