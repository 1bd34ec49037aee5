#!/usr/bin/env bash
# The main job: builds iwarp-bench and runs write-bw and write-lat, server and client. As root,
# on the veth test bed over the AF_XDP engine (server in namespace iwa, client in iwb); where
# that is not possible (not root, the bed does not come up, the AF_XDP engine cannot start on
# it), on loopback over the socket transport (MPA over kernel TCP). Any other failure of the
# AF_XDP run (data that does not verify, a server that fails or hangs) is the demo's failure:
# it says so and exits non-zero, without falling back.
# DEMO_TRANSPORT=socket picks the socket transport on loopback directly.
# BIN=path runs that iwarp-bench instead of building one, and installs nothing (what the bed
# needs is the caller's; bench/tests/scripts_demo.rs runs the script so, with a stub).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -n "${BIN:-}" ]; then
  [ -f "$BIN" ] && [ -x "$BIN" ] || { echo "demo: BIN=$BIN is not an executable file" >&2; exit 1; }
  echo "demo: BIN=$BIN: running it instead of a build of this tree"
else
  scripts/install-deps.sh
  cargo build --release --locked -p bench
  BIN=$PWD/target/release/iwarp-bench
fi
PORT=${PORT:-18515}
TMP=$(mktemp -d)
ERR=$TMP/client.err
SLOG=$TMP/server.err
BED=""
# stop PID, wait_bounded PID SECONDS, on_exit, waited.
# shellcheck source=scripts/lib/jobs.sh
source scripts/lib/jobs.sh
cleanup() {
  [ -z "$BED" ] || scripts/netns.sh down >/dev/null 2>&1 || true
  rm -rf "$TMP"
}
# However the demo ends (EXIT, INT, TERM): its server and client stopped, then the bed down.
on_exit cleanup

# run_pair's and xdp_demo's status when AF_XDP is not possible here (1: the run failed).
NOT_POSSIBLE=2
# What iwarp-bench says when the AF_XDP engine cannot start (bench/src/net.rs, open_device).
ENGINE_FAILED="iwarp-bench: starting the AF_XDP engine on "
# What a client says when nobody listens (yet) on the server's port: the kernel's error
# ("Connection refused (os error 111)"), or the engine's for a reset answering its SYN.
REFUSED="^iwarp-bench: connect to [^ ]+: (I/O error: )?connection refused"

# run_pair TEST SERVER_PREFIX CLIENT_PREFIX SERVER_ARGS CLIENT_ARGS ADDR -- common args
# Returns 0 when both sides succeeded, NOT_POSSIBLE when the AF_XDP engine could not start on
# either side, 1 for any other failure; each side's standard error is shown once it is done.
# Every command's status is checked here: the function runs where `set -e` does not act
# (`xdp_demo || ...`).
run_pair() {
  local test=$1 sp=$2 cp=$3 sargs=$4 cargs=$5 addr=$6 server rc=0
  shift 7
  echo "== iwarp-bench $test $* ($sargs server, $cargs client, $addr:$PORT)"
  # shellcheck disable=SC2086
  $sp "$BIN" "$test" $sargs --port "$PORT" "$@" 2>"$SLOG" &
  server=$!
  # The client tries again only while the server is not listening yet (connection refused)
  # and is still running. (`waited`: a SIGTERM stops it at once, not after its run.)
  for _ in $(seq 1 100); do
    # shellcheck disable=SC2086
    if waited $cp "$BIN" "$test" $cargs --port "$PORT" "$@" "$addr" 2>"$ERR"; then
      cat "$ERR" >&2
      # The server ends within seconds of its client; one still running 30 s later is stuck.
      wait_bounded "$server" 30 || rc=$?
      cat "$SLOG" >&2
      case $rc in
        0) return 0 ;;
        124) echo "demo: the $test server was still running 30 s after its client ended (killed)" >&2 ;;
        *) echo "demo: the $test server failed (exit status $rc)" >&2 ;;
      esac
      return 1
    fi
    if ! grep -q -i -E "$REFUSED" "$ERR" || ! kill -0 "$server" 2>/dev/null; then
      break
    fi
    sleep 0.1
  done
  # The client failed, or found nobody listening for 100 tries: the server is of no more use.
  cat "$ERR" >&2
  if kill -0 "$server" 2>/dev/null; then
    stop "$server"
  else
    wait "$server" 2>/dev/null || true
  fi
  cat "$SLOG" >&2
  if grep -q -F "$ENGINE_FAILED" "$ERR" "$SLOG"; then
    return "$NOT_POSSIBLE"
  fi
  if grep -q -i -E "$REFUSED" "$ERR"; then
    echo "demo: the $test server never listened on port $PORT (see its output above)" >&2
  else
    echo "demo: the $test client failed (see above)" >&2
  fi
  return 1
}

# The demo on the veth test bed over the AF_XDP engine: run_pair's statuses, and NOT_POSSIBLE
# when the bed does not come up.
xdp_demo() {
  exec 9>/run/lock/iwarp-netns.lock
  # As a job the script waits for: a SIGTERM while another holder keeps the bed ends the wait
  # at once (the lock, on the descriptor the job shares with us, stays ours once taken).
  waited flock 9
  BED=1
  if ! scripts/netns.sh up >/dev/null; then
    echo "demo: the veth test bed did not come up (scripts/netns.sh up, see above)" >&2
    return "$NOT_POSSIBLE"
  fi
  local sa="--transport xdp --iface iwa0 --bind 10.77.0.1" ca="--transport xdp --iface iwb0"
  run_pair write-bw "ip netns exec iwa" "ip netns exec iwb" "$sa" "$ca" 10.77.0.1 -- -s 65536 -n 5000 ||
    return
  run_pair write-lat "ip netns exec iwa" "ip netns exec iwb" "$sa" "$ca" 10.77.0.1 -- -s 64 -n 10000
}

socket_demo() {
  local sa="--transport socket --bind 127.0.0.1" ca="--transport socket"
  run_pair write-bw "" "" "$sa" "$ca" 127.0.0.1 -- -s 65536 -n 5000
  run_pair write-lat "" "" "$sa" "$ca" 127.0.0.1 -- -s 64 -n 10000
}

if [ "${DEMO_TRANSPORT:-}" = socket ]; then
  echo "demo: DEMO_TRANSPORT=socket: running over the socket transport on loopback"
  socket_demo
elif [ "$(id -u)" -ne 0 ]; then
  echo "demo: not root, so no test bed and no AF_XDP: running over the socket transport on loopback"
  socket_demo
else
  rc=0
  xdp_demo || rc=$?
  case $rc in
    0) ;;
    "$NOT_POSSIBLE")
      echo "demo: AF_XDP is not possible here (see above): falling back to the socket transport on loopback"
      scripts/netns.sh down >/dev/null 2>&1 || true
      BED=""
      socket_demo
      ;;
    *)
      echo "demo: the AF_XDP run on the veth test bed failed (see above): not falling back to the socket transport" >&2
      exit 1
      ;;
  esac
fi
