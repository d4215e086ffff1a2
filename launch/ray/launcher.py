"""Runs a SEED RL learner and its actors on a Ray cluster: Ray places them, restarts what was lost, and tells the
actors where the learner is. The learner and the actors are the ordinary `seed-learner` and `seed-actor` processes,
reached through their command lines only.

    # the learner's node (with a GPU: add --num-gpus=1 and pass --learner_gpus=1 and the cuda flags below)
    ray start --head --resources='{"learner": 1}'
    # every actor node: how many actors it runs
    ray start --address=HEAD_IP:6379 --resources='{"actor": 8}'
    # anywhere in the cluster (e.g. `ray job submit -- python launch/ray/launcher.py ...`, or on the head node):
    python launch/ray/launcher.py --num_actors=16 -- --env=atari:Pong --logdir=/shared/runs/pong

Flags after `--` are seed-learner's and seed-actor's: each process gets those it has (the env flags, e.g. --env
and --envs_per_actor, go to both, as with launch/local.sh; --reconnect_max_backoff_s to the actors only). The
launcher adds the rest: --num_actors, the learner's --server_address=0.0.0.0:PORT, each actor's --actor_index and
--server_address, and a shared token.

Placement and restarts (Ray's, no supervisor of our own):

* The learner is one Ray actor (`LearnerHost`) asking for the custom resource --learner_resource (1 of it) and
  --learner_gpus GPUs, with `max_restarts`: if its worker or node is lost, Ray starts it again on a node with the
  resource. It runs seed-learner in a session of its own (the raylet SIGKILLs a dead worker's process group, which
  would cost the checkpoint) with a parent-death signal (SIGTERM when the worker thread that started it ends), so a
  lost worker's learner still checkpoints; the restarted one waits for it to release the logdir (an flock on
  LOGDIR/learner.lock that the learner process holds) and then resumes from that checkpoint.
* Each actor is a Ray actor (`ActorHost`) asking for 1 of --actor_resource, spread over the nodes, with
  `max_restarts`. It asks the learner's Ray actor for the learner's address and token, runs seed-actor, and checks
  the address every few seconds: a learner that came back on another node is dialled there. A seed-actor that
  crashes takes its Ray actor down, so Ray restarts that too.
* The run ends by itself: the learner reaches --total_environment_frames, tells its actors (they exit 0,
  seed/learner/run_end.py) and exits; the launcher then returns the learner's exit status. SIGTERM or Ctrl-C stops
  the learner first (it checkpoints), then the actors.

Refused at submission, with what is missing named (`placement_problem`): a cluster with no node offering the
learner's resource (or its GPUs), a learner resource that another run's learner already holds (one learner per
logdir and resource), the same resource asked for the learner and the actors, and no node, or not enough of the
actor resource, for the actors. The learner's logdir should be on storage every learner node sees (it holds the
checkpoints and the generated token, LOGDIR/auth_token).
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from typing import Any

# The parent-death signal, set in the child before it execs the real command (no preexec_fn: the Ray worker has
# many threads, and forking Python code in one of them can deadlock). argv: signal number, parent pid, command...
# A parent already gone by then (the pid changed) ends the child at once.
_PDEATHSIG_CODE = (
    "import ctypes, os, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, int(sys.argv[1]))  # PR_SET_PDEATHSIG\n"
    "if os.getppid() != int(sys.argv[2]):\n"
    "    sys.exit(f'parent {sys.argv[2]} gone before {sys.argv[3]} started')\n"
    "os.execvp(sys.argv[3], sys.argv[3:])\n")
LEARNER_START_TIMEOUT_S = 300.0
LOGDIR_LOCK_TIMEOUT_S = 600.0
ADDRESS_CHECK_INTERVAL_S = 2.0
CONFIGURATION_ERROR = 2  # seed-learner's and seed-actor's exit status for a refused configuration
SUPERSEDED = 3  # seed-actor: another actor took over its index


@dataclasses.dataclass(frozen=True)
class Placement:
    """What the run asks of the cluster: `learner_resource` (1 unit) and `learner_gpus` for the learner, 1 unit of
    `actor_resource` per actor."""

    num_actors: int
    learner_resource: str = "learner"
    actor_resource: str = "actor"
    learner_gpus: float = 0


def placement_problem(nodes: list[dict[str, Any]], available: dict[str, float], placement: Placement) -> str | None:
    """Why the cluster cannot place this run, naming what is missing, or None.

    `nodes`: `ray.nodes()` (each with "Alive", "NodeManagerAddress", "Resources"); `available`:
    `ray.available_resources()`.
    """
    learner, actor = placement.learner_resource, placement.actor_resource
    alive = [n for n in nodes if n.get("Alive")]
    described = "; ".join(f"{n.get('NodeManagerAddress', '?')} {_custom(n.get('Resources', {}))}" for n in alive)
    described = described or "no node alive"
    if placement.num_actors < 1:
        return f"--num_actors: got {placement.num_actors}, expected >= 1 (a run with no actor nodes trains nothing)"
    if learner == actor:
        return (f"--learner_resource and --actor_resource: got {learner!r} for both, expected two resources: the "
                "learner's resource would be asked twice, once by the learner and once by every actor")
    learner_nodes = [n for n in alive if n.get("Resources", {}).get(learner, 0) >= 1]
    if not learner_nodes:
        return (f"no learner node: no node of the cluster offers the resource {learner!r} (nodes: {described}); "
                f"start the learner's node with `ray start ... --resources='{{\"{learner}\": 1}}'`")
    if placement.learner_gpus and not any(n["Resources"].get("GPU", 0) >= placement.learner_gpus
                                          for n in learner_nodes):
        return (f"--learner_gpus={placement.learner_gpus:g}: no node with the resource {learner!r} has that many "
                f"GPUs (nodes: {described})")
    if available.get(learner, 0) < 1:
        total = sum(n["Resources"][learner] for n in learner_nodes)
        return (f"the learner resource {learner!r} is asked twice: all {total:g} of it is held already (another "
                "run's learner); stop that run, or give this one its own --learner_resource")
    actor_total = sum(n.get("Resources", {}).get(actor, 0) for n in alive)
    if actor_total < 1:
        return (f"no actor nodes: no node of the cluster offers the resource {actor!r} (nodes: {described}); "
                f"start each actor node with `ray start ... --resources='{{\"{actor}\": N}}'` (N actors there)")
    if actor_total < placement.num_actors:
        return (f"--num_actors={placement.num_actors}: the cluster's nodes offer {actor_total:g} of {actor!r} in all "
                f"(nodes: {described}), expected at least one per actor")
    if available.get(actor, 0) < placement.num_actors:
        return (f"--num_actors={placement.num_actors}: only {available.get(actor, 0):g} of {actor!r} is free "
                f"({actor_total:g} in all; another run's actors hold the rest)")
    return None


def _custom(resources: dict[str, float]) -> str:
    """A node's resources as the message shows them (Ray's own bookkeeping ones left out)."""
    shown = {k: v for k, v in sorted(resources.items())
             if not k.startswith(("node:", "memory", "object_store_memory", "accelerator_type"))}
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in shown.items()) + "}"


def with_parent_death_signal(command: list[str], signum: int) -> list[str]:
    """`command` run so that it receives `signum` when the thread that started it ends (prctl PR_SET_PDEATHSIG,
    which survives exec)."""
    return [sys.executable, "-c", _PDEATHSIG_CODE, str(int(signum)), str(os.getpid()), *command]


def hold_logdir(logdir: str, timeout_s: float = LOGDIR_LOCK_TIMEOUT_S) -> int:
    """An open descriptor holding an exclusive flock on LOGDIR/learner.lock, for the learner process to inherit:
    the lock lasts as long as that process (however its Ray worker ends). Waits, saying so, while the learner of a
    lost worker still holds it (it checkpoints on its SIGTERM); raises TimeoutError after `timeout_s`."""
    os.makedirs(logdir, exist_ok=True)
    path = os.path.join(logdir, "learner.lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    start, said = time.monotonic(), False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if said:
                print(f"[ray] {path} released after {time.monotonic() - start:.1f}s", flush=True)
            return fd
        except BlockingIOError:
            if time.monotonic() - start > timeout_s:
                os.close(fd)
                raise TimeoutError(f"{path}: still locked after {timeout_s:.0f}s, expected the learner before this "
                                   "one to checkpoint and exit") from None
            if not said:
                said = True
                print(f"[ray] waiting for the learner before this one to release {path} (it checkpoints first)",
                      flush=True)
            time.sleep(0.2)


def run_token(logdir: str) -> str:
    """The run's token, LOGDIR/auth_token (made once, mode 0600): the same across learner restarts, so actors that
    outlive a learner are not refused by the next one."""
    path = os.path.join(logdir, "auth_token")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        with open(path) as f:
            return f.read().strip()
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32) + "\n")
    with open(path) as f:
        return f.read().strip()


def secret_descriptor(text: str) -> int:
    """An anonymous in-memory file (memfd) holding `text`, for a child to read as /proc/self/fd/N: the token on an
    actor's node never touches a disk, and goes with the processes however they end (a SIGKILLed worker too)."""
    fd = os.memfd_create("seed-token")
    os.write(fd, (text + "\n").encode())
    return fd


