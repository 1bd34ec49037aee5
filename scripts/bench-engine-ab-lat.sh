#!/usr/bin/env bash
# Two iwarp-bench binaries A/B on the veth test bed for latency, alternating run by run (the
# machine is noisy: alternating puts both under the same drift): write-lat (or another latency
# test) of SIZE octets, server in iwa, client in iwb, both `--transport xdp`. One line per run:
# label, median (t_typical) and p99 in us; at the end the medians of each and new/base, and
# the median of the pairs' own ratios.
# Companion of bench-engine-ab.sh (bandwidth). BASE_ARGS / NEW_ARGS as there.
# Usage: scripts/bench-engine-ab-lat.sh BASE_BIN NEW_BIN [pairs] [pinned|free] [write-lat|send-lat|read-lat] [iterations] [size]
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 2 ]; then
  echo "Usage: scripts/bench-engine-ab-lat.sh BASE_BIN NEW_BIN [pairs] [pinned|free] [write-lat|send-lat|read-lat] [iterations] [size]" >&2
  exit 2
fi
A=$1
B=$2
PAIRS=${3:-6}
PLACE=${4:-pinned}
TEST=${5:-write-lat}
N=${6:-20000}
SIZE=${7:-64}
# shellcheck source=scripts/bed-bench.sh
SKIP_BUILD=1 . scripts/bed-bench.sh bench-engine-ab-lat
PORT=19150
sp=""
cp=""
if [ "$PLACE" = pinned ]; then sp="taskset -c 0"; cp="taskset -c 1"; fi
pa=()
pb=()
qa=()
qb=()
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
      -s "$SIZE" -n "$N" --json >/dev/null 2>&1 &
    srv=$!
    out=""
    for _ in $(seq 1 100); do
      # shellcheck disable=SC2086
      if out=$(ip netns exec iwb $cp "$bin" "$TEST" --transport xdp --iface iwb0 --port "$PORT" \
        $xa -s "$SIZE" -n "$N" --json 10.77.0.1 2>/dev/null); then break; fi
      sleep 0.1
    done
    wait "$srv" || true
    PORT=$((PORT + 1))
    read -r p50 p99 < <(echo "$out" | python3 -c \
      "import json,sys; r = json.loads(sys.stdin.read())['results'][0]; \
print(round(r['t_typical_us'], 2), round(r['p99_us'], 2))")
    echo "$which t_typical $p50 us, p99 $p99 us"
    if [ "$which" = base ]; then pa+=("$p50"); qa+=("$p99"); else pb+=("$p50"); qb+=("$p99"); fi
  done
done
python3 -c "
import statistics, sys
m = [statistics.median(float(x) for x in v.split()) for v in sys.argv[1:]]
print(f'median t_typical base {m[0]:.2f} new {m[1]:.2f} us, base/new {m[0] / m[1]:.3f}; '
      f'p99 base {m[2]:.2f} new {m[3]:.2f} us, base/new {m[2] / m[3]:.3f} '
      f'($TEST, {sys.argv[1].count(\" \") + 1} pairs, $PLACE, -s $SIZE -n $N)')
# Each pair's own ratio: both runs of a pair saw the same phase of a drifting machine.
r = sorted(float(b) / float(n) for b, n in zip(sys.argv[1].split(), sys.argv[2].split()))
print(f'pairs base/new t_typical: median {statistics.median(r):.3f}, '
      f'quartiles {r[len(r) // 4]:.3f} {r[(3 * len(r)) // 4]:.3f}')
" "${pa[*]}" "${pb[*]}" "${qa[*]}" "${qb[*]}"
