# Sourced by the benchmark scripts that run on the veth test bed (bench-raw.sh, bench-tcp.sh,
# bench-engine.sh): checks for root, builds iwarp-bench in release mode (sets BIN), takes the
# test bed's lock (shared with the tests) and brings the bed up, down again on exit.
# SKIP_BUILD=1 leaves the build out (for A/B runs of binaries built elsewhere).
# However the script ends (EXIT, INT, TERM: `on_exit` of scripts/lib/jobs.sh), the servers it
# left running are stopped and the bed goes down; a script adds its own cleanup with
# `on_exit FUNCTION` (not a trap of its own, which would replace this one).
# Usage: . scripts/bed-bench.sh NAME
[ "$(id -u)" -eq 0 ] || { echo "$1: needs root (namespaces, XDP, AF_XDP)" >&2; exit 1; }
scripts/install-deps.sh >/dev/null
[ "${SKIP_BUILD:-0}" = 1 ] || cargo build -q --release --locked -p bench
BIN=$PWD/target/release/iwarp-bench
# shellcheck source=scripts/lib/jobs.sh
source scripts/lib/jobs.sh
bed_down() { scripts/netns.sh down >/dev/null 2>&1 || true; }
exec 9>/run/lock/iwarp-netns.lock
flock 9
# Only once the lock is ours: the bed is not ours to take down before.
on_exit bed_down
scripts/netns.sh up >/dev/null
