#!/usr/bin/env bash
# The AF_XDP engine through the test relay (scripts/netns-relay.sh, testbed's `iwarp-relay`):
# write-bw engine to engine (server in iwra, client in iwrb) with the relay dropping and
# reordering 1% and 5% of TCP segments, then re-segmenting (MSS clamped to 700, data re-cut at
# random offsets) with 2% loss and reordering and Markers on both ways; then the same three
# with IFT framing (`--framing ift`, both CRCs, speculative placement; no Markers). Prints
# Markdown: the receiving engine's placement counters (for IFT, how many speculative placements
# the in-order pass confirmed), the sender's retransmissions, what the relay did.
# Needs root. A failed row (relay, server or client) stops the script non-zero, its server and
# relay stopped, with the row's logs (client, server, relay) on stderr.
# BIN=path and RELAY=path run those `iwarp-bench` and `iwarp-relay` instead of building them
# (bench/tests/scripts_bench_relay.rs runs the script so, with stubs).
# Usage: scripts/bench-relay.sh [iterations] [size] [seed]   (ROWS="aligned-5" runs only those rows)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-400}
SIZE=${2:-65536}
SEED=${3:-7}
ROWS=${ROWS:-aligned-1 aligned-5 reseg-2 ift-aligned-1 ift-aligned-5 ift-reseg-2}
[ "$(id -u)" -eq 0 ] || { echo "bench-relay: needs root (namespaces, XDP, AF_XDP)" >&2; exit 1; }
# With BIN= and RELAY= given (the tests' stubs) nothing is installed or built.
[ -n "${BIN:-}" ] && [ -n "${RELAY:-}" ] || scripts/install-deps.sh >/dev/null
[ -n "${BIN:-}" ] || cargo build -q --release --locked -p bench
[ -n "${RELAY:-}" ] || cargo build -q --release --locked -p testbed --bin iwarp-relay
BIN=${BIN:-$PWD/target/release/iwarp-bench}
RELAY=${RELAY:-$PWD/target/release/iwarp-relay}
for exe in "$BIN" "$RELAY"; do
  [ -f "$exe" ] && [ -x "$exe" ] || { echo "bench-relay: $exe is not an executable file" >&2; exit 1; }
done
# stop PID, wait_bounded PID SECONDS, on_exit, waited.
# shellcheck source=scripts/lib/jobs.sh
source scripts/lib/jobs.sh
exec 9>/run/lock/iwarp-netns.lock
flock 9
TMP=$(mktemp -d)
relay_bed_down() {
  scripts/netns-relay.sh down >/dev/null 2>&1 || true
  rm -rf "$TMP"
}
# However the script ends (EXIT, INT, TERM): the row's server, client and relay stopped, then
# the bed down and $TMP gone.
on_exit relay_bed_down
scripts/netns-relay.sh up >/dev/null
PORT=18800
# The running row's server and relay (process ids), stopped by `fail`.
SRV=""
RLY=""

# stop_relay: closes the relay's standard input (it stops, printing its counters) and waits
# for it, at most 10 s; its exit status.
stop_relay() {
  local pid=$RLY
  RLY=""
  exec 8>&-
  wait_bounded "$pid" 10
}

# fail NAME WHAT: says what failed in row NAME, stops its server and relay, prints the row's
# logs on stderr and ends the script (the EXIT trap takes the bed down and removes $TMP).
fail() {
  local name=$1 what=$2 log
  echo "bench-relay: $name: $what" >&2
  [ -z "$SRV" ] || stop "$SRV"
  [ -z "$RLY" ] || stop_relay || true
  for log in client server relay; do
    [ -s "$TMP/$name.$log" ] || continue
    echo "--- $log ($name):" >&2
    cat "$TMP/$name.$log" >&2
  done
  exit 1
}

run() { # name relay-args bench-args
  local name=$1 rargs=$2 bargs=$3 rc=0
  case " $ROWS " in *" $name "*) ;; *) return 0 ;; esac
  # The relay stops (and prints its counters) when its standard input closes.
  # shellcheck disable=SC2086
  exec 8> >(exec ip netns exec iwrr "$RELAY" --stdin-stop --seed "$SEED" $rargs >"$TMP/$name.relay" 2>&1)
  RLY=$!
  for _ in $(seq 1 100); do
    grep -q "iwarp-relay: forwarding" "$TMP/$name.relay" 2>/dev/null && break
    kill -0 "$RLY" 2>/dev/null || fail "$name" "the relay ended before it forwarded"
    sleep 0.1
  done
  grep -q "iwarp-relay: forwarding" "$TMP/$name.relay" ||
    fail "$name" "the relay did not start forwarding within 10 s"
  # Neither side keeps the relay's standard input (fd 8) open: closing it stops the relay.
  # shellcheck disable=SC2086
  ip netns exec iwra "$BIN" write-bw --transport xdp --iface iwra0 --port "$PORT" -s "$SIZE" -n "$N" $bargs \
    >"$TMP/$name.server" 2>&1 8>&- &
  SRV=$!
  for _ in $(seq 1 100); do
    grep -q listening "$TMP/$name.server" 2>/dev/null && break
    kill -0 "$SRV" 2>/dev/null || fail "$name" "the server ended before it listened"
    sleep 0.1
  done
  grep -q listening "$TMP/$name.server" || fail "$name" "the server did not listen within 10 s"
  # (`waited`: a SIGTERM stops it at once, not after its run.)
  # shellcheck disable=SC2086
  waited ip netns exec iwrb "$BIN" write-bw --transport xdp --iface iwrb0 --port "$PORT" -s "$SIZE" -n "$N" $bargs \
    --report_gbits 10.78.0.1 >"$TMP/$name.client" 2>&1 8>&- || fail "$name" "the client failed"
  # The server ends within seconds of its client; one still running 30 s later is stuck.
  wait_bounded "$SRV" 30 || rc=$?
  case $rc in
    0) SRV="" ;;
    124) SRV=""; fail "$name" "the server was still running 30 s after its client ended (stopped)" ;;
    *) SRV=""; fail "$name" "the server failed (exit status $rc)" ;;
  esac
  stop_relay || fail "$name" "the relay failed or did not stop within 10 s"
  PORT=$((PORT + 1))
}

