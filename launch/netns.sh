#!/usr/bin/env bash
# Hosts on one machine: network namespaces joined by veth links, for multi-host tests and benchmarks.
#
#   launch/netns.sh create NAME HOSTS [--p2p]   hosts NAME-1..NAME-HOSTS; host i has eth0 = SUBNET.i/24
#   launch/netns.sh destroy NAME                power off every host, delete every namespace (and so every veth)
#   launch/netns.sh exec NAME HOST CMD...       run CMD on host HOST (a number), e.g. a learner or actors
#   launch/netns.sh addr NAME HOST              print host HOST's address
#   launch/netns.sh rate NAME HOST RATE|off     tbf rate limit (e.g. 20mbit) on both directions of HOST's link
#   launch/netns.sh link NAME HOST down|up      pull / plug HOST's cable (a partition of that host)
#   launch/netns.sh loss NAME HOST PERCENT      drop PERCENT % (e.g. 1 or 0.5; 100 = partition; 0 = off) of
#                                               packets in each direction of HOST's link (nftables numgen)
#   launch/netns.sh poweroff NAME HOST          SIGKILL every process on HOST at once (the host loses power)
#   launch/netns.sh bytes NAME HOST             print "rx_bytes tx_bytes" of HOST's eth0 (bytes on the wire)
#   launch/netns.sh hosts NAME HOST [ENTRY...]  HOST's /etc/hosts: localhost, then each ENTRY ("IP NAME"); set
#                                               it before starting a command there (`ip netns exec` mounts
#                                               /etc/netns/NAME-HOST/hosts over /etc/hosts for what it starts),
#                                               then again to move a name: rewritten in place, running
#                                               processes see the change at their next lookup
#
# Topology: by default every host's eth0 is one end of a veth pair whose other end (port hI) sits on a bridge in
# a switch namespace NAME-sw; with --p2p (two hosts) the two eth0 are the two ends of one veth pair. Nothing is
# added to this machine's own network: every interface lives inside the namespaces, the namespaces have no route
# anywhere else, and SUBNET (default 10.213.0, override with SEED_NETNS_SUBNET) is used only inside them, so
# traffic can go only to the hosts' own addresses. There is no netem qdisc on every kernel: add delay with the
# user-space relay (python -m seed.bench.tcp_relay) run on a host between the two. Needs root (CAP_NET_ADMIN,
# CAP_SYS_ADMIN), iproute2, and nftables for `loss`.
set -euo pipefail

SUBNET=${SEED_NETNS_SUBNET:-10.213.0}

