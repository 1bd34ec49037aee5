# Background jobs of the bench and demo scripts, ended within bounds, and the scripts' ends
# (`on_exit`). Sourced, not run (once: a second `source` changes nothing).
[ -z "${JOBS_SH_SOURCED:-}" ] || return 0
JOBS_SH_SOURCED=1

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

# The script's own cleanups (`on_exit FUNCTION...`), the shell that gave them, the signal that
# is ending it (if one is), the file `capture` is writing (if it is).
JOBS_AT_EXIT=()
JOBS_OWNER=""
JOBS_SIGNAL=""
JOBS_DONE=""
JOBS_CAPTURE=""

# on_exit [FUNCTION...]: however the script ends (EXIT, INT or TERM), once: stops every process
# it started that still runs and what those started (background jobs, process substitutions,
# the subshells of `capture` with their servers and clients: SIGTERM to all, SIGKILL to those
# left after 5 s), then runs the FUNCTIONs given so far (the bed down, temporary files), in
# order, in the shell that gave them (JOBS_SIGNAL then says INT or TERM when one of them is
# ending the script, empty otherwise). INT and TERM end the script as the signal does: the
# cleanup runs, then the signal ends it (status 130 or 143 for its caller, whose own loop stops
# too); a second INT or TERM during the cleanup ends it at once.
# A subshell that starts background jobs ($(...) resets the traps) calls it with no FUNCTION:
# it then stops its own when it ends.
# Bash runs a trap only once the foreground command it waits for has ended (Ctrl-C reaches
# that command too, a SIGTERM to the script alone does not): a long command runs as a job the
# script waits for, `waited` or `capture`, which the trap stops at once.
on_exit() {
  if [ $# -gt 0 ]; then
    JOBS_AT_EXIT+=("$@")
    JOBS_OWNER=$BASHPID
  fi
  trap _jobs_exit EXIT
  trap '_jobs_signal INT' INT
  trap '_jobs_signal TERM' TERM
}

# waited COMMAND...: runs COMMAND as a background job and waits for it; its exit status (a
# signal `on_exit` traps meanwhile ends the script at once, COMMAND stopped with the rest).
# Its standard input is /dev/null, as for any background job of a script.
waited() {
  "$@" &
  wait "$!"
}

# capture NAME COMMAND...: NAME=$(COMMAND...) (trailing newlines dropped), returning COMMAND's
# exit status, but run as `waited` (a command substitution is a foreground command).
capture() {
  local -n capture_into=$1
  shift
  local capture_rc=0
  JOBS_CAPTURE=$(mktemp)
  # (The file is this shell's to remove, not the job's subshells'.)
  { JOBS_CAPTURE=""; "$@"; } >"$JOBS_CAPTURE" &
  wait "$!" || capture_rc=$?
  capture_into=$(<"$JOBS_CAPTURE")
  rm -f "$JOBS_CAPTURE"
  JOBS_CAPTURE=""
  return "$capture_rc"
}

# _jobs_descendants PID: appends the processes below PID to JOBS_KIDS (from /proc; without it,
# this shell's jobs only).
_jobs_descendants() {
  local task kid kids
  if [ ! -e "/proc/$1/task" ]; then
    mapfile -t kids < <(jobs -p)
    JOBS_KIDS+=("${kids[@]}")
    return
  fi
  for task in /proc/"$1"/task/*/children; do
    kids=()
    read -r -a kids 2>/dev/null <"$task" || true
    for kid in "${kids[@]}"; do
      JOBS_KIDS+=("$kid")
      _jobs_descendants "$kid"
    done
  done
}

# _jobs_running PID...: whether any of them still runs (a zombie does not).
_jobs_running() {
  local pid stat
  for pid; do
    stat=""
    read -r stat 2>/dev/null <"/proc/$pid/stat" || kill -0 "$pid" 2>/dev/null || continue
    stat=${stat##*) }
    [ "${stat%% *}" = Z ] || return 0
  done
  return 1
}

_jobs_signal() {
  JOBS_SIGNAL=$1
  trap - INT TERM
  case $1 in
    INT) exit 130 ;;
    *) exit 143 ;;
  esac
}

_jobs_exit() {
  local rc=$? pid f tenths=50
  set +eu
  # A first INT or TERM during the cleanup is noted, not obeyed at once (that would cut the
  # cleanup short: servers left, the bed up); the cleanup then ends by it. A second one ends
  # the script at once.
  [ -n "$JOBS_SIGNAL" ] || {
    trap 'JOBS_SIGNAL=INT; trap - INT TERM' INT
    trap 'JOBS_SIGNAL=TERM; trap - INT TERM' TERM
  }
  if [ -z "$JOBS_DONE" ]; then
    JOBS_DONE=1
    JOBS_KIDS=()
    _jobs_descendants "$BASHPID"
    if [ "${#JOBS_KIDS[@]}" -gt 0 ]; then
      kill "${JOBS_KIDS[@]}" 2>/dev/null
      while _jobs_running "${JOBS_KIDS[@]}" && [ "$tenths" -gt 0 ]; do
        sleep 0.1
        tenths=$((tenths - 1))
      done
      for pid in "${JOBS_KIDS[@]}"; do
        ! _jobs_running "$pid" || kill -9 "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
      done
    fi
    [ -z "$JOBS_CAPTURE" ] || rm -f "$JOBS_CAPTURE"
    if [ "$BASHPID" = "$JOBS_OWNER" ]; then
      for f in "${JOBS_AT_EXIT[@]}"; do
        "$f"
      done
    fi
  fi
  if [ -n "$JOBS_SIGNAL" ]; then
    trap - EXIT
    kill -s "$JOBS_SIGNAL" "$BASHPID"
  fi
  exit "$rc"
}
