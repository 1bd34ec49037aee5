#!/usr/bin/env bash
# Relay test bed: two hosts joined through a relay namespace that forwards frames between them
# (the test relay, `testbed::relay`, or its binary `iwarp-relay`, drops, reorders and re-segments).
# It shares nothing with the plain bed of scripts/netns.sh (other names, other subnet).
#
#   netns iwra: iwra0 10.78.0.1/24 <─ veth ─> rra0 ┐ netns iwrr (relay, ┌ rrb0 <─ veth ─> iwrb0 10.78.0.2/24 :netns iwrb
#                                                  └ no addresses)     ┘
#
# Every veth end has 4 RX and 4 TX queues (native XDP on veth needs rx queues >= the peer's tx
# queues), TX checksum offload off (every frame carries full checksums), GRO off on the relay
# ends (the relay must see the frames as sent, not coalesced), the relay ends promiscuous, IPv6
# off in all three namespaces (no router or neighbour solicitations in captures).
#
# usage: scripts/netns-relay.sh up|down|status
set -euo pipefail

NS_A=iwra
NS_B=iwrb
NS_R=iwrr
DEV_A=iwra0
DEV_B=iwrb0
DEV_RA=rra0
DEV_RB=rrb0
ADDR_A=10.78.0.1/24
ADDR_B=10.78.0.2/24
QUEUES=4

die() {
  echo "netns-relay.sh: $*" >&2
  exit 1
}

need_root() {
  [ "$(id -u)" -eq 0 ] || die "must run as root (creates network namespaces and veth devices)"
  command -v ip >/dev/null 2>&1 || die "\`ip\` not found: install iproute2 (scripts/install-deps.sh)"
  command -v ethtool >/dev/null 2>&1 || die "\`ethtool\` not found: install ethtool (scripts/install-deps.sh)"
}

ns_exists() { [ -e "/var/run/netns/$1" ]; }

down() {
  need_root
  for ns in "$NS_A" "$NS_B" "$NS_R"; do
    if ns_exists "$ns"; then
      ip netns del "$ns"
    fi
  done
  for dev in "$DEV_A" "$DEV_B" "$DEV_RA" "$DEV_RB"; do
    if ip link show dev "$dev" >/dev/null 2>&1; then
      ip link del "$dev" 2>/dev/null || true
    fi
  done
  echo "netns-relay.sh: down"
}

up() {
  need_root
  # Always from scratch: the relay bed is made whole or not at all.
  down >/dev/null
  for ns in "$NS_A" "$NS_B" "$NS_R"; do
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1
    ip netns exec "$ns" sysctl -qw net.ipv6.conf.default.disable_ipv6=1
  done
  ip link add "$DEV_A" numrxqueues "$QUEUES" numtxqueues "$QUEUES" type veth \
    peer name "$DEV_RA" numrxqueues "$QUEUES" numtxqueues "$QUEUES"
  ip link add "$DEV_B" numrxqueues "$QUEUES" numtxqueues "$QUEUES" type veth \
    peer name "$DEV_RB" numrxqueues "$QUEUES" numtxqueues "$QUEUES"
  ip link set "$DEV_A" netns "$NS_A"
  ip link set "$DEV_B" netns "$NS_B"
  ip link set "$DEV_RA" netns "$NS_R"
  ip link set "$DEV_RB" netns "$NS_R"
  ip -n "$NS_A" addr replace "$ADDR_A" dev "$DEV_A"
  ip -n "$NS_B" addr replace "$ADDR_B" dev "$DEV_B"
  ip netns exec "$NS_A" ethtool -K "$DEV_A" tx off >/dev/null
  ip netns exec "$NS_B" ethtool -K "$DEV_B" tx off >/dev/null
  for dev in "$DEV_RA" "$DEV_RB"; do
    ip netns exec "$NS_R" ethtool -K "$dev" tx off gro off >/dev/null
    ip -n "$NS_R" link set "$dev" promisc on
    ip -n "$NS_R" link set "$dev" up
  done
  ip -n "$NS_A" link set "$DEV_A" up
  ip -n "$NS_B" link set "$DEV_B" up
  echo "netns-relay.sh: up ($NS_A/$DEV_A ${ADDR_A%/*} <-> $NS_R/$DEV_RA|$DEV_RB <-> $NS_B/$DEV_B ${ADDR_B%/*})"
}

status() {
  need_root
  for ns in "$NS_A" "$NS_R" "$NS_B"; do
    if ns_exists "$ns"; then
      echo "== netns $ns"
      ip -n "$ns" -br addr show
      ip -n "$ns" -d link show | grep -E 'xdp|prog/' || true
    else
      echo "== netns $ns: absent"
    fi
  done
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  *)
    echo "usage: $0 up|down|status" >&2
    exit 2
    ;;
esac
