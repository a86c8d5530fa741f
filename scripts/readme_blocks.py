#!/usr/bin/env python3
"""Runs the shell blocks of README.md (or other Markdown files) as a user would paste them.

    scripts/readme_blocks.py                  # every ```sh block of README.md, in order
    scripts/readme_blocks.py --list           # what would run, with the rules applied
    scripts/readme_blocks.py --only 120       # only the block holding line 120 (without the
                                              # variables earlier blocks would have set)
    scripts/readme_blocks.py --quick          # not the blocks marked slow (CI's subset)
    make readme-check                         # the first line (README_ARGS=--quick: the last)

Every fenced block tagged sh, bash or shell runs, in file order, in a scratch copy of the tree:
the files git tracks or would track, with models/, data/ and .venv/ linked to this tree's and
build/default linked to --build-dir (default: this tree's build/default, as `make test` leaves
it). The blocks share one shell session as a reader's pasted blocks do: a variable a block sets
(`B=...`) is there in the next. Each block runs under `set -e`; a block's background jobs
(`cmd &`) are waited for when it ends, and one that fails fails the block. A block that fails or
runs past its timeout is reported by its line in the file, with the failing command and the
last lines of its output; its process group is killed. Exit status: 0 when every block passed.

The rules, all visible in the Markdown source: HTML comments right above a block's fence, one
rule each, apply to that block only.

  <!-- readme-check: skip (REASON) -->       not run; the reason is required and printed
  <!-- readme-check: slow (REASON) -->       not run with --quick
  <!-- readme-check: env NAME=VALUE ... -->  set in the block's environment
  <!-- readme-check: replace 'OLD' 'NEW' --> shortening: OLD (which must occur in the block) is
                                             replaced by NEW before the block runs
  <!-- readme-check: before COMMAND -->      a command run first, in the block's session
  <!-- readme-check: timeout SECONDS -->     the block's time limit (default: --timeout)

One rule holds for every block, since the check runs on a tree that `make build` already built
(a copy cannot reuse the CMake build tree of another path): a `make build` in a block, alone or
in a list such as `scripts/setup.sh && make build`, is left out and said so.

Limits (those of a pasted shell too): under `set -e` a failure in the middle of an `a && b`
list does not stop the block, the later commands then fail instead.
"""

import argparse
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^```(\S*)\s*$")
RULE = re.compile(r"^<!--\s*readme-check:\s*(.*?)\s*-->\s*$")
SHELL_TAGS = {"sh", "bash", "shell"}
ASSIGNMENT = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=")
MAKE_BUILD = re.compile(r"(^|&&)\s*make build\s*(?=&&|$|#)")
LINKED = ("models", "data", ".venv")


@dataclass
class Block:
    path: Path
    line: int  # line of the first command (the one after the fence), 1-based
    text: str
    skip: str = ""
    slow: str = ""
    env: dict = field(default_factory=dict)
    before: list = field(default_factory=list)
    timeout: float = 0
    notes: list = field(default_factory=list)


def fail(message):
    print(f"readme-check: {message}", file=sys.stderr)
    sys.exit(2)


def apply_rule(block, rule, where):
    verb, _, rest = rule.partition(" ")
    if verb in ("skip", "slow"):
        if not re.fullmatch(r"\(.+\)", rest):
            fail(f"{where}: {verb} needs a reason in parentheses: {verb} (needs podman)")
        setattr(block, verb, rest[1:-1])
    elif verb == "env":
        for item in shlex.split(rest):
            name, eq, value = item.partition("=")
            if not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                fail(f"{where}: env takes NAME=VALUE items, not '{item}'")
            block.env[name] = value
    elif verb == "replace":
        parts = shlex.split(rest)
        if len(parts) != 2:
            fail(f"{where}: replace takes two quoted strings, 'OLD' 'NEW'")
        old, new = parts
        if old not in block.text:
            fail(f"{where}: replace: '{old}' does not occur in the block (a stale rule?)")
        block.text = block.text.replace(old, new)
        block.notes.append(f"'{old}' -> '{new}'")
    elif verb == "before":
        if not rest:
            fail(f"{where}: before needs a command")
        block.before.append(rest)
    elif verb == "timeout":
        try:
            block.timeout = float(rest)
        except ValueError:
            fail(f"{where}: timeout takes seconds, not '{rest}'")
    else:
        fail(f"{where}: unknown rule '{verb}' (skip, slow, env, replace, before, timeout)")


def parse(path):
    lines = path.read_text().splitlines()
    blocks, rules, i = [], [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            r = RULE.match(lines[i])
            rules = rules + [(i + 1, r.group(1))] if r else []
            i += 1
            continue
        start, tag = i, m.group(1)
        i += 1
        while i < len(lines) and not lines[i].startswith("```"):
            i += 1
        if i >= len(lines):
            fail(f"{path}:{start + 1}: fence not closed")
        if tag in SHELL_TAGS:
            block = Block(path, start + 2, "\n".join(lines[start + 1:i]))
            for line, rule in rules:
                apply_rule(block, rule, f"{path.name}:{line}")
            blocks.append(block)
        elif rules:
            fail(f"{path.name}:{rules[0][0]}: readme-check rules above a '{tag}' block, which never runs")
        rules = []
        i += 1
    return blocks


