"""`--env=minatar:<game>`: the five MinAtar games (Young & Tian 2019, `pip install minatar`) as the paper runs them.

`<game>` is MinAtar's own name: breakout, asterix, freeway, seaquest or space_invaders.

- observation: MinAtar's state, one bool [10, 10, C] array per agent step (height, width, channel; C per game in
  `CHANNELS`: breakout 4, asterix 4, freeway 7, seaquest 10, space_invaders 6), sent as it is. bool rather than
  uint8 or float32: one byte per cell like uint8 (a quarter of float32's bytes on the wire and in the replay), and
  every torso reads it as 0/1 (`.float()`), while uint8 observations are taken for pixels and scaled by 1/255.
  No frame stacking (the paper's agents see one state; the trail channels carry the motion).
- actions: MinAtar's 6 actions (no-op, left, up, right, down, fire) for every game, as the paper's agents use them;
  `minatar_minimal_action_set` keeps only the game's own (breakout 3, asterix 5, freeway 3, seaquest 6,
  space_invaders 4), mapped in MinAtar's order.
- MinAtar's defaults: sticky actions with probability 0.1 (the previous action is repeated), difficulty ramping
  on. Action repeat 1. Episodes end only when the game does (MinAtar has no time limit except Freeway's own 2,500
  steps, which MinAtar reports as terminal), so `truncated` is never set.
- seeding: env i of the batch seeds MinAtar's one NumPy RandomState (game dynamics and sticky actions alike) with
  seed + first_env_id + i once; later episodes continue that stream, as in the gym family.

Options (the `options` dict of `make_spec` / `make_batch`; all optional):

  seed                          int, default 0.
  minatar_sticky_actions        float in [0, 1], default 0.1: probability of repeating the previous action.
  minatar_difficulty_ramping    bool, default True.
  minatar_minimal_action_set    bool, default False.
  action_repeat                 must be 1 if given (MinAtar's games are not frame-skipped).

`MinAtarEnv.render_rgb()` draws the state for seed-eval's `--video` (the `render_rgb` option is not needed).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
from types import ModuleType
from typing import Any

import numpy as np

from seed.envs.base import EnvSpec, SequentialEnvBatch, StepResult, flag, option_defaults
from seed.envs.gym import AGENT_DEFAULTS as gym_defaults

# Channels of each game's [10, 10, C] state (minatar 1.0.15; tests/test_minatar.py checks them against the package).
CHANNELS = {"asterix": 4, "breakout": 4, "freeway": 7, "seaquest": 10, "space_invaders": 6}
# Each game's minimal action set as indices into the 6 actions (minatar 1.0.15's `minimal_action_set()`).
MINIMAL_ACTIONS = {"asterix": (0, 1, 2, 3, 4), "breakout": (0, 1, 3), "freeway": (0, 2, 4),
                   "seaquest": (0, 1, 2, 3, 4, 5), "space_invaders": (0, 1, 3, 5)}
FULL_ACTION_SET_SIZE = 6
GRID = 10
# render_rgb: a colour per channel (matplotlib's tab10; MinAtar's own display uses seaborn's cubehelix) and pixels per
# cell side (160 x 160 frames: video encoders want sizes divisible by 16).
PALETTE = np.array([[31, 119, 180], [255, 127, 14], [44, 160, 44], [214, 39, 40], [148, 103, 189], [140, 86, 75],
                    [227, 119, 194], [127, 127, 127], [188, 189, 34], [23, 190, 207]], np.uint8)
CELL_PIXELS = 16


@dataclasses.dataclass
class Options:
    """The minatar family's flags (envs/__init__.py; the module docstring says what each does)."""

    minatar_sticky_actions: float = flag(0.1, "MinAtar: probability of repeating the previous action (its 0.1).")
    minatar_difficulty_ramping: bool = flag(True, "MinAtar: the games speed up over an episode (its default).")
    minatar_minimal_action_set: bool = flag(False, "MinAtar: the game's own actions instead of all 6.")


DEFAULTS: dict[str, Any] = {"seed": 0, **option_defaults(Options)}

