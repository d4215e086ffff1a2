"""The R2D2 agent's flags (`--agent=r2d2`), with the central replay's."""

from __future__ import annotations

import dataclasses

from seed.agents.options import NetworkOptions
from seed.config import ReplayOptions, option
from seed.contracts.agent import AgentConfig


@dataclasses.dataclass
class R2D2Config(AgentConfig, NetworkOptions, ReplayOptions):
    n_steps: int = option(5, "R2D2: n of the n-step double-Q targets.")
    dueling_hidden: int = option(512, "R2D2: hidden units of each dueling stream (value and advantage); 0: no "
                                      "dueling, one linear layer from the features to the Q-values (the MinAtar "
                                      "paper's DQN head). MLP bodies use max(64, the last MLP size) unless 0.")
    value_rescaling: bool = option(True, "R2D2: learn Q in the rescaled space h(x) (R2D2's, for Atari's unclipped "
                                         "rewards); false: plain n-step targets, as DQN on clipped or small rewards.")
    value_rescaling_epsilon: float = option(1e-3, "R2D2: eps of h(x) = sign(x)(sqrt(|x|+1)-1)+eps x.")
    epsilon_base: float = option(0.4, "R2D2: training env i of N explores with base^(1 + alpha i / (N - 1)).")
    epsilon_alpha: float = option(7.0, "R2D2: alpha of the epsilon schedule.")
    epsilon_anneal_steps: int = option(0, "R2D2: anneal each training env's epsilon linearly from 1 down to its own "
                                          "(the schedule above) over this many agent steps of all training envs "
                                          "together (each env's own steps times their number; a resumed learner "
                                          "goes on from its checkpoint's steps; DQN anneals "
                                          "1 -> 0.1 over its first 1M frames, the MinAtar paper's over 100K); "
                                          "0 = off, R2D2's fixed epsilons.")
    eval_epsilon: float = option(1e-3, "R2D2: epsilon of eval envs.")