def leave_out_make_build(block):
    out = []
    for n, line in enumerate(block.text.split("\n")):
        new = MAKE_BUILD.sub(lambda m: "", line)
        if new != line:
            new = re.sub(r"^\s*&&\s*|\s*&&\s*$", "", new.rstrip()) or ":"
            block.notes.append(f"line {block.line + n}: 'make build' left out (the tree is built)")
        out.append(new)
    block.text = "\n".join(out)


def make_scratch(build_dir):
    scratch = Path(tempfile.mkdtemp(prefix="readme-check-"))
    listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT,
                            check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        if name.split("/")[0] in LINKED or name.startswith("build/"):
            continue
        src, dst = ROOT / name, scratch / name
        if not src.exists() and not src.is_symlink():
            continue  # deleted in the work tree, not yet in git
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst, follow_symlinks=False)
    for name in LINKED:
        if (ROOT / name).exists():
            (scratch / name).symlink_to((ROOT / name).resolve())
    (scratch / "build").mkdir(exist_ok=True)
    (scratch / "build" / "default").symlink_to(build_dir.resolve())
    return scratch


def block_script(block, scratch, state, offset_line, names):
    """The block as a bash script whose line offset_line + k is the block's line k; it saves the
    variables `names` (and those the block sets) to `state` for the next block."""
    head = [
        "set -eE",
        f"cd {shlex.quote(str(scratch))}",
        f"[[ -f {shlex.quote(str(state))} ]] && source {shlex.quote(str(state))}",
        *(f"export {k}={shlex.quote(v)}" for k, v in block.env.items()),
        f"trap 'echo \"readme-check: {block.path.name}:{block.line}: a before rule failed, "
        "exit $?: $BASH_COMMAND\" >&2' ERR",
        *block.before,
        f"trap 'echo \"readme-check: {block.path.name}:$((LINENO + {block.line - offset_line})): "
        "exit $?: $BASH_COMMAND\" >&2' ERR",
    ]
    assert len(head) < offset_line
    head += [":"] * (offset_line - 1 - len(head))
    names.update(m.group(1) for line in block.text.split("\n") if (m := ASSIGNMENT.match(line)))
    tail = [
        "trap - ERR",
        "__jobs=$(jobs -l)",
        "__failed=0",
        "for __p in $(jobs -p); do",
        "  wait \"$__p\" || { __rc=$?; __failed=1",
        "    echo \"readme-check: background job exited $__rc: $(grep -w \"$__p\" <<<\"$__jobs\")\" >&2; }",
        "done",
        f"for __n in {' '.join(sorted(names))}; do declare -p $__n 2>/dev/null || true; done"
        f" > {shlex.quote(str(state))}" if names else ":",
        "exit $__failed",
    ]
    return "\n".join(head + block.text.split("\n") + tail) + "\n"


