#!/usr/bin/env bash
# The iWARP engine over AF_XDP next to the socket transport (kernel TCP), same veth link, one
# run: write-bw and read-bw (64 KiB) and write-lat and send-lat (64 B), server in namespace iwa,
# client in iwb, alternating transports per test. Needs root. Prints Markdown.
# Usage: scripts/bench-engine.sh [iterations-bw] [iterations-lat]
set -euo pipefail
cd "$(dirname "$0")/.."
NBW=${1:-5000}
NLAT=${2:-10000}
# shellcheck source=scripts/bed-bench.sh
. scripts/bed-bench.sh bench-engine
PORT=18700

pair() { # transport test size iters -> client JSON
  local tr=$1 test=$2 size=$3 n=$4 sa ca out=""
  if [ "$tr" = xdp ]; then sa="--transport xdp --iface iwa0"; ca="--transport xdp --iface iwb0"
  else sa="--transport socket --bind 10.77.0.1"; ca="--transport socket"; fi
  # shellcheck disable=SC2086
  ip netns exec iwa "$BIN" "$test" $sa --port "$PORT" -s "$size" -n "$n" --json >/dev/null 2>&1 &
  local srv=$!
  for _ in $(seq 1 100); do
    # shellcheck disable=SC2086
    if out=$(ip netns exec iwb "$BIN" "$test" $ca --port "$PORT" -s "$size" -n "$n" --json 10.77.0.1 2>/dev/null); then break; fi
    sleep 0.1
  done
  wait "$srv" || true
  PORT=$((PORT + 1))
  echo "$out"
}
f() { python3 -c "import json,sys; r=json.loads(sys.stdin.read())['results'][0]; print(round(r['$1'], 2))"; }

echo "host: $(uname -r), $(nproc) cores; date $(date -u +%Y-%m-%dT%H:%MZ)"
echo
echo "| test | command (server in iwa, client in iwb) | socket transport | xdp engine | xdp / socket |"
echo "| --- | --- | --- | --- | --- |"
for spec in "write-bw 65536 $NBW gbit_per_sec Gbit/s" "read-bw 65536 $NBW gbit_per_sec Gbit/s" \
            "write-lat 64 $NLAT t_typical_us us(p50)" "write-lat 64 $NLAT p99_us us(p99)" \
            "send-lat 64 $NLAT t_typical_us us(p50)" "send-lat 64 $NLAT p99_us us(p99)"; do
  set -- $spec
  s=$(pair socket "$1" "$2" "$3" | f "$4")
  x=$(pair xdp "$1" "$2" "$3" | f "$4")
  printf '| %s %s B | `iwarp-bench %s -s %s -n %s --transport socket` or `xdp` | %s %s | %s %s | %s |\n' \
    "$1" "$2" "$1" "$2" "$3" "$s" "$5" "$x" "$5" "$(python3 -c "print(round($x/$s, 2))")"
done
