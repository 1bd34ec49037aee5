#!/usr/bin/env bash
# Installs the Debian packages the project needs (build, test bed, captures, baselines).
# Idempotent: does nothing when everything is already there. Needs root (or sudo) to install.
set -euo pipefail

# command -> package that provides it
declare -A NEED=(
  [clang]=clang
  [make]=make         # libbpf-sys (vendored libbpf) and libxdp-sys (`make libxdp`) build with make
  [gcc]=gcc           # libxdp-sys's xdp-tools configure (CC:=gcc) and the cc crate's default
  [tcpdump]=tcpdump
  [tshark]=tshark
  [iperf3]=iperf3
  [ip]=iproute2
  [ping]=iputils-ping
  [ethtool]=ethtool
  [m4]=m4
  [llc]=llvm          # xsk-rs builds libxdp's BPF objects with clang + llc
  [readelf]=binutils
  [pkg-config]=pkg-config
  [curl]=curl          # HTTP interop tests (the TCP RDMA option)
  [python3]=python3    # HTTP interop tests: python3 -m http.server
)
# libraries (checked by file)
declare -A LIBS=(
  [/usr/include/bpf/libbpf.h]=libbpf-dev
  [/usr/include/libelf.h]=libelf-dev
  [/usr/include/zlib.h]=zlib1g-dev
)

missing=()
for cmd in "${!NEED[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || missing+=("${NEED[$cmd]}")
done
for f in "${!LIBS[@]}"; do
  [ -e "$f" ] || missing+=("${LIBS[$f]}")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO=sudo; else
    echo "install-deps: missing packages (${missing[*]}) and not root: install them as root" >&2
    exit 1
  fi
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# tshark asks whether non-root users may capture; answer no without a prompt.
echo "wireshark-common wireshark-common/install-setuid boolean false" | $SUDO debconf-set-selections
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
