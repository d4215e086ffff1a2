"""The CPU image built offline and run: launch/README.md section 1 as written, and the Kubernetes manifests played
as pods. Both tests share one image build (module scope; one file, so pytest-xdist's --dist loadfile keeps them
on one worker).

- The image: `launch/docker/build.sh --offline`, what `make image` runs (a local Debian base and a wheelhouse,
  kept between runs as the cache of the next build; then `podman build --network=none`, whose last step runs the
  image's own import checks). The image is tagged seed-rl-torch:cpu and kept, as `make image` keeps it.
- Section 1: its three shell blocks run as written, with podman standing in for docker: a learner and 2 actors on
  an internal network train CartPole to a mean return; `docker stop` checkpoints (exit 0); the learner's own
  `docker run` line again resumes from the volume (`resumed from`), and both actors stream to it within 5 s of
  it listening, though it has a new address (they find it by name through aardvark-dns).
- The manifests: launch/k8s/overlays/cpu rendered with kustomize; its StatefulSets written as Pods here (podman
  4.3's `kube play` skips StatefulSets and Services): one per replica (2 actors), the claim template as a
  PersistentVolumeClaim, the learner pod named as the Service the actors dial. Played with `podman kube play` on
  an internal network, the actors train through that name with the manifests' flagfiles (ConfigMap), token
  (Secret), volume (PVC), uid and limits; SIGTERM checkpoints, and a new learner pod resumes, the actors streaming
  to it within 5 s.
  It shows the manifests' wiring; not a Kubernetes controller, probes or Services (podman ignores them).

Everything a test starts is removed after it, also when it fails: containers, pods, networks, volumes, secrets,
and the net.ipv4.ip_forward sysctl that netavark sets; the test then checks that podman lists what it listed
before. Without root, podman, debootstrap (launch/install_container_tools.sh) or kubectl the tests skip, naming
what is missing."""

from __future__ import annotations

import base64
import copy
import datetime
import json
import os
import re
import secrets
import shutil
import subprocess
import time

import pytest
import yaml

from seed.runtime import checkpoint
from tests.conftest import REPO, RESUMED, assert_resumed, read_metrics, wait_for

pytestmark = pytest.mark.slow

CONTAINERS_CONF = os.environ.get("CONTAINERS_CONF") or os.path.join(REPO, "launch", "docker", "containers.conf")
ENV = dict(os.environ, CONTAINERS_CONF=CONTAINERS_CONF)
IMAGE = "seed-rl-torch:cpu"
README = os.path.join(REPO, "launch", "README.md")
IP_FORWARD = "/proc/sys/net/ipv4/ip_forward"
BUILD_TIMEOUT_S = 1200  # a fresh machine: debootstrap, the wheelhouse and the image from an empty layer cache
START_TIMEOUT_S = 120  # a learner container's start (torch import) on a busy 2-core machine included
RETURN_TARGET = 60.0  # CartPole's mean episode return (a random policy: about 22)
REJOIN_BOUND_S = 5.0  # issue 60: every actor streams again within 5 s of the new learner listening
LEARNER_RESTARTS = 2  # section 1's learner replaced twice (each one a new address and bridge port)
KUBE_ACTORS = 2


