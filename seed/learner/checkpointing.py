"""The learner's checkpoints: the resume point read at start, and each rotated checkpoint written afterwards.

A checkpoint (seed/runtime/checkpoint.py writes the file) holds the agent's and the optimizer's state dicts, the metric
counters, the seed, this process's random generators' states and the configuration; the experience (the replay,
with --checkpoint_replay) is written beside it.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from seed.config import LearnerConfig
from seed.experience.training_batches import FifoExperience, ReplayExperience
from seed.metrics.recording import LearnerMetrics
from seed.runtime import checkpoint
from seed.training.optimizers import HeldOptimizerState, load_optimizer_state


class CheckpointDoesNotFit(ValueError):
    """The newest checkpoint of --logdir holds an agent or optimizer state that this configuration cannot load."""


def resume(config: LearnerConfig, agent: Any,
           optimizer: torch.optim.Optimizer | HeldOptimizerState) -> dict[str, Any] | None:
    """Loads the newest loadable checkpoint of `config.logdir` into `agent` and `optimizer` and returns it (its
    "counters" and "rng" are for the caller); None when there is none (a fresh start). The optimizer keeps the
    checkpoint's state (moments, step counts) with this configuration's hyperparameters (--learning_rate, ...);
    a state of another --optimizer is refused here, before the learner serves, with the training process too
    (which builds the optimizer only once started). Raises CheckpointDoesNotFit naming the flags that changed."""
    found = checkpoint.latest(config.logdir)
    if not found:
        return None
    path, restored = found
    saved = {"optimizer": "adam", **(restored.get("config") or {})}  # before --optimizer existed: Adam's state
    try:
        agent.load_state_dict(restored["agent"])
    except (RuntimeError, KeyError) as error:  # torch's "size mismatch" / "Missing key(s)", or a missing part
        raise does_not_fit(config, path, saved, "the agent", error) from error
    if restored["optimizer"] is not None and saved["optimizer"] != config.optimizer:
        raise does_not_fit(config, path, saved, "the optimizer")  # without building one (the training process does)
    try:
        load_optimizer_state(optimizer, restored["optimizer"])
    except ValueError as error:  # torch's "different number of parameter groups" and the like
        raise does_not_fit(config, path, saved, "the optimizer", error) from error
    counters = restored["counters"]
    print(f"[learner] resumed from {path}: "
          f"env_frames={counters['env_frames']:,} train_steps={counters['train_steps']:,}", flush=True)
    return restored


def does_not_fit(config: LearnerConfig, path: str, saved: dict[str, Any], part: str,
                 error: Exception | None = None) -> CheckpointDoesNotFit:
    """The refusal of checkpoint `path` whose `part` ("the agent", "the optimizer") this configuration cannot
    load, naming the flags that differ from the checkpoint's configuration `saved` (and torch's own `error`)."""
    return CheckpointDoesNotFit(
        f"--logdir {config.logdir}: its checkpoint {path} does not fit {part} this configuration builds "
        f"({changed_flags(saved, vars(config))}); resume with the checkpoint's flags or use a new --logdir."
        + (f" {error}" if error is not None else ""))


def changed_flags(saved: dict[str, Any], now: dict[str, Any]) -> str:
    """The flags whose values differ between a checkpoint's configuration and this one, as "--name: was X, now
    Y" (the run's paths left out: they may move with a resumed run; the token never shown)."""
    left_out = {"logdir", "server_address", "auth_token"}
    changed = [f"--{name}: was {saved[name]!r}, now {now[name]!r}" for name in sorted(saved.keys() & now.keys())
               if name not in left_out and saved[name] != now[name]]
    return "; ".join(changed) if changed else "no flag differs"


class LearnerCheckpointer:
    """Writes the next rotated checkpoint of `config.logdir` (at most `keep_checkpoints` kept)."""

    def __init__(self, config: LearnerConfig, metrics: LearnerMetrics, experience: FifoExperience | ReplayExperience):
        self.config = config
        self.metrics = metrics
        self.experience = experience

    def save(self, agent_state: dict[str, Any], optimizer_state: dict[str, Any] | None,
             with_experience: bool = True) -> None:
        """Writes the given agent and optimizer state with the counters and generator states of now, and, if
        `with_experience`, the experience (the replay)."""
        metrics = self.metrics
        state = {
            "agent": agent_state,
            "optimizer": optimizer_state,
            "counters": {"env_frames": metrics.env_frames, "train_steps": metrics.train_steps,
                         "episodes": metrics.episodes, "eval_returns": list(metrics.eval_returns),
                         "eval_episodes": metrics.eval_episodes,
                         "eval_scores": list(metrics.eval_scores)},
            "seed": self.config.seed,
            "rng": rng_states(),
            "config": vars(self.config).copy(),
        }
        checkpoint.save(self.config.logdir, state, keep=self.config.keep_checkpoints)
        if with_experience:
            self.experience.save(self.config.logdir)


def seed_everything(seed: int) -> None:
    """Seeds torch, NumPy's global generator and Python's `random` in this process (envs are seeded per env id
    from the same `--seed` by their actors)."""
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)


def rng_states() -> dict[str, Any]:
    """The random generators' states of this process, for the checkpoint."""
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def restore_rng_states(states: dict[str, Any] | None) -> None:
    """Sets the generators to the states `rng_states` returned (nothing for None or an empty dict)."""
    if not states:
        return
    torch.set_rng_state(states["torch"])
    np.random.set_state(states["numpy"])
    random.setstate(states["python"])
