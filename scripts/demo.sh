#!/usr/bin/env bash
# The main job: builds iwarp-bench and runs write-bw and write-lat, server and client. As root,
# on the veth test bed over the AF_XDP engine (server in namespace iwa, client in iwb); where
# that is not possible, on loopback over the socket transport (MPA over kernel TCP).
# DEMO_TRANSPORT=socket picks the socket transport on loopback directly.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
cargo build --release --locked -p bench
BIN=$PWD/target/release/iwarp-bench
PORT=${PORT:-18515}
ERR=$(mktemp)
trap 'rm -f "$ERR"' EXIT

# run_pair TEST SERVER_PREFIX CLIENT_PREFIX SERVER_ARGS CLIENT_ARGS ADDR -- common args
run_pair() {
  local test=$1 sp=$2 cp=$3 sargs=$4 cargs=$5 addr=$6
  shift 7
  echo "== iwarp-bench $test $* ($sargs server, $cargs client, $addr:$PORT)"
  # shellcheck disable=SC2086
  $sp "$BIN" "$test" $sargs --port "$PORT" "$@" &
  local server=$!
  # The client retries while the server is not listening yet.
  for _ in $(seq 1 100); do
    # shellcheck disable=SC2086
    if $cp "$BIN" "$test" $cargs --port "$PORT" "$@" "$addr" 2>"$ERR"; then
      cat "$ERR" >&2
      # The server ends within seconds of its client; one still running 30 s later is stuck.
      for _ in $(seq 1 300); do kill -0 "$server" 2>/dev/null || break; sleep 0.1; done
      if kill -0 "$server" 2>/dev/null; then
        kill "$server" 2>/dev/null || true
        wait "$server" 2>/dev/null || true
        echo "demo: the $test server was still running 30 s after its client ended (killed)" >&2
        return 1
      fi
      # Checked here: called from an `if` (xdp_demo), where `set -e` does not act.
      wait "$server" || { echo "demo: the $test server failed" >&2; return 1; }
      return 0
    fi
    grep -q -i "refused" "$ERR" || { cat "$ERR" >&2; kill "$server" 2>/dev/null; return 1; }
    sleep 0.1
  done
  kill "$server" 2>/dev/null
  echo "demo: server on port $PORT never came up" >&2
  return 1
}

xdp_demo() {
  exec 9>/run/lock/iwarp-netns.lock
  flock 9
  scripts/netns.sh up >/dev/null || return 1
  trap 'scripts/netns.sh down >/dev/null 2>&1 || true; rm -f "$ERR"' EXIT
  local sa="--transport xdp --iface iwa0 --bind 10.77.0.1" ca="--transport xdp --iface iwb0"
  run_pair write-bw "ip netns exec iwa" "ip netns exec iwb" "$sa" "$ca" 10.77.0.1 -- -s 65536 -n 5000 &&
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
elif xdp_demo; then
  :
else
  echo "demo: the AF_XDP run on the veth test bed did not work (see above): falling back to the socket transport on loopback"
  scripts/netns.sh down >/dev/null 2>&1 || true
  socket_demo
fi
