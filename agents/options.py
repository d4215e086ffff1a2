"""Option groups that several agents' configurations share (each agent's dataclass inherits the groups it uses).

  NetworkOptions      the torso and core of agents/networks.py (V-trace, PPO, R2D2; MuZero's MLP and LSTM sizes)
  ActorCriticOptions  the actor-critic losses' weights, lambda and reward clipping (V-trace, PPO)
"""

from __future__ import annotations

import dataclasses

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