# Each agent's defaults on MinAtar (envs/__init__.py: AGENT_DEFAULTS).
AGENT_DEFAULTS: dict[str, dict[str, Any]] = {
    # The MinAtar paper's network (no LSTM, as its actor-critic); gym's batch sizes.
    "vtrace": dict(network="minatar", use_lstm=False, unroll_length=20, batch_size=16, learning_rate=6e-4,
                   entropy_cost=0.01, discounting=0.99, grad_clip_norm=40.0),
    # The MinAtar paper's network (its DQN's lr 2.5e-4, gamma 0.99) with a small LSTM.
    "r2d2": dict(network="minatar", use_lstm=True, lstm_size=128, unroll_length=20, burn_in=5, batch_size=32,
                 learning_rate=2.5e-4, adam_epsilon=1e-5, discounting=0.99, n_steps=3, replay_capacity=10_000,
                 replay_min_size=200, replay_ratio=2.0, target_update_interval=250, grad_clip_norm=40.0),
    # The Atari recipe (CleanRL's) on the MinAtar paper's network, rewards unclipped, synchronous (`--sync=hts`).
    "ppo": dict(sync="hts", sync_every=128, use_lstm=False, lambda_=0.95, baseline_cost=0.5, network="minatar",
                learning_rate=2.5e-4, entropy_cost=0.01, discounting=0.99, grad_clip_norm=0.5, ppo_clip=0.2,
                ppo_epochs=4, ppo_minibatches=4),
    # The gym settings on the ResNet model at MinAtar's 10 x 10 (no downsampling).
    "muzero": dict(gym_defaults["muzero"], network="minatar", latent_channels=32, lstm_size=128),
}


def check_game(game: str) -> None:
    if game not in CHANNELS:
        raise ValueError(f"--env=minatar:{game}: unknown game {game!r}, expected one of "
                         f"{', '.join(sorted(CHANNELS))} (MinAtar's lower-case names)")


def _sticky_option(options: dict[str, Any]) -> float:
    value = options.get("minatar_sticky_actions", DEFAULTS["minatar_sticky_actions"])
    try:
        probability = float(value)
    except (TypeError, ValueError):
        probability = float("nan")
    if isinstance(value, bool) or not 0.0 <= probability <= 1.0:
        raise ValueError(f"minatar_sticky_actions: got {value!r}, expected a probability in [0, 1]")
    return probability


def _bool_option(options: dict[str, Any], key: str) -> bool:
    value = options.get(key, DEFAULTS[key])
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("1", "true", "0", "false"):
        return value.strip().lower() in ("1", "true")
    raise ValueError(f"{key}: got {value!r}, expected a boolean (True/False)")


def _check_action_repeat(options: dict[str, Any]) -> None:
    repeat = options.get("action_repeat", 1)
    if repeat not in (0, 1):  # 0 is the flag's "family default"
        raise ValueError(f"action_repeat: got {repeat!r}, expected 1 (MinAtar games are not frame-skipped)")


def make_spec(name: str, options: dict[str, Any]) -> EnvSpec:
    """The spec of `--env=minatar:<name>`: observation (10, 10, C) bool, 6 actions (or the minimal set's size),
    action repeat 1, frame stack 1. Needs no `minatar` import (the learner builds it)."""
    check_game(name)
    _check_action_repeat(options)
    minimal = _bool_option(options, "minatar_minimal_action_set")
    return EnvSpec(name=f"minatar:{name}", observation_shape=(GRID, GRID, CHANNELS[name]), observation_dtype="bool",
                   num_actions=len(MINIMAL_ACTIONS[name]) if minimal else FULL_ACTION_SET_SIZE)


