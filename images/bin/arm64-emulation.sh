#!/usr/bin/env bash
# Make sure this host can run linux/arm64 binaries, for the gb10 (arm64) builds: nothing to do on
# an arm64 host; elsewhere set up qemu user emulation (docs/facts.md sections 5 and 7):
#   1. qemu-user-static + binfmt-support installed (apt, as root, where missing);
#   2. binfmt_misc mounted on /proc/sys/fs/binfmt_misc;
#   3. the qemu-aarch64 handler enabled (update-binfmts --enable qemu-aarch64).
# Usage: images/bin/arm64-emulation.sh [--check]
#   --check  change nothing; exit 0 when arm64 binaries can run here, else say what is missing.
# Exit 0: ready (native or emulated). Exit 1: one line "error: ..." naming the missing piece.
# Environment (tests): ARM64_EMU_ARCH overrides `dpkg --print-architecture`; ARM64_EMU_BINFMT the
# binfmt_misc directory [/proc/sys/fs/binfmt_misc].
set -euo pipefail

check=0
if [ "${1:-}" = --check ]; then check=1; shift; fi
[ $# = 0 ] || { echo "usage: images/bin/arm64-emulation.sh [--check]" >&2; exit 2; }

host=${ARM64_EMU_ARCH:-$(dpkg --print-architecture 2>/dev/null || uname -m)}
case "$host" in
  arm64|aarch64) echo ">> arm64 host: no emulation needed"; exit 0 ;;
esac
binfmt=${ARM64_EMU_BINFMT:-/proc/sys/fs/binfmt_misc}
handler=$binfmt/qemu-aarch64
fail() { echo "error: arm64 emulation on $host: $*" >&2; exit 1; }
root() { [ "$(id -u)" = 0 ]; }

enabled() { [ -r "$handler" ] && head -n1 "$handler" | grep -qx enabled; }
if enabled; then echo ">> arm64 emulation ready ($handler enabled)"; exit 0; fi

# 1. Packages.
missing=()
command -v qemu-aarch64-static >/dev/null || missing+=(qemu-user-static)
command -v update-binfmts >/dev/null || missing+=(binfmt-support)
if [ ${#missing[@]} -gt 0 ]; then
  [ $check = 0 ] || fail "${missing[*]} not installed (run images/bin/arm64-emulation.sh as root)"
  root || fail "${missing[*]} not installed and not root (apt-get install ${missing[*]} as root)"
  command -v apt-get >/dev/null || fail "${missing[*]} not installed and no apt-get here"
  echo ">> installing ${missing[*]} (apt)"
  apt-get update -qq || fail "apt-get update failed (needed for ${missing[*]})"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null \
    || fail "apt-get install ${missing[*]} failed"
fi

# 2. binfmt_misc mounted (a container or a fresh boot may lack it).
if [ ! -e "$binfmt/register" ]; then
  [ $check = 0 ] || fail "binfmt_misc not mounted on $binfmt"
  root || fail "binfmt_misc not mounted on $binfmt and not root" \
    "(mount -t binfmt_misc binfmt_misc $binfmt as root)"
  mount -t binfmt_misc binfmt_misc "$binfmt" 2>/dev/null \
    || fail "mount -t binfmt_misc binfmt_misc $binfmt refused (a container needs --privileged)"
fi

# 3. The qemu-aarch64 handler.
if ! enabled; then
  [ $check = 0 ] || fail "qemu-aarch64 not enabled in $binfmt"
  root || fail "qemu-aarch64 not enabled and not root (update-binfmts --enable qemu-aarch64 as root)"
  update-binfmts --enable qemu-aarch64 >/dev/null 2>&1 || true
  enabled || fail "update-binfmts --enable qemu-aarch64 did not enable $handler"
fi
echo ">> arm64 emulation ready ($handler enabled)"
