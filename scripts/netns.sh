#!/usr/bin/env bash
# Test bed: two network namespaces joined by a veth pair.
#
#   netns iwa: iwa0 10.77.0.1/24  <── veth ──>  netns iwb: iwb0 10.77.0.2/24
#
# Both ends have 4 RX and 4 TX queues (AF_XDP sockets can bind to queues 0..3; native XDP on
# veth needs rx queues >= the peer's tx queues), TX checksum offload off (so kernel-made TCP
# segments carry full checksums, which an AF_XDP receiver can verify), MTU 1500 (or
# IWARP_BED_MTU), and lo up.
#
# usage: scripts/netns.sh up|down|status
#   up      create what is missing (idempotent: running it twice is fine)
#   down    remove the namespaces (and with them the veth pair); only what `up` makes
#   status  print what exists
set -euo pipefail

NS_A=iwa
NS_B=iwb
DEV_A=iwa0
DEV_B=iwb0
ADDR_A=10.77.0.1/24
ADDR_B=10.77.0.2/24
QUEUES=4

die() {
  echo "netns.sh: $*" >&2
  exit 1
}

need_root() {
  [ "$(id -u)" -eq 0 ] || die "must run as root (creates network namespaces and veth devices)"
  command -v ip >/dev/null 2>&1 || die "\`ip\` not found: install iproute2 (scripts/install-deps.sh)"
  command -v ethtool >/dev/null 2>&1 || die "\`ethtool\` not found: install ethtool (scripts/install-deps.sh)"
}

ns_exists() { [ -e "/var/run/netns/$1" ]; }
dev_in_ns() { ip -n "$1" link show dev "$2" >/dev/null 2>&1; }

up() {
  need_root
  for ns in "$NS_A" "$NS_B"; do
    ns_exists "$ns" || ip netns add "$ns"
    ip -n "$ns" link set lo up
  done

  # The pair is complete only when each end sits in its namespace; anything else (a half
  # made pair, an end left in the root namespace by an interrupted run) is rebuilt.
  if ! { dev_in_ns "$NS_A" "$DEV_A" && dev_in_ns "$NS_B" "$DEV_B"; }; then
    ip -n "$NS_A" link del "$DEV_A" 2>/dev/null || true
    ip -n "$NS_B" link del "$DEV_B" 2>/dev/null || true
    ip link del "$DEV_A" 2>/dev/null || true
    ip link del "$DEV_B" 2>/dev/null || true
    ip link add "$DEV_A" numrxqueues "$QUEUES" numtxqueues "$QUEUES" type veth \
      peer name "$DEV_B" numrxqueues "$QUEUES" numtxqueues "$QUEUES"
    ip link set "$DEV_A" netns "$NS_A"
    ip link set "$DEV_B" netns "$NS_B"
  fi

  ip -n "$NS_A" addr replace "$ADDR_A" dev "$DEV_A"
  ip -n "$NS_B" addr replace "$ADDR_B" dev "$DEV_B"
  ip netns exec "$NS_A" ethtool -K "$DEV_A" tx off >/dev/null
  ip netns exec "$NS_B" ethtool -K "$DEV_B" tx off >/dev/null
  # The MTU too (a run at jumbo MTU must not leave it to the next user of the bed).
  ip -n "$NS_A" link set "$DEV_A" mtu "${IWARP_BED_MTU:-1500}"
  ip -n "$NS_B" link set "$DEV_B" mtu "${IWARP_BED_MTU:-1500}"
  ip -n "$NS_A" link set "$DEV_A" up
  ip -n "$NS_B" link set "$DEV_B" up
  echo "netns.sh: up ($NS_A/$DEV_A ${ADDR_A%/*} <-> $NS_B/$DEV_B ${ADDR_B%/*})"
}

down() {
  need_root
  # Deleting a namespace destroys its veth end, and with it the pair.
  for ns in "$NS_A" "$NS_B"; do
    if ns_exists "$ns"; then
      ip netns del "$ns"
    fi
  done
  # An end stranded in the root namespace by an interrupted `up`.
  for dev in "$DEV_A" "$DEV_B"; do
    if ip link show dev "$dev" >/dev/null 2>&1; then
      ip link del "$dev" 2>/dev/null || true
    fi
  done
  echo "netns.sh: down"
}

status() {
  need_root
  local any=0
  for ns in "$NS_A" "$NS_B"; do
    if ns_exists "$ns"; then
      any=1
      echo "== netns $ns"
      ip -n "$ns" -br addr show
      ip -n "$ns" -d link show | grep -E 'xdp|prog/' || true
    else
      echo "== netns $ns: absent"
    fi
  done
  for dev in "$DEV_A" "$DEV_B"; do
    if ip link show dev "$dev" >/dev/null 2>&1; then
      any=1
      echo "== $dev is in the root namespace (left over; \`down\` removes it)"
    fi
  done
  [ "$any" -eq 1 ] || echo "netns.sh: test bed is down"
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
