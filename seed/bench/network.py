"""Bytes on the wire and FPS of remote actors, with and without lz4, across two hosts on one machine.

    python -m seed.bench.network --envs=atari:Pong,atari:MsPacman --rates=none,20mbit \
        --out=docs/performance/cpu/network/bandwidth.json

Each run makes two hosts joined by one veth pair (launch/netns.sh create ... 2 --p2p; needs root, iproute2 and a
repository checkout), starts the learner on host 1 listening on TCP with a token, one actor with
`--envs_per_actor` envs on host 2 (`--compression=none` or `lz4`), optionally rate-limits the link (tbf, both
directions), and after `--warmup_s` counts for `--duration_s` seconds:

  wire_bytes_per_env_frame  bytes the actor host's eth0 sent plus received (TCP/IP, HTTP/2 and gRPC framing,
                            actions and acknowledgements included; read from /sys/class/net/eth0/statistics)
                            divided by the env frames the actor stepped (agent steps x action repeat, its
                            --stats_file, written every 0.2 s)
  env_frames_per_s          env frames per second at the actor
  wire_mbit_per_s           the link's load, both directions, Mbit/s
  learner_cpu_us_per_env_frame, actor_cpu_us_per_env_frame
                            CPU time (user + system, us) per env frame of the learner's process tree (serving
                            and training processes included) and of the actor: a cost that other work on the
                            machine changes far less than FPS (psutil)

Latency tolerance (`--delays_ms=0,0.5,2.5,10`): the actor dials the learner through seed/bench/tcp_relay.py run
on the learner's host, which delays each direction by the given one-way delay (added round trip = 2x; 0 still
goes through the relay), for each of `--envs_per_actor_list`; `--plot` draws FPS against the added round trip.

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


def _frames(stats_file: str) -> int:
    """The actor's env frames so far (its newest --stats_file row)."""
    if not os.path.exists(stats_file):
        return 0
    with open(stats_file, "rb") as f:
        f.seek(max(0, os.path.getsize(stats_file) - 8192))
        for line in reversed(f.read().decode(errors="replace").splitlines()):
            try:
                return int(json.loads(line)["env_frames"])
            except (json.JSONDecodeError, KeyError):  # a line being written, or cut by the seek
                continue
    return 0


def _cpu_s(processes: list[subprocess.Popen]) -> float:
    """CPU seconds (user + system) used so far by `processes` and every live descendant (the learner's serving
    and training processes). Descendants that exited in between are not counted: count over a steady window."""
    import psutil

    total = 0.0
    for process in processes:
        try:
            root = psutil.Process(process.pid)
            for p in [root, *root.children(recursive=True)]:
                times = p.cpu_times()
                total += times.user + times.system
        except psutil.NoSuchProcess:
            continue
    return total


def _wire_bytes(name: str) -> int:
    rx, tx = _netns("bytes", name, "2").split()
    return int(rx) + int(tx)


