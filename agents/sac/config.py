"""The SAC agent's flags (`--agent=sac`), with the central replay's. The critics and the temperature train at
--learning_rate (CleanRL's q_lr), the actor at --sac_policy_learning_rate."""

from __future__ import annotations

import dataclasses

from seed.config import ReplayOptions, option
from seed.contracts.agent import AgentConfig


@dataclasses.dataclass
class SACConfig(AgentConfig, ReplayOptions):
    sac_hidden_sizes: str = option("256,256", "SAC: hidden layer sizes of the actor and of each critic, "
                                              "comma-separated.")
    sac_policy_learning_rate: float = option(3e-4, "SAC: the actor's learning rate (the critics and the "
                                                   "temperature use --learning_rate).")
    sac_tau: float = option(0.005, "SAC: Polyak rate of the target critics, target <- tau online + (1 - tau) "
                                   "target after every update.")
    sac_policy_frequency: int = option(2, "SAC: the actor and the temperature train on every N-th update, N "
                                          "steps each time (TD3-style delay, CleanRL's policy_frequency).")
    sac_initial_alpha: float = option(1.0, "SAC: the temperature alpha before training (log alpha is learned "
                                           "towards the target entropy -D).")
