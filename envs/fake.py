"""`--env=fake:<kind>`: deterministic envs with near-zero step cost, for tests and benchmarks.

Kinds:
  vector  observation float32 [8], 4 actions, action repeat 1.
  atari   observation uint8 [84, 84], 18 actions, action repeat 4, frame stack 4 (Atari-sized data).

Every episode lasts `fake_episode_length` agent steps (default 100). At step t the env shows a "target"
action (t mod num_actions, one-hot in the vector observation, brightness in the image) and pays reward 1
when the agent plays it, so a policy can learn it: a cheap learning signal for end-to-end tests. All K
envs of an actor step in one vectorised NumPy call.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from seed.envs.base import BatchStep, EnvSpec, EpisodeStats, flag
from seed.envs.gym import AGENT_DEFAULTS as gym_defaults

_KINDS = {
    "vector": dict(observation_shape=(8,), observation_dtype="float32", num_actions=4),
    "atari": dict(observation_shape=(84, 84), observation_dtype="uint8", num_actions=18, action_repeat=4,
                  frame_stack=4),
}


@dataclasses.dataclass
class Options:
    """The fake family's flags (envs/__init__.py)."""

    fake_episode_length: int = flag(100, "fake: agent steps per episode.")


# Each agent's defaults on fake (envs/__init__.py: AGENT_DEFAULTS): short unrolls and small batches for tests;
# r2d2 and muzero take their gym settings.
AGENT_DEFAULTS: dict[str, dict[str, Any]] = {
    "vtrace": dict(unroll_length=20, batch_size=16, use_lstm=False),
    "ppo": dict(sync="hts", sync_every=20, use_lstm=False, lambda_=0.95, baseline_cost=0.5),
    "r2d2": gym_defaults["r2d2"],
    "muzero": gym_defaults["muzero"],
}


def make_spec(name: str, options: dict[str, Any]) -> EnvSpec:
    if name not in _KINDS:
        raise ValueError(f"--env=fake:{name}: unknown kind {name!r}, expected one of {', '.join(_KINDS)}")
    return EnvSpec(name=f"fake:{name}", **_KINDS[name])


class FakeEnvBatch:
    def __init__(self, spec: EnvSpec, num_envs: int, first_env_id: int, episode_length: int):
        if episode_length < 1:
            raise ValueError(f"fake_episode_length: got {episode_length}, expected >= 1")
        self.spec = spec
        self.num_envs = num_envs
        self.episode_length = episode_length
        # Stagger episodes by env id so envs do not all finish on the same step.
        self._offset = (first_env_id + np.arange(num_envs)) % episode_length
        self._t = np.zeros(num_envs, np.int64)
        self._returns = np.zeros(num_envs, np.float64)

    def _target(self) -> np.ndarray:
        return (self._t + self._offset) % self.spec.num_actions

    def _observe(self) -> np.ndarray:
        target = self._target()
        if self.spec.observation_dtype == "uint8":
            brightness = (target * (255 // self.spec.num_actions)).astype(np.uint8)
            return np.broadcast_to(brightness[:, None, None], (self.num_envs,) + self.spec.observation_shape).copy()
        observation = np.zeros((self.num_envs,) + self.spec.observation_shape, np.float32)
        observation[np.arange(self.num_envs), target] = 1.0
        return observation

    def reset(self) -> np.ndarray:
        self._t[:] = 0
        self._returns[:] = 0
        return self._observe()

    def step(self, actions: np.ndarray) -> BatchStep:
        reward = (np.asarray(actions) == self._target()).astype(np.float32)
        self._returns += reward
        self._t += 1
        done = self._t >= self.episode_length
        finished = [
            EpisodeStats(int(k), float(self._returns[k]), float(self._returns[k]), int(self._t[k]),
                         int(self._t[k]) * self.spec.action_repeat, truncated=False)
            for k in np.flatnonzero(done)
        ]
        self._t[done] = 0
        self._returns[done] = 0
        return BatchStep(self._observe(), reward, done, np.zeros(self.num_envs, bool), finished)

    def close(self) -> None:
        pass


def make_batch(name: str, num_envs: int, first_env_id: int, options: dict[str, Any]) -> FakeEnvBatch:
    episode_length = int(options.get("fake_episode_length", Options.fake_episode_length))
    return FakeEnvBatch(make_spec(name, options), num_envs, first_env_id, episode_length)