usage() { sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
die() { echo "netns.sh: $*" >&2; exit 1; }

host_ns() { echo "$1-$2"; }
switch_ns() { echo "$1-sw"; }
is_p2p() { ! ip netns list | grep -qx "$(switch_ns "$1")\( (id: [0-9]*)\)\?"; }
check_host() {
  [[ $2 =~ ^[0-9]+$ ]] || die "HOST: got '$2', expected a host number (1, 2, ...)"
  namespaces_of "$1" | grep -qxF "$(host_ns "$1" "$2")" || die "HOST: got $2, expected a host of '$1' (no namespace $(host_ns "$1" "$2"))"
}
# The far end of HOST's cable: (namespace, interface) of the switch port, or the other host's eth0 with --p2p.
peer_of() {
  local name=$1 host=$2
  if is_p2p "$name"; then echo "$(host_ns "$name" $((3 - host))) eth0"; else echo "$(switch_ns "$name") h$host"; fi
}

# Tests: SEED_NETNS_CREATE_PAUSE_S=S sleeps S seconds after each namespace and link made, so that a signal can be
# sent at a chosen point of a create (tests/test_netns_cleanup.py).
made() { [[ -z ${SEED_NETNS_CREATE_PAUSE_S:-} ]] || sleep "$SEED_NETNS_CREATE_PAUSE_S"; }

# create and destroy of one NAME take turns (a lock per NAME, held by every command they start): a destroy run
# while a create is under way (the reaper of seed/bench/netns_hosts.py, when the process creating is SIGKILLed)
# waits for the create's last namespace and link, rather than remove the first ones while more are being made.
LOCK_DIR=/run/seed-netns  # root's own (not /run/lock, which anyone can write: a planted symlink there)
lock_run() { mkdir -p -m 700 "$LOCK_DIR"; exec 9>"$LOCK_DIR/$1.lock"; flock 9; }

create() {
  local name=${1:?NAME} hosts=${2:?HOSTS} p2p=${3:-}
  lock_run "$name"
  [[ $hosts =~ ^[0-9]+$ && $hosts -ge 2 && $hosts -le 250 ]] || die "HOSTS: got '$hosts', expected 2..250"
  [[ -z $p2p || ( $p2p == --p2p && $hosts == 2 ) ]] || die "--p2p: got '$p2p' with $hosts hosts, expected --p2p with 2 hosts"
  # Interface names (at most 15 characters) are per namespace, so every host's interface can be eth0.
  for i in $(seq 1 "$hosts"); do ip netns add "$(host_ns "$name" "$i")"; made; done
  if [[ -n $p2p ]]; then
    ip -n "$(host_ns "$name" 1)" link add eth0 type veth peer name eth0 netns "$(host_ns "$name" 2)"
  else
    local sw; sw=$(switch_ns "$name")
    ip netns add "$sw"; made
    ip -n "$sw" link add br0 type bridge
    ip -n "$sw" link set br0 up
    for i in $(seq 1 "$hosts"); do
      ip -n "$(host_ns "$name" "$i")" link add eth0 type veth peer name "h$i" netns "$sw"
      ip -n "$sw" link set "h$i" master br0 up; made
    done
  fi
  for i in $(seq 1 "$hosts"); do
    local ns; ns=$(host_ns "$name" "$i")
    ip -n "$ns" addr add "$SUBNET.$i/24" dev eth0
    ip -n "$ns" link set lo up
    ip -n "$ns" link set eth0 up
  done
}

poweroff() {
  local ns; ns=$(host_ns "$1" "$2")
  local pids; pids=$(ip netns pids "$ns" 2>/dev/null || true)
  [[ -z $pids ]] && return 0
  kill -KILL $pids 2>/dev/null || true
  for _ in $(seq 1 100); do  # SIGKILL is delivered at once, but a process leaves the namespace only when reaped
    [[ -z $(ip netns pids "$ns" 2>/dev/null || true) ]] && return 0
    sleep 0.05
  done
  echo "netns.sh: processes still in $ns after SIGKILL: $(ip netns pids "$ns" | tr '\n' ' ')" >&2
}

# The namespaces of run NAME: exactly NAME-<number> and NAME-sw (not those of a run NAME-x: NAME-x-1, NAME-x-sw).
namespaces_of() {
  ip netns list | awk -v prefix="$1-" '{
    ns = $1
    if (index(ns, prefix) == 1) { rest = substr(ns, length(prefix) + 1); if (rest ~ /^([0-9]+|sw)$/) print ns }
  }'
}

destroy() {
  local name=${1:?NAME}
  lock_run "$name"
  for ns in $(namespaces_of "$name"); do
    [[ $ns == "$(switch_ns "$name")" ]] && continue
    poweroff "$name" "${ns#"$name"-}" || true
  done
  # A namespace is freed with its last process; its veth ends (and their peers) go with it. Its /etc/netns
  # folder (`hosts`) is not: removed here.
  for ns in $(namespaces_of "$name"); do ip netns delete "$ns" || true; rm -rf "/etc/netns/${ns:?}"; done
  rmdir /etc/netns 2>/dev/null || true  # only when empty: another run's hosts files stay
  rm -f "$LOCK_DIR/$name.lock"
}

