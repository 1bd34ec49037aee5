#!/usr/bin/env bash
# Where the data sender's core goes per frame in the steady state, raw AF_XDP against the
# engine's write-bw, on the veth test bed (pinned: receiver on CPU 0, sender on CPU 1).
# Alternating run by run, each run is sampled for one second in its middle with
# `perf record -C 1 -e cpu-clock -F 4000`; the frames sent in that second are read from iwb0's
# TX counter inside the recorded command, so samples and frames cover the same interval. Prints
# per run: frames/s, kernel and user ns per frame (samples / 4000 / frames; kernel includes the
# receiver's veth NAPI, XDP program and XSK copy, which veth runs on the sending core), and per
# pair the steady-state goodput ratio xdp / raw (RDMA payload per engine frame: 65536 / 46
# octets; raw's TCP payload: 1460). Needs root; installs perf (Debian: linux-perf) if missing.
# RAW_ARGS: extra `raw tx` options (e.g. "--source-mib 8": raw's payloads copied from memory as
# the engine copies them, so that the difference left is the engine's protocol work).
# Usage: scripts/bench-engine-cpu.sh [pairs] [iterations]   (iterations: 64 KiB messages, >= 15000)
set -euo pipefail
cd "$(dirname "$0")/.."
PAIRS=${1:-3}
N=${2:-20000}
# shellcheck source=scripts/cpu-window.sh
. scripts/cpu-window.sh
ensure_perf bench-engine-cpu
[ "$N" -ge 15000 ] || { echo "bench-engine-cpu: iterations must be >= 15000 (runs must outlast the 1.6 s window)" >&2; exit 1; }
# shellcheck source=scripts/bed-bench.sh
. scripts/bed-bench.sh bench-engine-cpu
PORT=19900
FRAMES=$((N * 46))
tmp=$(mktemp -d)
# (With the bed down and the servers stopped: on_exit of bed-bench.sh.)
rm_tmp() { rm -rf "$tmp"; }
on_exit rm_tmp

ratios=()
for i in $(seq 1 "$PAIRS"); do
  ip netns exec iwa taskset -c 0 "$BIN" raw rx --iface iwa0 --size 1514 --count "$FRAMES" \
    --mode driver --port 18600 --ring 2048 --json 2>"$tmp/rx.log" >"$tmp/rx.out" &
  rx=$!
  for _ in $(seq 1 200); do grep -q "^raw rx: ready on" "$tmp/rx.log" && break; sleep 0.05; done
  # shellcheck disable=SC2086
  ip netns exec iwb taskset -c 1 "$BIN" raw tx --iface iwb0 --size 1514 --count "$FRAMES" \
    --dst-ip 10.77.0.1 --port 18600 --quiet ${RAW_ARGS:-} >/dev/null 2>>"$tmp/rx.log" &
  tx=$!
  read -r rf rk ru <<<"$(cpu_window raw)"
  rc=0
  wait "$tx" || rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "pair $i: raw tx failed (exit $rc), pair skipped: $(tail -n 2 "$tmp/rx.log")" >&2
    wait "$rx" || true
    continue
  fi
  # Raw has no retransmission: frames its receiver dropped are missing at the end (it then
  # exits non-zero). The sender's cost per frame is still measured; say so.
  lost=""
  wait "$rx" || lost=" (receiver: $(tail -n 1 "$tmp/rx.log"))"
  echo "pair $i raw: $rf frames/s, kernel $rk ns/frame, user $ru ns/frame$lost"
  rc=0
  engine_window xdp "$BIN" || rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "pair $i: engine run failed (exit $rc), pair skipped" >&2
    continue
  fi
  read -r xf xk xu <<<"$WIN"
  r=$(python3 -c "print(round($xf * 65536 / 46 / ($rf * 1460), 3))")
  ratios+=("$r")
  echo "pair $i xdp: $xf frames/s, kernel $xk ns/frame, user $xu ns/frame; steady-state goodput xdp / raw $r"
done
[ "${#ratios[@]}" -gt 0 ] || { echo "bench-engine-cpu: no pair completed" >&2; exit 1; }
python3 -c "import statistics, sys; print('median steady-state goodput xdp / raw:', statistics.median(float(x) for x in sys.argv[1:]))" "${ratios[@]}"