@functools.cache
def game_module(game: str) -> ModuleType:
    """MinAtar's module of one game (`minatar/environments/<game>.py`, which imports only NumPy), loaded from the
    installed package without running `minatar/__init__.py`: that imports matplotlib and seaborn (pandas, scipy)
    for its display code, 9 s of an actor's start on a loaded 2-core machine against none here."""
    check_game(game)
    found = importlib.util.find_spec("minatar")
    if found is None or not found.submodule_search_locations:
        raise ImportError("--env=minatar:*: needs the `minatar` package: pip install minatar "
                          "(or pip install -e '.[minatar]')")
    path = os.path.join(list(found.submodule_search_locations)[0], "environments", f"{game}.py")
    if not os.path.isfile(path):
        raise ImportError(f"--env=minatar:{game}: the installed minatar has no {path}; expected minatar 1.0.x")
    module_spec = importlib.util.spec_from_file_location(f"minatar.environments.{game}", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


class MinAtarEnv:
    """One MinAtar game with the spec of `make_spec`.

    The game is MinAtar's own `Env`; sticky actions and seeding are `minatar.Environment`'s, written out here (see
    `game_module` for why the wrapper is not imported): one RandomState, seeded once, drives both the game and the
    sticky-action draw (`rand() < p` before every step repeats the previous action, kept across episodes).
    tests/test_minatar.py checks equal frames against `minatar.Environment` for every game.

    `reset()` returns the first state, bool [10, 10, C]; `step(action)` plays one MinAtar step and returns its
    reward and state. After an episode ends call `reset()` before stepping again.
    """

    def __init__(self, game: str, seed: int, *, sticky_actions: float = 0.1, difficulty_ramping: bool = True,
                 minimal_action_set: bool = False):
        self.spec = make_spec(game, {"minatar_minimal_action_set": minimal_action_set})
        self.game = game
        self.sticky_actions = sticky_actions
        self._game = game_module(game).Env(ramping=difficulty_ramping)
        self._random = np.random.RandomState(int(seed) % (2**32))  # RandomState takes seeds in [0, 2**32)
        self._game.random = self._random
        self.actions = MINIMAL_ACTIONS[game] if minimal_action_set else tuple(range(FULL_ACTION_SET_SIZE))
        self._last_action = 0
        self._running = False

    def _state(self) -> np.ndarray:
        return np.asarray(self._game.state(), dtype=bool)

    def reset(self) -> np.ndarray:
        """Starts an episode; returns the first state, bool [10, 10, C]."""
        self._game.reset()
        self._running = True
        return self._state()

    def step(self, action: int) -> StepResult:
        """One MinAtar step: reward (MinAtar's, unclipped) and terminated (the game ended); never truncated."""
        if not self._running:
            raise RuntimeError(f"minatar:{self.game}: step() called before reset() or after the episode ended")
        if not 0 <= action < len(self.actions):
            raise ValueError(f"action: got {action}, expected an integer in [0, {len(self.actions)})")
        played = self.actions[action]
        if self._random.rand() < self.sticky_actions:
            played = self._last_action
        self._last_action = played
        reward, terminated = self._game.act(played)
        self._running = not terminated
        return StepResult(self._state(), float(reward), bool(terminated), False, float(reward))

    def render_rgb(self) -> np.ndarray:
        """The current state as a picture for seed-eval's videos, uint8 [160, 160, 3]: each cell in the colour of its
        highest set channel (MinAtar's display rule), black where none is set, 16 x 16 pixels a cell."""
        state = self._state()
        channels = state.shape[-1]
        top = channels - 1 - np.argmax(state[..., ::-1], axis=-1)  # [10, 10]: the highest set channel
        image = np.where(state.any(-1)[..., None], PALETTE[top], np.uint8(0))
        return np.repeat(np.repeat(image, CELL_PIXELS, axis=0), CELL_PIXELS, axis=1)

    def close(self) -> None:
        self._running = False


def make_batch(name: str, num_envs: int, first_env_id: int, options: dict[str, Any]) -> SequentialEnvBatch:
    check_game(name)
    _check_action_repeat(options)
    seed = int(options.get("seed", DEFAULTS["seed"]))
    kwargs = dict(sticky_actions=_sticky_option(options),
                  difficulty_ramping=_bool_option(options, "minatar_difficulty_ramping"),
                  minimal_action_set=_bool_option(options, "minatar_minimal_action_set"))
    return SequentialEnvBatch([MinAtarEnv(name, seed + first_env_id + i, **kwargs) for i in range(num_envs)])
