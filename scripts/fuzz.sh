#!/usr/bin/env bash
# Coverage-guided fuzzing with cargo-fuzz (libFuzzer) on the stable toolchain, each target for a
# bounded time. Fails (non-zero exit) on the first crash, printing the reproducer's path.
#
# Fuzz crates (each its own workspace, targets in fuzz_targets/, seeds in seeds/<target>/):
#   tcp-engine/fuzz   the TCP segment parser, the RDMA option, the connection state machine and
#                     the connection table (listeners, SYN cookies)
#   fuzz              the iWARP layers: MPA startup and framing, DDP, RDMAP, IwarpConn
#
# usage: scripts/fuzz.sh [TARGET...]          (default: every target of every fuzz crate)
#   FUZZ_SECONDS   seconds per target (default 60)
#   FUZZ_JOBS      targets fuzzed at once, each on one core (default: the machine's cores)
#   FUZZ_WORK_DIR  corpus and crash artifacts (default target/fuzz)
#
# cargo-fuzz's default AddressSanitizer needs nightly (-Zsanitizer); with `--sanitizer none`
# everything it passes to rustc is stable (-Cpasses=sancov-module and -Cllvm-args coverage
# flags), so no RUSTC_BOOTSTRAP is needed. The protocol crates forbid unsafe code, but the
# iwarp_conn target reaches copy-crc's SIMD CRC kernels (unsafe), whose over-reads within a page
# only ASan would see: copy-crc's own tests check them at every length and alignment up to 4 KiB
# against a reference, and with their buffers flush against inaccessible pages (an over-read or
# over-write faults) up to 16 KiB. Debug assertions and overflow checks are on, and the iWARP targets put
# registered memory between guard octets. Each input may run 10 s at most (-timeout: a hang
# fails the run rather than holding it for libFuzzer's default 20 minutes). All crates build into one target
# directory (target/fuzz-build), so the crates they share are compiled once. Reproduce a crash
# with (DIR the target's fuzz crate):
#   (cd DIR && cargo fuzz run --sanitizer none --target-dir ../target/fuzz-build TARGET path/to/crash-file)
# (from tcp-engine/fuzz the target directory is ../../target/fuzz-build).
set -euo pipefail
cd "$(dirname "$0")/.."

CARGO_FUZZ_VERSION=0.13.2
SECONDS_PER_TARGET="${FUZZ_SECONDS:-60}"
JOBS="${FUZZ_JOBS:-$(nproc)}"
WORK="${FUZZ_WORK_DIR:-$PWD/target/fuzz}"
BUILD="$PWD/target/fuzz-build"
FUZZ_DIRS=(tcp-engine/fuzz fuzz)
started=$SECONDS

case "$SECONDS_PER_TARGET" in
  '' | *[!0-9]*)
    echo "fuzz.sh: FUZZ_SECONDS must be a whole number of seconds, not '$SECONDS_PER_TARGET'" >&2
    exit 2
    ;;
esac
case "$JOBS" in
  '' | *[!0-9]* | 0)
    echo "fuzz.sh: FUZZ_JOBS must be a whole number above zero, not '$JOBS'" >&2
    exit 2
    ;;
esac

have_version() {
  command -v cargo-fuzz >/dev/null 2>&1 &&
    cargo fuzz --version 2>/dev/null | grep -qF "$CARGO_FUZZ_VERSION"
}
if ! have_version; then
  echo "== installing cargo-fuzz $CARGO_FUZZ_VERSION"
  cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked
fi

# Which crate each target belongs to.
declare -A dir_of=()
all=()
for d in "${FUZZ_DIRS[@]}"; do
  while read -r t; do
    [ -n "$t" ] || continue
    [ -z "${dir_of[$t]:-}" ] || { echo "fuzz.sh: target $t is in two crates" >&2; exit 2; }
    dir_of[$t]=$d
    all+=("$t")
  done < <(cd "$d" && cargo fuzz list)
done

targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${all[@]}")
[ ${#targets[@]} -gt 0 ] || { echo "fuzz.sh: no fuzz targets found in ${FUZZ_DIRS[*]}" >&2; exit 1; }
for t in "${targets[@]}"; do
  [ -n "${dir_of[$t]:-}" ] || {
    echo "fuzz.sh: unknown target '$t' (known: ${all[*]})" >&2
    exit 2
  }
done

for d in "${FUZZ_DIRS[@]}"; do
  wanted=()
  for t in "${targets[@]}"; do
    [ "${dir_of[$t]}" != "$d" ] || wanted+=("$t")
  done
  [ ${#wanted[@]} -gt 0 ] || continue
  echo "== cargo fuzz build $d (${wanted[*]})"
  (cd "$d" && cargo fuzz build --sanitizer none --target-dir "$BUILD")
done
echo "fuzz.sh: built in $((SECONDS - started))s"

# One target: libFuzzer's log goes to its own file, printed whole when the target ends (targets
# run side by side, up to JOBS at once).
fuzz_one() {
  local t=$1 d=${dir_of[$1]}
  local corpus="$WORK/corpus/$t" artifacts="$WORK/artifacts/$t"
  mkdir -p "$corpus" "$artifacts"
  local seeds=()
  [ -d "$d/seeds/$t" ] && seeds=("$PWD/$d/seeds/$t")
  echo "== fuzzing $t ($d) for ${SECONDS_PER_TARGET}s (corpus $corpus)"
  # The first corpus directory receives new inputs; the committed seeds are read only.
  (cd "$d" && cargo fuzz run --sanitizer none --target-dir "$BUILD" "$t" "$corpus" "${seeds[@]}" -- \
    -max_total_time="$SECONDS_PER_TARGET" -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="$artifacts/" -print_final_stats=1)
}

LOGS="$WORK/logs"
mkdir -p "$LOGS"
declare -A target_of=()
running=0
failed=()
# Waits for one running target, prints its log and notes a failure.
reap() {
  local pid rc=0
  wait -n -p pid || rc=$?
  running=$((running - 1))
  local t=${target_of[$pid]}
  cat "$LOGS/$t.log"
  if [ "$rc" -ne 0 ]; then
    echo "fuzz.sh: $t FAILED; reproducer(s):" >&2
    ls -1 "$WORK/artifacts/$t"/* >&2 || true
    failed+=("$t")
  fi
}
trap 'kill $(jobs -rp) 2>/dev/null || true' EXIT
for t in "${targets[@]}"; do
  while [ "$running" -ge "$JOBS" ]; do reap; done
  # The first crash ends the run: no new target starts after it.
  [ ${#failed[@]} -eq 0 ] || break
  fuzz_one "$t" >"$LOGS/$t.log" 2>&1 &
  target_of[$!]=$t
  running=$((running + 1))
done
while [ "$running" -gt 0 ]; do reap; done
trap - EXIT
if [ ${#failed[@]} -gt 0 ]; then
  # Again at the very end, after the logs of the targets that were still running: what a
  # caller's `tail` shows is the crash, not another target's statistics.
  for t in "${failed[@]}"; do
    echo "== $t crashed: the end of its log ($LOGS/$t.log)" >&2
    tail -n 60 "$LOGS/$t.log" >&2
    echo "fuzz.sh: $t's reproducer(s):" >&2
    ls -1 "$WORK/artifacts/$t"/* >&2 || true
  done
  echo "fuzz.sh: crashed: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz.sh: ${#targets[@]} target(s) ran ${SECONDS_PER_TARGET}s each, $JOBS at once, without a crash; total $((SECONDS - started))s (build included)"