def node_ip() -> str:
    import ray

    return ray.util.get_node_ip_address()


class LearnerHost:
    """The Ray actor that runs seed-learner (see the module docstring). Its methods run on a thread pool
    (max_concurrency), so `wait` blocks while `connection` answers."""

    def __init__(self, command: list[str], logdir: str, port: int, token_file: str):
        from seed.local_launcher import wait_until_serving

        self.port = port
        self.ip = node_ip()
        self.serving = False  # a learner that exits before it serves is refused, not restarted (see `_run`)
        self._exit: int | None = None
        self._exited = threading.Event()
        lock_fd = hold_logdir(logdir)
        self.token = "" if token_file else run_token(logdir)
        token_file = token_file or os.path.join(logdir, "auth_token")
        command = [*command, f"--server_address=0.0.0.0:{port}", f"--auth_token_file={token_file}"]
        log_path = os.path.join(logdir, "learner.log")
        started = threading.Event()
        # The thread that starts the learner waits for it, so it ends only with the learner or with this worker:
        # the parent-death signal fires when this thread is gone.
        threading.Thread(target=self._run, args=(command, lock_fd, log_path, started), name="learner",
                         daemon=True).start()
        started.wait()
        os.close(lock_fd)  # the learner process holds the lock now
        print(f"[ray] learner starting on {self.ip} (worker pid {os.getpid()}, learner pid {self.process.pid}), "
              f"log {log_path}", flush=True)
        if not wait_until_serving(f"127.0.0.1:{port}", self.process, LEARNER_START_TIMEOUT_S):
            self._exited.wait(10)
            raise RuntimeError(f"seed-learner on {self.ip} did not start serving (exit status {self._exit}); "
                               f"its log, {log_path}, ends:\n{_tail(log_path)}")
        self.serving = True
        print(f"[ray] learner serving at {self.ip}:{port}", flush=True)

    def _run(self, command: list[str], lock_fd: int, log_path: str, started: threading.Event) -> None:
        with open(log_path, "ab") as log:
            self.process = subprocess.Popen(with_parent_death_signal(command, signal.SIGTERM), stdout=log,
                                            stderr=subprocess.STDOUT, pass_fds=(lock_fd,), start_new_session=True,
                                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
        started.set()
        code = self.process.wait()
        self._exit = code
        self._exited.set()
        if self.serving and code not in (0, CONFIGURATION_ERROR) and code != -signal.SIGTERM:
            # A learner that crashed after it served (a helper thread died, killed): this Ray actor goes too, and Ray
            # restarts it. One that never served (a flag it refuses) fails the constructor instead: no restart.
            print(f"[ray] seed-learner exited with {code}; ending its Ray actor so that Ray restarts it", flush=True)
            os._exit(1)

    def connection(self) -> tuple[str, str]:
        """(the learner's address host:port, the run's token or '' if the user gave --auth_token_file); the
        address is '' once the learner has exited (its run is over: an actor started now has nothing to do)."""
        return ("" if self._exited.is_set() else f"{self.ip}:{self.port}"), self.token

    def where(self) -> dict[str, Any]:
        return {"ip": self.ip, "worker_pid": os.getpid(), "learner_pid": self.process.pid}

    def wait(self) -> int:
        """The learner's exit status, once it has exited."""
        self._exited.wait()
        return self._exit

    def stop(self, timeout_s: float = 300.0) -> int | None:
        """SIGTERM to the learner (it checkpoints and exits); its exit status, or None if it outlived `timeout_s`."""
        if not self._exited.is_set():
            self.process.send_signal(signal.SIGTERM)
        self._exited.wait(timeout_s)
        return self._exit


class ActorHost:
    """The Ray actor that runs one seed-actor against the learner's Ray actor (see the module docstring)."""

    def __init__(self, learner: Any, index: int, command: list[str]):
        self.learner, self.index, self.command = learner, index, command
        self.address, token = self._connection(timeout_s=None)
        self.token_fd = secret_descriptor(token) if token else None
        self._lock = threading.Lock()
        self._exit: int | None = None
        self._done = threading.Event()
        self._generation = 0
        self.process: subprocess.Popen | None = None
        if not self.address:  # the learner's run is over already
            self._finish(0)
            return
        self._start(self._generation)
        threading.Thread(target=self._follow_learner, name="follow-learner", daemon=True).start()
        print(f"[ray] actor {index} on {node_ip()} (worker pid {os.getpid()}) dials {self.address}", flush=True)

    def _connection(self, timeout_s: float | None) -> tuple[str, str]:
        import ray

        return ray.get(self.learner.connection.remote(), timeout=timeout_s)

    def _start(self, generation: int) -> None:
        """Starts seed-actor at the current address; a thread waits for it (see `_watch`). `generation` counts the
        processes started for a new learner address: only the current one's exit is this actor's end."""
        command = [*self.command, f"--actor_index={self.index}", f"--server_address={self.address}"]
        if self.token_fd is not None:  # the child's own copy of the descriptor (pass_fds keeps its number)
            command.append(f"--auth_token_file=/proc/self/fd/{self.token_fd}")
        started = threading.Event()
        threading.Thread(target=self._watch, args=(command, generation, started), daemon=True).start()
        started.wait()

    def _watch(self, command: list[str], generation: int, started: threading.Event) -> None:
        # SIGKILL when this thread (the worker) is gone: an actor keeps no state worth a clean stop.
        process = subprocess.Popen(with_parent_death_signal(command, signal.SIGKILL),
                                   pass_fds=() if self.token_fd is None else (self.token_fd,),
                                   env=dict(os.environ, PYTHONUNBUFFERED="1"))
        self.process = process
        started.set()
        code = process.wait()
        with self._lock:
            if generation != self._generation:
                return  # replaced by one dialling the learner's new address
        if code in (0, CONFIGURATION_ERROR, SUPERSEDED):
            self._finish(code)
            return
        print(f"[ray] seed-actor {self.index} exited with {code}; ending its Ray actor so that Ray restarts it",
              flush=True)
        os._exit(1)

    def _follow_learner(self) -> None:
        """Dials the learner where it is now: a restarted learner may come back on another node."""
        import ray

        while not self._done.wait(ADDRESS_CHECK_INTERVAL_S):
            try:
                address, _ = self._connection(timeout_s=10)
            except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError):
                continue  # the learner is being restarted
            if address and address != self.address:
                print(f"[ray] actor {self.index}: the learner moved from {self.address} to {address}", flush=True)
                with self._lock:
                    old, self.address = self.process, address
                    self._generation += 1  # the old process's exit is not this actor's end
                    generation = self._generation
                old.send_signal(signal.SIGTERM)
                old.wait()
                self._start(generation)

    def _finish(self, code: int) -> None:
        self._exit = code
        self._done.set()

    def where(self) -> dict[str, Any]:
        return {"ip": node_ip(), "worker_pid": os.getpid(), "index": self.index}

    def wait(self) -> int:
        """seed-actor's exit status: 0 once the learner said the run is over, 2 refused, 3 superseded."""
        self._done.wait()
        return self._exit


