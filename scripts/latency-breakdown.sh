#!/usr/bin/env bash
# Where one side's half round trip of write-lat goes on the engine, step by step (issue #24):
# builds iwarp-bench with the `latency-probe` feature (time-stamp-counter marks along the
# engine's path, `datapath::probe`; into target/probe, so the normal build is untouched), runs
# write-lat of SIZE octets on the veth bed (server in iwa on CPU 0, client in iwb on CPU 1,
# `--transport xdp`, default engine options plus ARGS), and prints for each side the mean time
# of each step from the reply's frame on the RX ring to the kick that sends the next message,
# their sum, and the kick itself. The probe costs a few ns per mark: compare runs of it with
# each other, not with runs of the plain build.
# Usage: scripts/latency-breakdown.sh [iterations] [size]   (ARGS: more iwarp-bench options)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-50000}
SIZE=${2:-64}
# Built before the bed's lock is taken (a first build takes minutes); errors shown.
cargo build --release --locked -p bench --features latency-probe --target-dir target/probe \
  >/dev/null
SKIP_BUILD=1
# shellcheck source=scripts/bed-bench.sh
. scripts/bed-bench.sh latency-breakdown
BIN=$PWD/target/probe/release/iwarp-bench
out=$(mktemp -d)
# (With the bed down and the servers stopped: on_exit of bed-bench.sh.)
rm_out() { rm -rf "$out"; }
on_exit rm_out
PORT=19450
# shellcheck disable=SC2086
ip netns exec iwa taskset -c 0 "$BIN" write-lat --transport xdp --iface iwa0 --port "$PORT" \
  ${ARGS:-} -s "$SIZE" -n "$N" >/dev/null 2>"$out/server.err" &
srv=$!
ok=0
for _ in $(seq 1 100); do
  # shellcheck disable=SC2086
  if ip netns exec iwb taskset -c 1 "$BIN" write-lat --transport xdp --iface iwb0 \
    --port "$PORT" ${ARGS:-} -s "$SIZE" -n "$N" --json 10.77.0.1 >"$out/client.json" \
    2>"$out/client.err"; then
    ok=1
    break
  fi
  sleep 0.1
done
if [ "$ok" != 1 ]; then
  kill "$srv" 2>/dev/null || true
  cat "$out/client.err" >&2
  echo "latency-breakdown: the client failed" >&2
  exit 1
fi
wait "$srv" || true
# Raw AF_XDP's ping-pong with the same build, frames of the message and the headers (as
# `iwarp-bench compare`): its kicks, beside the engine's.
RAW_FRAME=$((SIZE + 54 > 64 ? SIZE + 54 : 64))
ip netns exec iwa taskset -c 0 "$BIN" raw pingpong --iface iwa0 --count "$N" --mode driver \
  --port $((PORT + 1)) --quiet >/dev/null 2>"$out/raw-server.err" &
srv=$!
# The initiator once the responder is ready (at most 10 s).
for _ in $(seq 1 200); do
  grep -q "^raw pingpong: responder ready on" "$out/raw-server.err" && break
  kill -0 "$srv" 2>/dev/null || break
  sleep 0.05
done
ip netns exec iwb taskset -c 1 "$BIN" raw pingpong --iface iwb0 --dst-ip 10.77.0.1 \
  --size "$RAW_FRAME" --count "$N" --mode driver --port $((PORT + 1)) --quiet --json \
  >"$out/raw.json" 2>"$out/raw-client.err" || echo "latency-breakdown: raw ping-pong failed" >&2
wait "$srv" || true
python3 - "$out" "$SIZE" "$N" <<'EOF'
import json, re, sys
out, size, n = sys.argv[1:]
def steps(path):
    s = {}
    for line in open(path):
        m = re.match(r"probe: (\w+) -> (\w+): ([\d.]+) ns \(n (\d+)\)", line)
        if m:
            s[(m[1], m[2])] = float(m[3])
    return s
sides = [("server", steps(f"{out}/server.err")), ("client", steps(f"{out}/client.err"))]
path = [
    ("PollStart", "FrameSeen", "poll start to the frame seen (clock, inbox, RX ring)"),
    ("FrameSeen", "FrameRouted", "first touch of the frame, shard directory"),
    ("FrameRouted", "PayloadSummed", "IPv4/TCP parse, payload sum and FPDU CRC"),
    ("PayloadSummed", "DataPassedUp", "TCP: the segment to its data passed up"),
    ("DataPassedUp", "DataPlaced", "MPA/DDP/RDMAP: the data placed"),
    ("DataPlaced", "SegmentDone", "TCP after the data"),
    ("SegmentDone", "Received", "rest of the receive"),
    ("Received", "Delivered", "completions handed out (the answering poll returns, no service)"),
    ("Delivered", "Posted", "back in the application: the stamp seen, the reply posted"),
    ("Posted", "PollStart", "post to the posting turn (channel, wake, lock)"),
    ("PollStart", "Serviced", "the posting turn: the connection's request taken, FPDU queued"),
    ("Serviced", "TransmitStart", "to the transmit"),
    ("TransmitStart", "FrameWritten", "TCP segment and FPDU written into the frame"),
    ("FrameWritten", "KickStart", "end of the batch, TX ring, to the kick"),
]
res = json.load(open(f"{out}/client.json"))["results"][0]
print(f"write-lat {size} B x {n}: t_typical {res['t_typical_us']:.2f} us, p99 {res['p99_us']:.2f} us "
      "(half round trip, probe build)")
print(f"| step | {' | '.join(n for n, _ in sides)} |")
print(f"| --- | {' | '.join('---' for _ in sides)} |")
total = [0.0 for _ in sides]
missing = []
for a, b, what in path:
    cells = []
    for k, (name, s) in enumerate(sides):
        v = s.get((a, b))
        total[k] += v or 0.0
        if v is None:
            missing.append(f"{name}: {a} -> {b}")
        cells.append("-" if v is None else f"{v:.0f}")
    print(f"| {what} ({a} -> {b}) | {' | '.join(cells)} |")
print(f"| **before the kick** | {' | '.join(f'**{t:.0f}**' for t in total)} |")
kick = [s.get(("KickStart", "KickDone")) for _, s in sides]
print(f"| the kick (sendto) | {' | '.join('-' if v is None else f'{v:.0f}' for v in kick)} |")
try:
    raw = json.load(open(f"{out}/raw.json"))
    raw_kick = [steps(f"{out}/raw-{name}.err").get(("KickStart", "KickDone")) for name, _ in sides]
    print(f"| raw AF_XDP ping-pong's kick | {' | '.join('-' if v is None else f'{v:.0f}' for v in raw_kick)} |")
    print(f"raw AF_XDP ping-pong, frames of {size} B + 54: t_typical {raw['t_typical_us']:.2f} us, "
          f"p99 {raw['p99_us']:.2f} us (half round trip, same build)")
except (OSError, ValueError, KeyError):
    print("raw AF_XDP ping-pong: no result")
print("ns, means over the run")
if missing:
    print("steps not seen (left out of the sums; e.g. posts on another thread without inline "
          "progress): " + ", ".join(missing))
EOF
