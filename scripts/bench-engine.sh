#!/usr/bin/env bash
# The iWARP engine over AF_XDP next to the socket transport (kernel TCP) and next to the AF_XDP
# ceiling (`iwarp-bench raw`), same veth link, one run: write-bw and read-bw (64 KiB), write-lat
# and send-lat (64 B, p50 and p99), server in namespace iwa, client in iwb, transports
# alternating per test, every test in two placements:
#   pinned: the server process on CPU 0, the client process on CPU 1 (`taskset`), so each
#           side's application thread and engine (or connection) thread share one core;
#   free:   no pinning, the scheduler places the four threads on the two cores.
# The raw ceiling, measured in the same run and placement: `raw rx`/`raw tx` at MTU + 14-byte
# frames (the frame size the engine sends: 1514 at MTU 1500) and `raw pingpong` at 64 B (one
# way). For the bandwidth tests raw runs in every round right before the two transports, over
# as many frames as the engine's N messages take, in the test's direction, right before the engine; xdp / raw is the
# median of the rounds' own ratios, and the rounds are listed at the end. `raw rx` runs with --ring 2048 (RAW_RING): of 512, 2048 and 8192, alternating 8 runs
# each, 2048 gave raw its highest median goodput (5.01 against 4.94 and 4.68 Gbit/s).
# Bandwidth rows compare with raw's goodput (Gbit/s of the frames' TCP payload, frame less 54
# octets of headers: the most any protocol above TCP could carry in such frames), as
# issue #5's target is worded; raw's frame octets are in the last column. Needs root. Prints
# Markdown.
# Every cell is the median of REPS runs (default 3).
# XDP_ARGS: extra iwarp-bench options for both engine sides (e.g. "--engine-inline off");
# BENCH_ARGS: extra options for both sides of every transport (e.g. "--cq poll").
# Environment: TESTS="write-bw read-bw ..." runs only those tests; TX_COPY=1 adds, for the bw
# tests, a row of the engine with `--engine-tx-copy` (its former transmit path: payload copied
# through TCP's send buffer) measured alternately with the default engine in the same run.
# RAW_SOURCE_MIB=N adds, for the bw tests, raw with each frame's payload copied from an N MiB
# region as the engine copies it (`raw tx --source-mib N`, run in every round before plain raw)
# and a row of the engine against it: the ceiling when the data comes from memory, not from a
# template in cache.
# MTU: both veth ends' MTU (default 1500; above 3498 the engine and raw load the xdp.frags
# program, e.g. 9000); the engine and kernel TCP take their MSS from it, raw sends frames of
# MTU + 14 octets.
# A run that fails (either side of a pair, raw, a result that does not parse) stops the script
# with a non-zero exit, saying which command failed and printing its stderr (kept in LOGDIR,
# a temporary directory, or the directory given as LOGDIR), instead of a table with empty
# cells.
# Usage: scripts/bench-engine.sh [iterations-bw] [iterations-lat] [reps]
set -euo pipefail
# Command substitutions (every measurement is one) keep -e, so a failure in one stops it; each
# caller takes the result by assignment, whose status is the substitution's.
shopt -s inherit_errexit
cd "$(dirname "$0")/.."
NBW=${1:-10000}
NLAT=${2:-10000}
REPS=${3:-3}
RAW_RING=${RAW_RING:-2048}
# shellcheck source=scripts/bed-bench.sh
. scripts/bed-bench.sh bench-engine
MTU=${MTU:-1500}
FRAME=$((MTU + 14))
# The most RDMA payload one frame carries: MTU less IP/TCP (40), timestamps (12), MPA header
# and CRC (6) and the tagged DDP/RDMAP header (14).
PAYLOAD=$((MTU - 40 - 12 - 6 - 14))
ip -n iwa link set iwa0 mtu "$MTU"
ip -n iwb link set iwb0 mtu "$MTU"
if [ -z "${LOGDIR:-}" ]; then
  LOGDIR=$(mktemp -d)
  OWN_LOGDIR=1
