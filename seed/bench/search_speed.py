"""`seed-bench search`: how fast the batched MuZero search runs on this machine, beside DeepMind's mctx.

    seed-bench search --cpu=0 --compile_time --out=bench_results/search.json
    python -m seed.bench.search_speed --cpu=0 --batch=64 --simulations=50 --actions=18 --out=search.json

One search is B trees (--batch) of --simulations simulations over --actions actions, with a stub network: a
16-wide embedding, next = tanh(embedding @ W + E[action]), [logits, reward, value] = next @ W_out, discount
0.997; the same float32 weights for every implementation. Reported per implementation, over --repeats searches
after --warmup: node expansions per second = B x simulations / seconds of one search (wall time, median and
best, and CPU time of the process), and the tree depths the stub produces (the descent and the backup loop
over depth, so deeper trees cost more).

Implementations:
  seed_puct / seed_gumbel    agents/muzero/search with backend "numpy": the loop of numpy / torch calls (the
                             reference; torch with one intra-op thread)
  seed_numba_puct / _gumbel  agents/muzero/search with backend "numba": the compiled simulation loop (the CPU
                             default; compiled.py); --compile_time adds the first search's time in a fresh
                             process with an empty Numba cache (compilation) and again with the cache it left
  mctx_puct / mctx_gumbel    mctx.muzero_policy / mctx.gumbel_muzero_policy, jax.jit-compiled, XLA on one thread;
                             only when jax and mctx are importable (an optional benchmark dependency:
                             pip install jax mctx)

--cpu=N pins the process to core N (os.sched_setaffinity) before anything runs, so both sides get the same one
core (equivalent to starting it under `taskset -c N`).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from seed.bench.results import cpu_model

SCHEMA = "seed-bench-search/1"
EMBEDDING = 16
DISCOUNT = 0.997


def _stub_weights(actions: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"w": (rng.standard_normal((EMBEDDING, EMBEDDING)) / EMBEDDING ** 0.5).astype(np.float32),
            "action": rng.standard_normal((actions, EMBEDDING)).astype(np.float32),
            "out": (rng.standard_normal((EMBEDDING, actions + 2)) / EMBEDDING ** 0.5).astype(np.float32)}


def _roots(batch: int, actions: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed + 1)
    return {"logits": rng.standard_normal((batch, actions)).astype(np.float32),
            "value": rng.standard_normal(batch).astype(np.float32),
            "embedding": rng.standard_normal((batch, EMBEDDING)).astype(np.float32)}


def _time(run: Callable[[int], Any], warmup: int, repeats: int) -> tuple[list[float], list[float], Any]:
    """(wall seconds, process CPU seconds) of each of `repeats` calls run(i) after `warmup` calls; the last result."""
    result = None
    for i in range(warmup):
        result = run(i)
    walls, cpus = [], []
    for i in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        result = run(warmup + i)
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return walls, cpus, result


def _rates(walls: list[float], cpus: list[float], expansions: int) -> dict[str, Any]:
    median_wall = statistics.median(walls)
    return {"search_ms_median": 1e3 * median_wall, "search_ms_best": 1e3 * min(walls),
            "cpu_ms_median": 1e3 * statistics.median(cpus),
            "expansions_per_s": expansions / median_wall, "expansions_per_s_best": expansions / min(walls),
            "expansions_per_cpu_s": expansions / statistics.median(cpus), "repeats": len(walls)}


def _seed_search(algorithm: str, backend: str, batch: int, simulations: int, actions: int,
                 seed: int) -> Callable[[int], Any]:
    """run(i): one search of the stub with agents/muzero/search (backend "numpy" or "numba")."""
    import torch

    from seed.agents.muzero.search import RecurrentOutput, RootInput, SearchConfig, search

    torch.set_num_threads(1)
    weights = {k: torch.from_numpy(v) for k, v in _stub_weights(actions, seed).items()}
    roots = {k: torch.from_numpy(v) for k, v in _roots(batch, actions, seed).items()}
    discount = torch.full((batch,), DISCOUNT)

    def recurrent_fn(embedding: torch.Tensor, action: torch.Tensor) -> RecurrentOutput:
        hidden = torch.tanh(embedding @ weights["w"] + weights["action"][action])
        out = hidden @ weights["out"]
        return RecurrentOutput(out[:, actions], discount, out[:, :actions], out[:, actions + 1], hidden)

    root = RootInput(roots["logits"], roots["value"], roots["embedding"])
    config = SearchConfig(num_simulations=simulations, algorithm=algorithm, backend=backend)
    generator = torch.Generator().manual_seed(seed)
    return lambda i: search(root, recurrent_fn, config, generator=generator)


def bench_seed(algorithm: str, backend: str, batch: int, simulations: int, actions: int, warmup: int, repeats: int,
               seed: int) -> dict[str, Any]:
    import torch

    walls, cpus, out = _time(_seed_search(algorithm, backend, batch, simulations, actions, seed), warmup, repeats)
    depth = out.tree.depth.float()
    return {**_rates(walls, cpus, batch * simulations), "backend": backend, "max_depth": int(depth.max()),
            "mean_node_depth": float(depth[:, 1:].mean()), "torch": torch.__version__, "torch_threads": 1}


def first_search(algorithm: str, batch: int, simulations: int, actions: int, seed: int) -> dict[str, float]:
    """The compiled search's first and second search in this process (seconds, wall): the first one imports
    numba and compiles the search's functions, or loads them from the cache ($NUMBA_CACHE_DIR)."""
    run = _seed_search(algorithm, "numba", batch, simulations, actions, seed)
    start = time.perf_counter()
    run(0)
    first = time.perf_counter() - start
    start = time.perf_counter()
    run(1)
    return {"first_search_s": first, "second_search_s": time.perf_counter() - start}


