"""Agents the learner can drive, each a folder: `--agent=vtrace` (IMPALA), `--agent=r2d2`, `--agent=ppo` (HTS-RL)
or `--agent=muzero` (EfficientZero). agents/registry.py names them; seed/contracts/agent.py is the contract
every agent implements (the framework calls nothing else); agents/options.py holds option groups several agents'
configurations share.
"""

from seed.agents.registry import agent_class, config_class, names

__all__ = ["agent_class", "config_class", "names"]
