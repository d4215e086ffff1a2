#!/usr/bin/env bash
# Installs the system tools the multi-host tests use (tests/netns.py, launch/netns.sh): iproute2 (ip, tc) and
# nftables (nft: random packet loss and drop partitions), and Debian's Slurm 22.05 and munge for the Slurm tests
# (tests/slurm_lab.py: slurmctld, slurmd, munged, the client commands). `make test` calls it. apt may not start the
# daemons it installs: the tests start their own, with their own configuration, and stop them.
# Ray, for tests/test_ray.py, is a Python package: the `ray` extra that `make install` installs. valgrind counts
# an inference batch's instructions (seed/bench/batch_cost.py --callgrind, tests/test_batch_cost.py).
#
# Idempotent: exits at once when every tool is on PATH. Needs root and apt-get (Debian/Ubuntu); elsewhere it says
# what is missing and exits 0, and the tests that need a missing tool skip naming it.
set -euo pipefail

log() { echo "[install_test_tools] $*"; }

declare -A PACKAGE_OF=([ip]=iproute2 [tc]=iproute2 [nft]=nftables [slurmctld]=slurm-wlm [slurmd]=slurm-wlm
                       [sbatch]=slurm-wlm [munged]=munge [nsenter]=util-linux [valgrind]=valgrind
                       [callgrind_control]=valgrind)
missing=()
for tool in "${!PACKAGE_OF[@]}"; do
  command -v "$tool" >/dev/null 2>&1 || PATH="$PATH:/usr/sbin:/sbin" command -v "$tool" >/dev/null 2>&1 \
    || missing+=("${PACKAGE_OF[$tool]}")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  log "ip, tc, nft, Slurm and munge present; nothing to do."
  exit 0
fi
packages=$(printf '%s\n' "${missing[@]}" | sort -u | tr '\n' ' ')
if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
  log "missing ${packages}(needs root and apt-get to install); the namespace tests that need them will skip."
  exit 0
fi
log "installing ${packages}"
export DEBIAN_FRONTEND=noninteractive
# munge's and Slurm's packages start their daemons unless a policy forbids it (as container images do): forbid it
# for this install, so nothing is left running with the system's default configuration.
policy=/usr/sbin/policy-rc.d
if [[ ! -e $policy ]]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy"
  trap 'rm -f "$policy"' EXIT
fi
apt-get update -qq
# shellcheck disable=SC2086
apt-get install -y -qq --no-install-recommends $packages >/dev/null
log "done"
