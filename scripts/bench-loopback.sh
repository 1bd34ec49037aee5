#!/usr/bin/env bash
# Loopback figures for docs/BENCHMARKS.md, all from one run: iwarp-bench write-bw (64 KiB) and
# write-lat (64 B) over the socket transport, next to iperf3 on the same loopback.
# Usage: scripts/bench-loopback.sh [seconds-per-test]   (prints a Markdown table)
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-10}
scripts/install-deps.sh >/dev/null
cargo build --release --locked -p bench >/dev/null 2>&1
BIN=target/release/iwarp-bench
PORT=18560

pair() { # test, extra args...
  local test=$1; shift
  "$BIN" "$test" --bind 127.0.0.1 --port "$PORT" --json "$@" >/dev/null &
  local srv=$!
  local out=""
  for _ in $(seq 1 200); do
    if out=$("$BIN" "$test" --port "$PORT" --json "$@" 127.0.0.1 2>/dev/null); then break; fi
    sleep 0.05
  done
  wait "$srv"
  PORT=$((PORT + 1))
  echo "$out"
}

field() { python3 -c "import json,sys; d=json.load(sys.stdin); r=d['results'][0]; print(f\"{r['$1']:.${2:-2}f}\")"; }

echo "host: $(uname -r), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
echo

bw=$(pair write-bw -s 65536 -D "$SECS")
lat=$(pair write-lat -s 64 -D "$SECS")

iperf3 -s -1 -B 127.0.0.1 -p 5299 >/dev/null 2>&1 &
sleep 0.3
ip3=$(iperf3 -c 127.0.0.1 -p 5299 -t "$SECS" -J)
wait || true
ip3_gbit=$(echo "$ip3" | python3 -c "import json,sys; print(f\"{json.load(sys.stdin)['end']['sum_received']['bits_per_second']/1e9:.2f}\")")

echo "| measurement | command | result |"
echo "| --- | --- | --- |"
echo "| write-bw 64 KiB, socket transport | \`iwarp-bench write-bw -s 65536 -D $SECS\` | $(echo "$bw" | field gbit_per_sec) Gbit/s ($(echo "$bw" | field mib_per_sec 0) MiB/s, $(echo "$bw" | field msg_rate_mpps 3) Mmsg/s) |"
echo "| iperf3 TCP, same loopback | \`iperf3 -c 127.0.0.1 -t $SECS\` | $ip3_gbit Gbit/s |"
echo "| write-lat 64 B, socket transport | \`iwarp-bench write-lat -s 64 -D $SECS\` | p50 $(echo "$lat" | field t_typical_us) us, p99 $(echo "$lat" | field p99_us) us, p99.9 $(echo "$lat" | field p99_9_us) us |"
echo
python3 - "$(echo "$bw" | field gbit_per_sec)" "$ip3_gbit" <<'PY'
import sys
bw, ip = float(sys.argv[1]), float(sys.argv[2])
print(f"write-bw / iperf3 = {bw/ip:.2f}")
PY
