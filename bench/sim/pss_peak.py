"""Runs a command and reports its wall time and the peak memory of its whole process tree.

    python3 bench/sim/pss_peak.py --json run.json --log run.log -- CMD ARGS...

Every 0.5 s it sums Pss (from /proc/PID/smaps_rollup) over the command's process and all its
descendants: a Ray tree's workers and daemons as well as a single process. PSS splits shared pages
among the processes mapping them, so shared libraries and shared memory are counted once. The
command's stdout and stderr go to --log. Writes {"seconds", "peak_pss_mib", "peak_processes",
"exit_code"} to --json and exits with the command's status. Linux only; standard library only.
"""

import argparse
import json
import os
import subprocess
import sys
import time


def children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    return children


def tree(root: int) -> list[int]:
    children, pids, todo = children_map(), [], [root]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        todo.extend(children.get(pid, []))
    return pids


def pss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:  # gone, or a zombie
        pass
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True, help="write the figures here")
    parser.add_argument("--log", required=True, help="the command's stdout and stderr")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between samples")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command")

    peak_kib, peak_procs = 0, 0
    start = time.monotonic()
    with open(args.log, "wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        while proc.poll() is None:
            sizes = [pss_kib(pid) for pid in tree(proc.pid)]
            if sum(sizes) > peak_kib:
                peak_kib, peak_procs = sum(sizes), sum(1 for s in sizes if s)
            time.sleep(args.interval)
    seconds = time.monotonic() - start

    result = {"seconds": round(seconds, 2), "peak_pss_mib": round(peak_kib / 1024, 1),
              "peak_processes": peak_procs, "exit_code": proc.returncode}
    with open(args.json, "w") as f:
        json.dump(result, f)
        f.write("\n")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
