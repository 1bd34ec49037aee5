#!/usr/bin/env bash
# Two engine variants A/B by where the data sender's core goes per frame, on the veth test bed:
# pinned write-bw (server in iwa on CPU 0, client in iwb on CPU 1), the two alternating run by
# run. Each run is sampled for one second in its middle with `perf record -C 1 -e cpu-clock
# -F 4000` (as scripts/bench-engine-cpu.sh does; the frames sent in that second are read from
# iwb0's TX counter inside the recorded command). Prints per run frames/s and kernel and user ns
# per frame (samples / 4000 / frames; kernel includes the receiver's veth NAPI, XDP program and
# XSK copy, which veth runs on the sending core), then the medians of each. Per-frame CPU time
# moves less with the machine's speed than Gbit/s does, so a change of a few ns per frame shows
# in fewer pairs than in scripts/bench-engine-ab.sh.
# BASE_BIN / NEW_BIN: iwarp-bench binaries (the same one twice to compare options);
# BASE_ARGS / NEW_ARGS: extra iwarp-bench options for both sides of the base / new runs (e.g.
# NEW_ARGS="--slots 2"). Needs root; installs perf (Debian: linux-perf) if missing.
# Usage: scripts/bench-engine-cpu-ab.sh BASE_BIN NEW_BIN [pairs] [iterations]
#        (iterations: 64 KiB messages per run, >= 15000 so that a run outlasts its window)
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { echo "usage: $0 BASE_BIN NEW_BIN [pairs] [iterations]" >&2; exit 2; }
A=$1
B=$2
PAIRS=${3:-5}
N=${4:-20000}
[ "$N" -ge 15000 ] || { echo "bench-engine-cpu-ab: iterations must be >= 15000" >&2; exit 1; }
for b in "$A" "$B"; do
  [ -x "$b" ] || { echo "bench-engine-cpu-ab: $b is not an executable" >&2; exit 1; }
done
# shellcheck source=scripts/cpu-window.sh
. scripts/cpu-window.sh
ensure_perf bench-engine-cpu-ab
# shellcheck source=scripts/bed-bench.sh
. scripts/bed-bench.sh bench-engine-cpu-ab
PORT=19950
tmp=$(mktemp -d)
# (With the bed down and the servers stopped: on_exit of bed-bench.sh.)
rm_tmp() { rm -rf "$tmp"; }
on_exit rm_tmp

declare -A F K U
for _ in $(seq 1 "$PAIRS"); do
  for which in base new; do
    if [ "$which" = base ]; then bin=$A; xa=${BASE_ARGS:-}; else bin=$B; xa=${NEW_ARGS:-}; fi
    rc=0
    # shellcheck disable=SC2086
    engine_window "$which" "$bin" $xa || rc=$?
    if [ "$rc" -ne 0 ]; then
      echo "$which: run failed (exit $rc), not counted" >&2
      continue
    fi
    read -r f k u <<<"$WIN"
    echo "$which: $f frames/s, kernel $k ns/frame, user $u ns/frame"
    F[$which]="${F[$which]:-} $f"
    K[$which]="${K[$which]:-} $k"
    U[$which]="${U[$which]:-} $u"
  done
done
for which in base new; do
  [ -n "${F[$which]:-}" ] || { echo "bench-engine-cpu-ab: no $which run completed" >&2; exit 1; }
  python3 -c "
import statistics as s, sys
f, k, u = (s.median(float(x) for x in a.split()) for a in sys.argv[2:])
print('median %s: %d frames/s, kernel %d ns/frame, user %d ns/frame (%d runs)' % (sys.argv[1], f, k, u, len(sys.argv[2].split())))
" "$which" "${F[$which]}" "${K[$which]}" "${U[$which]}"
done
