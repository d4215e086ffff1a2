"""`seed-bench search-gpu`: the MuZero agent's whole search on a GPU, eager against one CUDA-graph replay.

    seed-bench search-gpu --batch=16,256 --out=bench_results/search_gpu.json
    seed-bench search-gpu --device=cpu --batch=4 --repeats=2 --out=/tmp/s.json     # a dry run of the script

One search is what the agent runs per inference batch: the representation call on B stacked Atari frames, then
--simulations simulations of B trees (agents/muzero/search), each one recurrent call of the EfficientZero network
(`atari100k_muzero_gpu`'s: 96 x 96 frames, 4 stacked, ResNet torso, value-prefix LSTM, supports of 601 atoms),
and the outcome. The network is freshly initialised (its speed does not depend on its weights; its trees do).

Reported per algorithm and batch size: milliseconds per search (median and best of --repeats, synchronised, after
--warmup), eager (the loop launched kernel by kernel, its depth bound polled) and graphed
(agents/muzero/graphed_search.py: one replay), and the graph's capture time; plus whether both give the same visit
counts for evaluation rows (no root noise, no Gumbel noise, greedy), which they must.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import platform
import statistics
import time
from typing import Any

SCHEMA = "seed-bench-search-gpu/1"


def _agent(algorithm: str, simulations: int, actions: int, device: str) -> Any:
    import torch

    from seed.agents.muzero.agent import MuZeroAgent
    from seed.envs.base import EnvSpec
    from seed.learner.configuration import resolve_config
    from seed.presets import PRESETS

    preset = {**PRESETS["atari100k_muzero_gpu"], "search": algorithm, "num_simulations": simulations,
              "inference_device": device, "training_device": device}
    config = resolve_config(preset)
    spec = EnvSpec(name=config.env, observation_shape=(config.atari_frame_size,) * 2, observation_dtype="uint8",
                   num_actions=actions, action_repeat=4, frame_stack=4)
    agent = MuZeroAgent(spec, config).to(torch.device(device))
    agent.network.eval()
    return agent, spec, config


def _time(run: Any, warmup: int, repeats: int, synchronize: Any) -> list[float]:
    for _ in range(warmup):
        run()
    synchronize()
    walls = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        synchronize()
        walls.append(time.perf_counter() - start)
    return walls


def bench(algorithm: str, batch: int, simulations: int, actions: int, device: str, warmup: int,
          repeats: int) -> dict[str, Any]:
    import torch

    from seed.agents.muzero.graphed_search import GraphedSearch

    agent, spec, _ = _agent(algorithm, simulations, actions, device)
    network = agent.network
    generator = torch.Generator().manual_seed(batch)
    stacked = torch.randint(0, 256, (batch, spec.frame_stack, *spec.observation_shape), generator=generator,
                            dtype=torch.uint8).to(device)
    acting = torch.zeros(batch, dtype=torch.bool, device=device)  # training rows: root noise, sampled actions
    cuda = device.startswith("cuda")
    synchronize = torch.cuda.synchronize if cuda else (lambda: None)
    graphed = GraphedSearch(agent._search)
    with torch.no_grad():
        eager_walls = _time(lambda: agent._search(network, stacked, acting), warmup, repeats, synchronize)
        start = time.perf_counter()
        graphed(network, stacked, acting)  # warm-up and capture
        synchronize()
        capture_s = time.perf_counter() - start
        graph_walls = _time(lambda: graphed(network, stacked, acting), warmup, repeats, synchronize)
        # the same trees: evaluation rows (no root noise, greedy) and, for Gumbel, no Gumbel noise (a fresh capture:
        # the graph holds the configuration it was captured with)
        agent.search_config = dataclasses.replace(agent.search_config, gumbel_scale=0.0)
        evaluating = torch.ones(batch, dtype=torch.bool, device=device)
        eager_eval = agent._search(network, stacked, evaluating)
        graph_eval = GraphedSearch(agent._search)(network, stacked, evaluating)
        same = bool(torch.equal(eager_eval.visit_counts, graph_eval.visit_counts))
        depth = int(eager_eval.tree.depth.max())

    def rates(walls: list[float]) -> dict[str, float]:
        return {"search_ms_median": 1e3 * statistics.median(walls), "search_ms_best": 1e3 * min(walls),
                "expansions_per_s": batch * simulations / statistics.median(walls)}

    return {"eager": rates(eager_walls), "graphed": {**rates(graph_walls), "capture_s": capture_s},
            "speedup": statistics.median(eager_walls) / statistics.median(graph_walls),
            "evaluation_visit_counts_equal": same, "max_depth": depth}


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    if args.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False  # the trees must match
    results = {}
    for algorithm in args.algorithms:
        for batch in args.batch:
            results[f"{algorithm}_b{batch}"] = bench(algorithm, batch, args.simulations, args.actions, args.device,
                                                     args.warmup, args.repeats)
            print(f"{algorithm} B={batch}: {results[f'{algorithm}_b{batch}']}", flush=True)
    device_name = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else platform.processor()
    return {"schema": SCHEMA, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": {"device": device_name, "cpu_count": os.cpu_count(), "python": platform.python_version(),
                        "torch": torch.__version__, "load_average": os.getloadavg()},
            "config": {"simulations": args.simulations, "actions": args.actions, "batches": args.batch,
                       "network": "atari100k_muzero_gpu's (ResNet, 96 x 96 x 4 frames)", "tf32": False,
                       "warmup": args.warmup, "repeats": args.repeats},
            "results": results,
            "units": "search_ms: wall milliseconds of one whole search (representation + simulations + outcome), "
                     "synchronised; expansions_per_s = batch * simulations / median seconds"}


def summary(result: dict[str, Any]) -> str:
    lines = [f"search on {result['machine']['device']}: {result['config']['simulations']} simulations, "
             f"{result['config']['actions']} actions",
             "| algorithm, B | eager ms (median) | graphed ms (median) | speed-up | capture s | same visits |",
             "|---|---:|---:|---:|---:|---|"]
    for name, r in result["results"].items():
        lines.append(f"| {name} | {r['eager']['search_ms_median']:.1f} | {r['graphed']['search_ms_median']:.2f} | "
                     f"{r['speedup']:.1f}x | {r['graphed']['capture_s']:.1f} | {r['evaluation_visit_counts_equal']} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="seed-bench search-gpu", description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=lambda s: [int(x) for x in s.split(",")], default=[16, 256],
                        help="comma-separated batch sizes (trees per search)")
    parser.add_argument("--simulations", type=int, default=50)
    parser.add_argument("--actions", type=int, default=18)
    parser.add_argument("--algorithms", type=lambda s: s.split(","), default=["puct", "gumbel"])
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", default="bench_results/search_gpu.json")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.algorithms) - {"puct", "gumbel"})
    if unknown:
        parser.error(f"--algorithms: got {unknown}, expected puct and/or gumbel")
    return args


def main(argv: list[str] | None = None) -> None:
    from seed.bench.results import write_json

    args = parse_args(argv)
    result = run(args)
    write_json(os.path.abspath(args.out), result)
    print(summary(result))
    print(f"\nwrote {os.path.abspath(args.out)}")


if __name__ == "__main__":
    main()
