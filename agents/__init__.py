"""Agents the learner can drive: `--agent=vtrace` (IMPALA), `--agent=r2d2`, `--agent=ppo` (HTS-RL) or
`--agent=muzero` (EfficientZero).

An agent module exposes:

    default_config(env_family: str) -> dict      per-env-family defaults over LearnerConfig
    Agent(spec: EnvSpec, config: LearnerConfig)  with the methods the learner calls:
        initial_state(n) -> State                 zero per-env state rows [n, ...]
        to(device)                                moves the trained networks to the training device
        act(network, batch, state) -> ActOutput   on the inference device, under inference_mode
        loss(batch: TrainingBatch) -> LossOutput  on the training device
        after_update(train_steps)                 after each optimizer step (R2D2: target copy)
        network                                   the trained nn.Module (the learner copies it for inference)
        state_dict() / load_state_dict(d)         everything to checkpoint besides the optimizer
    optional:
        train_rollout(batch, optimizer, grad_clip_norm, update) -> metrics
                                                  one learner update that takes its own optimizer steps (PPO's
                                                  epochs x minibatches); without it the learner steps on `loss`
        SUPPORTS_SYNC = True (module level)       the agent can train with --sync=hts
"""

from __future__ import annotations

import importlib
from types import ModuleType

AGENTS = ("vtrace", "r2d2", "ppo", "muzero")


def agent_module(name: str) -> ModuleType:
    if name not in AGENTS:
        raise ValueError(f"--agent: got {name!r}, expected one of {', '.join(AGENTS)}")
    return importlib.import_module(f"seed.agents.{name}.agent")