def _tool(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")


def why_no_containers() -> str | None:
    if os.geteuid() != 0:
        return f"needs root (rootful podman, debootstrap; running as uid {os.geteuid()})"
    for tool in ("podman", "debootstrap"):
        if _tool(tool) is None:
            return f"needs {tool} (launch/install_container_tools.sh installs it on Debian)"
    if not os.path.exists("/usr/lib/podman/netavark"):
        return "needs netavark (launch/install_container_tools.sh installs it on Debian)"
    return None


def podman(*args: str, check: bool = True, timeout: float = 180) -> subprocess.CompletedProcess:
    result = subprocess.run(["podman", *args], capture_output=True, text=True, env=ENV, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: exit {result.returncode}\n{result.stdout[-3000:]}"
                             f"\n{result.stderr[-3000:]}")
    return result


def listed() -> dict[str, set[str]]:
    """What podman holds that a test could leave behind, by kind: names of containers, pods, networks, volumes,
    secrets."""
    kinds = {"containers": ["ps", "-a", "--format", "{{.Names}}"], "pods": ["pod", "ps", "--format", "{{.Name}}"],
             "networks": ["network", "ls", "--format", "{{.Name}}"],
             "volumes": ["volume", "ls", "--format", "{{.Name}}"],
             "secrets": ["secret", "ls", "--format", "{{.Name}}"]}
    return {kind: set(podman(*args).stdout.split()) for kind, args in kinds.items()}


@pytest.fixture(scope="module")
def image():
    """seed-rl-torch:cpu, built offline by launch/docker/build.sh (what `make image` runs)."""
    reason = why_no_containers()
    if reason:
        pytest.skip(reason)
    started = time.monotonic()
    build = subprocess.run([os.path.join(REPO, "launch", "docker", "build.sh"), "--offline", f"--tag={IMAGE}"],
                           capture_output=True, text=True, env=ENV, cwd=REPO, timeout=BUILD_TIMEOUT_S)
    assert build.returncode == 0, f"{build.stdout[-4000:]}\n{build.stderr[-6000:]}"
    said = [line for line in build.stderr.splitlines() if re.match(r"\[(offline_base|build)\] ", line)]
    print(f"offline image build: {time.monotonic() - started:.0f} s\n" + "\n".join(said))
    # The build's last step ran the image's import checks; the image runs every role's command.
    versions = podman("run", "--rm", "--network=none", IMAGE, "python", "-c",
                      "import torch, ale_py, seed.actor.loop; print(torch.__version__)").stdout
    assert versions.strip().endswith("+cpu"), versions
    return IMAGE


@pytest.fixture
def host_kept():
    """Checks that a test left podman's objects and the host's ip_forward as it found them; `names` collects, by
    kind, what the test may have made, removed here in any case (also when the test failed)."""
    before = listed()
    with open(IP_FORWARD) as f:
        ip_forward = f.read().strip()
    made: dict[str, list[str]] = {"pods": [], "containers": [], "networks": [], "volumes": [], "secrets": []}
    yield made, before
    for pod in made["pods"]:
        podman("pod", "rm", "-f", "-t", "10", pod, check=False)
    for container in made["containers"]:
        podman("rm", "-f", "-t", "10", container, check=False)
    for kind, command in (("networks", "network"), ("volumes", "volume"), ("secrets", "secret")):
        for name in made[kind]:
            podman(command, "rm", *(["-f"] if kind != "secrets" else []), name, check=False)
    with open(IP_FORWARD, "w") as f:
        f.write(ip_forward + "\n")
    after = listed()
    assert after == before, {kind: sorted(after[kind] ^ before[kind]) for kind in before}


def refuse_taken(made: dict[str, list[str]], before: dict[str, set[str]]) -> None:
    """Fails, naming them, if objects the test is about to make (by fixed names) exist already: they are someone
    else's, and the test would remove them."""
    taken = {kind: sorted(set(names) & before[kind]) for kind, names in made.items() if set(names) & before[kind]}
    if taken:
        for kind in made:  # not ours: keep them out of the cleanup
            made[kind] = [name for name in made[kind] if name not in before[kind]]
        pytest.fail(f"podman already has {taken}: remove them first (the test uses these names)")


def pin_bridge_mac(network: str) -> None:
    """launch/docker/pin_bridge_mac.sh on `network`, whose bridge exists (a container runs on it)."""
    pinned = subprocess.run([os.path.join(REPO, "launch", "docker", "pin_bridge_mac.sh"), network],
                            capture_output=True, text=True, env=ENV, timeout=60)
    assert pinned.returncode == 0, pinned.stderr


def volume_path(volume: str) -> str:
    return podman("volume", "inspect", "--format", "{{.Mountpoint}}", volume).stdout.strip()


def logs(container: str) -> str:
    result = podman("logs", container, check=False)
    return result.stdout + result.stderr


def timed_lines(container: str) -> list[tuple[float, str]]:
    """The container's log lines with the time conmon read each (seconds since the epoch)."""
    result = podman("logs", "-t", container, check=False)
    lines = []
    for line in (result.stdout + result.stderr).splitlines():
        stamp, _, text = line.partition(" ")
        match = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)$", stamp)
        if not match:
            continue
        fraction = float(match.group(2) or 0)
        zone = "+00:00" if match.group(3) == "Z" else match.group(3)
        when = datetime.datetime.fromisoformat(match.group(1) + zone).timestamp() + fraction
        lines.append((when, text))
    return lines


