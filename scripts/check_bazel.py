#!/usr/bin/env python3
"""Checks the Bazel BUILD files against the CMake lists they mirror (CMake is the main build).

For every directory with both a CMakeLists.txt and a BUILD file, each fedlora_cc_library
(fedlora_cc_kernels_library counts as one),
fedlora_cc_test and fedlora_cc_binary of the CMake list must have a Bazel target of the same
name (a library's Bazel name is its directory's last component or its CMake NAME) with:
  - the same C++ sources (SRCS; CUDA_SRCS are not built under Bazel), and
  - the same fedlora dependencies (fedlora::x is //x, fedlora::a_b is //a/b when that package exists).
A directory with fedlora_cc_* targets needs a BUILD file, except under bench/ and fuzz/ (which
Bazel does not build: docs/bazel.md). A target that is CMake-only says so in its directory's BUILD file with a comment line
  # cmake-only: <name> (<why>)
Exit status 1 and one line per difference when they drift; scripts/lint.sh runs this.
"""
import glob as globmod
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOT_IN_BAZEL = ("bench", "fuzz")
SKIP_DIRS = {"build", "third_party", "models", "data", ".git", ".venv", "deploy"}


def strip_cmake_comments(text):
    out = []
    for line in text.splitlines():
        in_str = False
        cut = len(line)
        for i, ch in enumerate(line):
            if ch == '"':
                in_str = not in_str
            elif ch == "#" and not in_str:
                cut = i
                break
        out.append(line[:cut])
    return "\n".join(out)


def cmake_commands(path):
    """[(command, [args])] of a CMake file, in order (args split on whitespace, quotes kept)."""
    text = strip_cmake_comments(open(path).read())
    cmds = []
    for m in re.finditer(r"\b([A-Za-z_][A-Za-z0-9_]*)\s*\(", text):
        if cmds and m.start() < cmds[-1][2]:
            continue
        depth, i = 1, m.end()
        while depth and i < len(text):
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        cmds.append((m.group(1).lower(), text[m.end():i - 1].split(), i))
    return [(c, a) for c, a, _ in cmds]


def expand(words, variables):
    out = []
    for w in words:
        m = re.fullmatch(r"\$\{(\w+)\}", w)
        if m:
            out.extend(variables.get(m.group(1), [w]))
        else:
            out.append(re.sub(r"\$\{(\w+)\}",
                              lambda v: " ".join(variables.get(v.group(1), [v.group(0)])), w))
    return out


def parse_args(words):
    args, key = {}, None
    for w in words:
        if re.fullmatch(r"[A-Z_]+", w):
            key = w
            args.setdefault(key, [])
        elif key:
            args[key].append(w)
    return args


def cmake_targets(path):
    """{name: (kind, srcs, fedlora deps)} for the fedlora_cc_* calls of one CMakeLists.txt (and the
    .cmake files it includes), with set() variables, foreach() loops and OBJECT libraries (whose
    sources count as those of the targets that link them) resolved. Both branches of an if()."""
    variables, objects, targets = {}, {}, {}
    cmds = list(cmake_commands(path))
    i = 0
    while i < len(cmds):
        cmd, words = cmds[i]
        words = expand(words, variables)
        if cmd == "include" and words[0].endswith(".cmake"):
            inc = (words[0].replace("${CMAKE_CURRENT_SOURCE_DIR}", os.path.dirname(path))
                   .replace("${PROJECT_SOURCE_DIR}", ROOT))
            cmds[i + 1:i + 1] = cmake_commands(inc)
        elif cmd == "set" and words:
            variables[words[0]] = words[1:]
        elif cmd == "foreach":
            body, depth, j = [], 1, i + 1
            while depth:
                depth += {"foreach": 1, "endforeach": -1}.get(cmds[j][0], 0)
                if depth:
                    body.append(cmds[j])
                j += 1
            var = words[0]
            items = (variables.get(words[2], []) if words[1:3] == ["IN", "LISTS"] else words[1:])
            unrolled = []
            for item in items:
                for c, a in body:
                    unrolled.append((c, [w.replace("${%s}" % var, item) for w in a]))
            cmds[i + 1:j] = unrolled
        elif cmd == "add_library" and len(words) > 1 and words[1] == "OBJECT":
            objects[words[0]] = (set(words[2:]), set())
        elif cmd == "target_link_libraries" and words and words[0] in objects:
            objects[words[0]][1].update(w for w in words[1:] if w.startswith("fedlora::"))
        elif cmd.startswith("fedlora_cc_") and cmd[len("fedlora_cc_"):] in (
                "library", "kernels_library", "test", "binary"):
            args = parse_args(words)
            srcs = set(args.get("SRCS", []))
            deps = set()
            for d in args.get("DEPS", []) + args.get("PRIVATE_DEPS", []):
                if d in objects:
                    srcs |= objects[d][0]
                    deps |= objects[d][1]
                elif d.startswith("fedlora::"):
                    deps.add(d)
            kind = cmd[len("fedlora_cc_"):].replace("kernels_library", "library")
            targets[args["NAME"][0]] = (kind, srcs, deps)
        i += 1
    return targets