fi
mkdir -p "$LOGDIR"
# A run stopped by INT or TERM leaves no temporary LOGDIR behind (a failed one keeps it: `fail`
# names it); one given is kept.
drop_logdir_if_stopped() {
  [ -z "$JOBS_SIGNAL" ] || [ -z "${OWN_LOGDIR:-}" ] || rm -rf "$LOGDIR"
}
# Each pair takes the next port (and names its logs by it). `pair` runs in a command
# substitution, a subshell, so the count lives in a file.
PORT_FILE=$(mktemp "$LOGDIR/.port.XXXXXX")
echo 18700 >"$PORT_FILE"

# fail WHAT LOG... : says what failed and prints the logs on stderr, then ends the script (from
# a command substitution's subshell too: its non-zero status ends each caller in turn).
fail() {
  local what=$1 log
  shift
  echo "bench-engine: $what" >&2
  for log in "$@"; do
    [ -s "$log" ] || continue
    echo "--- $log:" >&2
    cat "$log" >&2
  done
  echo "bench-engine: logs in $LOGDIR" >&2
  exit 1
}

# stop PID, wait_bounded PID SECONDS, on_exit, capture (bed-bench.sh sourced it already: its
# traps stop the servers and take the bed down however the script ends).
source scripts/lib/jobs.sh
on_exit drop_logdir_if_stopped

place() { # placement side -> command prefix
  if [ "$1" = pinned ]; then
    if [ "$2" = server ]; then echo "taskset -c 0"; else echo "taskset -c 1"; fi
  fi
}

pair() { # placement transport test size iters -> client JSON
  local pl=$1 tr=$2 test=$3 size=$4 n=$5 sa ca out="" sp cp ok=0 rc=0 slog clog PORT
  # A command substitution's subshell, whose server the script's traps do not see: its own.
  on_exit
  PORT=$(cat "$PORT_FILE")
  echo $((PORT + 1)) >"$PORT_FILE"
  slog=$LOGDIR/$test-$tr-$pl-$PORT.server.log
  clog=$LOGDIR/$test-$tr-$pl-$PORT.client.log
  sp=$(place "$pl" server)
  cp=$(place "$pl" client)
  if [ "$tr" = xdp ]; then
    sa="--transport xdp --iface iwa0 ${XDP_ARGS:-}"; ca="--transport xdp --iface iwb0 ${XDP_ARGS:-}"
  elif [ "$tr" = xdpcopy ]; then
    sa="--transport xdp --engine-tx-copy --iface iwa0 ${XDP_ARGS:-}"
    ca="--transport xdp --engine-tx-copy --iface iwb0 ${XDP_ARGS:-}"
  else sa="--transport socket --bind 10.77.0.1"; ca="--transport socket"; fi
  sa="$sa ${BENCH_ARGS:-}"; ca="$ca ${BENCH_ARGS:-}"
  # shellcheck disable=SC2086
  ip netns exec iwa $sp "$BIN" "$test" $sa --port "$PORT" -s "$size" -n "$n" --json >"$SRV_JSON" 2>"$slog" &
  local srv=$!
  # The client tries again only while the server is not listening yet (connection refused)
  # and still running; any other failure is the run's.
  for _ in $(seq 1 100); do
    # shellcheck disable=SC2086
    if out=$(ip netns exec iwb $cp "$BIN" "$test" $ca --port "$PORT" -s "$size" -n "$n" --json 10.77.0.1 2>"$clog"); then
      ok=1
      break
    fi
    if ! grep -q -i "refused" "$clog" || ! kill -0 "$srv" 2>/dev/null; then break; fi
    sleep 0.1
  done
  if [ "$ok" != 1 ]; then
    kill "$srv" 2>/dev/null || true
    wait "$srv" 2>/dev/null || true
    fail "$test over $tr ($pl, port $PORT): the client failed" "$clog" "$slog"
  fi
  # The server ends within seconds of its client (it waits 5 s at most for the close).
  wait_bounded "$srv" 30 || rc=$?
  if [ "$rc" = 124 ]; then
    fail "$test over $tr ($pl, port $PORT): the server was still running 30 s after its client ended (killed)" "$slog" "$clog"
  elif [ "$rc" != 0 ]; then
    fail "$test over $tr ($pl, port $PORT): the server failed (exit $rc)" "$slog" "$clog"
  fi
  echo "$out"
}
f() { python3 -c "import json,sys; r=json.loads(sys.stdin.read())['results'][0]; print(round(r['$1'], 2))"; }
j() { python3 -c "import json,sys; d=json.load(sys.stdin); print(' '.join(str(round(d[k], 2)) for k in sys.argv[1:]))" "$@"; }
# (A zero divisor, e.g. a run that moved nothing in time, gives "n/a", not a traceback.)
ratio() { python3 -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); print(round(a / b, 2) if b else 'n/a')" "$1" "$2"; }

