"""The learner's compute per agent step on this machine: one inference forward and one training step, timed
alone (no actors, no gRPC, no other thread), so a framework FPS figure can be set against what the learner's
own arithmetic allows.

    python -m seed.bench.compute_cost --preset=pong_vtrace --torch_threads=1 --out=bench_results/cost.json
    python -m seed.bench.compute_cost --preset=pong_vtrace --network=nature --inference_batch_sizes=8,16
    python -m seed.bench.compute_cost --preset=minatar_muzero --profile=bench_results/update_profile.txt

Any learner flag (or a --preset) picks the agent, env, network and batch shapes. The unrolls it trains on are
made by the agent's own `act` on random frames, so every field the loss reads is there with its real shape.

Reported (milliseconds of wall time on the timing thread, medians over --repeats):
  inference_ms[B]           agent.act on B rows (the policy's forward and sampling), under torch.no_grad
  train_step_ms             one learner update (seed/training/update.py's train_on_batch, the training
                            process's, with its optimizer) on batch_size unrolls of burn_in + unroll_length + 1
                            steps: PPO's whole epochs x minibatches on one rollout, SAC's critic step and its
                            share of actor and temperature steps, MuZero's reanalysis with --reanalyse_ratio
  learner_ms_per_agent_step inference_ms[B] / B + train_step_ms / (trained agent steps per update), at the
                            largest B, times --replay_ratio for replay agents (R2D2, SAC, MuZero: each agent
                            step is trained that many times on average): the learner's time per agent step if it
                            had one core to itself
  learner_bound_fps         action_repeat x 1000 / learner_ms_per_agent_step: env frames per second that the
                            learner's arithmetic alone allows on that core
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from typing import Any

import torch
from absl import app, flags

from seed.config import LearnerConfig, burn_in_steps, explicit_flags, torch_threads
from seed.contracts import InferenceBatch
from seed.contracts.training import STEP_FIELDS, TrainingBatch, Unroll
from seed.envs import make_spec
from seed.learner.configuration import define_learner_flags, learner_fields, resolve_config
from seed.runtime.host_memory import keep_freed_memory
from seed.training.optimizers import make_optimizer
from seed.training.update import train_on_batch

FLAGS = flags.FLAGS


def _batch(spec, rows: int, step: int, generator: torch.Generator, actions: torch.Tensor) -> InferenceBatch:
    observation = torch.randint(0, 256, (rows, *spec.observation_shape), generator=generator,
                                dtype=torch.int64).to(getattr(torch, spec.observation_dtype))
    return InferenceBatch(env_ids=torch.arange(rows), observation=observation,
                          reward=torch.zeros(rows), done=torch.full((rows,), step == 0), prev_action=actions)


def _zero_actions(spec, rows: int) -> torch.Tensor:
    """Previous actions for the first step, as the learner holds them: int64 [rows] or float32 [rows, D]."""
    actions = torch.from_numpy(spec.zero_actions(rows))
    return actions if spec.continuous else actions.long()


def make_unrolls(agent: Any, spec, config: LearnerConfig, generator: torch.Generator) -> Unroll:
    """A time-major batch [burn_in + unroll_length + 1, batch_size, ...] played by `agent.act` on random frames."""
    rows = config.batch_size
    length = burn_in_steps(config) + config.unroll_length + 1
    initial = agent.initial_state(rows)
    state = dict(initial)
    actions = _zero_actions(spec, rows)
    steps: dict[str, list[torch.Tensor]] = {}
    with torch.no_grad():
        for t in range(length):
            batch = _batch(spec, rows, t, generator, actions)
            out = agent.act(agent.network, batch, state)
            fields = {"observation": batch.observation, "reward": batch.reward, "done": batch.done,
                      "truncated": torch.zeros(rows, dtype=torch.bool), "prev_action": actions,
                      "action": out.action, "valid": torch.ones(rows, dtype=torch.bool),
                      "policy_version": torch.zeros(rows, dtype=torch.int64), **out.outputs}
            for key, value in fields.items():
                steps.setdefault(key, []).append(value)
            state, actions = out.state, out.action
    assert set(STEP_FIELDS) <= set(steps)
    return Unroll({k: torch.stack(v) for k, v in steps.items()}, initial, torch.arange(rows))


def _median_ms(fn, repeats: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def measure(config: LearnerConfig, inference_batch_sizes: list[int], repeats: int, profile: str = "",
            profile_updates: int = 3) -> dict[str, Any]:
    """The JSON result (see the module docstring); CPU only. With `profile` a path: after the timed updates,
    `profile_updates` more under torch.profiler, their operators' table (sorted by self CPU time) written there."""
    torch.set_num_threads(torch_threads(config.torch_threads))
    if config.keep_freed_memory:
        keep_freed_memory()  # as the learner does
    torch.manual_seed(config.seed)
    spec = make_spec(config.env, config.env_options())
    agent = type(config).agent_class(spec, config)
    generator = torch.Generator().manual_seed(config.seed)
    inference_ms = {}
    for rows in inference_batch_sizes:
        batch = _batch(spec, rows, 1, generator, _zero_actions(spec, rows))
        state = agent.initial_state(rows)

        def act(batch=batch, state=state):
            with torch.no_grad():
                agent.act(agent.network, batch, state)
        inference_ms[rows] = _median_ms(act, repeats * 5)

    unrolls = make_unrolls(agent, spec, config, generator)
    training = TrainingBatch(unrolls, importance_weights=torch.ones(config.batch_size) if agent.uses_replay else None)
    optimizer = make_optimizer(agent, config)
    train_steps = 0

    def train():  # the training process's update: the agent's own (SAC's actor steps, MuZero's reanalysis)
        nonlocal train_steps
        training.unrolls.steps["policy_version"].fill_(train_steps)  # no --max_policy_lag drop
        train_on_batch(agent, optimizer, training, config, train_steps)
        train_steps += 1
    train_ms = _median_ms(train, repeats)
    if profile:
        _write_profile(train, profile_updates, profile)

    largest = max(inference_batch_sizes)
    trained_steps = config.batch_size * config.unroll_length
    # A replay agent trains each inserted sequence (unroll_length new agent steps) replay_ratio times on average.
    replay_ratio = config.replay_ratio if agent.uses_replay else None
    times_trained = replay_ratio or 1.0
    per_step = inference_ms[largest] / largest + times_trained * train_ms / trained_steps
    return {
        "agent": config.agent, "env": config.env,
        "network": getattr(config, "network", None), "use_lstm": getattr(config, "use_lstm", None),  # agents' own
        "preset": config.preset, "batch_size": config.batch_size, "unroll_length": config.unroll_length,
        "burn_in": burn_in_steps(config), "replay_ratio": replay_ratio,
        "torch_threads": torch.get_num_threads(), "cpu_cores": os.cpu_count(),
        "torch": torch.__version__, "repeats": repeats,
        "inference_ms": {str(k): round(v, 3) for k, v in inference_ms.items()},
        "train_step_ms": round(train_ms, 2),
        "learner_ms_per_agent_step": round(per_step, 4),
        # Four significant figures: a slow replay agent's bound is a few frames per second, where one decimal is 2-4%.
        "learner_bound_fps": float(f"{spec.action_repeat * 1e3 / per_step:.4g}"),
    }


