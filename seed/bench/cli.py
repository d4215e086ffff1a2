"""`seed-bench`: throughput, latency and CPU use of a learner plus actors on this machine, as one JSON file.

    seed-bench --config=fake_mlp --duration_s=30 --out=bench_results/fake_mlp.json
    seed-bench --config=fake_mlp --baselines=actor_side,transport,env_only --out=bench_results/fake_mlp.json
    seed-bench --config=cartpole --env_groups=2 --baselines=env_only --out=bench_results/cartpole_groups2.json
    seed-bench --config=fake_mlp --sweep=actors --values=1,2,4 --out=bench_results/sweep_actors.json
    seed-bench --list
    seed-bench --config=fake_mlp --compare=9e0b7a4 --baselines=transport --duration_s=25   (A/B: seed/bench/compare.py)

Across hosts (network namespaces, root): wire bytes per env frame and FPS with and without lz4, rate limits and
added latency: `python -m seed.bench.network` (seed/bench/network.py, docs/performance/cpu/network/).
    seed-bench search --cpu=0 --out=bench_results/search.json    (the MuZero tree search: seed/bench/search_speed.py)
    seed-bench search-gpu --out=bench_results/search_gpu.json    (the agent's search on a GPU, eager and as a CUDA
                                                                  graph: seed/bench/search_gpu.py)

A run starts the learner (`python -m seed.learner.main`) with the named configuration from the shipped
seed/bench/configs.yaml or --bench_configs (flags typed here override it), waits until it serves (gRPC
health check), starts `num_actors` actor processes that write stats files (seed/actor/stats.py), runs for `--duration_s`
seconds from the moment every actor steps, and stops everything. Rates are taken over the window after the
warm-up (`--warmup_s`, default 20% of the duration); seed/bench/measure.py says how each value is measured.
Env frames/s are counted at the actors (the headline FPS) and at the learner; round-trip latency is measured
at the actor (send of a step message to receipt of its actions); CPU per process type from /proc.

Baselines (`--baselines=actor_side,transport,env_only`) run right after, with the same env, actors, envs and
duration:
  actor_side  IMPALA-style: every actor runs its own copy of the network (seed/bench/actor_side.py; it steps
              its K envs in one group whatever --env_groups says)
  transport   the transport ceiling: the same seed-actor processes against a server that answers every step
              with zero actions and does nothing else (seed/bench/transport_ceiling.py)
  env_only    the simulator ceiling: num_actors processes stepping the actors' envs (same env flags, envs
              per actor, actor indices, cores) with uniform random actions and no learner
              (seed/bench/env_only.py); the result's ratios.framework_over_env_only is the share of the
              simulator's own limit the framework reaches

Sweeps (`--sweep=actors|envs_per_actor|env_groups|network_width --values=...`) run the configuration once per value
and also write a Markdown table (<out>.md) and a plot of FPS against the value (<out>.png).

Paths: --out and --runs_dir are made absolute once, against the directory seed-bench is started in, and only
absolute paths are handed to the processes it starts (they run in their run directory), so seed-bench behaves
the same from any directory and from a wheel install.
"""

from __future__ import annotations

import dataclasses
import os
import sys

from absl import app, flags

from seed.bench.compare import DEFAULT_CACHE_DIR, compare, report_markdown
from seed.bench.configs import DEFAULT_CONFIGS, build_setup, load_bench_configs
from seed.bench.measure import BenchError
from seed.bench.results import BASELINES, SCHEMA, run_bench, summary_markdown, write_json
from seed.bench.sweep import SWEEPS, sweep_plot, sweep_setups, sweep_table
from seed.config import explicit_flags
from seed.learner.configuration import define_learner_flags, learner_fields
from seed.runtime.quick_exit import freeze_objects_at_exit

# ----------------------------------------------------------------------------------------------- main

FLAGS = flags.FLAGS


def _stem(path: str) -> str:
    """The output path without its .json suffix: sweeps write <stem>.md, <stem>.png and one JSON per value."""
    return path[:-5] if path.endswith(".json") else path


