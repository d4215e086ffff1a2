"""Benchmark Atari env stepping: env frames per second (per core) for the env implementations of `atari:<Game>`.

Cases (random actions from the full 18-action set, each run for --seconds of wall time):
  bare_ale            one ale_py.ALEInterface, one `act` per raw frame, no preprocessing (upper bound).
  sequential          SequentialEnvBatch of K AtariEnv (Table 9 preprocessing, the default), one core.
  vector_tN           AleVectorEnvBatch of K envs on N C++ threads (emulation threaded, resize here).
  native_vector_tN    ale-py AtariVectorEnv with its own 84x84 INTER_AREA resize: NOT Table 9, shown only to
                      price the Python-side bilinear resize (skip with --no-native).

FPS = agent steps x action repeat / wall seconds (env frames; the bare loop: `act` calls / s).
fps_per_core = FPS / cores used (1 for the bare loop and the sequential batch, N threads for the vector env).
cpu_util = process CPU seconds / wall seconds, what the process really used (all threads).

Usage: python launch/bench_atari_envs.py [--game Pong] [--seconds 10] [--num-envs 8]
                                         [--out bench_results/atari_envs.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path

import ale_py
import numpy as np

from seed.envs import atari


def _timed(step: Callable[[], int], seconds: float) -> tuple[int, float, float]:
    """Calls step() (returning frames done) until `seconds` of wall time pass; returns (frames, wall, cpu)."""
    frames = 0
    wall0, cpu0 = time.perf_counter(), time.process_time()
    deadline = wall0 + seconds
    while time.perf_counter() < deadline:
        frames += step()
    return frames, time.perf_counter() - wall0, time.process_time() - cpu0


def bench_bare_ale(game: str, seconds: float, seed: int) -> tuple[int, float, float]:
    ale = ale_py.ALEInterface()
    ale.setInt("random_seed", seed)
    ale.setFloat("repeat_action_probability", 0.0)
    ale.loadROM(str(ale_py.roms.get_rom_path(atari.rom_id(game))))
    ale.reset_game()
    actions = ale.getLegalActionSet()
    choices = np.random.default_rng(seed).integers(0, len(actions), 1 << 16)
    chunk = 1000
    position = 0

    def step() -> int:
        nonlocal position
        for i in range(position, position + chunk):
            ale.act(actions[choices[i & 0xFFFF]])
            if ale.game_over():
                ale.reset_game()
        position += chunk
        return chunk

    return _timed(step, seconds)


def bench_batch(batch, seconds: float, seed: int) -> tuple[int, float, float]:
    k, repeat, n = batch.num_envs, batch.spec.action_repeat, batch.spec.num_actions
    rng = np.random.default_rng(seed)
    actions = rng.integers(0, n, (1024, k))
    batch.reset()
    t = 0

    def step() -> int:
        nonlocal t
        batch.step(actions[t & 1023])
        t += 1
        return k * repeat

    try:
        return _timed(step, seconds)
    finally:
        batch.close()


class _NativeVector:
    """ale-py's AtariVectorEnv as shipped (84x84 INTER_AREA, no-ops [0, 29]); for pricing only."""

    def __init__(self, game: str, num_envs: int, threads: int, seed: int):
        from ale_py.vector_env import AtariVectorEnv

        self.num_envs = num_envs
        self.spec = atari.make_spec(game, {})
        self._vec = AtariVectorEnv(atari.rom_id(game), num_envs, num_threads=threads, stack_num=1,
                                   full_action_space=True, reward_clipping=False, use_fire_reset=False,
                                   autoreset_mode="SameStep")
        self._seed = seed

    def reset(self):
        return self._vec.reset(seed=self._seed)[0]

    def step(self, actions):
        return self._vec.step(actions.astype(np.int32))

    def close(self):
        self._vec.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--game", default="Pong")
    parser.add_argument("--seconds", type=float, default=10.0, help="wall seconds per case")
    parser.add_argument("--num-envs", type=int, default=8, help="K envs per batch")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="vector env thread counts")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-native", action="store_true", help="skip the non-Table-9 native vector env cases")
    parser.add_argument("--out", default="bench_results/atari_envs.json")
    args = parser.parse_args()

    options = {"seed": args.seed}
    k = args.num_envs
    # (name, cores used, Table 9 exact, notes, run)
    cases: list[tuple[str, int, bool, str, Callable[[], tuple[int, float, float]]]] = [
        ("bare_ale", 1, False, "ALEInterface.act only, no preprocessing",
         lambda: bench_bare_ale(args.game, args.seconds, args.seed)),
        (f"sequential_k{k}", 1, True, "SequentialEnvBatch of AtariEnv (default)",
         lambda: bench_batch(atari.make_batch(args.game, k, 0, options), args.seconds, args.seed)),
    ]
    for threads in args.threads:
        vector_options = dict(options, atari_vector_env=True, atari_vector_threads=threads)
        cases.append((f"vector_k{k}_t{threads}", threads, False,
                      "AleVectorEnvBatch: Table 9 except reset no-ops uniform in [0, 29] and the frame cap "
                      "counted from after the no-ops",
                      lambda o=vector_options: bench_batch(atari.make_batch(args.game, k, 0, o), args.seconds,
                                                           args.seed)))
    if not args.no_native:
        for threads in args.threads:
            cases.append((f"native_vector_k{k}_t{threads}", threads, False,
                          "ale-py AtariVectorEnv as shipped (INTER_AREA resize, no-ops [0, 29]); not Table 9",
                          lambda t=threads: bench_batch(_NativeVector(args.game, k, t, args.seed), args.seconds,
                                                        args.seed)))

    results = []
    for name, cores, table9, notes, run in cases:
        frames, wall, cpu = run()
        fps = frames / wall
        results.append(dict(name=name, frames=frames, wall_s=round(wall, 3), cpu_s=round(cpu, 3),
                            cpu_util=round(cpu / wall, 3), fps=round(fps, 1), cores_used=cores,
                            fps_per_core=round(fps / cores, 1), table9_exact=table9, notes=notes))
        print(f"{name:24s} {fps:10.0f} frames/s  {fps / cores:10.0f} per core  (cpu_util {cpu / wall:.2f})",
              flush=True)

    report = dict(
        game=args.game, num_envs=k, action_repeat=4, seconds_per_case=args.seconds, seed=args.seed,
        os_cpu_count=os.cpu_count(), platform=platform.platform(), processor=platform.processor(),
        python=platform.python_version(), ale_py=ale_py.__version__, numpy=np.__version__,
        fps_definition="agent steps x action repeat / wall s (bare_ale: act calls / s); per core = / cores_used",
        results=results,
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")

    print(f"\n{args.game}, K={k}, {args.seconds:g} s per case, os.cpu_count()={os.cpu_count()}")
    print(f"{'case':24s} {'cores':>5s} {'frames/s':>10s} {'per core':>10s} {'cpu_util':>8s} {'Table 9':>8s}")
    for r in results:
        print(f"{r['name']:24s} {r['cores_used']:5d} {r['fps']:10.0f} {r['fps_per_core']:10.0f} "
              f"{r['cpu_util']:8.2f} {'yes' if r['table9_exact'] else 'no':>8s}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
