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

for t in "${targets[@]}"; do
  d=${dir_of[$t]}
  corpus="$WORK/corpus/$t"
  artifacts="$WORK/artifacts/$t"
  mkdir -p "$corpus" "$artifacts"
  seeds=()
  [ -d "$d/seeds/$t" ] && seeds=("$PWD/$d/seeds/$t")
  echo "== fuzzing $t ($d) for ${SECONDS_PER_TARGET}s (corpus $corpus)"
  # The first corpus directory receives new inputs; the committed seeds are read only.
  if ! (cd "$d" && cargo fuzz run --sanitizer none --target-dir "$BUILD" "$t" "$corpus" "${seeds[@]}" -- \
    -max_total_time="$SECONDS_PER_TARGET" -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="$artifacts/" -print_final_stats=1); then
    echo "fuzz.sh: $t FAILED; reproducer(s):" >&2
    ls -1 "$artifacts"/* >&2 || true
    exit 1
  fi
done
echo "fuzz.sh: ${#targets[@]} target(s) ran ${SECONDS_PER_TARGET}s each without a crash; total $((SECONDS - started))s (build included)"