def rejoin_delays(learner: str, actors: list[str]) -> dict[str, float]:
    """Seconds from `learner`'s "listening on" line to each actor's last "connected to" line."""
    listening = [when for when, text in timed_lines(learner) if "listening on" in text][-1]
    return {actor: [when for when, text in timed_lines(actor) if "] connected to " in text][-1] - listening
            for actor in actors}


def in_container(saved: tuple[str, dict]) -> tuple[str, dict]:
    """A checkpoint found on the volume (checkpoint.latest: the host's path), named as the learner names it: by
    its path in the container (the volume at /logdir, the manifests' and section 1's --logdir=/logdir/run)."""
    return f"/logdir/run/{os.path.basename(saved[0])}", saved[1]


def connections(container: str) -> int:
    return logs(container).count("] connected to ")


def best_return(logdir: str) -> float:
    returns = [row["episode_return_mean"] for row in read_metrics(logdir) if row.get("episode_return_mean")]
    return max(returns, default=0.0)


def train_steps(logdir: str) -> int:
    rows = read_metrics(logdir)
    return rows[-1]["train_steps"] if rows else -1


# --- launch/README.md section 1 ---------------------------------------------------------------------------------


def readme_blocks() -> list[str]:
    """The shell blocks of section 1's "Try them without a cluster": start, stop the learner, remove everything."""
    with open(README, encoding="utf-8") as f:
        text = f.read()
    section = text.split("### Try them without a cluster", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^```sh\n(.*?)^```", section, re.S | re.M)


def learner_command(block: str) -> str:
    """The learner's `docker run` command of the start block, continuation lines included."""
    match = re.search(r"^docker run -d --name seed-learner .*?[^\\]$", block, re.S | re.M)
    assert match, block
    return match.group(0)


def run_shell(block: str, cwd: str, timeout: float = 300) -> str:
    """Runs README shell lines as written, `docker` being podman; returns their output; fails if they fail."""
    script = 'set -euo pipefail\ndocker() { podman "$@"; }\n' + block
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=cwd, env=ENV,
                            timeout=timeout)
    assert result.returncode == 0, \
        f"{block}\nexit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout


