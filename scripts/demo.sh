#!/usr/bin/env bash
# The main job: builds iwarp-bench and runs write-bw and write-lat, server and client, on
# loopback over the socket transport (MPA over kernel TCP). The AF_XDP transport on the veth
# test bed will join here when it lands.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
cargo build --release --locked -p bench
BIN=target/release/iwarp-bench
PORT=${PORT:-18515}

run_pair() {
  local test=$1; shift
  echo "== iwarp-bench $test --transport socket $* (server and client on 127.0.0.1:$PORT)"
  "$BIN" "$test" --transport socket --bind 127.0.0.1 --port "$PORT" "$@" &
  local server=$!
  # The server is ready when its port accepts connections; the client retries until then.
  for _ in $(seq 1 100); do
    if "$BIN" "$test" --transport socket --port "$PORT" "$@" 127.0.0.1 2>/tmp/iwarp-demo-client.err; then
      cat /tmp/iwarp-demo-client.err >&2
      wait "$server"
      return 0
    fi
    grep -q "Connection refused" /tmp/iwarp-demo-client.err || { cat /tmp/iwarp-demo-client.err >&2; kill "$server" 2>/dev/null; return 1; }
    sleep 0.05
  done
  kill "$server" 2>/dev/null
  echo "demo: server on port $PORT never came up" >&2
  return 1
}

run_pair write-bw -s 65536 -n 5000
run_pair write-lat -s 64 -n 10000
