#!/usr/bin/env bash
# Pins the MAC address of a container network's bridge, so that it no longer changes as containers come and go.
#
#   launch/docker/pin_bridge_mac.sh NETWORK        # a podman (or docker) network, once a container runs on it
#   launch/docker/pin_bridge_mac.sh --device=BR    # a bridge device by name
#
# Why: a Linux bridge whose MAC was never set takes the lowest MAC of its ports. When the container whose veth had
# the lowest MAC stops, or a new one with a lower MAC starts, the bridge's MAC changes, and every other container
# keeps sending to the old one until its ARP entry for the gateway expires and is probed again: 15-45 s of lost
# packets to the gateway, where the network's DNS server (aardvark-dns) answers. A restarted learner container
# was so found by name only 5-45 s after it listened (tcpdump: the actors' DNS queries to the gateway unanswered
# until an ARP probe learnt its new MAC; launch/README.md section 1). netavark pins the bridge's MAC itself since
# 1.9 (containers/netavark#833); Debian 12's podman 4.3 comes with netavark 1.4, which does not. Docker sets its
# bridges' MACs itself. Setting the bridge's MAC to the one it has now (the kernel marks it as set and stops
# recalculating it) changes nothing the containers cached.
#
# Idempotent: a bridge whose MAC is already set (addr_assign_type 3) is left as it is. Needs root (the bridge of
# a rootful network lives in the host's network namespace). netavark removes the bridge with the last container
# on the network; run this again after the network's next first container.
set -euo pipefail
PATH="$PATH:/usr/sbin:/sbin"  # ip(8)

log() { echo "[pin_bridge_mac] $*" >&2; }
die() { log "$*"; exit 2; }

[[ $# -eq 1 ]] || die "usage: $0 NETWORK | --device=BRIDGE (got $# arguments)"
case "$1" in
  --device=*) device=${1#--device=} ;;
  -*) die "unknown option: $1 (expected NETWORK or --device=BRIDGE)" ;;
  *)
    network=$1
    if command -v podman >/dev/null 2>&1 && podman network exists "$network" 2>/dev/null; then
      device=$(podman network inspect --format '{{.NetworkInterface}}' "$network")
    elif command -v docker >/dev/null 2>&1 && docker network inspect "$network" >/dev/null 2>&1; then
      id=$(docker network inspect --format '{{.Id}}' "$network")
      named=$(docker network inspect --format '{{index .Options "com.docker.network.bridge.name"}}' "$network")
      device=${named:-br-${id:0:12}}
      [[ "$network" == bridge ]] && device=${named:-docker0}
    else
      die "network: got '$network', expected the name of a podman or docker network (podman network ls)"
    fi
    ;;
esac
[[ -n "$device" ]] || die "network '${network:-}': no bridge device named in its configuration (not a bridge network?)"
sysfs=/sys/class/net/$device
[[ -d "$sysfs/bridge" ]] || die "bridge: got '$device', expected an existing bridge device (a network's bridge is" \
  "made when its first container starts: run this after that)"
address=$(cat "$sysfs/address")
if [[ $(cat "$sysfs/addr_assign_type") == 3 ]]; then
  log "$device: MAC $address already set; nothing to do"
  exit 0
fi
[[ $(id -u) -eq 0 ]] || die "needs root to set the MAC of $device (running as uid $(id -u))"
ip link set dev "$device" address "$address"
log "$device: MAC pinned at $address"
