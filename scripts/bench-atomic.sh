#!/usr/bin/env bash
# RFC 7306 Atomic Operations on the veth test bed: atomic-lat and atomic-bw (FetchAdd and
# CmpSwap) over the AF_XDP engine and over the socket transport, alternating transports round by
# round, server in iwa on CPU 0 and client in iwb on CPU 1 (`taskset`). Every cell is the median
# of ROUNDS rounds; xdp/socket is the median of the rounds' own ratios. Needs root. Prints
# Markdown. BIN=path uses that iwarp-bench instead of building one.
# Usage: scripts/bench-atomic.sh [rounds] [iterations-lat] [iterations-bw]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-5}
NLAT=${2:-20000}
NBW=${3:-100000}
[ -n "${BIN:-}" ] && SKIP_BUILD=1
GIVEN_BIN=${BIN:-}
# shellcheck source=scripts/bed-bench.sh
. scripts/bed-bench.sh bench-atomic
[ -n "$GIVEN_BIN" ] && BIN=$GIVEN_BIN
PORT=18900

run() { # transport test op iterations -> client JSON
  local tr=$1 test=$2 op=$3 n=$4 sa ca out=""
  on_exit # a command substitution's subshell: its server is its own to stop (jobs.sh)
  if [ "$tr" = xdp ]; then
    sa="--transport xdp --iface iwa0"; ca="--transport xdp --iface iwb0"
  else sa="--transport socket --bind 10.77.0.1"; ca="--transport socket"; fi
  # shellcheck disable=SC2086
  ip netns exec iwa taskset -c 0 "$BIN" "$test" $sa -A "$op" --port "$PORT" -n "$n" --json \
    >/dev/null 2>&1 &
  local srv=$!
  for _ in $(seq 1 100); do
    # shellcheck disable=SC2086
    if out=$(ip netns exec iwb taskset -c 1 "$BIN" "$test" $ca -A "$op" --port "$PORT" -n "$n" \
      --json 10.77.0.1 2>/dev/null); then break; fi
    sleep 0.1
  done
  wait "$srv" || true
  PORT=$((PORT + 1))
  echo "$out"
}
field() { python3 -c "import json,sys; print(json.loads(sys.stdin.read())['results'][0]['$1'])"; }

echo "| test | operation | metric | engine (xdp) | socket transport | xdp/socket | rounds |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
for test in atomic-lat atomic-bw; do
  for op in fetch-and-add cmp-and-swap; do
    if [ "$test" = atomic-lat ]; then n=$NLAT; metric=t_typical_us; else n=$NBW; metric=msg_rate_mpps; fi
    xs=()
    ss=()
    for _ in $(seq 1 "$ROUNDS"); do
      xs+=("$(run xdp "$test" "$op" "$n" | field "$metric")")
      ss+=("$(run socket "$test" "$op" "$n" | field "$metric")")
    done
    python3 -c "
import statistics, sys
x = [float(v) for v in sys.argv[1].split()]
s = [float(v) for v in sys.argv[2].split()]
r = statistics.median(a / b for a, b in zip(x, s))
unit = 'us' if '$metric' == 't_typical_us' else 'Mops/s'
name = 'p50 latency' if unit == 'us' else 'operations'
print(f'| $test | $op | {name} ({unit}) | {statistics.median(x):.3f} | {statistics.median(s):.3f} | {r:.2f} | {len(x)} |')
" "${xs[*]}" "${ss[*]}"
  done
done
