#!/usr/bin/env bash
# The engine's receiver ACK policy A/B on the veth test bed, write-bw engine to engine,
# alternating run by run over `--engine-ack-every` values (in-order segments per ACK, both
# sides; the engine's default is 8, RFC 5681's every-second-segment is 2). Server in iwa on
# CPU 0, client (the sender) in iwb on CPU 1. Prints one line per run: value, Gbit/s, the
# client process's user and system CPU seconds, and the client engine's frame counters (rx:
# the ACKs it received; tx: its data segments). Needs root.
# Usage: scripts/bench-engine-ack.sh [pairs] [iterations] [values...]
set -euo pipefail
cd "$(dirname "$0")/.."
PAIRS=${1:-4}
N=${2:-3000}
shift 2 || true
VALS=${*:-"2 8"}
# shellcheck source=scripts/bed-bench.sh
. scripts/bed-bench.sh bench-engine-ack
PORT=19150
tmp=$(mktemp -d)
# (With the bed down and the servers stopped: on_exit of bed-bench.sh.)
rm_tmp() { rm -rf "$tmp"; }
on_exit rm_tmp
for _ in $(seq 1 "$PAIRS"); do
  for v in $VALS; do
    ip netns exec iwa taskset -c 0 "$BIN" write-bw --transport xdp --engine-ack-every "$v" \
      --iface iwa0 --port "$PORT" -s 65536 -n "$N" --json >/dev/null 2>&1 &
    srv=$!
    out=""
    for _ in $(seq 1 100); do
      if out=$(ip netns exec iwb taskset -c 1 /usr/bin/time -f "%U %S" -o "$tmp/time" "$BIN" \
        write-bw --transport xdp --engine-ack-every "$v" --iface iwb0 --port "$PORT" \
        -s 65536 -n "$N" 10.77.0.1 2>"$tmp/err"); then break; fi
      sleep 0.1
    done
    wait "$srv" || true
    PORT=$((PORT + 1))
    echo "ack-every $v: $(echo "$out" | awk 'NR==2{print $4}') Gbit/s, cpu $(cat "$tmp/time") s," \
      "$(grep -o "frames rx [0-9]* tx [0-9]*" "$tmp/err")"
  done
done
