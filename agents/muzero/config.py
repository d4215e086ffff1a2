"""The MuZero (EfficientZero, SpeedyZero) agent's flags (`--agent=muzero`), with the central replay's."""

from __future__ import annotations

import dataclasses

from seed.agents.options import NetworkOptions
from seed.config import ReplayOptions, option
from seed.contracts.agent import AgentConfig


@dataclasses.dataclass
class MuZeroConfig(AgentConfig, NetworkOptions, ReplayOptions):
    max_abs_reward: float = option(0.0, "Clip rewards to [-x, x] for the loss; 0 = off.")
    search: str = option("puct", "MuZero: puct (MuZero's pUCT, root Dirichlet noise, min-max normalised values) or "
                                 "gumbel (Gumbel MuZero's sequential halving at the root, for few simulations).")
    num_simulations: int = option(50, "MuZero: simulations per search (one batched recurrent call each).")
    search_backend: str = option("auto", "MuZero: how the search runs: numba (the compiled simulation loop; CPU "
                                         "only), numpy (numpy calls on the CPU, torch calls elsewhere: the "
                                         "reference) or auto (numba on the CPU, numpy elsewhere).")
    unroll_steps: int = option(5, "MuZero: K, the steps the model is unrolled from each trained position.")
    td_steps: int = option(5, "MuZero: n of the n-step value targets (before the off-policy correction).")
    td_age_updates: int = option(0, "MuZero: EfficientZero's off-policy correction: a step's value horizon shrinks "
                                    "by one per this many updates of its age (updates since it was acted), down "
                                    "to 1; 0 = off.")
    reanalyse_ratio: float = option(0.0, "MuZero: fraction of each training batch's sequences whose policy targets "
                                         "are recomputed by a search with the target network before the update "
                                         "(EfficientZero's reanalysis; 1 = every sequence, SpeedyZero's full "
                                         "reanalysis; 0 = the policies stored at acting). Runs where the update "
                                         "runs: the training process, or the learner's training thread.")
    reanalyse_workers: int = option(0, "MuZero: with --reanalyse_ratio > 0, processes that reanalyse each sampled "
                                       "batch beside the training process (SpeedyZero), batch k + 1 while batch k "
                                       "trains, with the target network synced to them at each target update; "
                                       "0 = reanalyse inside each update. Needs --training_process.")
    value_prefix_horizon: int = option(5, "MuZero: the value-prefix LSTM is reset every this many model steps.")
    value_support_size: int = option(300, "MuZero: value logits over the atoms -S..S of h(value).")
    reward_support_size: int = option(300, "MuZero: value-prefix logits over the atoms -S..S of h(prefix).")
    policy_cost: float = option(1.0, "MuZero: weight of the policy cross-entropy.")
    value_cost: float = option(0.25, "MuZero: weight of the value cross-entropy.")
    reward_cost: float = option(1.0, "MuZero: weight of the value-prefix cross-entropy.")
    consistency_cost: float = option(2.0, "MuZero: weight of the self-supervised consistency loss.")
    dirichlet_alpha: float = option(0.3, "MuZero: alpha of the root Dirichlet noise (training envs only; "
                                         "--search=puct only: a Gumbel search explores with its Gumbel noise and "
                                         "mixes no Dirichlet noise into its root prior or policy targets).")
    exploration_fraction: float = option(0.25, "MuZero: weight of the root Dirichlet noise in the prior.")
    visit_temperature: float = option(1.0, "MuZero: training envs sample actions from visit counts^(1 / T); "
                                           "evaluation envs play the most visited action.")
    latent_size: int = option(64, "MuZero MLP: dimension of the latent state.")
    latent_channels: int = option(64, "MuZero ResNet: channels of the latent state (EfficientZero: 64).")
    residual_blocks: int = option(1, "MuZero ResNet: residual blocks after the representation's torso, in the "
                                     "dynamics and before the prediction heads (EfficientZero: 1). 0 leaves one "
                                     "convolution in the dynamics and the heads on the latent: fewer "
                                     "multiply-adds per update, for CPUs.")
    projection_size: int = option(1024, "MuZero ResNet: width of the consistency loss's SimSiam projection (its "
                                        "hidden and output layers; the predictor's hidden layer is half of it). "
                                        "EfficientZero: 1024 on a 64 x 6 x 6 latent.")