def test_readme_section_1_trains_checkpoints_resumes_and_actors_follow_the_learner(image, host_kept, tmp_path):
    made, before = host_kept
    made.update(containers=["seed-learner", "seed-actor-0", "seed-actor-1"], networks=["seed"],
                volumes=["seed-logdir"])
    refuse_taken(made, before)
    start, stop, remove = readme_blocks()
    actors = ["seed-actor-0", "seed-actor-1"]
    following = [line for line in start.splitlines() if line.startswith("docker logs -f")]
    assert len(following) == 1, start  # the one line left out: it follows the log until Ctrl-C
    os.symlink(os.path.join(REPO, "launch"), tmp_path / "launch")  # run "from the repository root", token in tmp
    started = time.monotonic()
    run_shell("\n".join(line for line in start.splitlines() if line not in following), str(tmp_path))
    logdir = os.path.join(volume_path("seed-logdir"), "run")

    def log_tail() -> str:
        return "".join(f"\n--- {name}\n" + "\n".join(f"{when:.2f} {text}" for when, text in timed_lines(name)[-30:])
                       for name in ["seed-learner", *actors])

    wait_for(lambda: train_steps(logdir) > 0, START_TIMEOUT_S, "the first update in containers", interval_s=0.5,
             on_timeout=log_tail)
    first_update_s = time.monotonic() - started
    for actor in actors:
        assert "connected to seed-learner:8686 over grpc" in logs(actor), log_tail()
    wait_for(lambda: best_return(logdir) >= RETURN_TARGET, 240, f"a mean return of {RETURN_TARGET}",
             interval_s=1, on_timeout=log_tail)
    return_s = time.monotonic() - started
    # Twice: without launch/docker/pin_bridge_mac.sh, 10 of 14 restarts here left the actors 5.6-45 s late.
    for restart in range(LEARNER_RESTARTS):
        old_address = podman("inspect", "-f", "{{.NetworkSettings.Networks.seed.IPAddress}}", "seed-learner").stdout
        # docker stop and docker rm print the name; docker inspect the learner's exit status.
        assert run_shell(stop, str(tmp_path)).split() == ["seed-learner", "0", "seed-learner"], log_tail()
        saved = checkpoint.latest(logdir)
        assert saved is not None, log_tail()
        rows_before = len(read_metrics(logdir))

        run_shell(learner_command(start), str(tmp_path))  # "start it again with its docker run line above"
        output = wait_for(lambda: RESUMED.search(logs("seed-learner")) and logs("seed-learner"), START_TIMEOUT_S,
                          "the resumed learner", interval_s=0.5, on_timeout=log_tail)
        saved = in_container(saved)
        assert RESUMED.search(output).group(1) == saved[0], output[-3000:]
        wait_for(lambda wanted=2 + restart: all(connections(actor) >= wanted for actor in actors), 60,
                 "both actors to stream again", interval_s=0.2, on_timeout=log_tail)
        delays = rejoin_delays("seed-learner", actors)
        new_address = podman("inspect", "-f", "{{.NetworkSettings.Networks.seed.IPAddress}}", "seed-learner").stdout
        print(f"section 1: first update {first_update_s:.0f} s after docker run; mean return {RETURN_TARGET} at "
              f"{return_s:.0f} s; restart {restart + 1}: learner {old_address.strip()} -> {new_address.strip()}; "
              f"actors streaming {', '.join(f'{d:.2f}' for d in delays.values())} s after the new learner listened")
        assert max(delays.values()) <= REJOIN_BOUND_S, f"{delays}\n{log_tail()}"
        steps = saved[1]["counters"]["train_steps"]
        wait_for(lambda rows=rows_before, past=steps + 5: (len(read_metrics(logdir)) > rows
                                                         and train_steps(logdir) > past),
                 START_TIMEOUT_S, "training on after the resume", interval_s=0.5, on_timeout=log_tail)
        assert_resumed(logs("seed-learner"), logdir, saved, rows_before)

    run_shell(remove, str(tmp_path))
    left = listed()
    assert not any(set(names) & left[kind] for kind, names in made.items()), left


# --- the Kubernetes manifests, played as pods -------------------------------------------------------------------


def render_cpu_overlay() -> list[dict]:
    overlay = os.path.join(REPO, "launch", "k8s", "overlays", "cpu")
    if shutil.which("kubectl"):
        command = ["kubectl", "kustomize", overlay]
    elif shutil.which("kustomize"):
        command = ["kustomize", "build", overlay]
    else:
        pytest.skip("needs kubectl >= 1.21 or kustomize v4+ to render launch/k8s (launch/install_k8s_tools.sh)")
    rendered = subprocess.run(command, capture_output=True, text=True, check=True, timeout=60).stdout
    return [doc for doc in yaml.safe_load_all(rendered) if doc]


def flag_value(flagfile: str, flag: str) -> str:
    values = re.findall(rf"^--{flag}=(.*)$", flagfile, re.M)
    assert values, (flag, flagfile)
    return values[-1]