def run_block(block, scratch, state, names, default_timeout, log):
    offset_line = 20
    script = scratch / ".readme-check-block.sh"
    script.write_text(block_script(block, scratch, state, offset_line, names))
    limit = block.timeout or default_timeout
    t0 = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen(["bash", str(script)], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            rc = proc.wait(timeout=limit)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out, rc = True, None
    # Whatever the block left behind (a server after a failure, a timed-out block's jobs) goes.
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        time.sleep(2 if sig == signal.SIGTERM else 0)
    proc.wait()
    return rc, timed_out, time.monotonic() - t0, limit


def report_failure(block, log, rc, timed_out, limit):
    text = Path(log).read_text(errors="replace")
    lines = text.splitlines()
    where = [l for l in lines if l.startswith("readme-check: ")]
    what = f"timed out after {limit:.0f} s" if timed_out else f"failed (exit {rc})"
    print(f"readme-check: FAIL {block.path.name}:{block.line} {what}")
    for line in where:
        print(f"  {line}")
    print("  last lines of its output:")
    for line in lines[-30:]:
        print(f"    {line}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="*", type=Path, default=[ROOT / "README.md"])
    ap.add_argument("--build-dir", type=Path, default=ROOT / "build" / "default",
                    help="the built tree to link as build/default (default: this tree's)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per block (default 300)")
    ap.add_argument("--only", type=int, action="append", default=[],
                    help="run only the block holding this line (repeatable)")
    ap.add_argument("--quick", action="store_true", help="leave out the blocks marked slow")
    ap.add_argument("--list", action="store_true", help="print the blocks as they would run")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    args = ap.parse_args()

    blocks = []
    for path in args.files:
        for block in parse(path.resolve()):
            leave_out_make_build(block)
            if args.quick and block.slow and not block.skip:
                block.skip = f"slow: {block.slow}; --quick"
            blocks.append(block)
    if args.only:
        def holds(b, n):
            return b.line - 1 <= n < b.line + b.text.count("\n") + 1
        blocks = [b for b in blocks if any(holds(b, n) for n in args.only)]
        if not blocks:
            fail(f"no shell block holds line {args.only}")
    if args.list:
        for b in blocks:
            print(f"== {b.path.name}:{b.line}" + (f"  SKIP ({b.skip})" if b.skip else ""))
            for note in b.notes:
                print(f"   rule: {note}")
            for cmd in b.before:
                print(f"   before: {cmd}")
            print(b.text)
        return 0
    if not (args.build_dir / "tools" / "fedlora").exists():
        fail(f"{args.build_dir}/tools/fedlora is missing: build first (make build)")

    scratch = make_scratch(args.build_dir)
    state = scratch / ".readme-check-state"
    failures, t_all, names = 0, time.monotonic(), set()
    try:
        for b in blocks:
            if b.skip:
                print(f"readme-check: skip {b.path.name}:{b.line} ({b.skip})")
                continue
            for note in b.notes:
                print(f"readme-check:   {b.path.name}:{b.line}: {note}")
            log = scratch / f".readme-check-{b.line}.log"
            rc, timed_out, seconds, limit = run_block(b, scratch, state, names, args.timeout, log)
            if rc == 0 and not timed_out:
                print(f"readme-check: ok   {b.path.name}:{b.line} ({seconds:.0f} s)", flush=True)
            else:
                failures += 1
                report_failure(b, log, rc, timed_out, limit)
    finally:
        if args.keep:
            print(f"readme-check: scratch copy kept in {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    ran = sum(1 for b in blocks if not b.skip)
    print(f"readme-check: {ran - failures} of {ran} blocks passed, {len(blocks) - ran} skipped, "
          f"{time.monotonic() - t_all:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
