"""Environment contracts shared by every env family.

An actor process owns one `EnvBatch` of K environments. It steps them together, resets finished ones at
once and reports, per env, the SEED step semantics (see docs/ARCHITECTURE.md):

- `done[k] = True`: the reward is the last reward of the old episode and the observation is the first
  observation of the new episode (the env was reset in the same step).
- `truncated[k] = True` (only together with done): the old episode ended by the time limit, not by a
  terminal state, so a loss may bootstrap through it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """What the learner must know about an env family instance; sent in the actor's handshake.

    Attributes:
      name: the `--env` value, e.g. "atari:Pong" or "gym:CartPole-v1".
      observation_shape: shape of ONE observation as the actor sends it (a single frame for images,
        e.g. (84, 84); the learner stacks frames).
      observation_dtype: numpy dtype name of the observation ("uint8", "float32").
      num_actions: size of the Discrete action space; 0 for a Box.
      action_repeat: env frames per agent step (Atari 4, Football 1, gym 1).
      frame_stack: how many frames the learner stacks into the network input (Atari 4, else 1).
      action_shape: () for a Discrete action space (`num_actions` actions), (D,) for a Box of D values.
      action_low, action_high: a Box's bounds in the env's units, D values each (() for a Discrete space); the
        env clips every action into them before stepping.

    Actions (the agent's `ActOutput.action`, `InferenceBatch.prev_action`, the unroll's `action` column): Discrete:
    int64 [B] (int32 [K] on the wire and in the step slab); Box: float32 [B, D] everywhere (`action_dtype` on the
    wire, `batch_action_dtype` on the learner).
    """

    name: str
    observation_shape: tuple[int, ...]
    observation_dtype: str
    num_actions: int
    action_repeat: int = 1
    frame_stack: int = 1
    action_shape: tuple[int, ...] = ()
    action_low: tuple[float, ...] = ()
    action_high: tuple[float, ...] = ()

    def __post_init__(self):
        # Specs also arrive as JSON (the serving process's configuration) and protobuf (the handshake): the
        # sequences become tuples, so that two equal specs compare equal whatever carried them.
        for name, kind in (("observation_shape", int), ("action_shape", int), ("action_low", float),
                           ("action_high", float)):
            object.__setattr__(self, name, tuple(kind(v) for v in getattr(self, name)))
        self.check_action_space()

    def check_action_space(self) -> None:
        """Raises ValueError naming the field unless the action fields describe one Discrete or one Box space."""
        if not self.action_shape:
            if self.action_low or self.action_high:
                raise ValueError(f"{self.name}: action_low/action_high: got {self.action_low}/{self.action_high}, "
                                 "expected () for a Discrete action space (action_shape ())")
            return
        if len(self.action_shape) != 1 or self.action_shape[0] < 1:
            raise ValueError(f"{self.name}: action_shape: got {self.action_shape}, expected () (Discrete) or (D,) "
                             "with D >= 1 (Box)")
        if self.num_actions != 0:
            raise ValueError(f"{self.name}: num_actions: got {self.num_actions}, expected 0 for a Box action space")
        for field in ("action_low", "action_high"):
            if len(getattr(self, field)) != self.action_shape[0]:
                raise ValueError(f"{self.name}: {field}: got {len(getattr(self, field))} values, expected "
                                 f"{self.action_shape[0]} (action_shape {self.action_shape})")
        if any(lo > hi or lo != lo or hi != hi for lo, hi in zip(self.action_low, self.action_high, strict=True)):
            raise ValueError(f"{self.name}: action bounds: got low {self.action_low}, high {self.action_high}, "
                             "expected low <= high in every dimension")

    @property
    def continuous(self) -> bool:
        """True for a Box action space (action vectors), False for a Discrete one (action indices)."""
        return bool(self.action_shape)

    @property
    def action_space(self) -> str:
        """The action space in words, for messages: "Discrete(6)" or "Box(3,)"."""
        if self.continuous:
            return f"Box({', '.join(map(str, self.action_shape))},)"
        return f"Discrete({self.num_actions})"

    @property
    def action_dtype(self) -> str:
        """numpy dtype of actions on the wire and in the step slab: "int32" (Discrete) or "float32" (Box)."""
        return "float32" if self.continuous else "int32"

    @property
    def batch_action_dtype(self) -> str:
        """numpy dtype of actions on the learner (act, the unrolls, replay): "int64" (Discrete) or "float32"."""
        return "float32" if self.continuous else "int64"

    def random_actions(self, rng: np.random.Generator, count: int) -> np.ndarray:
        """`count` uniform random actions in the wire dtype: indices int32 [count] in [0, num_actions), or
        float32 [count, D] uniform in [low, high] (benchmarks' stand-in policy)."""
        if self.continuous:
            low, high = np.asarray(self.action_low, np.float32), np.asarray(self.action_high, np.float32)
            return rng.uniform(low, high, (count, *self.action_shape)).astype(np.float32)
        return rng.integers(0, self.num_actions, count).astype(np.int32)

    def zero_actions(self, count: int) -> np.ndarray:
        """`count` all-zero actions in the wire dtype, int32 [count] or float32 [count, D] (the env clips a zero
        outside its bounds)."""
        return np.zeros((count, *self.action_shape), self.action_dtype)

    def check_observation(self, observation: np.ndarray) -> None:
        if tuple(observation.shape) != self.observation_shape:
            raise ValueError(f"observation shape: got {tuple(observation.shape)}, expected {self.observation_shape}")
        if observation.dtype != np.dtype(self.observation_dtype):
            raise ValueError(f"observation dtype: got {observation.dtype}, expected {self.observation_dtype}")


@dataclasses.dataclass(frozen=True)
class StepResult:
    """One agent step of one env (gymnasium-style, plus the raw reward SEED logs)."""

    observation: np.ndarray
    reward: float
    terminated: bool
    truncated: bool
    raw_reward: float  # the score to log, e.g. goals in Football; equals reward elsewhere


@dataclasses.dataclass(frozen=True)
class EpisodeStats:
    """A finished episode, as the actor saw it. `frames` are env frames (agent steps x action repeat)."""

    env_index: int  # index within the actor, in [0, K)
    episode_return: float
    raw_return: float
    steps: int  # agent steps
    frames: int  # env frames
    truncated: bool


class Env(Protocol):
    """A single environment. `step` does the whole action repeat and returns one agent step."""

    spec: EnvSpec

    def reset(self) -> np.ndarray: ...

    def step(self, action: int | np.ndarray) -> StepResult:
        """One agent step: an int for a Discrete space, a float32 [D] vector for a Box (the env clips it)."""
        ...

    def close(self) -> None: ...


@dataclasses.dataclass
class BatchStep:
    """The result of stepping K envs once. Arrays have leading dimension K."""

    observation: np.ndarray  # [K, *observation_shape]
    reward: np.ndarray  # [K] float32
    done: np.ndarray  # [K] bool
    truncated: np.ndarray  # [K] bool
    finished: list[EpisodeStats]


class EnvBatch(Protocol):
    """K environments stepped together by one actor process."""

    spec: EnvSpec
    num_envs: int

    def reset(self) -> np.ndarray:
        """Resets every env; returns observations [K, *observation_shape]."""
        ...

    def step(self, actions: np.ndarray) -> BatchStep:
        """Steps every env with actions [K] (Discrete) or [K, D] (Box); finished envs are reset and report their
        new first frame."""
        ...

    def close(self) -> None: ...


class SequentialEnvBatch:
    """Steps K `Env`s one after another in this process; the generic `EnvBatch`."""

    def __init__(self, envs: Sequence[Env]):
        if not envs:
            raise ValueError("num_envs: got 0, expected at least 1")
        self.envs = list(envs)
        self.spec = self.envs[0].spec
        self.num_envs = len(self.envs)
        self._returns = np.zeros(self.num_envs, np.float64)
        self._raw_returns = np.zeros(self.num_envs, np.float64)
        self._steps = np.zeros(self.num_envs, np.int64)
        shape = (self.num_envs,) + self.spec.observation_shape
        self._observation = np.zeros(shape, self.spec.observation_dtype)

    def reset(self) -> np.ndarray:
        for k, env in enumerate(self.envs):
            self._observation[k] = env.reset()
        self._returns[:] = 0
        self._raw_returns[:] = 0
        self._steps[:] = 0
        return self._observation.copy()

    def step(self, actions: np.ndarray) -> BatchStep:
        reward = np.zeros(self.num_envs, np.float32)
        done = np.zeros(self.num_envs, bool)
        truncated = np.zeros(self.num_envs, bool)
        finished = []
        continuous = self.spec.continuous
        for k, env in enumerate(self.envs):
            result = env.step(actions[k] if continuous else int(actions[k]))
            reward[k] = result.reward
            self._returns[k] += result.reward
            self._raw_returns[k] += result.raw_reward
            self._steps[k] += 1
            if result.terminated or result.truncated:
                done[k] = True
                truncated[k] = result.truncated and not result.terminated
                finished.append(
                    EpisodeStats(
                        env_index=k,
                        episode_return=float(self._returns[k]),
                        raw_return=float(self._raw_returns[k]),
                        steps=int(self._steps[k]),
                        frames=int(self._steps[k]) * self.spec.action_repeat,
                        truncated=bool(truncated[k]),
                    )
                )
                self._returns[k] = self._raw_returns[k] = 0
                self._steps[k] = 0
                self._observation[k] = env.reset()
            else:
                self._observation[k] = result.observation
        return BatchStep(self._observation.copy(), reward, done, truncated, finished)

    def close(self) -> None:
        for env in self.envs:
            env.close()


def flag(default: Any, help: str) -> Any:  # noqa: A002 - mirrors absl's naming
    """A field of a family's `Options` dataclass that becomes the flag --<name> of the learner, the actors and
    seed-eval (seed/config.py defines the flags), with this default and help."""
    return dataclasses.field(default=default, metadata={"help": help})


def option_defaults(options_class: type) -> dict[str, Any]:
    """A family's `Options` dataclass as {flag name: default}: what its envs use for an option not given."""
    return {f.name: f.default for f in dataclasses.fields(options_class)}


# An env family module exposes these two functions; `seed.envs.family_module(name)` finds them.
SpecFn = Callable[[str, dict[str, Any]], EnvSpec]
BatchFn = Callable[[str, int, int, dict[str, Any]], EnvBatch]
