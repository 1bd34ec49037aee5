#!/usr/bin/env bash
# Two iwarp-bench binaries A/B on the veth test bed, alternating run by run (the machine is
# shared and noisy: alternating puts both under the same drift), server in iwa, client in iwb,
# both `--transport xdp`. Prints one line per run: label, Gbit/s, and the client process's CPU
# time per 64 KiB message in us, user and system (`/usr/bin/time`; the client sends in write-bw
# and send-bw: its CPU time does not grow when other processes take its core, unlike Gbit/s);
# at the end the medians of each and new/base, and the median of the pairs' own ratios. For
# measuring an engine change: build the old commit, copy its binary away, build the new one.
# BASE_ARGS / NEW_ARGS: extra iwarp-bench options for both sides of the base / new runs (e.g.
# the same binary twice with BASE_ARGS="--engine-threads one" NEW_ARGS="--engine-threads
# per-queue").
# Usage: scripts/bench-engine-ab.sh BASE_BIN NEW_BIN [pairs] [pinned|free] [write-bw|read-bw|send-bw] [iterations]
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 2 ]; then
  echo "Usage: scripts/bench-engine-ab.sh BASE_BIN NEW_BIN [pairs] [pinned|free] [write-bw|read-bw|send-bw] [iterations]" >&2
  exit 2
fi
A=$1
B=$2
PAIRS=${3:-5}
PLACE=${4:-pinned}
TEST=${5:-write-bw}
N=${6:-5000}
# shellcheck source=scripts/bed-bench.sh
. scripts/bed-bench.sh bench-engine-ab
PORT=19050
sp=""
cp=""
if [ "$PLACE" = pinned ]; then sp="taskset -c 0"; cp="taskset -c 1"; fi
ra=()
rb=()
ua=()
ub=()
ta=()
tb=()
tf=$(mktemp)
# Which binary runs first alternates pair by pair (base new, new base, ...): the second run of
# a pair was measured slower than the first with the same binary in both (an A/A of write-lat
# gave base/new 0.889 with a fixed order).
for pair in $(seq 1 "$PAIRS"); do
  order="base new"
  if [ $((pair % 2)) = 0 ]; then order="new base"; fi
  for which in $order; do
    if [ "$which" = base ]; then bin=$A; xa=${BASE_ARGS:-}; else bin=$B; xa=${NEW_ARGS:-}; fi
    # shellcheck disable=SC2086
    ip netns exec iwa $sp "$bin" "$TEST" --transport xdp --iface iwa0 --port "$PORT" $xa \
      -s 65536 -n "$N" --json >/dev/null 2>&1 &
    srv=$!
    out=""
    for _ in $(seq 1 100); do
      # shellcheck disable=SC2086
      if out=$(ip netns exec iwb $cp /usr/bin/time -f "%U %S" -o "$tf" "$bin" "$TEST" \
        --transport xdp --iface iwb0 --port "$PORT" $xa -s 65536 -n "$N" --json 10.77.0.1 \
        2>/dev/null); then break; fi
      sleep 0.1
    done
    wait "$srv" || true
    PORT=$((PORT + 1))
    g=$(echo "$out" | python3 -c \
      "import json,sys; print(round(json.loads(sys.stdin.read())['results'][0]['gbit_per_sec'], 2))")
    u=$(python3 -c "import sys; u, s = map(float, open(sys.argv[1]).read().split()[-2:]); \
print(f'{u * 1e6 / $N:.1f} {s * 1e6 / $N:.1f} {(u + s) * 1e6 / $N:.1f}')" "$tf")
    echo "$which $g Gbit/s, client CPU us/message user sys total: $u"
    read -r cu _ ct <<<"$u"
    if [ "$which" = base ]; then ra+=("$g"); ua+=("$cu"); ta+=("$ct"); else
      rb+=("$g"); ub+=("$cu"); tb+=("$ct"); fi
  done
done
rm -f "$tf"
python3 -c "
import statistics, sys
m = [statistics.median(float(x) for x in v.split()) for v in sys.argv[1:]]
print(f'median base {m[0]:.2f} new {m[1]:.2f} Gbit/s, new/base {m[1] / m[0]:.3f}; '
      f'client CPU us/message: user base {m[2]:.1f} new {m[3]:.1f}, new/base {m[3] / m[2]:.3f}, '
      f'user+sys base {m[4]:.1f} new {m[5]:.1f}, new/base {m[5] / m[4]:.3f} '
      f'($TEST, $PLACE, {len(sys.argv[1].split())} pairs, -n $N)')
# Each pair's own ratio: both runs of a pair saw the same phase of a drifting machine.
r = sorted(float(n) / float(b) for b, n in zip(sys.argv[1].split(), sys.argv[2].split()))
print(f'pairs new/base: median {statistics.median(r):.3f}, '
      f'quartiles {r[len(r) // 4]:.3f} {r[(3 * len(r)) // 4]:.3f}')
" "${ra[*]}" "${rb[*]}" "${ua[*]}" "${ub[*]}" "${ta[*]}" "${tb[*]}"
