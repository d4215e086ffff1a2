"""The football family's declarations (envs/__init__.py), importable without torch and gfootball: its flags, each
agent's defaults on Football and its reporting hooks. The envs themselves are in envs/football.py."""

from __future__ import annotations

import dataclasses
from typing import Any

from seed.envs.base import flag


@dataclasses.dataclass
class Options:
    """The football family's flags (envs/football.py's module docstring says what each does to the envs)."""

    smm_size: str = flag("default", "Football: super mini map size, default|medium|large.")
    football_rewards: str = flag("scoring", "Football: scoring or scoring,checkpoints.")


# The raw reward is the goal difference, the env reward may be shaped (checkpoints): log both returns.
SHOWS_RAW_RETURN = True
# Each agent's defaults on Football (envs/__init__.py: AGENT_DEFAULTS).
AGENT_DEFAULTS: dict[str, dict[str, Any]] = {
    # SEED's tuned "scoring" run.
    "vtrace": dict(network="football", use_lstm=False, unroll_length=32, batch_size=32, inference_batch_size=64,
                   learning_rate=5.53e-5, entropy_cost=3.19e-5, discounting=0.997, lambda_=0.9),
    "r2d2": dict(network="football", use_lstm=True, lstm_size=256, unroll_length=32, burn_in=8,
                 replay_capacity=20_000, replay_min_size=500, discounting=0.997, learning_rate=1e-4,
                 adam_epsilon=1e-3, grad_clip_norm=80.0),
    # HTS-RL's (rollouts of 128, 2 epochs x 8 minibatches, lr 3.43e-4), trained synchronously (`--sync=hts`).
    "ppo": dict(sync="hts", sync_every=128, use_lstm=False, lambda_=0.95, baseline_cost=0.5, network="football_small",
                learning_rate=3.43e-4, entropy_cost=0.01, discounting=0.993, grad_clip_norm=0.5, ppo_epochs=2,
                ppo_minibatches=8),
}