def _define_bench_flags() -> None:
    define_learner_flags()  # any learner flag overrides the named configuration
    flags.DEFINE_string("config", "", "Name of a configuration in --bench_configs (see --list).")
    flags.DEFINE_string("name", "", "The result's name (its rows in seed-report), e.g. pong_vtrace_gpu for a "
                                    "configuration run with overrides; default the --config name.")
    flags.DEFINE_string("bench_configs", DEFAULT_CONFIGS, "The YAML file of named configurations; default the "
                                                          "one shipped in the package (seed/bench/configs.yaml).")
    flags.DEFINE_bool("list", False, "List the named configurations and exit.")
    flags.DEFINE_float("duration_s", 0.0, "Seconds each run lasts once its actors start, warm-up included; "
                                          "0 = the configuration's duration_s (else 30).")
    flags.DEFINE_float("warmup_s", -1.0, "Seconds excluded from the rates at the start; -1 = 20% of the duration.")
    flags.DEFINE_string("out", "", "Result JSON path; default bench_results/<name>.json under the directory "
                                   "seed-bench is started in.")
    flags.DEFINE_string("runs_dir", "bench_results/runs", "Where each run's logs, metrics and stats files go "
                                                          "(relative to the directory seed-bench is started in).")
    flags.DEFINE_list("baselines", [], "Also measure: actor_side (IMPALA-style), transport (gRPC ceiling), env_only "
                                       "(the actors' envs alone with random actions: the simulator ceiling).")
    flags.DEFINE_enum("sweep", "", ["", *SWEEPS], "Run once per --values of actors, envs_per_actor, env_groups or "
                                                  "network_width.")
    flags.DEFINE_list("values", [], "The swept values, e.g. 1,2,4.")
    flags.DEFINE_enum("transport", "unix", ["unix", "tcp"], "Actors dial a unix socket or TCP on 127.0.0.1.")
    flags.DEFINE_bool("progress", True, "Show a progress bar on stderr.")
    flags.DEFINE_integer("repeats", 1, "Rounds of (framework, baselines...); each reports its median round.")
    flags.DEFINE_float("switch_interval_ms", 0.0, "Experiment: run the learner with sys.setswitchinterval(this); "
                                                  "0 = Python's default (5 ms).")
    flags.DEFINE_string("compare", "", "A/B: also install this commit (cached) and run the configuration for the "
                                       "working tree and it alternately; prints each round and the median ratio "
                                       "(seed/bench/compare.py).")
    flags.DEFINE_string("compare_with", "", "With --compare: judge this commit instead of the working tree.")
    flags.DEFINE_integer("compare_rounds", 3, "With --compare: rounds of (a, b) runs, the order flipped each round.")
    flags.DEFINE_string("compare_cache_dir", DEFAULT_CACHE_DIR, "With --compare: where each commit's virtual "
                                                                "environment is kept.")
    flags.DEFINE_float("compare_max_other_load", 0.25, "With --compare: refuse to measure while other processes "
                                                       "hold more than this share of the cores.")
    flags.DEFINE_float("compare_wait_s", 300.0, "With --compare: how long to wait for quiet cores before refusing.")
    flags.DEFINE_bool("compare_allow_load", False, "With --compare: measure even on busy cores.")
    flags.DEFINE_list("profile", [], "Sample these processes with py-spy over the measurement window: server "
                                     "(learner / ceiling), actor0, actor1, ...; writes <run_dir>/profile-*.txt.")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    try:
        if FLAGS.list:
            configs = load_bench_configs(FLAGS.bench_configs)
            width = max(map(len, configs), default=0)
            for name, entry in configs.items():
                print(f"{name:{width}s}  {entry.get('description', '')}")
            return
        if not FLAGS.config:
            raise BenchError("--config: required (see --list)")
        unknown = sorted(set(FLAGS.baselines) - set(BASELINES))
        if unknown:
            raise BenchError(f"--baselines: got {unknown}, expected a subset of {', '.join(BASELINES)}")
        if FLAGS.compare:
            _compare()
            return
        if FLAGS.compare_with:
            raise BenchError("--compare_with: needs --compare=REV (the reference commit)")
        overrides = explicit_flags(learner_fields(), FLAGS)
        setup, bench = build_setup(FLAGS.config, FLAGS.bench_configs, overrides, FLAGS.transport,
                                   FLAGS.switch_interval_ms)
        name = FLAGS.name or FLAGS.config
        setup = dataclasses.replace(setup, name=name)
        duration = FLAGS.duration_s or float(bench.get("duration_s", 30))
        warmup = FLAGS.warmup_s if FLAGS.warmup_s >= 0 else 0.2 * duration
        if not 0 <= warmup < duration - 1:
            raise BenchError(f"--warmup_s: got {warmup}, expected 0 <= warmup_s < duration_s - 1 ({duration})")
        out = os.path.abspath(FLAGS.out or os.path.join("bench_results", f"{name}.json"))
        runs_dir = os.path.abspath(FLAGS.runs_dir)
        baselines = [b for b in BASELINES if b in FLAGS.baselines]
        if not FLAGS.sweep:
            result = run_bench(setup, runs_dir, duration, warmup, baselines, FLAGS.progress, tuple(FLAGS.profile),
                               FLAGS.repeats)
            write_json(out, result)
            print(summary_markdown(result))
            print(f"\nwrote {out}")
            return
        if not FLAGS.values:
            raise BenchError("--values: required with --sweep, e.g. --values=1,2,4")
        try:
            values = [int(v) for v in FLAGS.values]
        except ValueError:
            raise BenchError(f"--values: got {FLAGS.values}, expected integers") from None
        points = []
        stem = _stem(out)
        for value, point_setup in sweep_setups(setup, FLAGS.sweep, values):
            print(f"[bench] {FLAGS.sweep}={value}", file=sys.stderr, flush=True)
            result = run_bench(point_setup, runs_dir, duration, warmup, baselines, FLAGS.progress,
                               tuple(FLAGS.profile), FLAGS.repeats)
            write_json(f"{stem}-{FLAGS.sweep}{value}.json", result)
            points.append({"value": value, "result": result})
        table = sweep_table(FLAGS.sweep, points)
        c = setup.config
        title = (f"{name}: {c.agent} on {c.env}, sweep {FLAGS.sweep}; {os.cpu_count()} CPU cores, "
                 f"{c.inference_device}/{c.training_device}")
        write_json(out, {"schema": SCHEMA + "-sweep", "name": name, "sweep": FLAGS.sweep,
                         "values": values, "title": title, "points": points})
        with open(f"{stem}.md", "w") as f:
            f.write(f"{title}\n\n{table}\n")
        sweep_plot(FLAGS.sweep, points, title, f"{stem}.png")
        print(f"{title}\n\n{table}\n\nwrote {out}, {stem}.md, {stem}.png")
    except BenchError as error:
        print(f"seed-bench: {error}", file=sys.stderr)
        sys.exit(1)


