"""Ray: launch/ray/launcher.py on a real 3-node Ray cluster on namespace hosts (a head with the resource `learner`
on host 1, two workers with `actor: 2` on hosts 2 and 3, each `ray start` in its own network namespace).

* Placements the cluster cannot give are refused at submission, naming what is missing (`placement_problem`, and
  the launcher against the live cluster).
* A run trains CartPole over TCP; kill -9 of an actor host's Ray workers: Ray restarts those actors, they
  reconnect and training goes on; kill -9 of the learner's Ray worker: the learner (in its own session, with a
  parent-death SIGTERM) checkpoints, Ray restarts its actor, and the new learner waits for the logdir and logs
  `resumed from`; the run reaches its end, every actor exits 0 and the launcher returns 0.

Skips, saying why, without root, namespaces or Ray (`pip install '.[ray]'`). Everything started is removed
afterwards, also on failure: the launcher and the `ray start` processes (by pid), the namespaces (and with them
every process left there), the directory.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from seed.bench.netns_hosts import NetnsHosts
from tests.conftest import REPO, read_metrics, wait_for
from tests.namespace_lab import lab_on_namespace_hosts

LAUNCHER = os.path.join(REPO, "launch", "ray", "launcher.py")
TARGET_RETURN = 60.0  # CartPole's random policy averages about 22
FRAMES = 200_000
SEED_FLAGS = ["--env=gym:CartPole-v1", "--agent=vtrace", "--envs_per_actor=4", "--learning_rate=0.005",
              "--batch_size=16", "--unroll_length=20", "--torch_threads=1", "--log_interval_s=1",
              "--checkpoint_interval_s=600", "--finished_linger_s=20", "--reconnect_max_backoff_s=2",
              f"--total_environment_frames={FRAMES}"]


def load_launcher():
    spec = importlib.util.spec_from_file_location("seed_ray_launcher", LAUNCHER)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def node(ip: str, alive: bool = True, **resources: float) -> dict:
    return {"Alive": alive, "NodeManagerAddress": ip, "Resources": {"CPU": 1.0, f"node:{ip}": 1.0, **resources}}


def test_placements_the_cluster_cannot_give_are_refused_naming_what_is_missing():
    launcher = load_launcher()
    Placement, problem = launcher.Placement, launcher.placement_problem
    cluster = [node("10.0.0.1", learner=1), node("10.0.0.2", actor=2), node("10.0.0.3", actor=2)]
    free = {"learner": 1, "actor": 4}
    assert problem(cluster, free, Placement(4)) is None
    assert problem(cluster[1:], {"actor": 4}, Placement(4)).startswith(
        "no learner node: no node of the cluster offers the resource 'learner' (nodes: 10.0.0.2 {CPU: 1, actor: 2}")
    dead_learner = [node("10.0.0.1", alive=False, learner=1), *cluster[1:]]
    assert problem(dead_learner, free, Placement(4)).startswith("no learner node")
    assert problem(cluster, {"actor": 4}, Placement(4)).startswith(
        "the learner resource 'learner' is asked twice: all 1 of it is held already")
    assert "asked twice" in problem(cluster, free, Placement(2, learner_resource="actor", actor_resource="actor"))
    assert problem(cluster[:1], {"learner": 1}, Placement(4)).startswith(
        "no actor nodes: no node of the cluster offers the resource 'actor'")
    assert problem(cluster, free, Placement(0)).startswith("--num_actors: got 0, expected >= 1")
    assert problem(cluster, free, Placement(5)).startswith(
        "--num_actors=5: the cluster's nodes offer 4 of 'actor' in all")
    assert problem(cluster, {"learner": 1, "actor": 1}, Placement(4)).startswith(
        "--num_actors=4: only 1 of 'actor' is free")
    assert problem(cluster, free, Placement(4, learner_gpus=1)).startswith(
        "--learner_gpus=1: no node with the resource 'learner' has that many GPUs")


def test_hold_logdir_waits_for_the_process_that_inherited_the_lock(tmp_path):
    launcher = load_launcher()
    fd = launcher.hold_logdir(str(tmp_path))
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)"], pass_fds=(fd,))
    os.close(fd)  # only the child holds it now, as the learner does after its Ray worker died
    start = time.monotonic()
    again = launcher.hold_logdir(str(tmp_path), timeout_s=30)
    waited = time.monotonic() - start
    os.close(again)
    assert holder.wait() == 0
    assert waited > 0.5, f"got the lock after {waited:.2f}s, expected to wait for the child holding it"


def why_no_ray() -> str | None:
    if importlib.util.find_spec("ray") is None:
        return "needs Ray: pip install '.[ray]' (ray[default] 2.60)"
    if shutil.which("ray", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")) is None:
        return "needs the `ray` command next to this Python"
    return None


class RayCluster:
    """`ray start --block` on each host (the head on host 1); stopped by pid."""

    def __init__(self, hosts: NetnsHosts, directory: str):
        self.hosts, self.directory = hosts, directory
        self.nodes: list[subprocess.Popen] = []
        self.ray = shutil.which("ray", path=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
        self.head = f"{hosts.addr(1)}:6379"
        self.environment = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_DEDUP_LOGS": "0"}

    def start(self) -> None:
        common = ["--block", "--num-cpus=1", "--object-store-memory=100000000", "--disable-usage-stats"]
        for host in range(1, self.hosts.count + 1):
            temp = os.path.join(self.directory, f"ray{host}")  # sockets inside: keep the path short
            head = ["--head", "--port=6379", '--resources={"learner": 1}', "--include-dashboard=false"]
            where = head if host == 1 else [f"--address={self.head}", '--resources={"actor": 2}']
            self.nodes.append(self.hosts.run_on(
                host, [self.ray, "start", f"--node-ip-address={self.hosts.addr(host)}", f"--temp-dir={temp}",
                       *where, *common], f"ray-node{host}", self.environment))
            if host == 1:
                wait_for(lambda: self.alive_nodes() >= 1, 120, "the Ray head", interval_s=1, on_timeout=self.logs)
        wait_for(lambda: self.alive_nodes() == self.hosts.count, 120, "every Ray node", interval_s=1,
                 on_timeout=self.logs)

    def alive_nodes(self) -> int:
        for process in self.nodes:
            assert process.poll() is None, self.logs()
        code = "import ray, sys; ray.init(address=sys.argv[1]); print(sum(n['Alive'] for n in ray.nodes()))"
        result = subprocess.run(["ip", "netns", "exec", f"{self.hosts.name}-1", sys.executable, "-c", code,
                                 self.head], capture_output=True, text=True, timeout=60,
                                env=dict(os.environ, **self.environment))
        lines = result.stdout.split()
        return int(lines[-1]) if result.returncode == 0 and lines else 0

    def workers(self, host: int, name: str) -> list[int]:
        """Pids of the Ray workers on `host` whose process title names the Ray actor class `name`."""
        pids = subprocess.run(["ip", "netns", "pids", f"{self.hosts.name}-{host}"], capture_output=True, text=True
                              ).stdout.split()
        found = []
        for pid in pids:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    title = f.read().split(b"\0")[0].decode(errors="replace")
            except OSError:
                continue
            if title.startswith(f"ray::{name}"):
                found.append(int(pid))
        return found

    def logs(self) -> str:
        return "".join(f"\n--- {os.path.basename(path)}\n{self.hosts.output(p)[-3000:]}"
                       for p, path in self.hosts.started)

    def stop(self) -> None:
        for process in self.nodes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.nodes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@pytest.fixture(name="cluster")
def cluster_fixture():
    yield from lab_on_namespace_hosts(why_no_ray, "ray", RayCluster, prefix="seedray-", dir="/tmp")


def text(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def train_steps(logdir: str) -> int:
    rows = read_metrics(logdir)
    return rows[-1]["train_steps"] if rows else 0


def test_ray_run_survives_lost_workers_resumes_and_ends_by_itself(cluster):
    hosts, logdir = cluster.hosts, os.path.join(cluster.directory, "run")

    def launch(name: str, *own: str) -> subprocess.Popen:
        return hosts.run_on(1, [sys.executable, LAUNCHER, f"--address={cluster.head}", *own, "--",
                                f"--logdir={logdir}", *SEED_FLAGS], name, cluster.environment)

    refused = launch("refused", "--num_actors=4", "--learner_resource=gpu_learner")
    assert refused.wait(timeout=120) == 2, cluster.logs()
    assert "no learner node: no node of the cluster offers the resource 'gpu_learner'" in hosts.output(refused)

    submitted = time.monotonic()
    driver = launch("launcher", "--num_actors=4", "--actors_grace_s=30")
    learner_log = os.path.join(logdir, "learner.log")

    def logs() -> str:
        return f"{cluster.logs()}\n--- learner.log\n{text(learner_log)[-4000:]}"

    wait_for(lambda: train_steps(logdir) > 0, 240, "the first training step", on_timeout=logs)
    placed_s = time.monotonic() - submitted
    connected = text(learner_log)
    assert all(f"actor {i} connected over grpc" in connected for i in range(4)), logs()

    # kill -9 of host 2's actor workers: Ray restarts those actors and they dial the learner again.
    lost = cluster.workers(2, "ActorHost")
    assert len(lost) == 2, logs()
    before, lost_at = text(learner_log).count("connected over grpc"), time.monotonic()
    for pid in lost:
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: text(learner_log).count("connected over grpc") >= before + 2, 120,
             "the restarted actors to reconnect", on_timeout=logs)
    steps = train_steps(logdir)
    wait_for(lambda: train_steps(logdir) > steps, 60, "training after the actors came back", on_timeout=logs)
    actors_back_s = time.monotonic() - lost_at
    assert set(cluster.workers(2, "ActorHost") + cluster.workers(3, "ActorHost")).isdisjoint(lost)

    # kill -9 of the learner's Ray worker: its learner checkpoints on the parent-death SIGTERM; Ray restarts the
    # learner's actor, which waits for the logdir and resumes from that checkpoint.
    [worker] = cluster.workers(1, "LearnerHost")
    steps, lost_at = train_steps(logdir), time.monotonic()
    os.kill(worker, signal.SIGKILL)
    wait_for(lambda: "resumed from" in text(learner_log), 180, "the restarted learner to resume", on_timeout=logs)
    resumed_s = time.monotonic() - lost_at
    resumed = re.search(r"resumed from \S+: env_frames=([\d,]+) train_steps=([\d,]+)", text(learner_log))
    assert int(resumed.group(2).replace(",", "")) >= steps > 0, logs()  # the dying learner's last state was saved
    wait_for(lambda: train_steps(logdir) > int(resumed.group(2).replace(",", "")), 120,
             "training after the learner came back", on_timeout=logs)
    learner_back_s = time.monotonic() - lost_at

    assert driver.wait(timeout=600) == 0, logs()
    ended_s = time.monotonic() - submitted
    output = hosts.output(driver)
    assert all(f"[ray] actor {i} exited with 0" in output for i in range(4)), output[-4000:]
    assert "still running" not in output, output[-4000:]
    rows = read_metrics(logdir)
    assert rows[-1]["env_frames"] >= FRAMES
    best = max(r["episode_return_mean"] for r in rows if r.get("episode_return_mean") is not None)
    assert best >= TARGET_RETURN, logs()
    assert json.loads(text(os.path.join(logdir, "summary.json")))["env_frames"] >= FRAMES
    print(f"ray: training {placed_s:.1f}s after submission; actor workers killed: training with them again after "
          f"{actors_back_s:.1f}s; learner worker killed: resumed after {resumed_s:.1f}s, training after "
          f"{learner_back_s:.1f}s; run ended {ended_s:.0f}s after submission")


# ---------------------------------------------------------------------------------------- the KubeRay manifest

KUBERAY_DIR = os.path.join(REPO, "launch", "k8s", "ray")
# KubeRay's RayCluster (ray.io/v1) fields this manifest may use; kubernetes-validate has no schema for the CRD, so
# its own level is checked against these and every pod template strictly as a core PodTemplateSpec.
RAYCLUSTER_SPEC = {"rayVersion", "headGroupSpec", "workerGroupSpecs", "enableInTreeAutoscaling"}
HEAD_GROUP = {"rayStartParams", "template", "serviceType"}
WORKER_GROUP = {"groupName", "replicas", "minReplicas", "maxReplicas", "rayStartParams", "template"}


def rendered_kuberay() -> list[dict]:
    import yaml

    from tests.test_k8s_manifests import _kustomize_command

    command, description = _kustomize_command()
    if command is None:
        pytest.skip(description)
    result = subprocess.run([*command, KUBERAY_DIR], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"{description}: launch/k8s/ray failed:\n{result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def ray_resources(group: dict) -> dict:
    """The custom resources a group's `ray start` declares (KubeRay passes rayStartParams as --key=value)."""
    value = group["rayStartParams"].get("resources")
    return json.loads(json.loads(value)) if value else {}


