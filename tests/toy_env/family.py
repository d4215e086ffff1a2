"""Two toy games. `--env=toy:lights`: a light among `TOY_ACTIONS` is on; pressing its button pays 1 (a hit), another
pays nothing.

- observation: float32 [TOY_ACTIONS], one-hot of the light that is on; a new light (uniform, from the env's own
  generator seeded with seed + env id) after every step. Discrete(TOY_ACTIONS) actions, action repeat 1.
- an episode lasts `--toy_episode_length` agent steps (this family's own flag) and ends as a truncation.
- reward: 1 for a hit; the raw reward (the score) counts a hit as 10 points, so the family shows raw returns.
- human-normalised scores: human = every step a hit, random = one hit in TOY_ACTIONS.
- `render_rgb()`: a 16 x 16 x TOY_ACTIONS image strip with the light that is on drawn white.

`--env=toy:dial` (a Box action, for the agents with continuous actions): the observation is a target t, float32 [1]
uniform in [-1, 1], new after every step; the action a is a float32 [1] in [-1, 1]; the reward is 1 - |a - t| (1 at
the target; a uniform random action earns 1/3 on average). Raw reward = reward. An episode lasts
`--toy_episode_length` steps, as in lights.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from seed.envs.base import EnvSpec, SequentialEnvBatch, StepResult, flag

TOY_ACTIONS = 4
POINTS_PER_HIT = 10.0


@dataclasses.dataclass
class Options:
    """The toy family's flags: the learner, the actors and seed-eval get them beside the framework's."""

    toy_episode_length: int = flag(20, "toy: agent steps per episode.")


# Its defaults per agent, over the agent's own and under a preset's and the typed flags.
AGENT_DEFAULTS: dict[str, dict[str, Any]] = {
    "vtrace": dict(network="mlp", mlp_sizes="32", use_lstm=False, unroll_length=10, batch_size=4,
                   learning_rate=2e-3, entropy_cost=0.003),
    # dial: small critics and actor, training from 200 transitions, one update of 64 per agent step.
    "sac": dict(sac_hidden_sizes="64,64", batch_size=64, replay_capacity=20_000, replay_min_size=200,
                replay_ratio=64.0),
}
SHOWS_RAW_RETURN = True
EVALUATION_OPTIONS: dict[str, Any] = {"toy_evaluating": True}


def reference_scores(name: str, settings: Mapping[str, Any]) -> tuple[float, float]:
    """(human, random) returns in points: every step a hit, or one step in TOY_ACTIONS."""
    length = int(settings.get("toy_episode_length", Options.toy_episode_length))
    if name == "dial":
        return float(length), length / 3.0
    return POINTS_PER_HIT * length, POINTS_PER_HIT * length / TOY_ACTIONS


def make_spec(name: str, options: dict[str, Any]) -> EnvSpec:
    if name == "dial":
        return EnvSpec(name=f"toy:{name}", observation_shape=(1,), observation_dtype="float32", num_actions=0,
                       action_shape=(1,), action_low=(-1.0,), action_high=(1.0,))
    if name != "lights":
        raise ValueError(f"--env=toy:{name}: unknown game {name!r}, expected lights or dial")
    return EnvSpec(name=f"toy:{name}", observation_shape=(TOY_ACTIONS,), observation_dtype="float32",
                   num_actions=TOY_ACTIONS)


class _ToyEnv:
    """What both games share: the episode's length and step count, the env's own generator, seed-eval's flag.
    A game draws its next observation in `_observation` and scores an action in `_reward` (reward, raw reward)."""

    def __init__(self, spec: EnvSpec, seed: int, episode_length: int, evaluating: bool):
        if episode_length < 1:
            raise ValueError(f"toy_episode_length: got {episode_length}, expected >= 1")
        self.spec = spec
        self.episode_length = episode_length
        self.evaluating = evaluating  # seed-eval's EVALUATION_OPTIONS reached the env
        self._random = np.random.default_rng(seed)
        self._steps = 0

    def reset(self) -> np.ndarray:
        self._steps = 0
        return self._observation()

    def step(self, action) -> StepResult:
        reward, raw_reward = self._reward(action)
        self._steps += 1
        return StepResult(self._observation(), reward=reward, terminated=False,
                          truncated=self._steps >= self.episode_length, raw_reward=raw_reward)

    def close(self) -> None:
        pass


class LightsEnv(_ToyEnv):
    _light = 0

    def _observation(self) -> np.ndarray:
        self._light = int(self._random.integers(TOY_ACTIONS))
        return np.eye(TOY_ACTIONS, dtype=np.float32)[self._light]

    def _reward(self, action: int) -> tuple[float, float]:
        hit = float(int(action) == self._light)
        return hit, POINTS_PER_HIT * hit

    def render_rgb(self) -> np.ndarray:
        frame = np.zeros((16, 16 * TOY_ACTIONS, 3), np.uint8)
        frame[:, 16 * self._light:16 * (self._light + 1)] = 255
        return frame


class DialEnv(_ToyEnv):
    _target = 0.0

    def _observation(self) -> np.ndarray:
        self._target = float(self._random.uniform(-1.0, 1.0))
        return np.array([self._target], np.float32)

    def _reward(self, action: np.ndarray) -> tuple[float, float]:
        reward = 1.0 - abs(float(np.clip(np.asarray(action, np.float32).reshape(-1)[0], -1.0, 1.0)) - self._target)
        return reward, reward

    def render_rgb(self) -> np.ndarray:
        frame = np.zeros((16, 64, 3), np.uint8)
        frame[:, int(round((self._target + 1.0) / 2.0 * 63))] = 255
        return frame


def make_batch(name: str, num_envs: int, first_env_id: int, options: dict[str, Any]) -> SequentialEnvBatch:
    spec = make_spec(name, options)
    seed = int(options.get("seed", 0))
    length = int(options.get("toy_episode_length", Options.toy_episode_length))
    evaluating = bool(options.get("toy_evaluating", False))
    game = DialEnv if name == "dial" else LightsEnv
    return SequentialEnvBatch([game(spec, seed + first_env_id + i, length, evaluating) for i in range(num_envs)])
