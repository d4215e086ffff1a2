"""The env_only baseline's actor process: an actor's K envs stepping with uniform random actions, no learner.

seed-bench (`--baselines=env_only`) starts `num_actors` of these in place of seed-actor, with the same env
flags and actor indices (so the same env ids and seeds), and measures them exactly like the framework's
actors from their stats files: env frames per second with nothing but the simulator in the way, on the same
cores. The framework's FPS divided by this is the share of the simulator's own limit the framework reaches.
The stepping loop is seed/bench/env_speed.py's `step_randomly`; a stats row's latency samples are the wall
time of one step of the K envs and its waited_s stays 0.

    python -m seed.bench.env_only --env=atari:Pong --envs_per_actor=8 --actor_index=0 --stats_file=/tmp/a0.jsonl

Runs until SIGTERM or SIGINT, then writes a final stats row. --env_groups is accepted (the env flags are the
actors') and changes nothing: grouping changes when envs step, not what a step costs.
"""

from __future__ import annotations

import signal
import threading

from absl import app, flags

from seed.actor.stats import ActorStats
from seed.bench.env_speed import step_randomly
from seed.config import build_config, define_flags, env_options_class, explicit_flags


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from seed.envs import make_batch

    FLAGS = flags.FLAGS
    options = build_config(env_options_class(), explicit_flags(env_options_class(), FLAGS))
    if FLAGS.actor_index < 0:
        raise app.UsageError(f"--actor_index: got {FLAGS.actor_index}, expected >= 0")
    k = options.envs_per_actor
    batch = make_batch(options.env, k, FLAGS.actor_index * k, options.env_options())
    stats = ActorStats(FLAGS.stats_file, FLAGS.stats_interval_s, batch.spec.action_repeat, FLAGS.actor_index)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    print(f"[env_only {FLAGS.actor_index}] env={options.env} envs={k} (env ids {FLAGS.actor_index * k}.."
          f"{FLAGS.actor_index * k + k - 1}), random actions, no learner", flush=True)
    try:
        counts = step_randomly(batch, options.seed + FLAGS.actor_index * k, lambda: not stop.is_set(), stats)
    finally:
        stats.write(final=True)
        batch.close()
    print(f"[env_only {FLAGS.actor_index}] stopped after {counts['agent_steps']:,} agent steps", flush=True)


def run() -> None:
    define_flags(env_options_class())  # the actors' env flags: the same envs as the framework's actors
    flags.DEFINE_integer("actor_index", 0, "This process's actor index: env ids [index*K, (index+1)*K).")
    flags.DEFINE_string("stats_file", "", "JSON Lines stats file (seed/actor/stats.py).")
    flags.DEFINE_float("stats_interval_s", 1.0, "Seconds between stats rows.")
    app.run(main)


if __name__ == "__main__":
    run()
