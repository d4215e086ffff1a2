"""How fast an env family steps on this machine, with random actions and no learner: the simulator's own limit.

    python -m seed.bench.env_speed --env=football:academy_empty_goal_close --num_envs=4 --processes=2 \
        --duration_s=30 --out=env_speed.json

Each of `--processes` processes steps one `EnvBatch` of `--num_envs` envs (the actor's own env code, with
uniform random actions) for `--duration_s` seconds of wall time. Reported: agent steps per second and env
frames per second (agent steps x action repeat) over all processes, and the CPU seconds they used per wall
second (how many of the machine's cores the envs took). A worker that dies (an import error, a crashed
simulator) ends the measurement at once with an EnvSpeedError naming the worker, its env ids and exit code.

`step_randomly` is the one stepping loop: this tool's workers run it for a fixed time, and seed-bench's
env_only baseline (seed/bench/env_only.py) runs it in each actor process until it is stopped.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import queue
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

from seed.actor.stats import ActorStats
from seed.envs.base import EnvBatch

WORKER_START_TIMEOUT_S = 300.0  # spawning, importing and building the envs, on top of --duration_s
EXITED_WITHOUT_RESULT_S = 5.0  # a worker that exited 0 has had its result flushed to the queue well before this


class EnvSpeedError(RuntimeError):
    """A worker failed or never reported (the message names the worker, its env ids and exit code)."""


def step_randomly(batch: EnvBatch, seed: int, keep_going: Callable[[], bool],
                  stats: ActorStats | None = None) -> dict[str, Any]:
    """Resets `batch`, then steps all its K envs with uniform random actions while `keep_going()`.

    Each step of the K envs is recorded in `stats` (if given) as one "round trip" whose latency is the step's
    wall time and whose wait is 0 (nothing to wait for). Returns agent_steps, episodes, wall_s and cpu_s
    (this process's CPU seconds) over the stepping, and the env's action_repeat.
    """
    rng = np.random.default_rng(seed)
    k = batch.num_envs
    batch.reset()
    steps, episodes = 0, 0
    cpu0, start = time.process_time(), time.perf_counter()
    while keep_going():
        began = time.perf_counter()
        result = batch.step(batch.spec.random_actions(rng, k))
        steps += k
        episodes += len(result.finished)
        if stats is not None:
            stats.record(k, time.perf_counter() - began, waited_s=0.0)
    return {"agent_steps": steps, "episodes": episodes, "wall_s": time.perf_counter() - start,
            "cpu_s": time.process_time() - cpu0, "action_repeat": batch.spec.action_repeat}


def _step_for(index: int, env: str, num_envs: int, first_env_id: int, duration_s: float, options: dict[str, Any],
              results: multiprocessing.Queue) -> None:
    """Worker `index`: steps its envs for `duration_s` and puts (index, counts) or (index, {"error": ...})."""
    try:
        from seed.envs import make_batch

        batch = make_batch(env, num_envs, first_env_id, options)
        try:
            start = time.perf_counter()
            row = step_randomly(batch, first_env_id, lambda: time.perf_counter() - start < duration_s)
        finally:
            batch.close()
    except BaseException as error:  # reported with the traceback, then the worker exits non-zero
        results.put((index, {"error": f"{type(error).__name__}: {error}\n{traceback.format_exc()}"}))
        raise
    results.put((index, row))


def _raise_reported_error(results: multiprocessing.Queue, describe: Callable[[int], str]) -> None:
    """Raises the first error row still in `results` (rows read here are results of workers about to be
    given up on anyway)."""
    try:
        while True:
            index, row = results.get(timeout=0.5)
            if "error" in row:
                raise EnvSpeedError(f"{describe(index)} failed: {row['error']}")
    except queue.Empty:
        return


def collect(workers: list, results: multiprocessing.Queue, timeout_s: float,
            describe: Callable[[int], str]) -> list[dict[str, Any]]:
    """Each worker's result row, in worker order. Fails as soon as a worker reports an error or exits without
    a result (e.g. it could not import), and after `timeout_s` in all, naming the worker (`describe(index)`)."""
    rows: dict[int, dict[str, Any]] = {}
    exited_at: dict[int, float] = {}
    deadline = time.monotonic() + timeout_s
    while len(rows) < len(workers):
        try:
            index, row = results.get(timeout=0.2)
        except queue.Empty:
            pass
        else:
            if "error" in row:
                raise EnvSpeedError(f"{describe(index)} failed: {row['error']}")
            rows[index] = row
            continue
        now = time.monotonic()
        for index, worker in enumerate(workers):
            if index in rows or worker.exitcode is None:
                continue
            exited_at.setdefault(index, now)
            if worker.exitcode != 0:
                _raise_reported_error(results, describe)  # its error row may have arrived since the last read
            if worker.exitcode != 0 or now - exited_at[index] > EXITED_WITHOUT_RESULT_S:
                raise EnvSpeedError(f"{describe(index)} exited with code {worker.exitcode} without a result "
                                    "(expected a result row; its traceback, if any, is on stderr above)")
        if now > deadline:
            missing = [describe(i) for i in range(len(workers)) if i not in rows]
            raise EnvSpeedError(f"{', '.join(missing)}: no result within {timeout_s:.0f}s (expected --duration_s "
                                f"plus at most {WORKER_START_TIMEOUT_S:.0f}s to start)")
    return [rows[i] for i in range(len(workers))]


def measure(env: str, num_envs: int, processes: int, duration_s: float, seed: int = 0,
            target: Callable[..., None] = _step_for) -> dict[str, Any]:
    """Steps `processes` x `num_envs` envs with random actions for `duration_s`; returns the rates.

    `target` is the worker function (the default steps envs; tests pass one that fails)."""
    context = multiprocessing.get_context("spawn")
    results: multiprocessing.Queue = context.Queue()
    options = {"seed": seed}
    first_ids = [seed + p * num_envs for p in range(processes)]
    workers = [context.Process(target=target, args=(p, env, num_envs, first_ids[p], duration_s, options, results))
               for p in range(processes)]

    def describe(index: int) -> str:
        return (f"env_speed worker {index} (pid {workers[index].pid}, --env={env}, env ids "
                f"{first_ids[index]}..{first_ids[index] + num_envs - 1})")

    for worker in workers:
        worker.start()
    try:
        rows = collect(workers, results, duration_s + WORKER_START_TIMEOUT_S, describe)
    finally:
        for worker in workers:
            if worker.exitcode is None:
                worker.join(timeout=10)
            if worker.exitcode is None:
                worker.terminate()
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
    try:
        result = measure(args.env, args.num_envs, args.processes, args.duration_s, args.seed)
    except EnvSpeedError as error:
        parser.exit(1, f"env_speed: {error}\n")
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
