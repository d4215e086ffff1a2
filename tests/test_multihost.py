"""Learner and actors on different "hosts": two network namespaces joined by a veth pair, real TCP between them.

The learner runs in namespace L and listens on 10.213.0.1:8686; two actors run in namespace A, whose only
interfaces are lo and the veth end 10.213.0.2/30, so everything they exchange with the learner crosses the
link. The /30 exists only inside the two namespaces (nothing is added to the host's network) and the tests
dial no other address. Needs root and iproute2; skips, saying why, where namespaces cannot be created.
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

from seed.runtime import checkpoint
from tests.conftest import REPO, Processes, assert_optimizer_continued, assert_resumed, read_metrics, wait_for

LEARNER_IP, ACTOR_IP, PREFIX_LEN = "10.213.0.1", "10.213.0.2", 30
PORT = 8686
ADDRESS = f"{LEARNER_IP}:{PORT}"

HEALTH_CHECK = """
import sys
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
with grpc.insecure_channel(sys.argv[1]) as channel:
    stub = health_pb2_grpc.HealthStub(channel)
    for service in sys.argv[2:]:
        reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        print(repr(service), health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))
"""


@dataclass
class Namespaces:
    learner: str
    actor: str


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


@pytest.fixture(scope="module")
def netns():
    if shutil.which("ip") is None:
        pytest.skip("needs the `ip` command: apt-get install iproute2")
    suffix = os.getpid()
    learner_ns, actor_ns = f"seed-l{suffix}", f"seed-a{suffix}"
    veth_learner, veth_actor = f"sl{suffix}", f"sa{suffix}"  # interface names: at most 15 characters
    created = []
    try:
        for name in (learner_ns, actor_ns):
            result = _ip("netns", "add", name)
            if result.returncode != 0:
                pytest.skip(f"cannot create network namespaces (`ip netns add` as uid {os.geteuid()}: "
                            f"{result.stderr.strip()}); needs root with CAP_SYS_ADMIN and CAP_NET_ADMIN")
            created.append(name)
        # The veth pair is created inside L with its peer placed straight into A: the host never sees it.
        steps = [
            ["-n", learner_ns, "link", "add", veth_learner, "type", "veth", "peer", "name", veth_actor,
             "netns", actor_ns],
            ["-n", learner_ns, "addr", "add", f"{LEARNER_IP}/{PREFIX_LEN}", "dev", veth_learner],
            ["-n", actor_ns, "addr", "add", f"{ACTOR_IP}/{PREFIX_LEN}", "dev", veth_actor],
        ] + [["-n", ns, "link", "set", dev, "up"]
             for ns, dev in ((learner_ns, veth_learner), (actor_ns, veth_actor), (learner_ns, "lo"), (actor_ns, "lo"))]
        for step in steps:
            result = _ip(*step)
            if result.returncode != 0:
                pytest.skip(f"cannot set up the veth link (`ip {' '.join(step)}`: {result.stderr.strip()})")
        links = _ip("-n", actor_ns, "-o", "link", "show").stdout
        assert sorted(line.split(":")[1].strip().split("@")[0] for line in links.splitlines()) == \
            sorted(["lo", veth_actor]), links
        yield Namespaces(learner_ns, actor_ns)
    finally:
        for name in created:
            _ip("netns", "delete", name)


class NetnsProcesses(Processes):
    """conftest.Processes, but each process runs inside a network namespace (`ip netns exec` execs it, so the
    Popen's pid is the seed process itself and SIGTERM reaches it directly)."""

    def run_in(self, namespace: str, command: list[str], name: str) -> subprocess.Popen:
        log_path = os.path.join(self.directory, f"{name}.log")
        log = open(log_path, "ab")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        process = subprocess.Popen(["ip", "netns", "exec", namespace, *command], stdout=log,
                                   stderr=subprocess.STDOUT, cwd=REPO, env=env)
        process.log_path = log_path  # type: ignore[attr-defined]
        self.started.append((process, log_path))
        return process


@pytest.fixture
def procs(tmp_path):
    processes = NetnsProcesses(str(tmp_path))
    yield processes
    processes.stop_all()


def _command(script: str, module: str) -> list[str]:
    """The console script next to this interpreter (what users run), else the module."""
    path = os.path.join(os.path.dirname(sys.executable), script)
    return [path] if os.access(path, os.X_OK) else [sys.executable, "-m", module]


def _token_file(logdir: str) -> str:
    """The shared token (a non-loopback learner refuses to start without credentials)."""
    path = os.path.join(os.path.dirname(logdir), "token")
    if not os.path.exists(path):
        with open(path, "w") as f:
            f.write("multihost-test-token\n")
    return path


def _start_learner(procs: NetnsProcesses, ns: Namespaces, logdir: str, name: str) -> subprocess.Popen:
    flags = dict(env="fake:vector", logdir=logdir, server_address=ADDRESS, num_actors=2, envs_per_actor=4,
                 auth_token_file=_token_file(logdir),
                 batch_size=4, unroll_length=10, log_interval_s=0.5, checkpoint_interval_s=3600,
                 total_environment_frames=int(1e12), torch_threads=1, fake_episode_length=20)
    return procs.run_in(ns.learner, _command("seed-learner", "seed.learner.main") +
                        [f"--{k}={v}" for k, v in flags.items()], name)


def _start_actors(procs: NetnsProcesses, ns: Namespaces, logdir: str) -> list[subprocess.Popen]:
    return [procs.run_in(ns.actor, _command("seed-actor", "seed.actor.main") +
                         ["--env=fake:vector", f"--server_address={ADDRESS}", f"--actor_index={i}",
                          "--envs_per_actor=4", "--fake_episode_length=20", f"--auth_token_file={_token_file(logdir)}"],
                         f"actor{i}") for i in range(2)]


def _train_steps(logdir: str) -> int:
    rows = read_metrics(logdir)
    return rows[-1]["train_steps"] if rows else -1


def _stop_learner(learner: subprocess.Popen, logdir: str) -> None:
    start = time.monotonic()
    learner.send_signal(signal.SIGTERM)
    assert learner.wait(timeout=30) == 0
    assert time.monotonic() - start < 20  # SIGTERM: stop serving, checkpoint, exit
    assert checkpoint.latest(logdir) is not None


def test_actors_train_with_a_learner_on_another_host(netns, procs, tmp_path):
    logdir = str(tmp_path / "run")
    learner = _start_learner(procs, netns, logdir, "learner")
    actors = _start_actors(procs, netns, logdir)
    wait_for(lambda: _train_steps(logdir) >= 20, 50, "20 training steps over the veth link",
             on_timeout=lambda: procs.output(learner) + "".join(procs.output(a) for a in actors))
    last = read_metrics(logdir)[-1]
    assert last["env_frames"] > 0 and last["episodes"] > 0
    for index, actor in enumerate(actors):  # the first actor alone can provide 20 steps: wait for both
        wait_for(lambda i=index, a=actor: f"[actor {i}] connected to {ADDRESS}" in procs.output(a), 30,
                 f"actor {index} to connect over the veth link")
    # The standard health service answers across the link too (what the Kubernetes gRPC probes ask).
    health = subprocess.run(["ip", "netns", "exec", netns.actor, sys.executable, "-c", HEALTH_CHECK, ADDRESS, "",
                             "seed.Learner"], capture_output=True, text=True, timeout=30, cwd=REPO)
    assert health.returncode == 0, health.stderr
    assert health.stdout.split("\n")[:2] == ["'' SERVING", "'seed.Learner' SERVING"], health.stdout
    _stop_learner(learner, logdir)


def test_restarted_learner_resumes_and_remote_actors_reconnect(netns, procs, tmp_path):
    logdir = str(tmp_path / "run")
    first = _start_learner(procs, netns, logdir, "learner1")
    _start_actors(procs, netns, logdir)
    wait_for(lambda: _train_steps(logdir) >= 5, 45, "training before the restart",
             on_timeout=lambda: procs.output(first))
    _stop_learner(first, logdir)
    before = _train_steps(logdir)
    saved = checkpoint.latest(logdir)
    rows_before = len(read_metrics(logdir))
    # The same actors, still running in the other namespace, reconnect to the new learner on their own.
    second = _start_learner(procs, netns, logdir, "learner2")
    wait_for(lambda: "resumed from" in procs.output(second), 90, "the resume message",
             on_timeout=lambda: procs.output(second))
    wait_for(lambda: _train_steps(logdir) > before + 5, 40, "training after the restart",
             on_timeout=lambda: procs.output(second))
    assert second.poll() is None
    assert_resumed(procs.output(second), logdir, saved, rows_before)
    _stop_learner(second, logdir)
    assert_optimizer_continued(logdir)
