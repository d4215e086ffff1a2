"""The atari family's declarations (envs/__init__.py), importable without ale-py: its flags, each agent's defaults on
Atari and its reporting hooks. The envs themselves are in envs/atari.py."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from seed.envs.base import flag


@dataclasses.dataclass
class Options:
    """The atari family's flags (envs/atari.py's module docstring says what each does to the envs)."""

    sticky_actions: bool = flag(False, "Atari: repeat the previous action with probability 0.25.")
    atari_minimal_action_set: bool = flag(False, "Atari: use the game's minimal action set instead of all 18.")
    atari_max_frames: int = flag(108_000, "Atari: episode cap in raw frames, reported as truncation.")
    atari_vector_env: bool = flag(False, "Atari: step an actor's envs with ale-py's threaded vector env.")
    atari_frame_size: int = flag(84, "Atari: observations are N x N grayscale frames (Table 9: 84; EfficientZero's "
                                     "Atari 100k: 96).")
    atari_scores_file: str = flag("", "CSV game,human,random adding reference scores for human-normalised "
                                      "Atari scores (the shipped table lacks random scores for some games).")


# Each agent's defaults on Atari (envs/__init__.py: AGENT_DEFAULTS).
AGENT_DEFAULTS: dict[str, dict[str, Any]] = {
    # The original SEED never shipped Atari V-trace: the IMPALA paper's Atari settings (unroll 20, discount 0.99,
    # entropy 0.01, rewards clipped to [-1, 1], gradient norm clip 40) with Adam as in SEED.
    "vtrace": dict(network="impala_deep", use_lstm=True, lstm_size=256, unroll_length=20, batch_size=32,
                   learning_rate=4.8e-4, entropy_cost=0.01, discounting=0.99, max_abs_reward=1.0,
                   grad_clip_norm=40.0),
    # SEED paper Table 8 (R2D2 on Atari-57), plus the network of appendix A.3.1.
    "r2d2": dict(network="nature", use_lstm=True, lstm_size=512, replay_ratio=0.75, unroll_length=80, burn_in=40,
                 replay_capacity=100_000, replay_min_size=5000, priority_exponent=0.9,
                 importance_sampling_exponent=0.6, discounting=0.997, batch_size=64, inference_batch_size=64,
                 learning_rate=1e-4, adam_epsilon=1e-3, target_update_interval=2500, value_rescaling_epsilon=1e-3,
                 grad_clip_norm=80.0, n_steps=5, epsilon_base=0.4, epsilon_alpha=7.0, eval_epsilon=1e-3,
                 priority_eta=0.9),
    # CleanRL's Atari PPO, trained synchronously (`--sync=hts`) in rollouts of 128.
    "ppo": dict(sync="hts", sync_every=128, use_lstm=False, lambda_=0.95, baseline_cost=0.5, network="nature",
                learning_rate=2.5e-4, entropy_cost=0.01, discounting=0.99, max_abs_reward=1.0, grad_clip_norm=0.5,
                ppo_clip=0.1, ppo_epochs=4, ppo_minibatches=4),
    # EfficientZero's Atari 100k configuration (efficientzero_facts.md, SpeedyZero Table 6) where this framework has
    # the setting. Not EfficientZero's: Adam instead of SGD 0.2 (the framework's optimizer), grayscale 84 x 84
    # frames (this family's), sequences of 10 positions in the replay instead of single positions.
    "muzero": dict(network="resnet", latent_channels=64, lstm_size=512, value_support_size=300,
                   reward_support_size=300, num_simulations=50, search="puct", unroll_steps=5, td_steps=5, burn_in=9,
                   unroll_length=10, value_prefix_horizon=5, discounting=0.997, batch_size=26, learning_rate=1e-3,
                   grad_clip_norm=10.0, priority_exponent=0.6, importance_sampling_exponent=0.4,
                   target_update_interval=200, td_age_updates=30_000, policy_cost=1.0, value_cost=0.25,
                   reward_cost=1.0, consistency_cost=2.0, dirichlet_alpha=0.3, exploration_fraction=0.25,
                   max_abs_reward=1.0, replay_capacity=10_000, replay_min_size=200, replay_ratio=4.0,
                   inference_batch_size=-1),
}
# seed-eval steps its envs one by one (the threaded vector env's resets depart from Table 9).
EVALUATION_OPTIONS: dict[str, Any] = {"atari_vector_env": False}


def reference_scores(name: str, settings: Mapping[str, Any]) -> tuple[float, float]:
    """(human, random) returns of the game (envs/atari_scores.py), with `--atari_scores_file`'s rows added."""
    from seed.envs.atari_scores import reference_scores as game_scores

    return game_scores(name, settings.get("atari_scores_file") or None)
