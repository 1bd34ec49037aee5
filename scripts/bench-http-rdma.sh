#!/usr/bin/env bash
# HTTP GETs with the TCP RDMA option against the same client with it off (an ordinary stream
# copy), alternating run by run on the veth test bed: `iwarp-bench http-server` in iwb,
# `http-client` in iwa (both our TCP on AF_XDP), COUNT GETs of SIZE-octet /gen/ objects per run,
# verified. One line per run: mode, Gbit/s of bodies, client thread CPU ns per body octet, body
# octets placed; at the end the medians of each and on/off.
# Usage: scripts/bench-http-rdma.sh [rounds] [pinned|free] [count] [size]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-5}
PLACE=${2:-pinned}
COUNT=${3:-1024}
SIZE=${4:-1048576}
# shellcheck source=scripts/bed-bench.sh
. scripts/bed-bench.sh bench-http-rdma
PORT=19250
sp=""
cp=""
if [ "$PLACE" = pinned ]; then sp="taskset -c 0"; cp="taskset -c 1"; fi
gon=(); gof=(); con=(); cof=()
for round in $(seq 1 "$ROUNDS"); do
  order="on off"
  if [ $((round % 2)) = 0 ]; then order="off on"; fi
  for mode in $order; do
    $sp ip netns exec iwb "$BIN" http-server --iface iwb0 --port "$PORT" --connections 1 \
      >/dev/null 2>&1 &
    srv=$!
    out=""
    for _ in $(seq 1 100); do
      if out=$($cp ip netns exec iwa "$BIN" http-client --iface iwa0 --quiet --rdma-option "$mode" \
        --count "$COUNT" --size "$SIZE" "10.77.0.2:$PORT" 2>/dev/null); then break; fi
      sleep 0.1
    done
    wait "$srv" || true
    PORT=$((PORT + 1))
    read -r g c p < <(echo "$out" | python3 -c \
      "import json,sys; r = json.loads(sys.stdin.read()); \
print(round(r['gbit_s'], 3), round(r['cpu_ns_per_octet'], 3), r['body_octets_placed'])")
    echo "option $mode: $g Gbit/s, $c ns CPU per octet, $p octets placed"
    if [ "$mode" = on ]; then gon+=("$g"); con+=("$c"); else gof+=("$g"); cof+=("$c"); fi
  done
done
python3 -c "
import statistics, sys
m = [statistics.median(float(x) for x in v.split()) for v in sys.argv[1:]]
print(f'median Gbit/s on {m[0]:.3f} off {m[1]:.3f} (on/off {m[0] / m[1]:.3f}); '
      f'CPU ns/octet on {m[2]:.3f} off {m[3]:.3f} (off/on {m[3] / m[2]:.3f}) '
      f'($ROUNDS rounds, $PLACE, $COUNT GETs of $SIZE octets)')
" "${gon[*]}" "${gof[*]}" "${con[*]}" "${cof[*]}"
