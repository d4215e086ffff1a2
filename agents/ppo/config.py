"""The PPO (HTS-RL) agent's flags (`--agent=ppo`)."""

from __future__ import annotations

import dataclasses

from seed.agents.options import ActorCriticOptions, BoxPolicyOptions, InputStatisticsOptions, NetworkOptions
from seed.config import option
from seed.contracts.agent import AgentConfig


@dataclasses.dataclass
class PPOConfig(AgentConfig, NetworkOptions, ActorCriticOptions, InputStatisticsOptions, BoxPolicyOptions):
    ppo_clip: float = option(0.2, "PPO: epsilon of the clipped surrogate, ratio clipped to [1 - eps, 1 + eps].")
    ppo_epochs: int = option(2, "PPO: passes over each rollout per learner update.")
    ppo_minibatches: int = option(8, "PPO: minibatches per pass; each holds all steps of about B / this many envs "
                                     "(with --ppo_shuffle_steps: about T x B / this many single steps).")
    ppo_shuffle_steps: bool = option(False, "PPO: minibatches of single steps drawn from the whole rollout (CleanRL's "
                                            "shuffle), not whole env columns; needs a network without memory (no "
                                            "LSTM, no frame stack).")
    ppo_decoupled: bool = option(False, "PPO: clip the ratio against the policy at the start of each update, weighting "
                                        "each sample by that policy's probability over the behaviour policy's "
                                        "(Hilton et al. 2022's decoupled objective). HTS acts one update behind, so "
                                        "the plain ratio starts away from 1.")
    ppo_decoupled_weight_clip: float = option(0.0, "PPO with --ppo_decoupled: truncate each sample's weight "
                                                   "pi_prox / mu at this (V-trace's rho-bar, e.g. 1); 0: none.")
    ppo_value_clip: float = option(0.0, "PPO: keep the value loss's step within +- this of the value at the start of "
                                        "each update, taking the larger of the clipped and unclipped squared errors "
                                        "(CleanRL's clip_vloss, which uses the ratio's clip, 0.2); 0: no clipping.")
    anneal_learning_rate: bool = option(False, "PPO: decay the learning rate linearly from --learning_rate to 0 over "
                                               "--total_environment_frames (CleanRL's anneal_lr).")