def _tail(path: str, lines: int = 30) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError as error:
        return f"({error})"


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, dict[str, str]]:
    """The launcher's own flags (before `--`) and the seed flags after it ({name: value}, as local.sh parses
    them)."""
    from seed.local_launcher import parse_flags

    own, seed_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(prog="launch/ray/launcher.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--address", default="auto", help="The Ray cluster (ray.init's address; default: auto).")
    parser.add_argument("--num_actors", type=int, default=2, help="seed-actor processes (each 1 of --actor_resource).")
    parser.add_argument("--learner_resource", default="learner", help="Custom resource of the learner's node.")
    parser.add_argument("--actor_resource", default="actor", help="Custom resource of the actors' nodes.")
    parser.add_argument("--learner_gpus", type=float, default=0, help="GPUs for the learner (Ray's num_gpus).")
    parser.add_argument("--port", type=int, default=8686, help="The learner's TCP port on its node.")
    parser.add_argument("--max_restarts", type=int, default=20,
                        help="How often Ray restarts the learner and each actor after a loss (-1: always).")
    parser.add_argument("--actors_grace_s", type=float, default=60.0,
                        help="After the learner exits, how long actors that did not hear the run's end are waited "
                             "for before they are stopped.")
    args = parser.parse_args(own)
    seed_flags = parse_flags(seed_args)
    known = learner_fields() | actor_fields()
    unknown = sorted(set(seed_flags) - known)
    if unknown:
        parser.error(f"after --: got unknown flags {unknown}, expected seed-learner's or seed-actor's flags")
    for name in ("server_address", "actor_index"):
        if name in seed_flags:
            parser.error(f"--{name}: got {seed_flags[name]!r} after --, expected none: the launcher sets it")
    if not seed_flags.get("logdir"):
        parser.error("--logdir: got none after --, expected the run's logdir, on storage every learner node sees")
    seed_flags.setdefault("num_actors", str(args.num_actors))
    if int(seed_flags["num_actors"]) < args.num_actors:
        parser.error(f"--num_actors={seed_flags['num_actors']} after --: expected >= the launcher's --num_actors "
                     f"({args.num_actors}): the learner refuses actor indices beyond it")
    return args, seed_flags