def bench_compile_time(algorithm: str, batch: int, simulations: int, actions: int, seed: int) -> dict[str, Any]:
    """first_search in two fresh processes sharing a new Numba cache directory: the first compiles (empty cache),
    the second loads what the first wrote. compile_s: the first search less the second, without and with the
    cache."""
    import json
    import subprocess
    import sys
    import tempfile

    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="numba-cache-") as cache:
        for name in ("empty_cache", "warm_cache"):
            command = [sys.executable, "-m", "seed.bench.search_speed", f"--first_search={algorithm}",
                       f"--batch={batch}", f"--simulations={simulations}", f"--actions={actions}", f"--seed={seed}"]
            done = subprocess.run(command, env={**os.environ, "NUMBA_CACHE_DIR": cache}, capture_output=True,
                                  text=True, check=True)
            times = json.loads(done.stdout.strip().splitlines()[-1])
            result[name] = {**times, "compile_s": times["first_search_s"] - times["second_search_s"]}
    result["numba"] = _numba_version()
    return result


def _numba_version() -> str:
    from importlib import metadata

    return metadata.version("numba")


def bench_mctx(algorithm: str, batch: int, simulations: int, actions: int, warmup: int, repeats: int,
               seed: int) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    import mctx

    weights = {k: jnp.asarray(v) for k, v in _stub_weights(actions, seed).items()}
    roots = _roots(batch, actions, seed)

    def recurrent_fn(params, rng_key, action, embedding):
        hidden = jnp.tanh(embedding @ weights["w"] + weights["action"][action])
        out = hidden @ weights["out"]
        return mctx.RecurrentFnOutput(reward=out[:, actions], discount=jnp.full((batch,), DISCOUNT, jnp.float32),
                                      prior_logits=out[:, :actions], value=out[:, actions + 1]), hidden

    root = mctx.RootFnOutput(prior_logits=jnp.asarray(roots["logits"]), value=jnp.asarray(roots["value"]),
                             embedding=jnp.asarray(roots["embedding"]))

    @jax.jit
    def policy(rng_key):
        if algorithm == "puct":
            out = mctx.muzero_policy(None, rng_key, root, recurrent_fn, num_simulations=simulations,
                                     dirichlet_fraction=0.25, dirichlet_alpha=0.3)
        else:
            out = mctx.gumbel_muzero_policy(None, rng_key, root, recurrent_fn, num_simulations=simulations,
                                            max_num_considered_actions=16)
        return out.action, out.action_weights

    walls, cpus, _ = _time(lambda i: jax.block_until_ready(policy(jax.random.PRNGKey(i))), warmup, repeats)
    from importlib import metadata

    return {**_rates(walls, cpus, batch * simulations), "jax": jax.__version__, "mctx": metadata.version("mctx"),
            "xla_flags": os.environ.get("XLA_FLAGS", "")}


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.cpu >= 0:
        os.sched_setaffinity(0, {args.cpu})
    # XLA reads its flags when jax initialises its CPU backend: one thread, as torch gets.
    os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    try:
        import jax  # noqa: F401
        import mctx  # noqa: F401
        have_mctx = True
    except ImportError:
        have_mctx = False
    shape = (args.batch, args.simulations, args.actions)
    load_before = os.getloadavg()
    results: dict[str, Any] = {}
    compile_time: dict[str, Any] = {}
    for algorithm in args.algorithms:
        for backend in args.backends:
            name = f"seed_{algorithm}" if backend == "numpy" else f"seed_{backend}_{algorithm}"
            results[name] = bench_seed(algorithm, backend, *shape, args.warmup, args.repeats, args.seed)
        if have_mctx:
            results[f"mctx_{algorithm}"] = bench_mctx(algorithm, *shape, args.warmup, args.repeats, args.seed)
        if args.compile_time:
            compile_time[algorithm] = bench_compile_time(algorithm, *shape, args.seed)
    return {"schema": SCHEMA, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": {"cpu": cpu_model(), "cpu_count": os.cpu_count(), "pinned_cpu": args.cpu,
                        "load_average_before": load_before, "load_average_after": os.getloadavg(),
                        "python": platform.python_version(), "numpy": np.__version__},
            "config": {"batch": args.batch, "simulations": args.simulations, "actions": args.actions,
                       "embedding": EMBEDDING, "discount": DISCOUNT, "warmup": args.warmup, "repeats": args.repeats,
                       "stub": "tanh(e @ W + E[a]) -> [logits, reward, value] linear, float32"},
            "mctx_available": have_mctx, "results": results,
            **({"numba_first_search": compile_time} if compile_time else {}),
            "units": "expansions_per_s = batch * simulations / wall seconds of one search (median; _best: the "
                     "fastest search); expansions_per_cpu_s uses the process's CPU seconds instead; "
                     "numba_first_search: wall seconds of a fresh process's first and second compiled search, "
                     "with an empty Numba cache and with the cache the first process wrote"}


