"""Hosts on one machine for tests: network namespaces joined through a bridge (seed/bench/netns_hosts.py, over
launch/netns.sh), a learner on one host and actors on others over TCP with mutual TLS and a token.

    def test_x(hosts):                      # hosts 1..3: 10.213.0.1..3; the learner on 1, actors on 2 and 3
        run = RemoteRun(hosts, tmp_path)
        learner = run.start_learner()
        run.start_actor(host=2, index=0)
        hosts.link(2, "down")               # faults: link down/up, loss %, rate limit, power off

Everything the fixture made is removed when the test ends, also when it fails: processes (SIGTERM, then
SIGKILL of every process left in a namespace), namespaces and with them veths and nft tables. Tests skip,
naming the reason, where namespaces cannot be made (not root, no iproute2, `ip netns add` refused). Every
address dialled is one of these namespaces' own (SUBNET.i); the namespaces have no route anywhere else.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest

from seed.bench.netns_hosts import NetnsHosts, netns, why_no_namespaces
from tests.certs import make_pki
from tests.conftest import read_metrics

PORT = 8686
TOKEN = "netns-test-token-0123456789"


class Hosts(NetnsHosts):
    """The namespaces of seed/bench/netns_hosts.py, with a skip where a fault needs a missing tool."""

    def loss(self, host: int, percent: float) -> None:
        if shutil.which("nft") is None:
            pytest.skip("packet loss needs nftables' `nft` command (apt-get install nftables)")
        super().loss(host, percent)


@pytest.fixture(name="hosts")
def hosts_fixture(tmp_path):
    """Three hosts on one bridge: 10.213.0.1 (the learner's), .2 and .3 (actors'). Removed after the test."""
    reason = why_no_namespaces()
    if reason:
        pytest.skip(reason)
    name = f"seed{os.getpid() % 100000}"
    netns("destroy", name, check=False)  # a previous run of this pid that was itself killed
    created = netns("create", name, "3", check=False)
    made = Hosts(name, 3, str(tmp_path))
    try:
        if created.returncode != 0:
            pytest.skip(f"cannot make network namespaces (launch/netns.sh create as uid {os.geteuid()}: "
                        f"{created.stderr.strip()}); needs root with CAP_SYS_ADMIN and CAP_NET_ADMIN")
        yield made
    finally:
        made.destroy()
        left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert not [line for line in left.splitlines() if line.startswith(f"{name}-")], left


def seed_command(script: str, module: str) -> list[str]:
    """The console script next to this interpreter (what users run), else the module."""
    path = os.path.join(os.path.dirname(sys.executable), script)
    return [path] if os.access(path, os.X_OK) else [sys.executable, "-m", module]


@dataclass
class RemoteRun:
    """A learner on host 1 and actors on other hosts, over TCP with mutual TLS and a token.

    The server certificate names localhost (tests/certs.py), so actors dial the learner's address with
    --tls_server_name=localhost, as an actor dialling a load balancer's address would.
    """

    hosts: Hosts
    directory: str
    envs_per_actor: int = 4
    num_actors: int = 2
    env: str = "fake:vector"

    def __post_init__(self):
        self.logdir = os.path.join(self.directory, "run")
        self.pki = make_pki(os.path.join(self.directory, "pki"))
        self.token_file = os.path.join(self.directory, "token")
        with open(self.token_file, "w") as f:
            f.write(TOKEN + "\n")
        self.address = f"{self.hosts.addr(1)}:{PORT}"

    def start_learner(self, name: str = "learner", host: int = 1, **flags) -> subprocess.Popen:
        values = dict(env=self.env, logdir=self.logdir, server_address=f"0.0.0.0:{PORT}",
                      num_actors=self.num_actors, envs_per_actor=self.envs_per_actor,
                      auth_token_file=self.token_file, tls_cert=self.pki.server_cert, tls_key=self.pki.server_key,
                      tls_ca=self.pki.ca, batch_size=4, unroll_length=10, log_interval_s=0.5,
                      checkpoint_interval_s=3600, total_environment_frames=int(1e12), torch_threads=1,
                      fake_episode_length=20)
        values.update(flags)
        return self.hosts.run_on(host, seed_command("seed-learner", "seed.learner.main") +
                                 [f"--{k}={v}" for k, v in values.items()], name)

    def start_actor(self, host: int, index: int, name: str = "", **flags) -> subprocess.Popen:
        values = dict(env=self.env, server_address=self.address, actor_index=index,
                      envs_per_actor=self.envs_per_actor, fake_episode_length=20, auth_token_file=self.token_file,
                      tls_cert=self.pki.client_cert, tls_key=self.pki.client_key, tls_ca=self.pki.ca,
                      tls_server_name="localhost", log_interval_s=1)
        values.update(flags)
        return self.hosts.run_on(host, seed_command("seed-actor", "seed.actor.main") +
                                 [f"--{k}={v}" for k, v in values.items()], name or f"actor{index}")

    def train_steps(self) -> int:
        rows = read_metrics(self.logdir)
        return rows[-1]["train_steps"] if rows else -1

    def stop_learner(self, learner: subprocess.Popen) -> None:
        learner.send_signal(signal.SIGTERM)
        assert learner.wait(timeout=30) == 0, self.hosts.output(learner)[-3000:]

    def logs(self) -> str:
        """Every process's output, for a failed wait."""
        return "".join(f"\n--- {os.path.basename(path)}\n{self.hosts.output(p)[-3000:]}"
                       for p, path in self.hosts.started)


def wait_for_change(value, timeout_s: float, interval_s: float = 0.1) -> float | None:
    """Seconds until `value()` differs from its first reading, or None after `timeout_s`."""
    start, first = time.monotonic(), value()
    while time.monotonic() - start < timeout_s:
        if value() != first:
            return time.monotonic() - start
        time.sleep(interval_s)
    return None
