#!/usr/bin/env bash
# Instructions the sending engine executes per FPDU, counted by callgrind (deterministic where
# wall-clock runs on this VM are not): a write-bw client of N 64 KiB messages under
# `valgrind --tool=callgrind`, counting only inside the driver's turns (`XdpTcp::poll_inner`,
# on whichever thread runs them, the engine's or the application's polls: everything the
# engine does, TCP, MPA framing, the payload copy and CRC, but its loop's idle turns), against
# a server run normally; prints the count divided by the FPDUs the client sent. For each
# binary given, in order (e.g. a base build and a new one).
# TEST=read-bw counts the receiving side instead: a read-bw client (the Read Responses come to
# it), divided by the FPDUs it received.
# ARGS: more options for both sides (e.g. ARGS="--framing ift").
# Usage: scripts/callgrind-write-bw.sh BIN [BIN...]   (N: environment, default 300; TEST, ARGS)
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: $0 BIN [BIN...]" >&2; exit 2; }
command -v valgrind >/dev/null || apt-get install -y -qq valgrind >/dev/null
N=${N:-300}
TEST=${TEST:-write-bw}
case "$TEST" in
  write-bw) COUNT=fpdus_tx; WHAT=sent ;;
  read-bw) COUNT=fpdus_rx; WHAT=received ;;
  *) echo "TEST must be write-bw or read-bw" >&2; exit 2 ;;
esac
SKIP_BUILD=1
# shellcheck source=scripts/bed-bench.sh
. scripts/bed-bench.sh callgrind-write-bw
PORT=19350
out=$(mktemp -d)
# (With the bed down and the servers stopped: on_exit of bed-bench.sh.)
rm_out() { rm -rf "$out"; }
on_exit rm_out
for bin in "$@"; do
  # shellcheck disable=SC2086
  ip netns exec iwa taskset -c 0 "$bin" "$TEST" --transport xdp --iface iwa0 --port "$PORT" \
    ${ARGS:-} -s 65536 -n "$N" --json >/dev/null 2>&1 &
  srv=$!
  sleep 2
  # shellcheck disable=SC2086
  ip netns exec iwb taskset -c 1 valgrind --tool=callgrind --callgrind-out-file="$out/cg" \
    --toggle-collect='*XdpTcp*poll_inner*' "$bin" "$TEST" --transport xdp --iface iwb0 \
    --port "$PORT" ${ARGS:-} -s 65536 -n "$N" --json 10.77.0.1 >"$out/client.json" 2>/dev/null
  wait "$srv" || true
  PORT=$((PORT + 1))
  python3 - "$bin" "$out/cg" "$out/client.json" "$COUNT" "$WHAT" <<'EOF'
import json, sys
bin_, cg, client, count, what = sys.argv[1:]
total = next(int(l.split()[1]) for l in open(cg) if l.startswith("summary:"))
fpdus = json.load(open(client))["engine"][count]
print(f"{bin_}: {total / fpdus:.0f} instructions per FPDU {what} ({total} over {fpdus} FPDUs)")
EOF
done