def _write_profile(update, updates: int, path: str) -> None:
    """torch.profiler's operator table of `updates` calls of `update`, sorted by self CPU time, written to `path`."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        for _ in range(updates):
            update()
    table = profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=50)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write(f"torch.profiler: {updates} updates, sorted by self CPU time\n{table}\n")


def main(argv: list[str]) -> None:
    del argv
    values = explicit_flags(learner_fields(), FLAGS)
    values.setdefault("logdir", "/tmp/seed-compute-cost")
    config = resolve_config(values)
    sizes = [int(s) for s in FLAGS.inference_batch_sizes]
    if not sizes or min(sizes) < 1:
        raise SystemExit(f"--inference_batch_sizes: got {FLAGS.inference_batch_sizes}, expected positive integers")
    result = measure(config, sizes, FLAGS.repeats, FLAGS.profile, FLAGS.profile_updates)
    text = json.dumps(result, indent=1)
    print(text)
    if FLAGS.out:
        os.makedirs(os.path.dirname(os.path.abspath(FLAGS.out)), exist_ok=True)
        with open(FLAGS.out, "w") as f:
            f.write(text + "\n")


def run() -> None:
    define_learner_flags()
    flags.DEFINE_list("inference_batch_sizes", ["8", "16"], "Rows per timed inference forward.")
    flags.DEFINE_integer("repeats", 20, "Timed training steps (inference forwards: 5x as many); medians reported.")
    flags.DEFINE_string("out", "", "Write the JSON result here too.")
    flags.DEFINE_string("profile", "", "Write a torch.profiler table (operators by self CPU time) of "
                                       "--profile_updates more updates here, after the timed ones.")
    flags.DEFINE_integer("profile_updates", 3, "Updates under the profiler with --profile.")
    app.run(main)


if __name__ == "__main__":
    sys.exit(run())
