# Sourced by the benchmark scripts that run on the veth test bed (bench-raw.sh, bench-tcp.sh,
# bench-engine.sh): checks for root, builds iwarp-bench in release mode (sets BIN), takes the
# test bed's lock (shared with the tests) and brings the bed up, down again on exit.
# SKIP_BUILD=1 leaves the build out (for A/B runs of binaries built elsewhere).
# Usage: . scripts/bed-bench.sh NAME
[ "$(id -u)" -eq 0 ] || { echo "$1: needs root (namespaces, XDP, AF_XDP)" >&2; exit 1; }
scripts/install-deps.sh >/dev/null
[ "${SKIP_BUILD:-0}" = 1 ] || cargo build -q --release --locked -p bench
BIN=$PWD/target/release/iwarp-bench
exec 9>/run/lock/iwarp-netns.lock
flock 9
scripts/netns.sh up >/dev/null
trap 'scripts/netns.sh down >/dev/null 2>&1 || true' EXIT
