#!/usr/bin/env bash
# Long soak runs, by hand (CI runs each case for 8 s): datapath/tests/soak.rs, random Writes
# read back, Sends echoed and connections opened and ended three ways, through the relay bed's
# loss, reordering, duplication and jitter, every byte checked, each case for SECONDS.
# Needs root (the relay bed); fails rather than skips.
#
# usage: scripts/soak.sh [seconds] [seed]   (defaults 600, and a seed from the clock, printed)
# environment: SOAK_LOSS (default 0.01),
#              SOAK_MTU (default 1500; jumbo_frames always runs at 9000),
#              CASES (default "engine_clients socket_clients socket_server jumbo_frames")
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-600}
seed=${2:-$(date +%s)}
cases=${CASES:-engine_clients socket_clients socket_server jumbo_frames}
[ "$(id -u)" -eq 0 ] || { echo "soak.sh: must run as root (the relay bed)" >&2; exit 1; }

echo "soak.sh: $seconds s per case, seed $seed, loss ${SOAK_LOSS:-0.01}, MTU ${SOAK_MTU:-1500} (jumbo_frames 9000): $cases"
cargo test -p datapath --test soak --locked --no-run
for case in $cases; do
  SOAK_SECONDS=$seconds SOAK_SEED=$seed CI=true \
    cargo test -p datapath --test soak --locked -- --exact "$case" --nocapture
done
