"""launch/docker/pin_bridge_mac.sh on a real Linux bridge, in a network namespace of this test's own.

The defect it mends (netavark < 1.9, Debian 12's podman): a bridge whose MAC was never set takes the lowest MAC of
its ports, so it changes as containers leave and join, and the other containers' ARP entries for the gateway (where
aardvark-dns answers) go stale for 15-45 s. The section-1 container test (tests/test_containers.py) measures what
that costs the actors; this one checks the kernel behaviour and the script's fix port by port, in a second.
Skips without root or iproute2."""

from __future__ import annotations

import os
import subprocess

import pytest

from seed.bench.netns_hosts import REPO, why_no_namespaces

SCRIPT = os.path.join(REPO, "launch", "docker", "pin_bridge_mac.sh")
HIGH, LOW, LOWER = "02:00:00:00:00:05", "02:00:00:00:00:03", "02:00:00:00:00:01"


@pytest.fixture(name="ns")
def ns_fixture():
    reason = why_no_namespaces()
    if reason:
        pytest.skip(reason)
    name = f"pinmac{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    yield name
    subprocess.run(["ip", "netns", "delete", name], capture_output=True)


def ip(ns: str, *args: str) -> None:
    subprocess.run(["ip", "-n", ns, *args], check=True, capture_output=True)


def add_port(ns: str, port: str, mac: str) -> None:
    """A veth pair whose end `port` (MAC `mac`) is a port of br0, as netavark adds a container's veth."""
    ip(ns, "link", "add", port, "type", "veth", "peer", "name", f"{port}p")
    ip(ns, "link", "set", port, "address", mac)
    ip(ns, "link", "set", port, "master", "br0")


def bridge_mac(ns: str) -> str:
    return subprocess.run(["ip", "netns", "exec", ns, "cat", "/sys/class/net/br0/address"], check=True,
                          capture_output=True, text=True).stdout.strip()


def pin(ns: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", "netns", "exec", ns, SCRIPT, *args], capture_output=True, text=True, timeout=30)


def test_the_bridge_follows_its_lowest_port_until_pinned(ns):
    ip(ns, "link", "add", "br0", "type", "bridge")
    add_port(ns, "learner", LOW)
    add_port(ns, "actor", HIGH)
    assert bridge_mac(ns) == LOW
    ip(ns, "link", "del", "learner")  # the learner's container stops: the bridge's MAC changes under the actors
    assert bridge_mac(ns) == HIGH
    add_port(ns, "learner2", LOWER)  # its replacement joins with a lower MAC: it changes again
    assert bridge_mac(ns) == LOWER

    pinned = pin(ns, "--device=br0")
    assert pinned.returncode == 0 and f"br0: MAC pinned at {LOWER}" in pinned.stderr, pinned.stderr
    ip(ns, "link", "del", "learner2")
    assert bridge_mac(ns) == LOWER  # kept, though no port has it any more
    add_port(ns, "learner3", "02:00:00:00:00:00")
    assert bridge_mac(ns) == LOWER

    again = pin(ns, "--device=br0")
    assert again.returncode == 0 and "already set; nothing to do" in again.stderr, again.stderr
    assert bridge_mac(ns) == LOWER


def test_bad_input_is_named(ns):
    missing = pin(ns, "--device=nosuchbr")
    assert missing.returncode == 2, missing
    assert "bridge: got 'nosuchbr', expected an existing bridge device" in missing.stderr, missing.stderr
    ip(ns, "link", "add", "plain", "type", "veth", "peer", "name", "plainp")
    not_bridge = pin(ns, "--device=plain")
    assert not_bridge.returncode == 2 and "got 'plain'" in not_bridge.stderr, not_bridge.stderr
    network = pin(ns, "no-such-network-here")
    assert network.returncode == 2, network
    assert "network: got 'no-such-network-here', expected the name of a podman or docker network" \
        in network.stderr, network.stderr
    usage = pin(ns)
    assert usage.returncode == 2 and "got 0 arguments" in usage.stderr, usage.stderr
