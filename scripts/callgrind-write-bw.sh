#!/usr/bin/env bash
# Instructions the sending engine executes per FPDU, counted by callgrind (deterministic where
# wall-clock runs on this VM are not): a write-bw client of N 64 KiB messages under
# `valgrind --tool=callgrind`, counting only inside the engine thread's loop (`Engine::run`,
# everything the engine does: the turn, TCP, MPA framing, the payload copy and CRC), against a
# server run normally; prints the count divided by the FPDUs the client sent. For each binary
# given, in order (e.g. a base build and a new one).
# Usage: scripts/callgrind-write-bw.sh BIN [BIN...]   (N: environment, default 300)
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: $0 BIN [BIN...]" >&2; exit 2; }
command -v valgrind >/dev/null || apt-get install -y -qq valgrind >/dev/null
N=${N:-300}
SKIP_BUILD=1
# shellcheck source=scripts/bed-bench.sh
. scripts/bed-bench.sh callgrind-write-bw
PORT=19350
out=$(mktemp -d)
trap 'rm -rf "$out"; scripts/netns.sh down >/dev/null 2>&1 || true' EXIT
for bin in "$@"; do
  ip netns exec iwa taskset -c 0 "$bin" write-bw --transport xdp --iface iwa0 --port "$PORT" \
    -s 65536 -n "$N" --json >/dev/null 2>&1 &
  srv=$!
  sleep 2
  ip netns exec iwb taskset -c 1 valgrind --tool=callgrind --callgrind-out-file="$out/cg" \
    --toggle-collect='*Engine*::run' "$bin" write-bw --transport xdp --iface iwb0 \
    --port "$PORT" -s 65536 -n "$N" --json 10.77.0.1 >"$out/client.json" 2>/dev/null
  wait "$srv" || true
  PORT=$((PORT + 1))
  python3 - "$bin" "$out/cg" "$out/client.json" <<'EOF'
import json, sys
bin_, cg, client = sys.argv[1:]
total = next(int(l.split()[1]) for l in open(cg) if l.startswith("summary:"))
fpdus = json.load(open(client))["engine"]["fpdus_tx"]
print(f"{bin_}: {total / fpdus:.0f} instructions per FPDU sent ({total} over {fpdus} FPDUs)")
EOF
done
