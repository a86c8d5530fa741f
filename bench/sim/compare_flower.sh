#!/usr/bin/env bash
# fedlora simulate against Flower's simulation of the same federation (bench/sim/flower_iid.py),
# back to back and alternating (odd reps fedlora first, even reps Flower first). Each run goes
# through bench/sim/pss_peak.py: wall time of the whole process, and the peak PSS summed over its
# process tree (fedlora's one process; Flower's driver, Ray daemons and workers).
#
#   bench/sim/compare_flower.sh [--reps 3] [--rounds R] [--config configs/iid.json]
#                               [--fedlora build/default/tools/fedlora] [--work DIR] [--json FILE]
#
# Needs `scripts/setup.sh --flower` (.venv-flower) and a built fedlora. --rounds overrides the
# config's rounds in both (for a quick check). Prints each run's wall time, final accuracy and
# peak memory, then the medians and the ratios fedlora / Flower; --json writes all of it.
set -euo pipefail
cd "$(dirname "$0")/../.."

REPS=3
ROUNDS=0
CONFIG=configs/iid.json
FEDLORA=build/default/tools/fedlora
WORK=""
JSON=""
while (($#)); do
  case "$1" in
    --reps) REPS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --config) CONFIG=$2; shift 2 ;;
    --fedlora) FEDLORA=$2; shift 2 ;;
    --work) WORK=$2; shift 2 ;;
    --json) JSON=$2; shift 2 ;;
    *) echo "usage: $0 [--reps N] [--rounds R] [--config FILE] [--fedlora BIN] [--work DIR] [--json FILE]" >&2; exit 2 ;;
  esac
done
[[ -x .venv-flower/bin/python ]] || { echo "compare_flower: no .venv-flower; run scripts/setup.sh --flower" >&2; exit 1; }
[[ -x $FEDLORA ]] || { echo "compare_flower: no $FEDLORA; build it (make build)" >&2; exit 1; }
WORK=${WORK:-$(mktemp -d /tmp/compare-flower.XXXXXX)}
mkdir -p "$WORK"

rounds_flag=()
((ROUNDS > 0)) && rounds_flag=(--rounds "$ROUNDS")

# Adds the final accuracy (from $2, key final_accuracy) to pss_peak's figures ($1.mem.json): $1.json.
merge() {
  /usr/bin/python3 -c '
import json, sys
run = json.load(open(sys.argv[1] + ".mem.json"))
run["final_accuracy"] = json.load(open(sys.argv[2]))["final_accuracy"]
json.dump(run, open(sys.argv[1] + ".json", "w"))
' "$1" "$2"
}

report() {  # system rep file
  /usr/bin/python3 -c '
import json, sys
name, rep, r = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3]))
load = open("/proc/loadavg").read().split()[0]
print("%-8s rep %s: %8.1f s  accuracy %.4f  peak PSS %7.1f MiB (%d processes)  load %s" % (
    name, rep, r["seconds"], r["final_accuracy"], r["peak_pss_mib"], r["peak_processes"], load), flush=True)
' "$@"
}

run_fedlora() {  # rep
  local d=$WORK/fedlora-$1
  rm -rf "$d"
  /usr/bin/python3 bench/sim/pss_peak.py --json "$d.mem.json" --log "$d.log" -- \
    "$FEDLORA" simulate --config "$CONFIG" --out "$d" --progress=false "${rounds_flag[@]}"
  merge "$d" "$d/summary.json"
  report fedlora "$1" "$d.json"
}

run_flower() {  # rep
  local d=$WORK/flower-$1
  /usr/bin/python3 bench/sim/pss_peak.py --json "$d.mem.json" --log "$d.log" -- \
    .venv-flower/bin/python bench/sim/flower_iid.py --config "$CONFIG" --out "$d.result.json" "${rounds_flag[@]}"
  merge "$d" "$d.result.json"
  report flower "$1" "$d.json"
}

echo "compare_flower: $REPS reps of $CONFIG, rounds: $( ((ROUNDS > 0)) && echo "$ROUNDS" || echo "the config's");" \
  "logs in $WORK; load $(cut -d' ' -f1-3 /proc/loadavg)"
for ((i = 1; i <= REPS; i++)); do
  if ((i % 2)); then run_fedlora "$i"; run_flower "$i"; else run_flower "$i"; run_fedlora "$i"; fi
done

/usr/bin/python3 - "$WORK" "$REPS" "$JSON" "$CONFIG" "$ROUNDS" <<'EOF'
import json, statistics, sys
work, reps, out, config, rounds = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
runs = {s: [json.load(open(f"{work}/{s}-{i}.json")) for i in range(1, reps + 1)] for s in ("fedlora", "flower")}
med = {s: {k: statistics.median(r[k] for r in runs[s]) for k in ("seconds", "peak_pss_mib", "final_accuracy")}
       for s in runs}
ratio = {k: med["fedlora"][k] / med["flower"][k] for k in ("seconds", "peak_pss_mib")}
for s in runs:
    m = med[s]
    print(f"median {s:8}: {m['seconds']:8.1f} s  accuracy {m['final_accuracy']:.4f}  peak PSS {m['peak_pss_mib']:7.1f} MiB")
print(f"fedlora / Flower: wall time {ratio['seconds']:.3f}, peak PSS {ratio['peak_pss_mib']:.3f}")
if out:
    with open(out, "w") as f:
        json.dump({"config": config, "rounds": rounds or None, "reps": reps, "runs": runs, "median": med,
                   "ratio_fedlora_over_flower": ratio}, f, indent=1)
        f.write("\n")
EOF