run aligned-1 "--loss 0.01 --reorder 0.01" ""
run aligned-5 "--loss 0.05 --reorder 0.05" ""
run reseg-2 "--loss 0.02 --reorder 0.02 --resegment --mss-clamp 700" "--markers on"
run ift-aligned-1 "--loss 0.01 --reorder 0.01" "--framing ift"
run ift-aligned-5 "--loss 0.05 --reorder 0.05" "--framing ift"
run ift-reseg-2 "--loss 0.02 --reorder 0.02 --resegment --mss-clamp 700" "--framing ift"

echo "host: $(uname -r), $(nproc) cores; date $(date -u +%Y-%m-%dT%H:%MZ); write-bw $SIZE B x $N, seed $SEED"
echo
python3 - "$TMP" <<'PY'
import os, re, sys
tmp = sys.argv[1]
def counters(path):
    line = [l for l in open(path) if "engine counters" in l][0]
    num = lambda pat: int(re.search(pat, line).group(1))
    return dict(seg=num(r"segments (\d+)"), ooo=num(r"out of order (\d+)\)"),
                ooo_b=num(r"out of order (\d+) B"), ooo_f=num(r"\((\d+) FPDUs\)"),
                peak=num(r"held peak (\d+) B"), gaps=num(r"held peak \d+ B at (\d+) gaps"),
                gap=num(r"most held at one gap (\d+) B"), rtx=num(r"retransmitted segments (\d+)"),
                rto=num(r"timeouts (\d+)"), tlp=num(r"loss probes (\d+)"),
                undone=num(r"undone as spurious (\d+)"), paws=num(r"PAWS drops (\d+)"),
                crc=num(r"CRC errors (\d+)"),
                confirmed=int((re.search(r"placements confirmed (\d+)", line) or [0, 0])[1]))
def relay(path):
    d = {}
    for l in open(path):
        m = re.match(r"relay (a->b|b->a): DirStats \{(.*)\}", l)
        if m:
            d[m.group(1)] = {k: int(v) for k, v in re.findall(r"(\w+): (\d+)", m.group(2))}
    if "b->a" not in d:  # the relay failed (an `iwarp-relay:` error line) or printed nothing
        sys.exit(f"bench-relay: no relay counters in {path}:\n" + open(path).read())
    return d
def gbit(path):
    for l in open(path):
        f = l.split()
        if len(f) >= 5 and f[0].isdigit():
            return f[3]
    return "?"
print("| relay | `iwarp-relay` args / bench args | Gbit/s | receiver: segments (out of order) | placed out of order | store peak (gaps holding octets then) | most held at one gap | CRC errors | receiver PAWS drops | sender retransmitted (timeouts / loss probes / undone as spurious) | relay b->a: dropped / reordered / re-cut pieces (unaligned) | relay lost unasked: refused sends / receive drops |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for name, r, b in [("aligned-1", "--loss 0.01 --reorder 0.01", ""),
                   ("aligned-5", "--loss 0.05 --reorder 0.05", ""),
                   ("reseg-2", "--loss 0.02 --reorder 0.02 --resegment --mss-clamp 700", "--markers on"),
                   ("ift-aligned-1", "--loss 0.01 --reorder 0.01", "--framing ift"),
                   ("ift-aligned-5", "--loss 0.05 --reorder 0.05", "--framing ift"),
                   ("ift-reseg-2", "--loss 0.02 --reorder 0.02 --resegment --mss-clamp 700", "--framing ift")]:
    if not os.path.exists(f"{tmp}/{name}.server"):
        continue
    s = counters(f"{tmp}/{name}.server"); c = counters(f"{tmp}/{name}.client")
    rl = relay(f"{tmp}/{name}.relay")["b->a"]
    conf = f", {s['confirmed']} confirmed" if name.startswith("ift") else ""
    print(f"| {name} | `{r}` / `{b}` | {gbit(tmp + '/' + name + '.client')} | {s['seg']} ({s['ooo']}) | "
          f"{s['ooo_b']} B ({s['ooo_f']} FPDUs{conf}) | {s['peak']} B ({s['gaps']}) | {s['gap']} B | {s['crc']} | {s['paws']} | "
          f"{c['rtx']} ({c['rto']} / {c['tlp']} / {c['undone']}) | "
          f"{rl['dropped']} / {rl['reordered']} / {rl['pieces']} ({rl['unaligned_pieces']}) | "
          f"{rl['tx_refused']} / {rl['rx_dropped']} |")
PY
