"""What one inference batch costs the learner, on one thread with nothing else running: CPU microseconds, or
instructions counted by callgrind (within about 0.5% from run to run, whatever the machine is doing).

    python -m seed.bench.batch_cost --config=fake_mlp
    python -m seed.bench.batch_cost --config=fake_mlp --callgrind --batches=80 --out=batch_cost.json

A learner is built from the named seed-bench configuration (seed/bench/configs.yaml) without starting it: no
serving process, actors or training. Each batch writes `inference_batch_size / envs_per_actor` actors' requests
into the step slab as the serving process would (random observations of the env's shape), then calls
`CentralInference.run_batch` on this thread: the requests' checks, the gather, the policy, the replies and the
unroll store, the emitted unrolls counted and dropped. The two rates:

  cpu_us_per_batch   this thread's CPU time per batch (time.thread_time), median of --repeats rounds of --batches
  instructions_per_batch  with --callgrind: the process runs again under `valgrind --tool=callgrind` with
                     collection switched on around --batches batches only (callgrind_control), after a warm-up

A full run (`seed-bench`) measures what contention adds (other threads holding the GIL, the actors and the training
process on the same cores); this measures the work itself. Instruction counts compare two commits without quiet
cores: run this file with the other commit's interpreter (`seed-bench --compare` keeps one per commit under
~/.cache/seed-rl/ab/<commit>/venv) from a directory outside the checkout, so that it imports that commit's seed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

if __name__ == "__main__" and sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    # Run as a file (by another commit's interpreter): seed/bench/ must not shadow top-level modules.
    sys.path.pop(0)

_TOGGLE_ENV = "SEED_BATCH_COST_CALLGRIND"  # set in the process valgrind runs: switch collection around the loop


def _build(config_name: str, overrides: dict[str, Any], logdir: str):
    """(learner, inference, config) for the named configuration, built but not started."""
    # seed.bench.configs' functions, not the learner's configuration module: they exist under these names in
    # older commits too (this file may run with another commit's interpreter).
    from seed.bench.configs import DEFAULT_CONFIGS, load_bench_configs, resolve_learner_config, split_bench_config
    from seed.learner.learner import Learner

    configs = load_bench_configs(DEFAULT_CONFIGS)
    if config_name not in configs:
        raise SystemExit(f"--config: got {config_name!r}, expected one of {', '.join(configs)}")
    learner_flags, _ = split_bench_config(config_name, configs[config_name], DEFAULT_CONFIGS)
    config = resolve_learner_config({**learner_flags, **overrides, "logdir": logdir,
                                     "server_address": f"unix:{logdir}/learner.sock", "torch_threads": 1})
    learner = Learner(config)
    return learner, learner.parts.inferences[0], config


def _batches(inference, config, seed: int):
    """run(i): batch i: the requests of the next actors, written into the slab, then run_batch."""
    import numpy as np

    slab = inference.slab
    slab.live_run[:] = 1
    k = config.envs_per_actor
    per_batch = max(1, min(config.num_actors, config.inference_batch_size // k))
    groups = [np.arange(i, i + per_batch) % config.num_actors for i in range(0, config.num_actors, per_batch)]
    rng = np.random.default_rng(seed)
    shape, dtype = tuple(slab.observation.shape[1:]), slab.observation.dtype
    if np.issubdtype(dtype, np.integer):
        observation = rng.integers(0, 255, size=(k, *shape)).astype(dtype)
    else:
        observation = rng.normal(size=(k, *shape)).astype(dtype)
    reward, done, truncated = np.ones(k, np.float32), np.zeros(k, bool), np.zeros(k, bool)

    def run(i: int) -> None:
        actors = groups[i % len(groups)]
        seqs = np.array([slab.write_request(int(a), 1, observation, reward, done, truncated) for a in actors],
                        np.int64)
        inference.run_batch(actors.astype(np.int64), seqs)

    return run, per_batch * k


def measure(config_name: str, overrides: dict[str, Any], batches: int, repeats: int, warmup: int) -> dict[str, Any]:
    """CPU microseconds per batch on this thread (and the callgrind toggles, when valgrind runs this process)."""
    import torch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="batch-cost-") as logdir:
        learner, inference, config = _build(config_name, overrides, logdir)
        emitted = [0]

        def sink(unrolls) -> None:  # a time-major batch (a list of unrolls before ee56fb7)
            emitted[0] += len(unrolls) if isinstance(unrolls, list) else unrolls.batch_size

        inference.sink = sink
        try:
            run, rows = _batches(inference, config, seed=0)
            for i in range(warmup):
                run(i)
            if os.environ.get(_TOGGLE_ENV):
                subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], capture_output=True, check=True)
                for i in range(batches):
                    run(i)
                subprocess.run(["callgrind_control", "-i", "off", str(os.getpid())], capture_output=True, check=True)
                return {"batches": batches}
            rounds = []
            for _ in range(repeats):
                cpu, wall = time.thread_time(), time.perf_counter()
                for i in range(batches):
                    run(i)
                rounds.append({"cpu_us": (time.thread_time() - cpu) / batches * 1e6,
                               "wall_us": (time.perf_counter() - wall) / batches * 1e6})
        finally:
            learner.parts.stop_event.set()
            learner._close()
    return {"config": config_name, "rows_per_batch": rows, "batches": batches, "repeats": repeats,
            "cpu_us_per_batch": statistics.median(r["cpu_us"] for r in rounds),
            "cpu_us_per_batch_min": min(r["cpu_us"] for r in rounds),
            "wall_us_per_batch": statistics.median(r["wall_us"] for r in rounds),
            "unrolls_emitted": emitted[0], "rounds": rounds}


def count_instructions(config_name: str, override_args: list[str], batches: int, warmup: int) -> dict[str, Any]:
    """This module again under callgrind, counting only the measured batches; instructions per batch."""
    with tempfile.TemporaryDirectory(prefix="batch-cost-cg-") as out:
        log = os.path.join(out, "valgrind.log")
        command = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}/cg.out",
                   f"--log-file={log}", sys.executable, os.path.abspath(__file__), f"--config={config_name}",
                   f"--batches={batches}", f"--warmup={warmup}", *override_args]
        completed = subprocess.run(command, env=dict(os.environ, **{_TOGGLE_ENV: "1"}), capture_output=True,
                                   text=True)
        with open(log) as f:
            text = f.read()
        collected = [line.split("Collected :")[1] for line in text.splitlines() if "Collected :" in line]
        if completed.returncode != 0 or not collected:
            raise SystemExit(f"callgrind run failed (exit {completed.returncode}):\n{completed.stderr[-2000:]}\n"
                             f"{text[-2000:]}")
    instructions = int(collected[-1].strip().replace(",", ""))
    return {"config": config_name, "batches": batches, "instructions": instructions,
            "instructions_per_batch": instructions / batches}


def _overrides(pairs: list[str]) -> dict[str, Any]:
    """--set=flag=value pairs, values as YAML scalars (numbers, booleans, strings)."""
    import yaml

    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--set: got {pair!r}, expected flag=value")
        out[name] = yaml.safe_load(value)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="fake_mlp", help="a seed-bench configuration (seed/bench/configs.yaml)")
    parser.add_argument("--set", action="append", default=[], help="flag=value overriding the configuration")
    parser.add_argument("--batches", type=int, default=2000, help="batches per round (callgrind: measured batches)")
    parser.add_argument("--repeats", type=int, default=5, help="rounds of --batches (CPU time; the median is kept)")
    parser.add_argument("--warmup", type=int, default=100, help="batches run first, not measured")
    parser.add_argument("--callgrind", action="store_true", help="count instructions with valgrind's callgrind")
    parser.add_argument("--out", default="", help="also write the result to this JSON file")
    args = parser.parse_args(argv)
    if args.batches < 1 or args.repeats < 1 or args.warmup < 0:
        raise SystemExit(f"--batches, --repeats, --warmup: got {args.batches}, {args.repeats}, {args.warmup}, "
                         "expected >= 1, >= 1, >= 0")
    overrides = _overrides(args.set)
    if os.environ.get(_TOGGLE_ENV):  # the process valgrind runs
        measure(args.config, overrides, args.batches, 1, args.warmup)
        return
    if args.callgrind:
        result = count_instructions(args.config, [f"--set={s}" for s in args.set], args.batches, args.warmup)
        print(f"{args.config}: {result['instructions_per_batch']:,.0f} instructions per inference batch "
              f"({args.batches} batches, callgrind)")
    else:
        result = measure(args.config, overrides, args.batches, args.repeats, args.warmup)
        print(f"{args.config}: {result['cpu_us_per_batch']:,.1f} CPU us per inference batch of "
              f"{result['rows_per_batch']} rows (min {result['cpu_us_per_batch_min']:,.1f}; wall "
              f"{result['wall_us_per_batch']:,.1f}), one thread")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
