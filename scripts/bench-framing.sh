#!/usr/bin/env bash
# MPA against IFT framing (draft-williams-iwarp-ift-01) on the veth test bed, over the socket
# transport and the AF_XDP engine (TRANSPORTS, default "socket xdp"): write-bw and read-bw
# (64 KiB) and write-lat (64 B), `--framing mpa` and `--framing ift` alternating round by round,
# CRCs on, server in iwa on CPU 0 and client in iwb on CPU 1. Every cell is the median of ROUNDS rounds; ift/mpa is the median of
# the rounds' own ratios. Also prints each framing's octets on the wire per 64 KiB Write at the
# MULPDU the run reported. Needs root. Prints Markdown. BIN=path uses that iwarp-bench instead
# of building one.
# Usage: scripts/bench-framing.sh [rounds] [iterations-bw] [iterations-lat]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-5}
NBW=${2:-5000}
NLAT=${3:-20000}
[ -n "${BIN:-}" ] && SKIP_BUILD=1
GIVEN_BIN=${BIN:-}
# shellcheck source=scripts/bed-bench.sh
. scripts/bed-bench.sh bench-framing
[ -n "$GIVEN_BIN" ] && BIN=$GIVEN_BIN
PORT=19600
TRANSPORTS=${TRANSPORTS:-socket xdp}

run() { # transport framing test size iterations -> client JSON
  local transport=$1 framing=$2 test=$3 size=$4 n=$5 out="" sa ca
  on_exit # a command substitution's subshell: its server is its own to stop (jobs.sh)
  if [ "$transport" = xdp ]; then
    sa="--transport xdp --iface iwa0"; ca="--transport xdp --iface iwb0"
  else
    sa="--transport socket --bind 10.77.0.1"; ca="--transport socket"
  fi
  # shellcheck disable=SC2086
  ip netns exec iwa taskset -c 0 "$BIN" "$test" $sa \
    --framing "$framing" --port "$PORT" -s "$size" -n "$n" --json >/dev/null 2>&1 &
  local srv=$!
  for _ in $(seq 1 100); do
    # shellcheck disable=SC2086
    if out=$(ip netns exec iwb taskset -c 1 "$BIN" "$test" $ca \
      --framing "$framing" --port "$PORT" -s "$size" -n "$n" --json 10.77.0.1 2>/dev/null); then
      break
    fi
    sleep 0.1
  done
  wait "$srv" || true
  PORT=$((PORT + 1))
  echo "$out"
}

echo "| transport | test | metric | MPA | IFT | ift/mpa | rounds |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
for transport in $TRANSPORTS; do
for spec in "write-bw 65536 $NBW gbit_per_sec" "read-bw 65536 $NBW gbit_per_sec" \
  "write-lat 64 $NLAT t_typical_us"; do
  read -r test size n metric <<<"$spec"
  ms=()
  is=()
  for _ in $(seq 1 "$ROUNDS"); do
    ms+=("$(run "$transport" mpa "$test" "$size" "$n")")
    is+=("$(run "$transport" ift "$test" "$size" "$n")")
  done
  python3 - "$transport" "$test" "$metric" "$(printf '%s\n' "${ms[@]}")" "$(printf '%s\n' "${is[@]}")" <<'EOF'
import json, statistics, sys
transport, test, metric, ms, is_ = sys.argv[1:]
m = [json.loads(l) for l in ms.splitlines() if l.strip()]
i = [json.loads(l) for l in is_.splitlines() if l.strip()]
assert all(r["framing"] == "mpa" for r in m) and all(r["framing"] == "ift" for r in i)
mv = [r["results"][0][metric] for r in m]
iv = [r["results"][0][metric] for r in i]
ratio = statistics.median(b / a for a, b in zip(mv, iv))
unit = "Gbit/s" if metric == "gbit_per_sec" else "us (p50)"
print(f"| {transport} | {test} | {unit} | {statistics.median(mv):.3f} | {statistics.median(iv):.3f} "
      f"| {ratio:.3f} | {len(mv)} |")
if test == "write-bw" and transport == "socket":
    # A Write's segments: 14-octet tagged DDP header; MPA adds 2 + PAD + 4 (CRC), IFT 6 + 4 + 4.
    for name, r, per in (("MPA", m[0], lambda p: 2 + 14 + p + (-(2 + 14 + p) % 4) + 4),
                         ("IFT", i[0], lambda p: 6 + 14 + 4 + p + 4)):
        room = r["mulpdu"] - 14
        full, rest = divmod(65536, room)
        wire = full * per(room) + (per(rest) if rest else 0)
        print(f"| | 64 KiB Write on the wire, {name} | octets (MULPDU {r['mulpdu']}) "
              f"| {wire if name == 'MPA' else ''} | {wire if name == 'IFT' else ''} | | |")
EOF
done
done
