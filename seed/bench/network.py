"""Bytes on the wire and FPS of remote actors, with and without lz4, across two hosts on one machine.

    python -m seed.bench.network --envs=atari:Pong,atari:MsPacman --rates=none,20mbit \
        --out=docs/performance/cpu/network/bandwidth.json

Each run makes two hosts joined by one veth pair (launch/netns.sh create ... 2 --p2p; needs root, iproute2 and a
repository checkout), starts the learner on host 1 listening on TCP with a token, one actor with
`--envs_per_actor` envs on host 2 (`--compression=none` or `lz4`), optionally rate-limits the link (tbf, both
directions), and after `--warmup_s` counts for `--duration_s` seconds:

  wire_bytes_per_env_frame  bytes the actor host's eth0 sent plus received (TCP/IP, HTTP/2 and gRPC framing,
                            actions and acknowledgements included; read from /sys/class/net/eth0/statistics)
                            divided by the env frames the learner counted (agent steps x action repeat)
  env_frames_per_s          env frames per second at the learner (metrics.jsonl)
  wire_mbit_per_s           the link's load, both directions, Mbit/s

The learner is a small V-trace learner (the 2013 DQN network, no LSTM) so that on a 2-core machine the link, not
the learner, is what a rate limit constrains. Everything is removed after each run (launch/netns.sh destroy).
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

from absl import app, flags

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NETNS_SH = os.path.join(REPO, "launch", "netns.sh")
PORT = 8686
TOKEN = "seed-bench-network-token"

FLAGS = flags.FLAGS


def _netns(*args: str) -> str:
    result = subprocess.run([NETNS_SH, *args], capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise RuntimeError(f"launch/netns.sh {' '.join(args)}: exit {result.returncode}: {result.stderr.strip()}")
    return result.stdout


def _metrics(logdir: str) -> list[dict[str, Any]]:
    path = os.path.join(logdir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    rows = []
    with open(path) as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:  # a line being written
                pass
    return rows


def _frames(logdir: str) -> int:
    rows = _metrics(logdir)
    return int(rows[-1]["env_frames"]) if rows else 0


def _wire_bytes(name: str) -> int:
    rx, tx = _netns("bytes", name, "2").split()
    return int(rx) + int(tx)


def measure_once(env: str, codec: str, rate: str, envs_per_actor: int, warmup_s: float, duration_s: float,
                 run_dir: str) -> dict[str, Any]:
    """One run (see the module docstring); returns its row."""
    name = f"sbn{os.getpid() % 100000}"
    logdir = os.path.join(run_dir, "run")
    os.makedirs(run_dir, exist_ok=True)
    token_file = os.path.join(run_dir, "token")
    with open(token_file, "w") as f:
        f.write(TOKEN)
    _netns("destroy", name)
    _netns("create", name, "2", "--p2p")
    processes = []
    try:
        if rate != "none":
            _netns("rate", name, "2", rate)
        learner_address = f"{_netns('addr', name, '1').strip()}:{PORT}"
        common = [f"--env={env}", f"--envs_per_actor={envs_per_actor}", "--atari_minimal_action_set=true",
                  f"--auth_token_file={token_file}"]
        learner = [sys.executable, "-m", "seed.learner_main", *common, f"--logdir={logdir}",
                   f"--server_address=0.0.0.0:{PORT}", "--num_actors=1", "--agent=vtrace", "--network=dqn_small",
                   "--use_lstm=false", "--batch_size=8", "--unroll_length=20", "--log_interval_s=1",
                   "--torch_threads=1", "--total_environment_frames=1e12", "--checkpoint_interval_s=3600"]
        actor = [sys.executable, "-m", "seed.actor_main", *common, f"--server_address={learner_address}",
                 "--actor_index=0", f"--compression={codec}", "--log_interval_s=5"]
        for host, command, log in (("1", learner, "learner.log"), ("2", actor, "actor.log")):
            with open(os.path.join(run_dir, log), "wb") as out:
                processes.append(subprocess.Popen([NETNS_SH, "exec", name, host, *command], stdout=out,
                                                  stderr=subprocess.STDOUT, cwd=REPO))
        deadline = time.monotonic() + 180
        while _frames(logdir) == 0:
            if time.monotonic() > deadline or any(p.poll() is not None for p in processes):
                raise RuntimeError(f"no env frames within 180 s: see {run_dir}/learner.log and actor.log")
            time.sleep(0.5)
        time.sleep(warmup_s)
        frames0, bytes0, t0 = _frames(logdir), _wire_bytes(name), time.monotonic()
        time.sleep(duration_s)
        frames1, bytes1, t1 = _frames(logdir), _wire_bytes(name), time.monotonic()
        frames, wire, seconds = frames1 - frames0, bytes1 - bytes0, t1 - t0
        return dict(env=env, compression=codec, rate=rate, envs_per_actor=envs_per_actor, seconds=round(seconds, 1),
                    env_frames=frames, wire_bytes=wire,
                    wire_bytes_per_env_frame=round(wire / frames, 1) if frames else None,
                    env_frames_per_s=round(frames / seconds, 1), wire_mbit_per_s=round(wire * 8 / seconds / 1e6, 2))
    finally:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        _netns("destroy", name)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if os.geteuid() != 0:
        print("seed.bench.network: needs root to make network namespaces", file=sys.stderr)
        sys.exit(1)
    rows = []
    runs_dir = os.path.abspath(FLAGS.runs_dir)
    for env, rate, codec in itertools.product(FLAGS.envs, FLAGS.rates, FLAGS.codecs):
        label = f"{env.replace(':', '_')}-{rate}-{codec}"
        print(f"[network] {env} rate={rate} compression={codec}", file=sys.stderr, flush=True)
        row = measure_once(env, codec, rate, FLAGS.envs_per_actor, FLAGS.warmup_s, FLAGS.duration_s,
                           os.path.join(runs_dir, label))
        print(json.dumps(row), flush=True)
        rows.append(row)
    if FLAGS.out:
        os.makedirs(os.path.dirname(os.path.abspath(FLAGS.out)), exist_ok=True)
        with open(FLAGS.out, "w") as f:
            json.dump({"schema": "seed-bench-network/1", "cpu_cores": os.cpu_count(), "command": " ".join(sys.argv),
                       "rows": rows}, f, indent=1)


def run() -> None:
    flags.DEFINE_list("envs", ["atari:Pong", "atari:MsPacman"], "Envs to measure.")
    flags.DEFINE_list("rates", ["none", "20mbit"], "Link rates: none (unconstrained veth) or a tc rate (20mbit).")
    flags.DEFINE_list("codecs", ["none", "lz4"], "--compression values.")
    flags.DEFINE_integer("envs_per_actor", 16, "Envs of the one actor.")
    flags.DEFINE_float("warmup_s", 10.0, "Seconds after the first env frames before counting.")
    flags.DEFINE_float("duration_s", 20.0, "Seconds counted.")
    flags.DEFINE_string("runs_dir", "bench_results/network_runs", "Logs of each run.")
    flags.DEFINE_string("out", "", "Result JSON.")
    app.run(main)


if __name__ == "__main__":
    run()