def measure_once(env: str, codec: str, rate: str, envs_per_actor: int, warmup_s: float, duration_s: float,
                 run_dir: str, delay_ms: float | None = None) -> dict[str, Any]:
    """One run (see the module docstring); returns its row."""
    name = f"sbn{os.getpid() % 100000}"
    logdir = os.path.join(run_dir, "run")
    stats = os.path.join(run_dir, "actor_stats.jsonl")
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
        learner_ip = _netns("addr", name, "1").strip()
        learner_address = f"{learner_ip}:{PORT}"
        if delay_ms is not None:
            relay = [sys.executable, "-m", "seed.bench.tcp_relay", f"--listen={learner_ip}:{PORT + 1}",
                     f"--target=127.0.0.1:{PORT}", f"--delay_ms={delay_ms}"]
            with open(os.path.join(run_dir, "relay.log"), "wb") as out:
                processes.append(subprocess.Popen([NETNS_SH, "exec", name, "1", *relay], stdout=out,
                                                  stderr=subprocess.STDOUT, cwd=REPO))
            learner_address = f"{learner_ip}:{PORT + 1}"
        common = [f"--env={env}", f"--envs_per_actor={envs_per_actor}", "--atari_minimal_action_set=true",
                  f"--auth_token_file={token_file}"]
        learner = [sys.executable, "-m", "seed.learner.main", *common, f"--logdir={logdir}",
                   f"--server_address=0.0.0.0:{PORT}", "--num_actors=1", "--agent=vtrace", "--network=dqn_small",
                   "--use_lstm=false", "--batch_size=8", "--unroll_length=20", "--log_interval_s=1",
                   "--torch_threads=1", "--total_environment_frames=1e12", "--checkpoint_interval_s=3600"]
        actor = [sys.executable, "-m", "seed.actor.main", *common, f"--server_address={learner_address}",
                 "--actor_index=0", f"--compression={codec}", "--log_interval_s=5",
                 f"--stats_file={stats}", "--stats_interval_s=0.2"]
        for host, command, log in (("1", learner, "learner.log"), ("2", actor, "actor.log")):
            with open(os.path.join(run_dir, log), "wb") as out:
                processes.append(subprocess.Popen([NETNS_SH, "exec", name, host, *command], stdout=out,
                                                  stderr=subprocess.STDOUT, cwd=REPO))
        deadline = time.monotonic() + 180
        while _frames(stats) == 0:
            if time.monotonic() > deadline or any(p.poll() is not None for p in processes):
                raise RuntimeError(f"no env frames within 180 s: see {run_dir}/learner.log and actor.log")
            time.sleep(0.5)
        time.sleep(warmup_s)
        learner_actor = processes[-2:]  # (learner, actor); the relay, if any, is counted by neither
        frames0, bytes0, t0 = _frames(stats), _wire_bytes(name), time.monotonic()
        cpu0 = [_cpu_s([p]) for p in learner_actor]
        time.sleep(duration_s)
        frames1, bytes1, t1 = _frames(stats), _wire_bytes(name), time.monotonic()
        cpu1 = [_cpu_s([p]) for p in learner_actor]
        frames, wire, seconds = frames1 - frames0, bytes1 - bytes0, t1 - t0
        cpu_us = [round((b - a) / frames * 1e6, 1) if frames else None for a, b in zip(cpu0, cpu1, strict=True)]
        return dict(env=env, compression=codec, rate=rate, envs_per_actor=envs_per_actor,
                    added_round_trip_ms=None if delay_ms is None else 2 * delay_ms, seconds=round(seconds, 1),
                    env_frames=frames, wire_bytes=wire,
                    wire_bytes_per_env_frame=round(wire / frames, 1) if frames else None,
                    env_frames_per_s=round(frames / seconds, 1), wire_mbit_per_s=round(wire * 8 / seconds / 1e6, 2),
                    learner_cpu_us_per_env_frame=cpu_us[0], actor_cpu_us_per_env_frame=cpu_us[1],
                    load_average_1min=round(os.getloadavg()[0], 1))  # other work on the machine, for the reader
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


def _plot_latency(rows: list[dict[str, Any]], path: str) -> None:
    """FPS against the added round trip, one line per (env, envs per actor)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 4))
    for (env, k), group in itertools.groupby(sorted(rows, key=lambda r: (r["env"], r["envs_per_actor"])),
                                             key=lambda r: (r["env"], r["envs_per_actor"])):
        points = sorted((r["added_round_trip_ms"], r["env_frames_per_s"]) for r in group)
        axes.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=f"{env}, {k} envs per actor")
    axes.set_xlabel("added round trip (ms, user-space relay)")
    axes.set_ylabel("env frames / s (one actor)")
    axes.set_ylim(bottom=0)
    axes.grid(alpha=0.3)
    axes.legend()
    axes.set_title(f"Latency tolerance across two namespaces, {os.cpu_count()} CPU cores")
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if os.geteuid() != 0:
        print("seed.bench.network: needs root to make network namespaces", file=sys.stderr)
        sys.exit(1)
    rows = []
    runs_dir = os.path.abspath(FLAGS.runs_dir)
    delays: list[float | None] = [float(d) for d in FLAGS.delays_ms] or [None]
    envs_per_actor = [int(k) for k in FLAGS.envs_per_actor_list] or [FLAGS.envs_per_actor]
    for env, rate, codec, k, delay in itertools.product(FLAGS.envs, FLAGS.rates, FLAGS.codecs, envs_per_actor,
                                                        delays):
        label = f"{env.replace(':', '_')}-{rate}-{codec}-k{k}" + ("" if delay is None else f"-d{delay}")
        print(f"[network] {label}", file=sys.stderr, flush=True)
        row = measure_once(env, codec, rate, k, FLAGS.warmup_s, FLAGS.duration_s, os.path.join(runs_dir, label),
                           delay)
        print(json.dumps(row), flush=True)
        rows.append(row)
    if FLAGS.plot:
        _plot_latency(rows, FLAGS.plot)
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
    flags.DEFINE_list("envs_per_actor_list", [], "Several --envs_per_actor values, one run each.")
    flags.DEFINE_list("delays_ms", [], "One-way delays (ms) of a relay between actor and learner, one run each; "
                                       "empty = no relay.")
    flags.DEFINE_string("plot", "", "With --delays_ms: write FPS against the added round trip to this PNG.")
    flags.DEFINE_float("warmup_s", 10.0, "Seconds after the first env frames before counting.")
    flags.DEFINE_float("duration_s", 20.0, "Seconds counted.")
    flags.DEFINE_string("runs_dir", "bench_results/network_runs", "Logs of each run.")
    flags.DEFINE_string("out", "", "Result JSON.")
    app.run(main)


if __name__ == "__main__":
    run()
