"""What the namespace tools leave behind: `launch/netns.sh destroy NAME` removes run NAME's namespaces and no other
run's, and `soak --hosts=netns` (seed/bench/soak_netns.py over seed/bench/netns_hosts.py) leaves no namespace,
veth or nft table when it is SIGTERMed or SIGKILLed at any point of making its hosts.

Real namespaces (root, iproute2); every name made here starts with this test process's own prefix, so other
people's namespaces are never touched. Skips naming the reason where namespaces cannot be made.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

import pytest

from seed.bench.netns_hosts import REPO, netns, why_no_namespaces
from tests.conftest import wait_for


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


# --- soak --hosts=netns killed while it makes its hosts ------------------------------------------------------

PAUSE_S = 0.4  # launch/netns.sh sleeps this long after each namespace and link (SEED_NETNS_CREATE_PAUSE_S)


def _links(namespace: str) -> str:
    return subprocess.run(["ip", "-n", namespace, "-o", "link", "show"], capture_output=True, text=True).stdout


def _root_state() -> tuple[str, str]:
    """This machine's own veths and nft tables (the namespaces' are gone with them; these must not change)."""
    veths = subprocess.run(["ip", "-o", "link", "show", "type", "veth"], capture_output=True, text=True).stdout
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout \
        if shutil.which("nft") else ""
    return veths, tables


def _processes_naming(text: str) -> list[int]:
    """Pids of live processes whose command line contains `text` (this run's workdir)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{entry}/stat") as f:
                zombie = f.read().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            continue
        if text in cmdline and not zombie:
            pids.append(int(entry))
    return pids


# The points of `soak --hosts=netns` at which the signal is sent, each seen from outside: the first namespace made,
# the switch made (3 hosts and their switch, no link yet), host 2's link made (one host still unlinked), and the
# hosts made with the learner started on host 1 (its log exists).
POINTS = {
    "first_namespace": lambda name, work: f"{name}-1" in _namespaces(),
    "switch": lambda name, work: f"{name}-sw" in _namespaces(),
    "half_the_links": lambda name, work: f"{name}-sw" in _namespaces() and " h2@" in _links(f"{name}-sw"),
    "learner_started": lambda name, work: os.path.exists(os.path.join(work, "learner.1.log")),
}


@pytest.mark.parametrize("point", list(POINTS))
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_soak_netns_killed_while_making_its_hosts_leaves_nothing(tmp_path, signum, point):
    """Before: the hosts were made before run()'s try/finally, and a create interrupted halfway was not undone, so
    a SIGTERM during the create left its namespaces; a SIGKILL anywhere left everything (no finally runs). Now a
    reaper process started before the first namespace removes them after a SIGKILL, and the create is inside the
    try and undoes itself."""
    reason = why_no_namespaces()
    if reason:
        pytest.skip(reason)
    work = str(tmp_path / "work")
    before = _root_state()
    command = [sys.executable, os.path.join(REPO, "launch", "soak.py"), "--hosts=netns", "--env=fake:vector",
               "--duration_s=60", "--actor_hosts=2", "--actors_per_host=1", f"--workdir={work}",
               f"--out={tmp_path / 'soak.json'}"]
    soak = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=REPO,
                            env=dict(os.environ, SEED_NETNS_CREATE_PAUSE_S=str(PAUSE_S)))
    name = f"soak{soak.pid}"  # seed/bench/soak_netns.py's hosts: soak<its pid>-1..3, -sw
    try:
        wait_for(lambda: POINTS[point](name, work) or soak.poll() is not None, 120, f"the soak to reach {point}")
        assert soak.poll() is None, soak.communicate()[0].decode(errors="replace")[-3000:]
        soak.send_signal(signum)
        output = soak.communicate(timeout=90)[0].decode(errors="replace")[-3000:]
        gone = lambda: not [n for n in _namespaces() if n.startswith(f"{name}-")] and not _processes_naming(work)
        wait_for(gone, 60, f"{name}'s namespaces and processes to be removed after {signum.name} at {point}",
                 interval_s=0.2)
        assert _root_state() == before, (before, _root_state())
        if signum == signal.SIGTERM:
            assert soak.returncode == 1 and "SIGTERM" in output, (soak.returncode, output)
    finally:
        if soak.poll() is None:
            soak.kill()
            soak.wait()
        netns("destroy", name, check=False)  # whatever the code under test left