def library_dirs():
    """CMake library NAME -> its directory (relative), over the whole tree."""
    found = {}
    for rel in source_dirs(with_build=False):
        for name, (kind, _, _) in cmake_targets(os.path.join(ROOT, rel, "CMakeLists.txt")).items():
            if kind == "library":
                found[name] = rel
    return found


def source_dirs(with_build=True):
    for dirpath, dirnames, filenames in os.walk(ROOT):
        rel = os.path.relpath(dirpath, ROOT)
        dirnames[:] = sorted(d for d in dirnames
                             if d not in SKIP_DIRS and not d.startswith("bazel-") and
                             not d.startswith("."))
        if rel != "." and "CMakeLists.txt" in filenames and (not with_build or
                                                             "BUILD" in filenames):
            yield rel


class Recorder:
    def __init__(self, pkg_dir):
        self.pkg_dir = pkg_dir
        self.targets = {}

    def rule(self, kind):
        def record(name=None, srcs=(), deps=(), **_):
            self.targets[name] = (kind, list(srcs), list(deps))
        return record

    def glob(self, include, exclude=(), **_):
        found = set()
        for pattern in include:
            for p in globmod.glob(os.path.join(self.pkg_dir, pattern), recursive=True):
                found.add(os.path.relpath(p, self.pkg_dir))
        for pattern in exclude:
            for p in globmod.glob(os.path.join(self.pkg_dir, pattern), recursive=True):
                found.discard(os.path.relpath(p, self.pkg_dir))
        return sorted(found)


def bazel_targets(path):
    rec = Recorder(os.path.dirname(path))
    env = {
        "load": lambda *a, **k: None,
        "package": lambda **k: None,
        "glob": rec.glob,
        "select": lambda d: next(iter(d.values())),
        "package_name": lambda: os.path.relpath(os.path.dirname(path), ROOT),
    }
    for kind in ("cc_library", "cc_test", "cc_binary", "fedlora_cc_test", "filegroup",
                 "sh_test", "genrule", "exports_files", "config_setting", "py_binary",
                 "cc_proto_library", "proto_library", "cc_grpc_library", "alias",
                 "test_suite", "sh_binary"):
        env[kind] = rec.rule(kind)
    exec(compile(open(path).read(), path, "exec"), env)
    return rec.targets


def label_package(label, pkg):
    """'//a/b' or '//a/b:c' or ':c' -> the package it names."""
    if label.startswith(":"):
        return pkg
    if not label.startswith("//"):
        return None
    return label[2:].split(":")[0]


def check_dir(rel, libs, problems):
    ctargets = cmake_targets(os.path.join(ROOT, rel, "CMakeLists.txt"))
    bz = os.path.join(ROOT, rel, "BUILD")
    btargets = bazel_targets(bz)
    cmake_only = set(re.findall(r"^# cmake-only: (\S+)", open(bz).read(), re.M))
    base = os.path.basename(rel)
    for name, (kind, srcs, deps) in sorted(ctargets.items()):
        if name in cmake_only:
            continue
        bname = name if name in btargets else (base if kind == "library" else None)
        if bname not in btargets:
            problems.append(f"{rel}/BUILD: no target for CMake's {kind} {name} "
                            f"(add it, or a line '# cmake-only: {name} (why)')")
            continue
        _, bsrcs, bdeps = btargets[bname]
        srcs = {x.replace("${CMAKE_CURRENT_LIST_DIR}/", "") for x in srcs}
        bsrcs_cc = {x for x in bsrcs if not x.endswith((".h", ".cuh", ".inc"))}
        if srcs != bsrcs_cc:
            problems.append(f"{rel}/BUILD:{bname}: sources differ from CMake's {name}: "
                            f"CMake only {sorted(srcs - bsrcs_cc)}, "
                            f"Bazel only {sorted(bsrcs_cc - srcs)}")
        bpkgs = {label_package(d, rel) for d in bdeps}
        for d in sorted(deps):
            lib = d[len("fedlora::"):]
            if lib not in libs:
                problems.append(f"{rel}/CMakeLists.txt:{name}: {d} is no fedlora_cc_library")
            elif libs[lib] not in bpkgs:
                problems.append(f"{rel}/BUILD:{bname}: lacks a dependency on //{libs[lib]} "
                                f"(CMake's {name} has {d})")


def main():
    problems = []
    libs = library_dirs()
    dirs = list(source_dirs())
    for rel in source_dirs(with_build=False):
        if rel not in dirs and not rel.startswith(NOT_IN_BAZEL) and cmake_targets(
                os.path.join(ROOT, rel, "CMakeLists.txt")):
            problems.append(f"{rel}: has CMake targets and no BUILD file")
    for rel in dirs:
        check_dir(rel, libs, problems)
    for p in problems:
        print(f"check_bazel: {p}", file=sys.stderr)
    if problems:
        print(f"check_bazel: {len(problems)} difference(s) between the CMake lists and the BUILD "
              f"files", file=sys.stderr)
        return 1
    print(f"check_bazel: {len(dirs)} BUILD files match their CMake lists")
    return 0


if __name__ == "__main__":
    sys.exit(main())
