# Sourced by the scripts that sample the data sender's core on the veth test bed
# (bench-engine-cpu.sh, bench-engine-cpu-ab.sh). Needs `tmp` (a scratch directory) set by the
# caller.
# ensure_perf NAME: installs perf (Debian: linux-perf) if missing; only these scripts need it, so
# install-deps.sh (run by the tests too) leaves it out.
# engine_window LABEL BIN [OPTIONS...]: a pinned engine write-bw of N x 64 KiB on port PORT
# (server in iwa on CPU 0, client in iwb on CPU 1, OPTIONS for both), sampled by cpu_window
# LABEL; sets WIN to its "frames/s kernel_ns user_ns", advances PORT and returns the first
# non-zero exit status of the two (0 if both succeeded). Needs N and PORT.
# cpu_window LABEL -> "frames/s kernel_ns user_ns": 0.6 s after the call, samples CPU 1 for one
# second (`perf record -C 1 -e cpu-clock -F 4000`) and reads the frames iwb0 sent meanwhile from
# its TX counter inside the recorded command, so samples and frames cover the same interval;
# kernel ns per frame includes the receiver's veth NAPI, XDP program and XSK copy, which veth
# runs on the sending core.
ensure_perf() {
  command -v perf >/dev/null && return 0
  echo "$1: perf missing, installing linux-perf" >&2
  { [ "$(id -u)" -eq 0 ] && DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends linux-perf >/dev/null; } ||
    { echo "$1: needs perf (as root: apt-get install linux-perf)" >&2; exit 1; }
}

cpu_window() {
  sleep 0.6
  # perf itself on CPU 1 too (its samples count, for both alike): on CPU 0 it would take the
  # receiver's core, and raw's receiver drops frames when it loses its core.
  taskset -c 1 perf record -q -C 1 -F 4000 -e cpu-clock -o "$tmp/$1.data" -- sh -c \
    "ip -n iwb -s link show iwb0 >$tmp/$1.c1; sleep 1; ip -n iwb -s link show iwb0 >$tmp/$1.c2" \
    >/dev/null 2>&1
  local a b
  a=$(awk '/TX:/{getline; print $2}' "$tmp/$1.c1")
  b=$(awk '/TX:/{getline; print $2}' "$tmp/$1.c2")
  perf report -i "$tmp/$1.data" --sort dso -n --stdio 2>/dev/null | python3 -c "
import re, sys
frames = max($b - $a, 1)
kernel = user = 0
for line in sys.stdin:
    m = re.match(r'\s*[\d.]+%\s+(\d+)\s+(\S+)', line)
    if not m:
        continue
    n, dso = int(m.group(1)), m.group(2)
    if 'kernel' in dso or dso.startswith('bpf_prog'):
        kernel += n
    else:
        user += n
print(frames, round(kernel / 4000 / frames * 1e9), round(user / 4000 / frames * 1e9))
"
}

engine_window() {
  local label=$1 bin=$2 srv cli rc=0
  shift 2
  ip netns exec iwa taskset -c 0 "$bin" write-bw --transport xdp --iface iwa0 --port "$PORT" \
    "$@" -s 65536 -n "$N" --json >/dev/null 2>&1 &
  srv=$!
  sleep 0.3
  ip netns exec iwb taskset -c 1 "$bin" write-bw --transport xdp --iface iwb0 --port "$PORT" \
    "$@" -s 65536 -n "$N" --json 10.77.0.1 >/dev/null 2>&1 &
  cli=$!
  WIN=$(cpu_window "$label")
  wait "$cli" || rc=$?
  wait "$srv" || rc=$?
  PORT=$((PORT + 1))
  return "$rc"
}
