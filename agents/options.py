"""Option groups that several agents' configurations share (each agent's dataclass inherits the groups it uses).

  NetworkOptions      the torso and core of agents/networks.py (V-trace, PPO, R2D2; MuZero's MLP and LSTM sizes)
  ActorCriticOptions  the actor-critic losses' weights, lambda and reward clipping (V-trace, PPO)
  InputStatisticsOptions  running observation normalisation and return-based reward scaling (V-trace, PPO)
  BoxPolicyOptions    the tanh-Gaussian policy on Box action spaces (V-trace, PPO)
"""

from __future__ import annotations

import dataclasses

from seed.agents.distributions import BOX_POLICIES
from seed.config import option


@dataclasses.dataclass
class NetworkOptions:
    """The network flags of agents/networks.py."""

    network: str = option("auto", "mlp, impala_deep, nature, dqn_small, football or football_small; auto = mlp "
                                  "for vectors, else the agent's "
                                  "image network.")
    network_width: int = option(1, "Filter multiplier for image networks (paper Table 4 compares 1, 2, 4).")
    use_lstm: bool = option(True, "Put an LSTM core after the torso.")
    lstm_size: int = option(256, "LSTM hidden units.")
    mlp_sizes: str = option("64,64", "Hidden layer sizes of the MLP torso, comma-separated.")


def check_network_options(config: NetworkOptions) -> None:
    """Refusals of the network flags (ValueError naming the field, the value and what was expected)."""
    if config.network_width < 1:
        raise ValueError(f"--network_width: got {config.network_width!r}, expected >= 1")


@dataclasses.dataclass
class ActorCriticOptions:
    """The actor-critic flags shared by V-trace and PPO."""

    lambda_: float = option(1.0, "Lambda of the V-trace targets (V-trace) or of GAE (PPO).")
    entropy_cost: float = option(2.5e-4, "Entropy bonus weight.")
    baseline_cost: float = option(0.5, "Baseline loss weight (times 0.5 (vs - V)^2).")
    max_abs_reward: float = option(0.0, "Clip rewards to [-x, x] for the loss; 0 = off.")
    eval_greedy: bool = option(False, "Evaluation envs (and seed-eval) play the policy's argmax instead of "
                                      "sampling from it.")


@dataclasses.dataclass
class InputStatisticsOptions:
    """Running statistics of the inputs (agents/normalization.py), updated from training batches."""

    normalize_observations: bool = option(False, "Normalise vector observations by their running mean and std "
                                                 "(network buffers: published to inference, checkpointed), "
                                                 "clipped to +-observation_clip.")
    observation_clip: float = option(10.0, "Clip of the normalised observations (SEED's and CleanRL's 10).")
    normalize_rewards: bool = option(False, "Divide the rewards the loss sees by the running std of each env's "
                                            "discounted return (CleanRL's normalize_reward); logged returns stay "
                                            "raw.")
    reward_clip: float = option(10.0, "Clip of the scaled rewards with --normalize_rewards (CleanRL's 10).")


@dataclasses.dataclass
class BoxPolicyOptions:
    """The Gaussian policy on Box action spaces (agents/gaussian_actor_critic.py), tanh-squashed by default."""

    policy_min_std: float = option(1e-3, "Box actions: the Gaussian's minimum std (SEED's 1e-3).")
    initial_log_std: float = option(0.0, "Box actions: the initial log std, a state-independent parameter "
                                         "(CleanRL's 0).")
    box_policy: str = option("tanh", "Box actions: tanh (the Gaussian squashed into the bounds, SEED's) or clipped "
                                     "(unsquashed; the env clips the action, CleanRL's ppo_continuous_action).")


def check_input_statistics_options(config: InputStatisticsOptions) -> None:
    """Refusals of the input-statistics and Box policy flags (ValueError naming the field, value and expected)."""
    checks = [("observation_clip", config.observation_clip > 0, "> 0"),
              ("reward_clip", config.reward_clip > 0, "> 0")]
    if isinstance(config, BoxPolicyOptions):
        checks.append(("policy_min_std", config.policy_min_std > 0, "> 0"))
        checks.append(("box_policy", config.box_policy in BOX_POLICIES, " or ".join(BOX_POLICIES)))
    for name, ok, expected in checks:
        if not ok:
            raise ValueError(f"--{name}: got {getattr(config, name)!r}, expected {expected}")
