#!/usr/bin/env bash
# Our TCP over AF_XDP against the kernel's TCP on the veth test bed, side by side in one run:
# `iwarp-bench tcp-source --transport xdp` (iwa) -> kernel sink (iwb), and kernel source (iwb) ->
# `tcp-sink --transport xdp` (iwa), each alternated with iperf3 in the same direction; medians of
# ROUNDS. Our figures include generating and hashing (SHA-256) the stream; iperf3's do not.
# Needs root. Usage: scripts/bench-tcp.sh [bytes-per-run] [rounds]   (prints Markdown)
set -euo pipefail
cd "$(dirname "$0")/.."
BYTES=${1:-1073741824}
ROUNDS=${2:-3}
# shellcheck source=scripts/bed-bench.sh
. scripts/bed-bench.sh bench-tcp
gbit() { python3 -c "import json,sys; d=json.loads(sys.stdin.read().strip().splitlines()[-1]); print(round(d['gbit_s'], 2))"; }
ip3() { python3 -c "import json,sys; print(round(json.load(sys.stdin)['end']['sum_received']['bits_per_second']/1e9, 2))"; }
median() { python3 -c "import sys,statistics; print(statistics.median(float(x) for x in sys.argv[1:]))" "$@"; }

tx=(); tx_k=(); rx=(); rx_k=()
for r in $(seq 1 "$ROUNDS"); do
  ip netns exec iwb "$BIN" tcp-sink --transport socket --port 18800 --quiet >/dev/null &
  sleep 0.3
  tx+=("$(ip netns exec iwa "$BIN" tcp-source --transport xdp --iface iwa0 --bytes "$BYTES" --seed "$r" --quiet 10.77.0.2:18800 | gbit)")
  wait
  ip netns exec iwb iperf3 -s -1 -p 5201 >/dev/null 2>&1 &
  sleep 0.3
  tx_k+=("$(ip netns exec iwa iperf3 -c 10.77.0.2 -p 5201 -n "$BYTES" -J | ip3)")
  wait
  ip netns exec iwa "$BIN" tcp-sink --transport xdp --iface iwa0 --port 18801 --quiet >/dev/null &
  sleep 1
  rx+=("$(ip netns exec iwb "$BIN" tcp-source --transport socket --bytes "$BYTES" --seed "$r" --quiet 10.77.0.1:18801 | gbit)")
  wait
  ip netns exec iwa iperf3 -s -1 -p 5202 >/dev/null 2>&1 &
  sleep 0.3
  rx_k+=("$(ip netns exec iwb iperf3 -c 10.77.0.1 -p 5202 -n "$BYTES" -J | ip3)")
  wait
  echo "round $r: xdp->kernel ${tx[-1]} vs iperf3 ${tx_k[-1]}; kernel->xdp ${rx[-1]} vs iperf3 ${rx_k[-1]} Gbit/s" >&2
done
a=$(median "${tx[@]}"); b=$(median "${tx_k[@]}"); c=$(median "${rx[@]}"); d=$(median "${rx_k[@]}")
echo "| direction | ours (median of $ROUNDS) | iperf3 (median of $ROUNDS) | ours / iperf3 |"
echo "| --- | --- | --- | --- |"
echo "| \`tcp-source --transport xdp\` (iwa) -> kernel (iwb) | $a Gbit/s | $b Gbit/s | $(python3 -c "print(round($a/$b, 2))") |"
echo "| kernel (iwb) -> \`tcp-sink --transport xdp\` (iwa) | $c Gbit/s | $d Gbit/s | $(python3 -c "print(round($c/$d, 2))") |"