# Flags the comparison owns or sets for each run itself; every other flag typed on the command line is passed to
# both sides' runs unchanged.
_COMPARE_OWN = ("out", "runs_dir", "progress")


def _compare() -> None:
    if FLAGS.sweep:
        raise BenchError("--compare: runs one configuration; got --sweep too, expected one of them")
    bench_args = [FLAGS[name].serialize() for name in FLAGS
                  if FLAGS[name].present and name not in _COMPARE_OWN + ("bench_configs",)
                  and not name.startswith("compare")]
    if FLAGS["bench_configs"].present:  # the runs start in a directory of their own
        bench_args.append(f"--bench_configs={os.path.abspath(FLAGS.bench_configs)}")
    out = os.path.abspath(FLAGS.out or os.path.join("bench_results", f"{FLAGS.config}-ab.json"))
    os.makedirs(os.path.dirname(out), exist_ok=True)
    duration = FLAGS.duration_s or float(load_bench_configs(FLAGS.bench_configs)[FLAGS.config].get("duration_s", 30))
    result = compare(FLAGS.config, bench_args, FLAGS.compare, FLAGS.compare_with, FLAGS.compare_rounds, duration,
                     out, FLAGS.compare_cache_dir, FLAGS.compare_max_other_load, FLAGS.compare_wait_s,
                     FLAGS.compare_allow_load)
    print(report_markdown(result))
    print(f"\nwrote {out}")


def run() -> None:
    freeze_objects_at_exit()
    if sys.argv[1:2] == ["search"]:  # `seed-bench search ...`: the tree-search micro-benchmark, its own flags
        from seed.bench.search_speed import main as search_main

        search_main(sys.argv[2:])
        return
    if sys.argv[1:2] == ["search-gpu"]:  # the agent's whole search on a GPU, eager against a CUDA graph
        from seed.bench.search_gpu import main as search_gpu_main

        search_gpu_main(sys.argv[2:])
        return
    _define_bench_flags()
    app.run(main)


if __name__ == "__main__":
    run()