raw_bw() { # placement direction count [tx options] -> "goodput frames": Gbit/s of TCP payload
  # and of FRAME-byte frames received; direction "iwb" sends from iwb to iwa (as write-bw moves
  # data), "iwa" the other way (as read-bw does); the sender is pinned where that test's data
  # sender is.
  local sp cp log rxns=iwa rxif=iwa0 txns=iwb txif=iwb0 dst=10.77.0.1 rc=0 out
  on_exit # (a subshell's, as in pair)
  sp=$(place "$1" server)
  cp=$(place "$1" client)
  if [ "$2" = iwa ]; then
    rxns=iwb; rxif=iwb0; txns=iwa; txif=iwa0; dst=10.77.0.2
    local t=$sp; sp=$cp; cp=$t
  fi
  log=$(mktemp "$LOGDIR/raw-rx.XXXXXX")
  # shellcheck disable=SC2086
  ip netns exec "$rxns" $sp "$BIN" raw rx --iface "$rxif" --size "$FRAME" --count "$3" --mode driver \
    --port 18600 --ring "$RAW_RING" --json 2>"$log" >"$log.out" &
  local rx=$!
  for _ in $(seq 1 200); do grep -q "^raw rx: ready on" "$log" && break; sleep 0.05; done
  if ! grep -q "^raw rx: ready on" "$log"; then
    kill "$rx" 2>/dev/null || true
    wait "$rx" 2>/dev/null || true
    fail "raw rx in $rxns did not get ready" "$log"
  fi
  # shellcheck disable=SC2086
  if ! ip netns exec "$txns" $cp "$BIN" raw tx --iface "$txif" --size "$FRAME" --count "$3" --dst-ip "$dst" \
    --port 18600 --quiet ${4:-} >/dev/null 2>"$log.tx"; then
    kill "$rx" 2>/dev/null || true
    wait "$rx" 2>/dev/null || true
    fail "raw tx in $txns failed" "$log.tx" "$log"
  fi
  # rx fails when frames were lost (fewer than --count arrived) but still reports what came:
  # that is a measurement; no report is a failure.
  wait_bounded "$rx" 30 || rc=$?
  out=$(j payload_gbit_per_sec gbit_per_sec <"$log.out" 2>>"$log") ||
    fail "raw rx in $rxns gave no result (exit $rc)" "$log"
  rm -f "$log" "$log.out" "$log.tx"
  echo "$out"
}

