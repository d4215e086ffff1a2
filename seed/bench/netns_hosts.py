"""Hosts on one machine: network namespaces joined through a bridge (launch/netns.sh), with processes started on
them and the faults a network has (a pulled cable, dropped packets, a host losing power).

Shared by the test fixture (tests/netns.py) and the soak tool's namespace mode (seed/bench/soak_netns.py):

    hosts = NetnsHosts("soak123", count=3, directory="/tmp/run")   # hosts 1..3: SUBNET.1..3
    hosts.create()
    learner = hosts.run_on(1, [sys.executable, "-m", "seed.learner.main", ...], "learner")
    hosts.link(2, "down")                                          # host 2's cable pulled at the switch
    hosts.destroy()                                                # every process, namespace, veth and nft table

The hosts are removed however the process that made them ends: `destroy`, a failed or interrupted `create`, or,
without either (SIGKILL), a reaper process that `create` starts first and that acts once its maker is gone.

Needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN), iproute2, nftables for `loss`, and a repository checkout (it runs
launch/netns.sh). Every address is one of the namespaces' own (SUBNET.i); the namespaces have no route anywhere
else, so no traffic leaves them.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NETNS_SH = os.path.join(REPO, "launch", "netns.sh")
SUBNET = "10.213.0"  # private range, used only inside the namespaces (launch/netns.sh's default)


def netns(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Runs `launch/netns.sh ARGS...`; raises naming the command and its stderr if it fails and `check`."""
    result = subprocess.run([NETNS_SH, *args], capture_output=True, text=True, timeout=60,
                            env=dict(os.environ, SEED_NETNS_SUBNET=SUBNET))
    if check and result.returncode != 0:
        raise RuntimeError(f"launch/netns.sh {' '.join(args)}: exit {result.returncode}: {result.stderr.strip()}")
    return result


def why_no_namespaces() -> str | None:
    """Why network namespaces cannot be made here, or None."""
    if sys.platform != "linux":
        return f"network namespaces need Linux, got {sys.platform}"
    if shutil.which("ip") is None:
        return "needs the `ip` command (apt-get install iproute2)"
    if os.geteuid() != 0:
        return f"needs root for `ip netns add` (running as uid {os.geteuid()})"
    if not os.access(NETNS_SH, os.X_OK):
        return f"needs a repository checkout with launch/netns.sh (not found at {NETNS_SH})"
    return None


class NetnsHosts:
    """`count` hosts (namespaces NAME-1..NAME-count) on one bridge; processes started here run on a host, with
    their output in DIRECTORY/<log name>.log."""

    def __init__(self, name: str, count: int, directory: str):
        self.name, self.count, self.directory = name, count, directory
        self.started: list[tuple[subprocess.Popen, str]] = []
        self._reaper: subprocess.Popen | None = None
        self._reaper_pipe: int | None = None  # our end: its closing (our exit, however it comes) starts the reaper

    def create(self) -> None:
        """Makes the hosts (first removing any left by an earlier run of the same name); raises if refused.

        Nothing is left behind however this process ends, from the first namespace on: a create that fails or is
        interrupted (SIGTERM's SystemExit, KeyboardInterrupt) removes what it made before raising, and a reaper
        started first (`_start_reaper`) removes the hosts once this process is gone, SIGKILL included."""
        self._start_reaper()
        netns("destroy", self.name, check=False)
        try:
            netns("create", self.name, str(self.count))
        except BaseException:
            netns("destroy", self.name, check=False)
            raise

    def _start_reaper(self) -> None:
        """A process in a session of its own that waits for the end of a pipe only this process holds (not
        inherited by the processes started on the hosts), then runs `launch/netns.sh destroy NAME`: it powers
        off the hosts' processes and removes the namespaces when this process exits, also when it cannot run a
        `finally` (SIGKILL). Its own session keeps it out of a Ctrl-C or a kill of this process's group."""
        if self._reaper is not None:
            return
        read_end, write_end = os.pipe()  # not inheritable: only this process holds write_end
        try:
            self._reaper = subprocess.Popen(
                ["sh", "-c", 'read -r _; exec "$0" destroy "$1"', NETNS_SH, self.name], stdin=read_end,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                env=dict(os.environ, SEED_NETNS_SUBNET=SUBNET))
        except BaseException:
            os.close(write_end)
            raise
        finally:
            os.close(read_end)
        self._reaper_pipe = write_end

    def addr(self, host: int) -> str:
        return f"{SUBNET}.{host}"

    def run_on(self, host: int, command: list[str], name: str,
               environment: dict[str, str] | None = None) -> subprocess.Popen:
        """Starts `command` on `host` (`ip netns exec` execs it: the Popen's pid is the command itself)."""
        log_path = os.path.join(self.directory, f"{name}.log")
        log = open(log_path, "ab")
        process = subprocess.Popen(["ip", "netns", "exec", f"{self.name}-{host}", *command], stdout=log,
                                   stderr=subprocess.STDOUT, cwd=REPO,
                                   env=dict(os.environ, PYTHONUNBUFFERED="1", **(environment or {})))
        log.close()  # the child holds its own descriptor
        process.log_path = log_path  # type: ignore[attr-defined]
        self.started.append((process, log_path))
        return process

    def output(self, process: subprocess.Popen) -> str:
        with open(process.log_path, errors="replace") as f:  # type: ignore[attr-defined]
            return f.read()

    def link(self, host: int, state: str) -> None:
        """Pulls ("down") or plugs ("up") the host's cable at the switch."""
        netns("link", self.name, str(host), state)

    def loss(self, host: int, percent: float) -> None:
        """Drops `percent` % of packets in each direction of the host's link (0 = none, 100 = a partition with
        the link up). Needs nftables' `nft`."""
        netns("loss", self.name, str(host), str(percent))

    def rate(self, host: int, rate: str) -> None:
        """A tbf rate limit (e.g. "20mbit", or "off") on both directions of the host's link."""
        netns("rate", self.name, str(host), rate)

    def poweroff(self, host: int) -> None:
        """SIGKILLs every process on the host at once (returns once they are gone)."""
        netns("poweroff", self.name, str(host))
        for process, _ in self.started:
            process.poll()  # reaps the killed ones

    def set_hosts(self, host: int, entries: dict[str, str]) -> None:
        """The host's /etc/hosts: localhost and `entries` (name -> address). Set it before starting a process
        there; setting it again moves a name under the running processes (launch/netns.sh hosts)."""
        netns("hosts", self.name, str(host), *(f"{address} {name}" for name, address in entries.items()))

    def wire_bytes(self, host: int) -> tuple[int, int]:
        """(received, sent) bytes of the host's eth0 since it was made."""
        rx, tx = netns("bytes", self.name, str(host)).stdout.split()
        return int(rx), int(tx)

    def stop_all(self, timeout_s: float = 20.0) -> None:
        """SIGTERM to every process still running, SIGKILL to any still there after `timeout_s`."""
        for process, _ in self.started:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process, _ in self.started:
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def destroy(self) -> None:
        """Stops every process, then removes every namespace (and with them every veth and nft table)."""
        self.stop_all()
        netns("destroy", self.name, check=False)
        if self._reaper_pipe is not None:  # the reaper finds nothing left to remove
            os.close(self._reaper_pipe)
            self._reaper_pipe = None
            try:
                self._reaper.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self._reaper.kill()
                self._reaper.wait()
            self._reaper = None