def test_kuberay_manifest_validates_strictly_and_matches_the_launcher():
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="pip install kubernetes-validate (launch/install_k8s_tools.sh does)")
    from tests.test_k8s_manifests import MIN_K8S_VERSION

    docs = rendered_kuberay()
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == ["PersistentVolumeClaim", "RayCluster"], kinds
    [claim] = [d for d in docs if d["kind"] == "PersistentVolumeClaim"]
    [cluster] = [d for d in docs if d["kind"] == "RayCluster"]
    assert cluster["apiVersion"] == "ray.io/v1"
    spec = cluster["spec"]
    assert set(spec) <= RAYCLUSTER_SPEC and set(spec["headGroupSpec"]) <= HEAD_GROUP, spec.keys()
    groups = {g["groupName"]: g for g in spec["workerGroupSpecs"]}
    for group in groups.values():
        assert set(group) <= WORKER_GROUP, group.keys()
    templates = [spec["headGroupSpec"]["template"], *(g["template"] for g in groups.values())]
    for version in (MIN_K8S_VERSION, kubernetes_validate.latest_version()):
        kubernetes_validate.validate(claim, version, strict=True)
        for template in templates:
            kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"},
                                          "template": template}, version, strict=True)

    launcher = load_launcher()
    defaults = launcher.Placement(num_actors=1)
    # The head takes no Ray tasks (the driver only); one learner pod offers the learner's resource, once.
    assert spec["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    assert not ray_resources(spec["headGroupSpec"])
    offering = {name: ray_resources(g) for name, g in groups.items()}
    learner_groups = [name for name, r in offering.items() if defaults.learner_resource in r]
    assert learner_groups == ["learner"], offering
    learner = groups["learner"]
    assert learner["replicas"] == learner["maxReplicas"] == 1 and offering["learner"] == {"learner": 1}
    assert offering["actors"] == {defaults.actor_resource: 8}
    assert ray_resources(groups["actors"])[defaults.actor_resource] * groups["actors"]["replicas"] >= 1
    # The logdir volume is the claim, mounted on the learner's pod only (where the learner writes it).
    pod = learner["template"]["spec"]
    [volume] = pod["volumes"]
    assert volume["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    [mount] = pod["containers"][0]["volumeMounts"]
    assert mount["name"] == volume["name"] and mount["mountPath"] == "/logdir"
    assert pod["terminationGracePeriodSeconds"] >= 60  # the learner's final checkpoint
    assert "volumes" not in groups["actors"]["template"]["spec"]
    images = {t["spec"]["containers"][0]["image"] for t in templates}
    assert images == {"seed-rl-torch:cpu-ray"}, images
    dockerfile = text(os.path.join(REPO, "launch", "ray", "Dockerfile"))
    assert "seed-rl-torch:cpu-ray" in dockerfile and ".[atari,ray]" in dockerfile
