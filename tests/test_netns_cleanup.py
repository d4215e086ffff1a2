"""What the namespace tools leave behind: `launch/netns.sh destroy NAME` removes run NAME's namespaces and no other
run's, and `soak --hosts=netns` (seed/bench/soak_netns.py over seed/bench/netns_hosts.py) leaves no namespace,
veth or nft table when it is SIGTERMed or SIGKILLed at any point of making its hosts.

Real namespaces (root, iproute2); every name made here starts with this test process's own prefix, so other
people's namespaces are never touched. Skips naming the reason where namespaces cannot be made.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from seed.bench.netns_hosts import netns, why_no_namespaces


def _namespaces() -> set[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return {line.split()[0] for line in listed.splitlines() if line.strip()}


@pytest.fixture(name="prefix")
def prefix_fixture():
    """A name prefix of this test process's own; every namespace starting with it is removed afterwards."""
    reason = why_no_namespaces()
    if reason:
        pytest.skip(reason)
    prefix = f"t37a{os.getpid()}"
    yield prefix
    for ns in _namespaces():
        if ns.startswith(prefix):
            subprocess.run(["ip", "netns", "delete", ns], capture_output=True)


def test_destroy_removes_exactly_the_named_run_not_one_whose_name_extends_it(prefix):
    """Runs `P` and `P-x` (namespaces P-1, P-2, P-sw and P-x-1, P-x-2, P-x-sw): destroying P must leave P-x whole.
    Matching by prefix (`^P-`) also tore down P-x's three namespaces."""
    netns("create", prefix, "2")
    netns("create", f"{prefix}-x", "2")
    ours = {n for n in _namespaces() if n.startswith(prefix)}
    assert ours == {f"{prefix}-1", f"{prefix}-2", f"{prefix}-sw",
                    f"{prefix}-x-1", f"{prefix}-x-2", f"{prefix}-x-sw"}, ours
    netns("destroy", prefix)
    left = {n for n in _namespaces() if n.startswith(prefix)}
    assert left == {f"{prefix}-x-1", f"{prefix}-x-2", f"{prefix}-x-sw"}, left
    # P-x still works as a run: its host 1 is found by the exact name, and destroying it removes the rest.
    assert netns("addr", f"{prefix}-x", "1").stdout.strip().endswith(".1")
    assert netns("addr", f"{prefix}-x", "3", check=False).returncode != 0  # no host 3
    netns("destroy", f"{prefix}-x")
    assert not {n for n in _namespaces() if n.startswith(prefix)}