raw_lat() { # placement -> "p50 p99" of 64-byte raw pingpong, one way
  local sp cp out rlog=$LOGDIR/raw-pingpong-$1.responder.log ilog=$LOGDIR/raw-pingpong-$1.initiator.log
  on_exit # (a subshell's, as in pair)
  sp=$(place "$1" server)
  cp=$(place "$1" client)
  # shellcheck disable=SC2086
  ip netns exec iwa $sp "$BIN" raw pingpong --iface iwa0 --count "$NLAT" --mode driver --port 18620 \
    --quiet >/dev/null 2>"$rlog" &
  local resp=$!
  # The initiator starts once the responder says "responder ready" (its socket bound, the port
  # steered), at most 10 s; a responder that ended first fails the run with its error. (The
  # initiator gives up by itself after 10 s without a reply.)
  for _ in $(seq 1 200); do
    grep -q "^raw pingpong: responder ready on" "$rlog" && break
    kill -0 "$resp" 2>/dev/null || break
    sleep 0.05
  done
  if ! grep -q "^raw pingpong: responder ready on" "$rlog"; then
    kill "$resp" 2>/dev/null || true
    wait "$resp" 2>/dev/null || true
    fail "raw pingpong ($1): the responder in iwa did not get ready" "$rlog"
  fi
  # shellcheck disable=SC2086
  if ! out=$(ip netns exec iwb $cp "$BIN" raw pingpong --iface iwb0 --dst-ip 10.77.0.1 --size 64 \
    --count "$NLAT" --mode driver --port 18620 --quiet --json 2>"$ilog"); then
    kill "$resp" 2>/dev/null || true
    wait "$resp" 2>/dev/null || true
    fail "raw pingpong ($1) failed" "$ilog" "$rlog"
  fi
  # The responder stops once idle (2 s); its exit status says nothing about the measurement.
  wait_bounded "$resp" 30 || true
  out=$(echo "$out" | j t_typical_us p99_us 2>>"$ilog") ||
    fail "raw pingpong ($1) gave no result" "$ilog"
  echo "$out"
}