def as_pods(docs: list[dict], actor_replicas: int, token: str) -> tuple[list[dict], dict[str, str]]:
    """The rendered manifests as podman 4.3's `kube play` can run them: the ConfigMap as it is, the Secret the
    manifests expect (README: `kubectl create secret generic seed-auth --from-literal=token=...`), each
    StatefulSet's pods (the actors' `actor_replicas`; named NAME-ORDINAL; the learner's named as the Service
    that the actors' --server_address names) with a PersistentVolumeClaim per claim template
    (CLAIM-STATEFULSET-ORDINAL, as Kubernetes names it). Secret volumes get `optional: false` (podman 4.3.1
    panics without it). Services are left out (podman ignores them). Returns the documents and the pod names by
    StatefulSet."""
    by_kind: dict[str, list[dict]] = {}
    for doc in docs:
        by_kind.setdefault(doc["kind"], []).append(doc)
    assert sorted(by_kind) == ["ConfigMap", "Service", "StatefulSet"], sorted(by_kind)
    (config_map,) = by_kind["ConfigMap"]
    dialled = flag_value(config_map["data"]["actor.flags"], "server_address").rsplit(":", 1)[0]
    services = {service["metadata"]["name"]: service for service in by_kind["Service"]}
    assert dialled in services, (dialled, sorted(services))
    secret_names = {volume["secret"]["secretName"] for sts in by_kind["StatefulSet"]
                    for volume in sts["spec"]["template"]["spec"]["volumes"] if "secret" in volume}
    assert secret_names == {"seed-auth"}, secret_names
    out = [config_map, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "seed-auth"},
                        "data": {"token": base64.b64encode(token.encode()).decode()}}]
    names: dict[str, list[str]] = {}
    for sts in by_kind["StatefulSet"]:
        name, spec = sts["metadata"]["name"], sts["spec"]
        labels = spec["template"]["metadata"]["labels"]
        serving = [service for service, body in services.items() if body["spec"].get("clusterIP") != "None"
                   and body["spec"]["selector"].items() <= labels.items()]
        replicas = spec["replicas"] if not labels.get("app.kubernetes.io/component") == "actor" else actor_replicas
        if dialled in serving:
            assert replicas == 1, (name, replicas)
        names[name] = []
        for ordinal in range(replicas):
            pod_spec = copy.deepcopy(spec["template"]["spec"])
            for volume in pod_spec["volumes"]:
                if "secret" in volume:
                    volume["secret"].setdefault("optional", False)
            for claim in spec.get("volumeClaimTemplates", []):
                claim_name = f"{claim['metadata']['name']}-{name}-{ordinal}"
                out.append({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": claim_name},
                            "spec": claim["spec"]})
                pod_spec["volumes"].append({"name": claim["metadata"]["name"],
                                            "persistentVolumeClaim": {"claimName": claim_name}})
            pod_name = dialled if dialled in serving else f"{name}-{ordinal}"
            names[name].append(pod_name)
            out.append({"apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": pod_name, "labels": copy.deepcopy(sts["spec"]["template"]["metadata"]
                                                                             ["labels"])},
                        "spec": pod_spec})
    return out, names


def write_yaml(path: str, docs: list[dict]) -> str:
    with open(path, "w") as f:
        yaml.safe_dump_all(docs, f, sort_keys=False)
    return path


