#!/usr/bin/env bash
# Installs the system tools the multi-host tests use (tests/netns.py, launch/netns.sh): iproute2 (ip, tc) and
# nftables (nft: random packet loss and drop partitions). `make test` calls it.
#
# Idempotent: exits at once when every tool is on PATH. Needs root and apt-get (Debian/Ubuntu); elsewhere it says
# what is missing and exits 0, and the tests that need a missing tool skip naming it.
set -euo pipefail

log() { echo "[install_test_tools] $*"; }

declare -A PACKAGE_OF=([ip]=iproute2 [tc]=iproute2 [nft]=nftables)
missing=()
for tool in "${!PACKAGE_OF[@]}"; do
  command -v "$tool" >/dev/null 2>&1 || PATH="$PATH:/usr/sbin:/sbin" command -v "$tool" >/dev/null 2>&1 \
    || missing+=("${PACKAGE_OF[$tool]}")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  log "ip, tc and nft present; nothing to do."
  exit 0
fi
packages=$(printf '%s\n' "${missing[@]}" | sort -u | tr '\n' ' ')
if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
  log "missing ${packages}(needs root and apt-get to install); the namespace tests that need them will skip."
  exit 0
fi
log "installing ${packages}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086
apt-get install -y -qq --no-install-recommends $packages >/dev/null
log "done"