def learner_fields() -> set[str]:
    from seed.learner.configuration import learner_fields as fields

    return set(fields())


def actor_fields() -> set[str]:
    from seed.config import actor_config_class

    return {f.name for f in dataclasses.fields(actor_config_class())}


def commands(seed_flags: dict[str, str]) -> tuple[list[str], list[str], str]:
    """(seed-learner's command, seed-actor's command without its index and address, the user's token file or ''):
    each gets the flags it has (the env flags go to both)."""
    token_file = seed_flags.get("auth_token_file", "")
    learner_names, actor_names = learner_fields(), actor_fields()
    learner = [sys.executable, "-m", "seed.learner.main"] + [
        f"--{k}={v}" for k, v in seed_flags.items() if k in learner_names and k != "auth_token_file"]
    actor = [sys.executable, "-m", "seed.actor.main"] + [
        f"--{k}={v}" for k, v in seed_flags.items() if k in actor_names and k != "auth_token_file"]
    return learner, actor, token_file


def main(argv: list[str]) -> int:
    import ray

    args, seed_flags = parse_args(argv)
    learner_command, actor_command, token_file = commands(seed_flags)
    submitted = time.monotonic()
    ray.init(address=args.address, log_to_driver=True)
    placement = Placement(args.num_actors, args.learner_resource, args.actor_resource, args.learner_gpus)
    problem = placement_problem(ray.nodes(), ray.available_resources(), placement)
    if problem:
        print(f"launch/ray: refused: {problem}", file=sys.stderr, flush=True)
        return CONFIGURATION_ERROR
    restarts = dict(max_restarts=args.max_restarts, max_task_retries=-1)
    learner = ray.remote(LearnerHost).options(
        resources={args.learner_resource: 1}, num_gpus=args.learner_gpus, num_cpus=0, max_concurrency=8,
        **restarts).remote(learner_command, seed_flags["logdir"], args.port, token_file)
    actors = [ray.remote(ActorHost).options(
        resources={args.actor_resource: 1}, num_cpus=0, max_concurrency=4, scheduling_strategy="SPREAD",
        **restarts).remote(learner, index, actor_command) for index in range(args.num_actors)]
    stopping = []

    def on_signal(signum: int, _frame: Any) -> None:
        stopping.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    learner_done = learner.wait.remote()
    try:
        where = ray.get(learner.where.remote())
        print(f"[ray] learner placed on {where['ip']} {time.monotonic() - submitted:.1f}s after submission",
              flush=True)
        code = ray.get(learner_done)
    except KeyboardInterrupt:
        print("[ray] stopping: the learner first (it checkpoints), then the actors", flush=True)
        code = ray.get(learner.stop.remote())
        for actor in actors:
            ray.kill(actor, no_restart=True)
        return 128 + (stopping[0] if stopping else signal.SIGINT)
    except ray.exceptions.RayActorError as error:
        print(f"launch/ray: the learner failed: {error}", file=sys.stderr, flush=True)
        for actor in actors:
            ray.kill(actor, no_restart=True)
        return 1
    print(f"[ray] learner exited with {code}", flush=True)
    waits = {actor.wait.remote(): index for index, actor in enumerate(actors)}
    ready, left = ray.wait(list(waits), num_returns=len(waits), timeout=args.actors_grace_s)
    for ref in ready:
        try:
            print(f"[ray] actor {waits[ref]} exited with {ray.get(ref)}", flush=True)
        except ray.exceptions.RayError as error:
            print(f"[ray] actor {waits[ref]} failed: {error}", flush=True)
    if left:
        print(f"[ray] actors {sorted(waits[ref] for ref in left)} still running {args.actors_grace_s:g}s after the "
              "learner exited; stopping them", flush=True)
    for actor in actors:
        ray.kill(actor, no_restart=True)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
