"""Runs one learner and `--num_actors` actor processes on this machine (what `launch/local.sh` calls).

Every flag goes to the learner; the flags an actor understands (env flags) go to the actors too. Actors
talk to the learner over a unix socket in the logdir unless `--server_address` says otherwise. The launcher
waits until the learner serves (gRPC health check) before it starts actors and counts their failures; it
restarts a crashed actor (not one that another actor with its index superseded, nor one that exited 0 because the
learner said the run is over), restarts a learner that exits non-zero (e.g. a helper thread died; it resumes from
its newest checkpoint and the actors reconnect by themselves) up to MAX_LEARNER_RESTARTS times, stops every child
on exit, Ctrl-C or SIGTERM, and exits with the learner's status.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from seed.actor.main import SUPERSEDED_EXIT_CODE
from seed.config import actor_config_class
from seed.learner.configuration import learner_fields as all_learner_fields
from seed.transport import CHANNEL_OPTIONS

MAX_ACTOR_RESTARTS = 20
MAX_LEARNER_RESTARTS = 5
LEARNER_START_TIMEOUT_S = 300.0


def parse_flags(argv: list[str]) -> dict[str, str]:
    """`--name=value`, `--name` and `--noname` -> {name: value}; anything else is a usage error."""
    values = {}
    learner_fields = set(all_learner_fields())
    for arg in argv:
        if not arg.startswith("--"):
            raise SystemExit(f"local.sh: unexpected argument {arg!r}; flags look like --name=value")
        name, sep, value = arg[2:].partition("=")
        if not sep:
            if name.startswith("no") and name[2:] in learner_fields:
                name, value = name[2:], "false"
            else:
                value = "true"
        values[name] = value
    return values


def actor_address(server_address: str) -> str:
    """The address local actors should dial: the unix socket if there is one, else the first TCP address."""
    addresses = [a.strip() for a in server_address.split(",") if a.strip()]
    for address in addresses:
        if address.startswith("unix:"):
            return address
    host, _, port = addresses[0].rpartition(":")
    if host in ("[::]", "0.0.0.0", ""):
        host = "localhost"
    return f"{host}:{port}"


def wait_until_serving(address: str, learner: subprocess.Popen, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:  # retries a starting learner fast
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline and learner.poll() is None:
            try:
                response = stub.Check(health_pb2.HealthCheckRequest(service="seed.Learner"), timeout=1.0)
                if response.status == health_pb2.HealthCheckResponse.SERVING:
                    return True
            except grpc.RpcError:
                pass
            time.sleep(0.2)
    return False


def stop_all(processes: list[subprocess.Popen], timeout_s: float = 30.0) -> None:
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for process in processes:
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def main(argv: list[str]) -> int:
    from seed.learner.configuration import resolve_config

    flags = parse_flags(argv)
    learner_fields = set(all_learner_fields())
    unknown = sorted(set(flags) - learner_fields)
    if unknown:
        print(f"local.sh: unknown flags {unknown}; see `seed-learner --helpfull`", file=sys.stderr)
        return 2
    # Parse the typed values the same way the learner will, to learn the logdir and address.
    typed = {}
    for f in all_learner_fields().values():
        if f.name in flags:
            raw = flags[f.name]
            kind = type(f.default)
            typed[f.name] = raw.lower() in ("1", "true", "yes") if kind is bool else kind(raw)
    if "server_address" not in flags:
        typed["server_address"] = "unix:{logdir}/learner.sock"  # local actors use the unix socket
    try:
        config = resolve_config(typed)
    except ValueError as error:
        print(f"local.sh: {error}", file=sys.stderr)
        return 2
    flags["logdir"] = config.logdir
    flags["server_address"] = config.server_address
    os.makedirs(config.logdir, exist_ok=True)

    learner_cmd = [sys.executable, "-m", "seed.learner.main"] + [f"--{k}={v}" for k, v in flags.items()]
    actor_fields = {f.name for f in dataclasses.fields(actor_config_class())}
    address = actor_address(config.server_address)
    actor_flags = [f"--{k}={v}" for k, v in flags.items() if k in actor_fields and k != "server_address"]

    def start_actor(index: int) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "seed.actor.main", f"--actor_index={index}",
                                 f"--server_address={address}", *actor_flags])

    stopping = False

    def on_signal(*_):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    print(f"[local] learner: {' '.join(learner_cmd[1:])}", flush=True)
    learner = subprocess.Popen(learner_cmd)
    actors: list[subprocess.Popen] = []
    try:
        if not wait_until_serving(address, learner, LEARNER_START_TIMEOUT_S):
            print("[local] the learner did not start serving", file=sys.stderr, flush=True)
            return learner.poll() or 1
        actors = [start_actor(i) for i in range(config.num_actors)]
        print(f"[local] started {config.num_actors} actors x {config.envs_per_actor} envs on {address}", flush=True)
        restarts = learner_restarts = 0
        superseded: set[int] = set()
        finished: set[int] = set()  # actors that exited 0: the run is over
        while not stopping:
            time.sleep(0.5)
            code = learner.poll()
            if code is not None:
                # 0: done; 2: a configuration error that a restart repeats; a signal from us: stopping.
                if code in (0, 2) or stopping:
                    break
                learner_restarts += 1
                if learner_restarts > MAX_LEARNER_RESTARTS:
                    print(f"[local] the learner failed {learner_restarts} times; stopping", file=sys.stderr, flush=True)
                    break
                print(f"[local] learner exited with {code}; restarting it ({learner_restarts}/{MAX_LEARNER_RESTARTS})",
                      flush=True)
                learner = subprocess.Popen(learner_cmd)
                continue
            for index, actor in enumerate(actors):
                code = actor.poll()
                if code is None or index in superseded or index in finished or learner.poll() is not None \
                        or stopping:
                    continue
                if code == 0:  # the learner said its run is over (seed/learner/run_end.py): nothing to restart
                    finished.add(index)
                    continue
                if code == 2:  # the learner rejected the actor's configuration: restarting cannot help
                    print(f"[local] actor {index} was rejected (exit 2); stopping", file=sys.stderr, flush=True)
                    return 2
                if code == SUPERSEDED_EXIT_CODE:  # a restart would evict the newer actor that took the index
                    print(f"[local] actor {index} was superseded by another actor with --actor_index={index} "
                          f"(exit {code}); not restarting it", file=sys.stderr, flush=True)
                    superseded.add(index)
                    continue
                restarts += 1
                if restarts > MAX_ACTOR_RESTARTS:
                    print(f"[local] actors failed {restarts} times; stopping", file=sys.stderr, flush=True)
                    return 1
                print(f"[local] actor {index} exited with {code}; restarting", flush=True)
                actors[index] = start_actor(index)
        if stopping:
            stop_all([learner])
        code = learner.wait()
    finally:
        stop_all(actors + [learner])
    summary_path = os.path.join(config.logdir, "summary.json")
    if os.path.exists(summary_path):
        with open(summary_path) as f:
            summary = json.load(f)
        ret = summary["last_episode_return_mean"]
        print(f"[local] summary: frames={summary['env_frames']:,} wall_time={summary['wall_time_s']:.0f}s "
              f"mean_fps={summary['mean_env_frames_per_sec']:,.0f} "
              f"last_mean_return={'-' if ret is None else f'{ret:.1f}'} logdir={config.logdir}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