rate() {
  local name=$1 host=$2 value=$3 ns peer_ns peer_dev
  ns=$(host_ns "$name" "$host"); read -r peer_ns peer_dev <<<"$(peer_of "$name" "$host")"
  for end in "$ns eth0" "$peer_ns $peer_dev"; do
    read -r n dev <<<"$end"
    if [[ $value == off ]]; then
      ip netns exec "$n" tc qdisc del dev "$dev" root 2>/dev/null || true
    else
      # burst: one 64 KiB GSO packet must fit; latency bounds the queue (packets beyond it are dropped).
      ip netns exec "$n" tc qdisc replace dev "$dev" root tbf rate "$value" burst 64kb latency 100ms
    fi
  done
}

link() {
  local name=$1 host=$2 state=$3
  [[ $state == up || $state == down ]] || die "STATE: got '$state', expected up or down"
  if is_p2p "$name"; then
    ip -n "$(host_ns "$name" "$host")" link set eth0 "$state"
  else  # the cable is pulled at the switch: the host keeps its address and routes, as a real host would
    ip -n "$(switch_ns "$name")" link set "h$host" "$state"
  fi
}

loss() {
  local name=$1 host=$2 percent=$3 ns per_mille
  ns=$(host_ns "$name" "$host")
  command -v nft >/dev/null || die "loss: needs nft (apt-get install nftables)"
  per_mille=$(awk -v p="$percent" 'BEGIN { if (p !~ /^[0-9]*\.?[0-9]+$/ || p > 100) exit 1; printf "%d", p * 10 + 0.5 }') \
    || die "PERCENT: got '$percent', expected a number in 0..100"
  ip netns exec "$ns" nft delete table inet seed_loss 2>/dev/null || true
  [[ $per_mille == 0 ]] && return 0
  local match="numgen random mod 1000 < $per_mille"
  [[ $per_mille -ge 1000 ]] && match=""  # every packet: a partition with the link still up
  ip netns exec "$ns" nft -f - <<EOF
table inet seed_loss {
  chain input { type filter hook input priority 0; iifname "eth0" $match drop; }
  chain output { type filter hook output priority 0; oifname "eth0" $match drop; }
}
EOF
}

hosts() {
  local name=$1 host=$2 dir
  shift 2
  dir=/etc/netns/$(host_ns "$name" "$host")
  mkdir -p "$dir"
  # `>` truncates and writes the same file: a bind mount of it (a running process's /etc/hosts) sees the change,
  # which a new file renamed over it would not.
  { printf '127.0.0.1 localhost\n::1 localhost\n'; printf '%s\n' "$@"; } >"$dir/hosts"
}

bytes() {
  local ns; ns=$(host_ns "$1" "$2")
  echo "$(ip netns exec "$ns" cat /sys/class/net/eth0/statistics/rx_bytes)" \
       "$(ip netns exec "$ns" cat /sys/class/net/eth0/statistics/tx_bytes)"
}

command=${1:-}; shift || true
case $command in
  create) create "$@" ;;
  destroy) destroy "$@" ;;
  exec) [[ $# -ge 3 ]] || usage; check_host "$1" "$2"; ns=$(host_ns "$1" "$2"); shift 2; exec ip netns exec "$ns" "$@" ;;
  addr) [[ $# -eq 2 ]] || usage; check_host "$1" "$2"; echo "$SUBNET.$2" ;;
  rate) [[ $# -eq 3 ]] || usage; check_host "$1" "$2"; rate "$@" ;;
  link) [[ $# -eq 3 ]] || usage; check_host "$1" "$2"; link "$@" ;;
  loss) [[ $# -eq 3 ]] || usage; check_host "$1" "$2"; loss "$@" ;;
  poweroff) [[ $# -eq 2 ]] || usage; check_host "$1" "$2"; poweroff "$@" ;;
  bytes) [[ $# -eq 2 ]] || usage; check_host "$1" "$2"; bytes "$@" ;;
  hosts) [[ $# -ge 2 ]] || usage; check_host "$1" "$2"; hosts "$@" ;;
  *) usage ;;
esac
