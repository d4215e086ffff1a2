"""The V-trace (IMPALA) agent's flags (`--agent=vtrace`)."""

from __future__ import annotations

import dataclasses

from seed.agents.options import ActorCriticOptions, BoxPolicyOptions, InputStatisticsOptions, NetworkOptions
from seed.config import option
from seed.contracts.agent import AgentConfig


@dataclasses.dataclass
class VTraceConfig(AgentConfig, NetworkOptions, ActorCriticOptions, InputStatisticsOptions, BoxPolicyOptions):
    clip_rho_threshold: float = option(1.0, "V-trace rho-bar.")
    clip_pg_rho_threshold: float = option(1.0, "V-trace rho-bar for the policy-gradient advantage.")
