#!/usr/bin/env bash
# The AF_XDP ceiling on the veth test bed, all from one run: `iwarp-bench raw tx/rx` frame rates
# at 64, 1514 and 3498-byte frames and `raw pingpong` latency, next to iperf3 between the same
# namespaces with and without the steering program attached. Needs root. Prints Markdown.
# Usage: scripts/bench-raw.sh [mode: driver|generic] [iperf-seconds]
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-driver}
SECS=${2:-5}
# shellcheck source=scripts/bed-bench.sh
. scripts/bed-bench.sh bench-raw

mtu() { ip -n iwa link set iwa0 mtu "$1"; ip -n iwb link set iwb0 mtu "$1"; }
json() { python3 -c "import json,sys; d=json.load(sys.stdin); print(' '.join(str(d[k]) for k in sys.argv[1:]))" "$@"; }

rx_tx() { # size count -> "frames mpps gbit"
  local size=$1 count=$2 log
  on_exit # a command substitution's subshell: its server is its own to stop (jobs.sh)
  log=$(mktemp)
  ip netns exec iwa "$BIN" raw rx --iface iwa0 --size "$size" --count "$count" --mode "$MODE" \
    --port 18600 --ring 8192 --json 2>"$log" >"$log.out" &
  local rx=$!
  for _ in $(seq 1 200); do grep -q "^raw rx: ready on" "$log" && break; sleep 0.05; done
  ip netns exec iwb "$BIN" raw tx --iface iwb0 --size "$size" --count "$count" --dst-ip 10.77.0.1 \
    --port 18600 --quiet >/dev/null
  wait "$rx" || true
  json frames msg_rate_mpps gbit_per_sec <"$log.out"
  rm -f "$log" "$log.out"
}

pingpong() { # size -> "median p99"
  local size=$1 out
  on_exit # a command substitution's subshell: its server is its own to stop (jobs.sh)
  ip netns exec iwa "$BIN" raw pingpong --iface iwa0 --count 10000 --mode "$MODE" --port 18620 \
    --quiet >/dev/null 2>&1 &
  local resp=$!
  sleep 0.5
  out=$(ip netns exec iwb "$BIN" raw pingpong --iface iwb0 --dst-ip 10.77.0.1 --size "$size" \
    --count 10000 --mode "$MODE" --port 18620 --quiet --json)
  wait "$resp" || true
  echo "$out" | json t_typical_us p99_us
}

iperf() { # -> Gbit/s
  on_exit # a command substitution's subshell: its server is its own to stop (jobs.sh)
  ip netns exec iwa iperf3 -s -1 -B 10.77.0.1 -p 5201 >/dev/null 2>&1 &
  local srv=$!
  sleep 0.3
  ip netns exec iwb iperf3 -c 10.77.0.1 -p 5201 -t "$SECS" -J |
    python3 -c "import json,sys; print(round(json.load(sys.stdin)['end']['sum_received']['bits_per_second']/1e9, 2))"
  wait "$srv" || true
}

echo "host: $(uname -r), $(nproc) cores; mode $MODE; date $(date -u +%Y-%m-%dT%H:%MZ)"
echo
echo "| frame | command (rx in iwa, tx in iwb) | frames received | Mpps | Gbit/s |"
echo "| --- | --- | --- | --- | --- |"
for spec in "64 1000000 1500" "1514 500000 1500" "3498 300000 3484"; do
  set -- $spec
  mtu "$3"
  read -r frames mpps gbit <<<"$(rx_tx "$1" "$2")"
  printf '| %s B | `raw rx --size %s --count %s --mode %s --ring 8192` / `raw tx --size %s --count %s` | %s of %s | %.3f | %.2f |\n' \
    "$1" "$1" "$2" "$MODE" "$1" "$2" "$frames" "$2" "$mpps" "$gbit"
done
mtu 1500
echo
echo "| pingpong | command | median (us) | 99% (us) |"
echo "| --- | --- | --- | --- |"
for size in 64 1514; do
  read -r med p99 <<<"$(pingpong "$size")"
  printf '| %s B | `raw pingpong --size %s --count 10000 --mode %s` | %.2f | %.2f |\n' "$size" "$size" "$MODE" "$med" "$p99"
done
echo
plain=$(iperf)
# The steering program attached (steering a port nobody uses): kernel TCP now passes through XDP.
ip netns exec iwa "$BIN" raw rx --iface iwa0 --count 1 --mode "$MODE" --port 18699 --timeout $((SECS + 5)) \
  --idle $((SECS + 5)) --quiet >/dev/null 2>&1 &
holder=$!
sleep 1
attached=$(iperf)
kill "$holder" 2>/dev/null || true
wait "$holder" 2>/dev/null || true
echo "| iperf3 iwb -> iwa | command | Gbit/s |"
echo "| --- | --- | --- |"
echo "| without XDP program | \`iperf3 -c 10.77.0.1 -t $SECS\` | $plain |"
echo "| with the steering program attached ($MODE mode) | same | $attached |"