# Median over REPS runs of each measurement (the machine is shared; one run is too noisy).
# (Rounds whose ratio is "n/a", a zero divisor, are left out; none left: "n/a".)
med() { python3 -c "
import statistics, sys
v = [float(x) for x in sys.argv[1:] if x != 'n/a']
print(round(statistics.median(v), 2) if v else 'n/a')" "$@"; }
reps() { # placement transport test size iters -> "p50-or-gbit p99" medians over REPS runs
  local a=() b=() out v1 v2=0 m1 m2
  for _ in $(seq 1 "$REPS"); do
    out=$(pair "$@")
    if [[ "$3" == *-bw ]]; then
      v1=$(echo "$out" | f gbit_per_sec)
    else
      v1=$(echo "$out" | f t_typical_us)
      v2=$(echo "$out" | f p99_us)
    fi
    a+=("$v1"); b+=("$v2")
  done
  m1=$(med "${a[@]}")
  m2=$(med "${b[@]}")
  echo "$m1 $m2"
}
raw_lat_reps() { # placement -> "p50 p99" medians over REPS runs of raw pingpong
  local p=() q=() l50 l99 out m1 m2
  for _ in $(seq 1 "$REPS"); do
    out=$(raw_lat "$1")
    read -r l50 l99 <<<"$out"
    p+=("$l50"); q+=("$l99")
  done
  m1=$(med "${p[@]}")
  m2=$(med "${q[@]}")
  echo "$m1 $m2"
}
# Bandwidth: each of the REPS rounds runs the socket transport, then raw AF_XDP over as many
# frames as the engine carries (N x ceil(size / PAYLOAD)), then the engine (then --engine-tx-copy
# with TX_COPY=1), one right after the other, so raw and the engine meet the same machine and
# carry the same frames (the machine drifts by tens of percent over minutes; a short run pays
# its start more). -> medians of "raw-goodput raw-frames socket xdp xdp/raw xdpcopy xdpcopy/raw",
# the ratios the median of the rounds' own ratios.
bw_reps() { # placement test size iters
  local rg=() rf=() s=() x=() xr=() c=() cr=() sg=() sr=() idle=() gp fr sv xv cv sgp out dir=iwb count
  count=$(( $4 * (($3 + PAYLOAD - 1) / PAYLOAD) ))
  [ "$2" = read-bw ] && dir=iwa
  for _ in $(seq 1 "$REPS"); do
    out=$(pair "$1" socket "$2" "$3" "$4")
    sv=$(echo "$out" | f gbit_per_sec)
    sgp=0
    if [ -n "${RAW_SOURCE_MIB:-}" ]; then
      out=$(raw_bw "$1" "$dir" "$count" "--source-mib $RAW_SOURCE_MIB")
      read -r sgp _ <<<"$out"
    fi
    out=$(raw_bw "$1" "$dir" "$count")
    read -r gp fr <<<"$out"
    out=$(pair "$1" xdp "$2" "$3" "$4")
    xv=$(echo "$out" | f gbit_per_sec)
    # The data sender's engine idle time (the client's in write-bw, the server's in read-bw).
    [ "$2" = read-bw ] && out=$(cat "$SRV_JSON")
    idle+=("$(echo "$out" | python3 -c "import json,sys; print(round(json.load(sys.stdin)['engine']['idle_ms']))" 2>/dev/null || echo '?')")
    rg+=("$gp"); rf+=("$fr"); s+=("$sv"); x+=("$xv"); xr+=("$(ratio "$xv" "$gp")")
    sg+=("$sgp"); if [ -n "${RAW_SOURCE_MIB:-}" ]; then sr+=("$(ratio "$xv" "$sgp")"); else sr+=(0); fi
    if [ "${TX_COPY:-0}" = 1 ]; then
      out=$(pair "$1" xdpcopy "$2" "$3" "$4")
      cv=$(echo "$out" | f gbit_per_sec)
      c+=("$cv"); cr+=("$(ratio "$cv" "$gp")")
    else
      c+=(0); cr+=(0)
    fi
  done
  # (Each by assignment: an array append would not carry a failure's status.)
  local meds=() list m
  for list in rg rf s x xr c cr sg sr; do
    local -n values=$list
    m=$(med "${values[@]}")
    meds+=("$m")
  done
  echo "${meds[*]}"
  local from=""
  [ -n "${RAW_SOURCE_MIB:-}" ] && from="; raw with payload from a region of $RAW_SOURCE_MIB MiB ${sg[*]}; xdp/that ${sr[*]}"
  echo "$2 $1: raw ${rg[*]}; xdp ${x[*]}; xdp/raw ${xr[*]}$from; data sender's engine idle ms ${idle[*]}" >>"$ROUNDS"
}

echo "host: $(uname -r), $(nproc) cores; MTU $MTU; date $(date -u +%Y-%m-%dT%H:%MZ); median of $REPS runs per cell; engine options: ${XDP_ARGS:-defaults}; options of both transports: ${BENCH_ARGS:-defaults}"
echo
echo "| test | placement | socket transport | xdp engine | xdp / socket | raw AF_XDP | xdp / raw | raw frame octets, Gbit/s |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
ROUNDS=$LOGDIR/rounds
SRV_JSON=$LOGDIR/server.json
# The measurements run by `capture` (jobs.sh): a SIGTERM to the script stops them at once, not
# once the running one has ended.
: >"$ROUNDS"
# Raw's ping-pong only where a latency test runs.
wants_lat=1
if [ -n "${TESTS:-}" ] && [[ " $TESTS " != *-lat\ * ]]; then wants_lat=0; fi
for pl in pinned free; do
  if [ "$wants_lat" = 1 ]; then
    capture out raw_lat_reps "$pl"
    read -r rp50 rp99 <<<"$out"
  fi
  for spec in "write-bw 65536 $NBW" "read-bw 65536 $NBW" "write-lat 64 $NLAT" "send-lat 64 $NLAT"; do
    # shellcheck disable=SC2086
    set -- $spec
    if [ -n "${TESTS:-}" ] && [[ " $TESTS " != *" $1 "* ]]; then continue; fi
    if [[ "$1" == *-bw ]]; then
      capture out bw_reps "$pl" "$1" "$2" "$3"
      read -r rbw rfr s1 x1 xr c1 cr sgb sgr <<<"$out"
      printf '| %s %s B, Gbit/s | %s | %s | %s | %s | %s | %s | %s |\n' \
        "$1" "$2" "$pl" "$s1" "$x1" "$(ratio "$x1" "$s1")" "$rbw" "$xr" "$rfr"
      if [ -n "${RAW_SOURCE_MIB:-}" ]; then
        printf '| %s %s B, Gbit/s, raw with payload from a region of %s MiB | %s | %s | %s | %s | %s | %s | |\n' \
          "$1" "$2" "$RAW_SOURCE_MIB" "$pl" "$s1" "$x1" "$(ratio "$x1" "$s1")" "$sgb" "$sgr"
      fi
      if [ "${TX_COPY:-0}" = 1 ]; then
        printf '| %s %s B, Gbit/s, engine --engine-tx-copy | %s | %s | %s | %s | %s | %s | %s |\n' \
          "$1" "$2" "$pl" "$s1" "$c1" "$(ratio "$c1" "$s1")" "$rbw" "$cr" "$rfr"
      fi
    else
      capture out reps "$pl" socket "$1" "$2" "$3"
      read -r s1 s2 <<<"$out"
      capture out reps "$pl" xdp "$1" "$2" "$3"
      read -r x1 x2 <<<"$out"
      printf '| %s %s B, us p50 | %s | %s | %s | %s | %s | %s | |\n' \
        "$1" "$2" "$pl" "$s1" "$x1" "$(ratio "$x1" "$s1")" "$rp50" "$(ratio "$x1" "$rp50")"
      printf '| %s %s B, us p99 | %s | %s | %s | %s | %s | %s | |\n' \
        "$1" "$2" "$pl" "$s2" "$x2" "$(ratio "$x2" "$s2")" "$rp99" "$(ratio "$x2" "$rp99")"
    fi
  done
done
echo
echo "Bandwidth rounds (raw goodput and engine Gbit/s, run right after each other, their ratio, and"
echo "how long the engine that sent the data waited for ACKs instead of sending, \`idle_ms\`):"
echo
sed 's/^/- /' "$ROUNDS"
# Every run worked: the logs of a temporary LOGDIR go (a LOGDIR given is kept).
rm -f "$PORT_FILE"
[ -z "${OWN_LOGDIR:-}" ] || rm -rf "$LOGDIR"
echo
echo "Commands: \`iwarp-bench TEST -s SIZE -n N --transport socket|xdp\` (server \`--iface iwa0\` or"
echo "\`--bind 10.77.0.1\`, client \`--iface iwb0 10.77.0.1\`), N = $NBW (bw) / $NLAT (lat); raw: \`raw rx"
echo "--size $FRAME --count N x $(( (65536 + PAYLOAD - 1) / PAYLOAD )) --mode driver --ring $RAW_RING\` / \`raw tx --size $FRAME --count\` the same (the"
echo "frames the engine's N messages take; iwb to iwa for write-bw, iwa to iwb for read-bw),"
echo "\`raw pingpong --size 64 --count $NLAT --mode driver\`; pinned: server \`taskset -c 0\`, client"
echo "\`taskset -c 1\`. Gbit/s of the engine and the socket transport count RDMA payload; raw AF_XDP"
echo "and xdp / raw use raw's goodput, its frames' TCP payload ($((FRAME - 54)) of $FRAME octets; an engine"
echo "FPDU carries at most $PAYLOAD: TCP timestamps, MPA, DDP/RDMAP headers and CRC take the rest); the"
echo "last column is raw in Ethernet frame octets."
if [ -n "${RAW_SOURCE_MIB:-}" ]; then
  echo "Rows \"raw with payload from a region of $RAW_SOURCE_MIB MiB\": \`raw tx ... --source-mib $RAW_SOURCE_MIB\` (each"
  echo "frame's payload copied from a pinned $RAW_SOURCE_MIB MiB region walked in order, with CRC32C and checksum"
  echo "sum, as the engine moves it), run in each round before plain raw; its goodput and xdp / that."
fi
