#!/usr/bin/env bash
# The engine's transmit paths A/B on the veth test bed, alternating run by run: the default
# (FPDUs written from registered memory into the UMEM frames) and `--engine-tx-copy` (the former
# path through TCP's send buffer). Server in iwa, client in iwb. Needs root. Prints one line per
# run: path and Gbit/s.
# Usage: scripts/bench-engine-tx.sh [pairs] [pinned|free] [write-bw|read-bw|send-bw] [iterations]
set -euo pipefail
cd "$(dirname "$0")/.."
PAIRS=${1:-5}
PLACE=${2:-pinned}
TEST=${3:-write-bw}
N=${4:-5000}
# shellcheck source=scripts/bed-bench.sh
. scripts/bed-bench.sh bench-engine-tx
PORT=18950
sp=""
cp=""
if [ "$PLACE" = pinned ]; then sp="taskset -c 0"; cp="taskset -c 1"; fi
for _ in $(seq 1 "$PAIRS"); do
  for mode in "" "--engine-tx-copy"; do
    # shellcheck disable=SC2086
    ip netns exec iwa $sp "$BIN" "$TEST" --transport xdp $mode --iface iwa0 --port "$PORT" \
      -s 65536 -n "$N" --json >/dev/null 2>&1 &
    srv=$!
    out=""
    for _ in $(seq 1 100); do
      # shellcheck disable=SC2086
      if out=$(ip netns exec iwb $cp "$BIN" "$TEST" --transport xdp $mode --iface iwb0 \
        --port "$PORT" -s 65536 -n "$N" --json 10.77.0.1 2>/dev/null); then break; fi
      sleep 0.1
    done
    wait "$srv" || true
    PORT=$((PORT + 1))
    echo "${mode:-default} $(echo "$out" | python3 -c \
      "import json,sys; print(round(json.loads(sys.stdin.read())['results'][0]['gbit_per_sec'], 2))")"
  done
done