def test_k8s_cpu_overlay_played_as_pods_trains_checkpoints_and_resumes(image, host_kept, tmp_path):
    made, before = host_kept
    docs = render_cpu_overlay()
    played, pods = as_pods(docs, KUBE_ACTORS, secrets.token_hex(32))
    (learner_pod,) = pods["seed-learner"]
    actor_pods = pods["seed-actor"]
    claims = [doc["metadata"]["name"] for doc in played if doc["kind"] == "PersistentVolumeClaim"]
    config_map = next(doc for doc in played if doc["kind"] == "ConfigMap")
    network = f"seed-kube-{os.getpid()}"
    # podman 4.3 makes a volume of each Secret and ConfigMap it plays, named as they are.
    made.update(pods=[learner_pod, *actor_pods], networks=[network], secrets=["seed-auth"],
                volumes=[*claims, "seed-auth", config_map["metadata"]["name"]])
    refuse_taken(made, before)
    learner, actors = f"{learner_pod}-learner", [f"{pod}-actor" for pod in actor_pods]
    # CartPole for the manifests' atari:Pong: Pong's learner made 3 updates in its first 2 minutes on 2 cores (and a
    # 2-core CI machine runs another test file beside this one). Every other flag is the manifests'.
    env_flags, replaced = re.subn(r"^--env=.*$", "--env=gym:CartPole-v1", config_map["data"]["env.flags"], flags=re.M)
    assert replaced == 1, config_map["data"]["env.flags"]
    config_map["data"]["env.flags"] = env_flags

    def log_tail() -> str:
        return "".join(f"\n--- {name}\n{logs(name)[-2500:]}" for name in [learner, *actors])

    podman("network", "create", "--internal", network)
    started = time.monotonic()
    podman("kube", "play", "--network", network, write_yaml(str(tmp_path / "pods.yaml"), played), timeout=300)
    pin_bridge_mac(network)  # netavark 1.4 (launch/README.md section 1); after play: the bridge exists now
    logdir = os.path.join(volume_path(claims[0]), "run")  # the manifests' --logdir=/logdir/run on the claim
    wait_for(lambda: train_steps(logdir) > 0, 300, "the first update of the played pods", interval_s=1,
             on_timeout=log_tail)
    first_update_s = time.monotonic() - started
    learner_log = logs(learner)
    env = flag_value(env_flags, "env")
    assert f"agent=vtrace env={env} listening on 0.0.0.0:8686" in learner_log, learner_log[-3000:]
    for index, actor in enumerate(actors):  # POD_NAME's ordinal became --actor_index: env ids of their own
        wait_for(lambda a=actor: connections(a) >= 1, 120, f"{actor} to stream", on_timeout=log_tail)
        envs = int(flag_value(env_flags, "envs_per_actor"))
        assert f"connected to {learner_pod}:8686 over grpc (env ids from {index * envs}," in logs(actor), log_tail()
    # The manifests' securityContext and limits reached the containers.
    assert podman("exec", learner, "id", "-u").stdout.strip() == "1000"
    assert podman("inspect", "-f", "{{.HostConfig.Memory}}", actors[0]).stdout.strip() == str(2 << 30)
    assert os.stat(logdir).st_uid == 1000

    # SIGTERM to the learner; then the rest of the pod (`podman pod stop` alone also takes the pod's network down
    # while the learner still closes its connections: the actors noticed only when TCP gave up, 20 s later).
    podman("stop", "-t", "120", learner, timeout=180)
    podman("pod", "stop", "-t", "30", learner_pod, timeout=180)
    assert podman("inspect", "-f", "{{.State.ExitCode}}", learner).stdout.strip() == "0", log_tail()
    saved = checkpoint.latest(logdir)
    assert saved is not None, log_tail()
    saved = in_container(saved)
    rows_before = len(read_metrics(logdir))
    podman("pod", "rm", learner_pod)
    # A new learner pod on the same claim (a StatefulSet replaces its pod so): the ConfigMap and the Pod again;
    # the Secret and the volume exist (a second play of the claim fails on the existing volume).
    again = [doc for doc in played if doc["kind"] == "ConfigMap" or doc["metadata"]["name"] == learner_pod]
    podman("kube", "play", "--network", network, write_yaml(str(tmp_path / "learner.yaml"), again), timeout=300)
    wait_for(lambda: RESUMED.search(logs(learner)), 300, "the new learner pod to resume", interval_s=1,
             on_timeout=log_tail)
    wait_for(lambda: all(connections(actor) >= 2 for actor in actors), 120, "the actors to stream again",
             interval_s=0.5, on_timeout=log_tail)
    steps = saved[1]["counters"]["train_steps"]
    wait_for(lambda: len(read_metrics(logdir)) > rows_before and train_steps(logdir) > steps, 300,
             "training on after the resume", interval_s=1, on_timeout=log_tail)
    assert_resumed(logs(learner), logdir, saved, rows_before)
    delays = rejoin_delays(learner, actors)
    print(f"kube play ({env}): first update {first_update_s:.0f} s after play; actors streaming "
          f"{', '.join(f'{d:.2f}' for d in delays.values())} s after the new learner pod listened")
    assert max(delays.values()) <= REJOIN_BOUND_S, f"{delays}\n{log_tail()}"
    # Stopped as they should be: actors and learner with SIGTERM (podman kube down would SIGKILL them).
    for pod in [*actor_pods, learner_pod]:
        podman("pod", "stop", "-t", "60", pod, timeout=120)
    assert json.loads(podman("inspect", learner).stdout)[0]["State"]["ExitCode"] == 0
