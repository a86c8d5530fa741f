"""Runs a command and reports its wall time, the peak memory and the CPU use of its process tree.

    python3 bench/sim/pss_peak.py --json run.json --log run.log -- CMD ARGS...

Every 0.5 s it sums Pss (from /proc/PID/smaps_rollup) over the command's process and all its
descendants: a Ray tree's workers and daemons as well as a single process. PSS splits shared pages
among the processes mapping them, so shared libraries and shared memory are counted once. The
command's stdout and stderr go to --log. With the same samples it follows the tree's CPU time
(utime + stime of the live processes, from /proc/PID/stat): how many cores were busy on average
and in what share of the intervals more than 1.2 cores were (a process that exits between two
samples takes its last interval's time with it). Writes {"seconds", "peak_pss_mib",
"peak_processes", "cpu_seconds", "mean_cores", "share_above_1_2_cores", "exit_code"} to --json
and exits with the command's status. Linux only; standard library only.
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


def cpu_ticks(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    except (OSError, IndexError, ValueError):
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

    hz = os.sysconf("SC_CLK_TCK")
    peak_kib, peak_procs = 0, 0
    ticks_seen: dict[int, int] = {}  # pid -> its utime + stime at the last sample
    cpu_total, intervals, busy = 0.0, 0, 0
    start = time.monotonic()
    last = start
    with open(args.log, "wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        while proc.poll() is None:
            pids = tree(proc.pid)
            sizes = [pss_kib(pid) for pid in pids]
            if sum(sizes) > peak_kib:
                peak_kib, peak_procs = sum(sizes), sum(1 for s in sizes if s)
            now, delta = time.monotonic(), 0
            for pid in pids:
                ticks = cpu_ticks(pid)
                delta += max(0, ticks - ticks_seen.get(pid, 0))
                ticks_seen[pid] = ticks
            if now > last:
                cores = delta / hz / (now - last)
                cpu_total += delta / hz
                intervals += 1
                busy += cores > 1.2
            last = now
            time.sleep(args.interval)
    seconds = time.monotonic() - start

    result = {"seconds": round(seconds, 2), "peak_pss_mib": round(peak_kib / 1024, 1),
              "peak_processes": peak_procs, "cpu_seconds": round(cpu_total, 1),
              "mean_cores": round(cpu_total / seconds, 2) if seconds > 0 else 0.0,
              "share_above_1_2_cores": round(busy / intervals, 3) if intervals else 0.0,
              "exit_code": proc.returncode}
    with open(args.json, "w") as f:
        json.dump(result, f)
        f.write("\n")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
