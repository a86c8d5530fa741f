#!/usr/bin/env python3
"""Fails when a kernel op has no GPU equivalence test.

An op is a public dispatcher declared in kernels/*.h or kernels/base/*.h as
    absl::Status Name(const ExecContext& ctx, const SomeArgs& args);
(the *Cpu / *Cuda halves and CanRun are not ops). Each op must be called in
tests/kernels/backend_equivalence_test.cc, the test that runs it on CUDA and on the CPU and
compares the two. Usage: gpu_coverage_test.py [repository root]
"""
import pathlib
import re
import sys

OP = re.compile(r"^absl::Status (\w+)\(const ExecContext& ctx, const \w+& args\);", re.M)


def ops_in(headers):
    """{op name: header} for every dispatcher declared in the given {name: text} headers."""
    found = {}
    for name, text in headers.items():
        for op in OP.findall(text):
            if op.endswith(("Cpu", "Cuda")) or op == "CanRun":
                continue
            found[op] = name
    return found


def untested(ops, test_text):
    return sorted(op for op in ops if not re.search(r"\b%s\(" % op, test_text))


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parents[2])
    headers = {str(p.relative_to(root)): p.read_text()
               for d in ("kernels", "kernels/base") for p in sorted((root / d).glob("*.h"))}
    test_text = (root / "tests/kernels/backend_equivalence_test.cc").read_text()

    # The checker itself: an op absent from the test must be reported, a present one must not.
    fake = {"fake.h": "absl::Status FakeOp(const ExecContext& ctx, const FakeArgs& args);\n"
                      "absl::Status FakeOpCuda(const ExecContext& ctx, const FakeArgs& args);\n"}
    assert ops_in(fake) == {"FakeOp": "fake.h"}, ops_in(fake)
    assert untested(ops_in(fake), "Gemm(ctx, a);") == ["FakeOp"]
    assert untested(ops_in(fake), "FakeOp(ctx, a);") == []

    ops = ops_in(headers)
    # A pattern that stopped matching would pass vacuously: the kernels declare 25+ ops.
    if len(ops) < 25:
        print(f"only {len(ops)} ops found in kernels/*.h; has the declaration style changed?")
        return 1
    missing = untested(ops, test_text)
    for op in missing:
        print(f"{op} ({ops[op]}) has no GPU equivalence test in tests/kernels/backend_equivalence_test.cc")
    print(f"{len(ops) - len(missing)} of {len(ops)} kernel ops have a GPU equivalence test")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
