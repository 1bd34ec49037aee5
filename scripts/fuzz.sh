#!/usr/bin/env bash
# Coverage-guided fuzzing of tcp-engine with cargo-fuzz (libFuzzer) on the stable toolchain:
# the segment parser and the connection state machine (tcp-engine/fuzz/fuzz_targets/), each for
# a bounded time. Fails (non-zero exit) on the first crash, printing the reproducer's path.
#
# usage: scripts/fuzz.sh [TARGET...]          (default: every target)
#   FUZZ_SECONDS   seconds per target (default 60)
#   FUZZ_WORK_DIR  corpus and crash artifacts (default target/fuzz)
#
# cargo-fuzz's default AddressSanitizer needs nightly (-Zsanitizer); with `--sanitizer none`
# everything it passes to rustc is stable (-Cpasses=sancov-module and -Cllvm-args coverage
# flags), so no RUSTC_BOOTSTRAP is needed. The targets are safe Rust over a
# #![forbid(unsafe_code)] crate, so ASan would add little; debug assertions and overflow
# checks are on. Reproduce a crash with:
#   (cd tcp-engine/fuzz && cargo fuzz run --sanitizer none TARGET path/to/crash-file)
set -euo pipefail
cd "$(dirname "$0")/.."

CARGO_FUZZ_VERSION=0.13.2
SECONDS_PER_TARGET="${FUZZ_SECONDS:-60}"
WORK="${FUZZ_WORK_DIR:-$PWD/target/fuzz}"
FUZZ_DIR=tcp-engine/fuzz

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

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(cd "$FUZZ_DIR" && cargo fuzz list)
fi
[ ${#targets[@]} -gt 0 ] || { echo "fuzz.sh: no fuzz targets found in $FUZZ_DIR" >&2; exit 1; }

echo "== cargo fuzz build (${targets[*]})"
(cd "$FUZZ_DIR" && cargo fuzz build --sanitizer none)

for t in "${targets[@]}"; do
  corpus="$WORK/corpus/$t"
  artifacts="$WORK/artifacts/$t"
  mkdir -p "$corpus" "$artifacts"
  seeds=()
  [ -d "$FUZZ_DIR/seeds/$t" ] && seeds=("$PWD/$FUZZ_DIR/seeds/$t")
  echo "== fuzzing $t for ${SECONDS_PER_TARGET}s (corpus $corpus)"
  # The first corpus directory receives new inputs; the committed seeds are read only.
  if ! (cd "$FUZZ_DIR" && cargo fuzz run --sanitizer none "$t" "$corpus" "${seeds[@]}" -- \
    -max_total_time="$SECONDS_PER_TARGET" -artifact_prefix="$artifacts/" -print_final_stats=1); then
    echo "fuzz.sh: $t FAILED; reproducer(s):" >&2
    ls -1 "$artifacts"/* >&2 || true
    exit 1
  fi
done
echo "fuzz.sh: ${#targets[@]} target(s) ran ${SECONDS_PER_TARGET}s each without a crash"
