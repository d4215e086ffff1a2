"""Data contracts: the records and the agent interface that producers and consumers import from one home.

  inference.py  State, InferenceBatch, ActOutput, FinishedEpisodes: inference <-> `agent.act`, the learner
  agent.py      Agent (every member the framework calls), AgentConfig, UpdateStep, UpdateOutput

The training side's records (Unroll, TrainingBatch, LossOutput) live in seed/contracts/training.py. Nothing here imports
a
part of seed that imports it back.
"""

from seed.contracts.agent import Agent, AgentConfig, GradientShard, UpdateOutput, UpdateStep, gradient_step
from seed.contracts.inference import ActOutput, FinishedEpisodes, InferenceBatch, State

__all__ = ["ActOutput", "Agent", "AgentConfig", "FinishedEpisodes", "GradientShard", "InferenceBatch", "State",
           "UpdateOutput", "UpdateStep", "gradient_step"]
