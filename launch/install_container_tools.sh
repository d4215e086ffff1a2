#!/usr/bin/env bash
# Installs what `make image` (launch/docker/build.sh) and tests/test_containers.py use to build and run the images
# without a registry: podman with runc, netavark and aardvark-dns (container networks and their DNS: actors find
# the learner by its container name), iptables (netavark's firewall rules), catatonit (the init of a pod's infra
# container, which podman builds locally instead of pulling a pause image) and debootstrap (the local Debian base
# of an offline build, launch/docker/offline_base.sh). `make test` and `make image` call it.
#
# Nothing under /etc is edited: the settings these machines need are in launch/docker/containers.conf, which
# build.sh and the tests pass to podman as CONTAINERS_CONF.
#
# Idempotent: exits at once when every tool is on PATH. Needs root and apt-get (Debian/Ubuntu); elsewhere it says
# what is missing and exits 0, and the container tests skip naming it.
set -euo pipefail

log() { echo "[install_container_tools] $*"; }

# runc rather than crun: crun 1.8 refuses the hybrid cgroup layout of these VMs (launch/docker/containers.conf).
declare -A PACKAGE_OF=([podman]=podman [runc]=runc [netavark]=netavark [aardvark-dns]=aardvark-dns
                       [iptables]=iptables [catatonit]=catatonit [debootstrap]=debootstrap)
# netavark and aardvark-dns are not on PATH: podman runs them from /usr/lib/podman.
declare -A FOUND_AT=([netavark]=/usr/lib/podman/netavark [aardvark-dns]=/usr/lib/podman/aardvark-dns)
missing=()
for tool in "${!PACKAGE_OF[@]}"; do
  if [[ -n "${FOUND_AT[$tool]:-}" ]]; then
    [[ -x "${FOUND_AT[$tool]}" ]] || missing+=("${PACKAGE_OF[$tool]}")
  elif ! command -v "$tool" >/dev/null 2>&1 && ! PATH="$PATH:/usr/sbin:/sbin" command -v "$tool" >/dev/null 2>&1; then
    missing+=("${PACKAGE_OF[$tool]}")
  fi
done
if [[ ${#missing[@]} -eq 0 ]]; then
  log "podman ($(podman --version | awk '{print $3}')), runc, netavark, aardvark-dns, iptables, catatonit and" \
    "debootstrap present; nothing to do."
  exit 0
fi
packages=$(printf '%s\n' "${missing[@]}" | sort -u | tr '\n' ' ')
if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
  log "missing ${packages}(needs root and apt-get to install); the container tests will skip."
  exit 0
fi
log "installing ${packages}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086
apt-get install -y -qq --no-install-recommends $packages >/dev/null
log "done: $(podman --version)"
