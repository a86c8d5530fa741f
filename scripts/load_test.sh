#!/usr/bin/env bash
# The aggregation server under load (make load): runs bench/load's load_server_bench REPS times
# (default 3) and prints each run's report, then the median of every figure over the runs.
#
#   scripts/load_test.sh <build_dir> [bench args...]     e.g. scripts/load_test.sh build/default rounds=4
#   REPS=5 scripts/load_test.sh build/default
#
# Each run's full output is kept in <build_dir>/load-results/rep-<n>.txt. Exit status: 0 every run
# valid; 2 a run completed with validation problems (a live client declared dead, a round short of
# updates, a wrong adapter); 1 a run failed to start. The speed goal (Heartbeat p99 < 100 ms in
# every phase) is printed beside the figures, never turned into the exit status.
set -euo pipefail

if [[ $# -lt 1 ]]; then
  echo "usage: $0 <build_dir> [load_server_bench args...]" >&2
  exit 1
fi
build_dir=$1
shift
bench="$build_dir/bench/load/load_server_bench"
if [[ ! -x "$bench" ]]; then
  echo "$bench not found: build the load_server_bench target first" >&2
  exit 1
fi
reps=${REPS:-3}
out="$build_dir/load-results"
mkdir -p "$out"
rm -f "$out"/rep-*.txt

status=0
for ((i = 1; i <= reps; i++)); do
  echo "=== load run $i of $reps: $bench $*"
  rc=0
  "$bench" "$@" >"$out/rep-$i.txt" 2>"$out/rep-$i.stderr" || rc=$?
  grep -v '^figure ' "$out/rep-$i.txt" || true
  if [[ $rc -eq 1 ]]; then
    echo "run $i failed to start:" >&2
    tail -20 "$out/rep-$i.stderr" >&2
    exit 1
  fi
  [[ $rc -eq 2 ]] && status=2
done

echo
echo "=== medians over $reps runs (figure: median  [each run])"
# Keys in the first run's order, then any that only later runs printed.
keys=$( (awk '$1 == "figure" {print $2}' "$out/rep-1.txt"; awk '$1 == "figure" {print $2}' "$out"/rep-*.txt) |
  awk '!seen[$0]++')
for key in $keys; do
  vals=$(awk -v k="$key" '$1 == "figure" && $2 == k {print $3}' "$out"/rep-*.txt)
  median=$(echo "$vals" | sort -g | awk '{v[NR] = $1} END {if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2}')
  printf '%-34s %12s  [%s]\n' "$key" "$median" "$(echo "$vals" | tr '\n' ' ' | sed 's/ $//')"
done

median_of() {
  awk -v k="$1" '$1 == "figure" && $2 == k {print $3}' "$out"/rep-*.txt | sort -g |
    awk '{v[NR] = $1} END {if (NR == 0) print "n/a"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2}'
}
echo
# The heartbeats the goal is measured on: the prober's (every client's heartbeat, from a process
# that moves no bulk data), else the clients' own (probe_process=0).
hb=heartbeat
what="Heartbeat"
if [[ $(median_of "probe_heartbeat.agg.p99_ms") != n/a ]]; then hb=probe_heartbeat; what="Heartbeat (prober)"; fi
met=MET
for phase in burst agg other; do
  p99=$(median_of "$hb.$phase.p99_ms")
  echo "$what p99, $phase phase: median $p99 ms (goal < 100 ms)"
  if [[ $p99 == n/a ]]; then
    [[ $met == MISSED ]] || met="NOT MEASURED (no $phase heartbeats)"
  elif awk -v x="$p99" 'BEGIN {exit !(x >= 100)}'; then
    met=MISSED
  fi
done
echo "goal: $what p99 < 100 ms in every phase (medians): $met"
dead=$(awk '$1 == "figure" && $2 == "liveness.declared_dead" {print $3}' "$out"/rep-*.txt | tr '\n' ' ')
live=$(awk '$1 == "figure" && $2 == "liveness.min_connected" {print $3}' "$out"/rep-*.txt | tr '\n' ' ')
echo "live clients declared dead, per run: $dead; server's lowest live count, per run: $live"
if [[ $status -ne 0 ]]; then
  echo "at least one run had validation problems (see above and $out/rep-*.txt)"
fi
exit $status
