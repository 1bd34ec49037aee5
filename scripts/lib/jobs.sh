# Background jobs of the bench and demo scripts, ended within bounds. Sourced, not run.

# stop PID: ends background job PID (SIGTERM, SIGKILL after 5 s) and reaps it.
stop() {
  kill "$1" 2>/dev/null || true
  local tenths=50
  while kill -0 "$1" 2>/dev/null && [ "$tenths" -gt 0 ]; do
    sleep 0.1
    tenths=$((tenths - 1))
  done
  kill -9 "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}

# wait_bounded PID SECONDS: the exit status of background job PID, waiting at most SECONDS for
# it; 124 after stopping it when it is still running then.
wait_bounded() {
  local pid=$1 tenths=$(($2 * 10)) rc=0
  while kill -0 "$pid" 2>/dev/null && [ "$tenths" -gt 0 ]; do
    sleep 0.1
    tenths=$((tenths - 1))
  done
  if kill -0 "$pid" 2>/dev/null; then
    stop "$pid"
    return 124
  fi
  wait "$pid" || rc=$?
  return "$rc"
}
