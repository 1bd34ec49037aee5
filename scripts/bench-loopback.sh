#!/usr/bin/env bash
# Loopback figures for docs/BENCHMARKS.md, all from one run: iwarp-bench write-bw (64 KiB) and
# write-lat (64 B) over the socket transport, next to iperf3 on the same loopback. The bandwidth
# runs alternate with iperf3 (ROUNDS rounds) and the medians are compared, so background load
# hits both alike.
# Usage: scripts/bench-loopback.sh [seconds-per-run] [rounds]   (prints a Markdown table)
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-5}
ROUNDS=${2:-3}
scripts/install-deps.sh >/dev/null
cargo build -q --release --locked -p bench
BIN=target/release/iwarp-bench
PORT=18560
# Servers still running are stopped however the script ends (EXIT, INT, TERM).
# shellcheck source=scripts/lib/jobs.sh
source scripts/lib/jobs.sh
on_exit

pair() { # test, extra args...  -> client JSON on stdout
  local test=$1; shift
  on_exit # a command substitution's subshell: its server is its own to stop (jobs.sh)
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

iperf() {
  on_exit # a command substitution's subshell: its server is its own to stop (jobs.sh)
  iperf3 -s -1 -B 127.0.0.1 -p 5299 >/dev/null 2>&1 &
  local srv=$!
  sleep 0.3
  iperf3 -c 127.0.0.1 -p 5299 -t "$SECS" -J |
    python3 -c "import json,sys; print(json.load(sys.stdin)['end']['sum_received']['bits_per_second']/1e9)"
  wait "$srv" || true
}

field() { python3 -c "import json,sys; d=json.load(sys.stdin); print(d['results'][0]['$1'])"; }
median() { python3 -c "import sys,statistics; print(f'{statistics.median(float(x) for x in sys.argv[1:]):.2f}')" "$@"; }

echo "host: $(uname -r), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "date: $(date -u +%Y-%m-%dT%H:%MZ), $ROUNDS alternating rounds of ${SECS} s"
echo

bw=(); ip=()
for r in $(seq 1 "$ROUNDS"); do
  bw+=("$(pair write-bw -s 65536 -D "$SECS" | field gbit_per_sec)")
  ip+=("$(iperf)")
  echo "round $r: write-bw ${bw[-1]} Gbit/s, iperf3 ${ip[-1]} Gbit/s" >&2
done
lat=$(pair write-lat -s 64 -D "$SECS")
lfield() { echo "$lat" | field "$1" | xargs printf '%.2f'; }

bw_med=$(median "${bw[@]}")
ip_med=$(median "${ip[@]}")
echo "| measurement | command | result |"
echo "| --- | --- | --- |"
echo "| write-bw 64 KiB, socket transport | \`iwarp-bench write-bw -s 65536 -D $SECS\` | $bw_med Gbit/s (median of $ROUNDS) |"
echo "| iperf3 TCP, same loopback | \`iperf3 -c 127.0.0.1 -t $SECS\` | $ip_med Gbit/s (median of $ROUNDS) |"
echo "| write-bw / iperf3 | | $(python3 -c "print(f'{$bw_med/$ip_med:.2f}')") |"
echo "| write-lat 64 B, socket transport | \`iwarp-bench write-lat -s 64 -D $SECS\` | t_typical $(lfield t_typical_us) us, p99 $(lfield p99_us) us, p99.9 $(lfield p99_9_us) us |"