def summary(result: dict[str, Any]) -> str:
    c = result["config"]
    lines = [f"search: B={c['batch']}, {c['simulations']} simulations, {c['actions']} actions; "
             f"load average {result['machine']['load_average_before'][0]:.1f}",
             "| implementation | ms / search (median) | expansions/s (median) | expansions/s (best) | per CPU s | "
             "x mctx (per CPU s) |",
             "|---|---:|---:|---:|---:|---:|"]
    results = result["results"]
    for name, r in results.items():
        mctx = results.get("mctx_" + name.rsplit("_", 1)[-1])
        ratio = f"{r['expansions_per_cpu_s'] / mctx['expansions_per_cpu_s']:.2f}" if mctx else ""
        lines.append(f"| {name} | {r['search_ms_median']:.1f} | {r['expansions_per_s']:,.0f} | "
                     f"{r['expansions_per_s_best']:,.0f} | {r['expansions_per_cpu_s']:,.0f} | {ratio} |")
    if not result["mctx_available"]:
        lines.append("(mctx not importable: pip install jax mctx to measure it beside)")
    for algorithm, times in result.get("numba_first_search", {}).items():
        lines.append(f"numba {algorithm}, first search of a fresh process: "
                     f"{times['empty_cache']['first_search_s']:.2f} s with an empty cache (compiling "
                     f"{times['empty_cache']['compile_s']:.2f} s), {times['warm_cache']['first_search_s']:.2f} s "
                     f"with the cache ({times['warm_cache']['compile_s']:.2f} s more than the second search)")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="seed-bench search", description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=64, help="trees searched at once (B)")
    parser.add_argument("--simulations", type=int, default=50)
    parser.add_argument("--actions", type=int, default=18)
    parser.add_argument("--algorithms", type=lambda s: s.split(","), default=["puct", "gumbel"],
                        help="comma-separated: puct, gumbel")
    parser.add_argument("--backends", type=lambda s: s.split(","), default=["numpy", "numba"],
                        help="comma-separated search backends: numpy (the reference loop), numba (compiled)")
    parser.add_argument("--compile_time", action="store_true",
                        help="also time the compiled search's first search in fresh processes, with an empty Numba "
                             "cache and with the cache it leaves (two processes per algorithm)")
    parser.add_argument("--first_search", default="", help=argparse.SUPPRESS)  # --compile_time's child processes
    parser.add_argument("--warmup", type=int, default=3, help="searches before timing (jit compilation for mctx)")
    parser.add_argument("--repeats", type=int, default=20, help="timed searches")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cpu", type=int, default=-1, help="pin to this core first (-1: leave the affinity)")
    parser.add_argument("--out", default="bench_results/search.json")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.algorithms) - {"puct", "gumbel"})
    if unknown:
        parser.error(f"--algorithms: got {unknown}, expected puct and/or gumbel")
    unknown = sorted(set(args.backends) - {"numpy", "numba"})
    if unknown:
        parser.error(f"--backends: got {unknown}, expected numpy and/or numba")
    return args


def main(argv: list[str] | None = None) -> None:
    from seed.bench.results import write_json

    args = parse_args(argv)
    if args.first_search:
        import json

        print(json.dumps(first_search(args.first_search, args.batch, args.simulations, args.actions, args.seed)))
        return
    result = run(args)
    write_json(os.path.abspath(args.out), result)
    print(summary(result))
    print(f"\nwrote {os.path.abspath(args.out)}")


if __name__ == "__main__":
    main()
