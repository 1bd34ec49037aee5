#!/usr/bin/env bash
# The whole test suite: formatting, lints, every crate's tests (unit, property, end-to-end over
# loopback) and the Wireshark capture check. This is what CI runs (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy (all targets, -D warnings)"
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "== cargo test"
# Tests that need root (packet captures) fail instead of skipping when CI=true.
cargo test --workspace --locked 2>&1 | tee target/test-output.txt
grep -E "^test result:" target/test-output.txt | awk '
  { for (i = 1; i <= NF; i++) { if ($i == "passed;") p += $(i-1); if ($i == "failed;") f += $(i-1); if ($i == "ignored;") s += $(i-1) } }
  END { printf "%d passed, %d failed, %d skipped\n", p, f, s }'
