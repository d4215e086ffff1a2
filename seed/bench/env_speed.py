"""How fast an env family steps on this machine, with random actions and no learner: the simulator's own limit.

    python -m seed.bench.env_speed --env=football:academy_empty_goal_close --num_envs=4 --processes=2 \
        --duration_s=30 --out=env_speed.json

Each of `--processes` processes steps one `EnvBatch` of `--num_envs` envs (the actor's own env code, with
uniform random actions) for `--duration_s` seconds of wall time. Reported: agent steps per second and env
frames per second (agent steps x action repeat) over all processes, and the CPU seconds they used per wall
second (how many of the machine's cores the envs took).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import time
from typing import Any

import numpy as np


def _step_for(env: str, num_envs: int, first_env_id: int, duration_s: float, options: dict[str, Any],
              results: multiprocessing.Queue) -> None:
    from seed.envs import make_batch

    batch = make_batch(env, num_envs, first_env_id, options)
    rng = np.random.default_rng(first_env_id)
    batch.reset()
    steps, episodes = 0, 0
    cpu0, start = time.process_time(), time.perf_counter()
    while time.perf_counter() - start < duration_s:
        result = batch.step(rng.integers(0, batch.spec.num_actions, num_envs))
        steps += num_envs
        episodes += len(result.finished)
    wall = time.perf_counter() - start
    results.put({"agent_steps": steps, "episodes": episodes, "wall_s": wall, "cpu_s": time.process_time() - cpu0,
                 "action_repeat": batch.spec.action_repeat})
    batch.close()


def measure(env: str, num_envs: int, processes: int, duration_s: float, seed: int = 0) -> dict[str, Any]:
    """Steps `processes` x `num_envs` envs with random actions for `duration_s`; returns the rates."""
    context = multiprocessing.get_context("spawn")
    results: multiprocessing.Queue = context.Queue()
    options = {"seed": seed}
    workers = [context.Process(target=_step_for, args=(env, num_envs, seed + p * num_envs, duration_s, options,
                                                        results)) for p in range(processes)]
    for worker in workers:
        worker.start()
    rows = [results.get(timeout=duration_s + 300) for _ in workers]
    for worker in workers:
        worker.join()
    wall = max(r["wall_s"] for r in rows)
    steps = sum(r["agent_steps"] for r in rows)
    return {
        "env": env, "num_envs": num_envs, "processes": processes, "duration_s": duration_s,
        "machine_cores": os.cpu_count(),
        "agent_steps_per_sec": round(steps / wall, 1),
        "env_frames_per_sec": round(steps * rows[0]["action_repeat"] / wall, 1),
        "episodes": sum(r["episodes"] for r in rows),
        "cores_used": round(sum(r["cpu_s"] for r in rows) / wall, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", required=True, help="FAMILY:NAME, e.g. atari:Pong")
    parser.add_argument("--num_envs", type=int, default=4, help="envs per process")
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--duration_s", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="", help="also write the result as JSON here")
    args = parser.parse_args()
    for name in ("num_envs", "processes"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}: got {getattr(args, name)}, expected >= 1")
    result = measure(args.env, args.num_envs, args.processes, args.duration_s, args.seed)
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
