"""`--env=atari:<Game>`: Atari 2600 games through the Arcade Learning Environment, as the SEED paper ran them.

`<Game>` is the CamelCase name gymnasium's ALE ids use ("Pong", "Breakout", "MsPacman", "UpNDown"); it maps
to the ale-py ROM id ("ms_pacman"). The ROMs bundled with ale-py are used; `valid_games()` lists them.

Preprocessing (SEED paper, Table 9), all on raw emulator frames of 210 x 160:

- observation: one 84 x 84 uint8 grayscale frame per agent step (ALE's `getScreenGrayscale`, bilinear resize
  with `cv2.INTER_LINEAR`; `atari_frame_size` sets another size, e.g. EfficientZero's 96); the learner stacks 4
  of them (`EnvSpec.frame_stack`).
- action repeat 4: one agent step = 4 raw frames, each a single `ALEInterface.act`; the reward of an agent
  step is the sum of the raw rewards of its frames (no clipping).
- frame pooling: the observation is the pixel-wise max of the last two raw frames of the repeat. With
  action repeat 1 the observation is that step's single raw frame (nothing to pool; every step shows a fresh
  frame, unlike the original SEED code whose preprocessing kept returning the reset frame there).
- reset: `reset_game`, then n raw NOOP frames (action 0), n uniform in [1, atari_noop_max] (default [1, 30]),
  before any action repetition; the reset observation is the max of the last two of those raw frames.
- full 18-action set; no terminal on loss of life; sticky actions off.
- episode cap: 108,000 raw frames since `reset_game`, no-op frames included (30 minutes at 60 Hz); reaching it
  ends the episode as a truncation (`truncated=True`, `terminated=False`). A game over in the same frame
  counts as termination.

Options (the `options` dict of `make_spec` / `make_batch`; all optional):

  seed                      int, default 0. Env i of the batch uses seed + first_env_id + i for both the ALE
                            `random_seed` setting and the NumPy generator that draws the no-op counts.
  action_repeat             int >= 1, default 4 (raw frames per agent step).
  sticky_actions            bool, default False; True sets ALE `repeat_action_probability` to 0.25.
  atari_minimal_action_set  bool, default False; True uses the game's minimal action set (Pong: 6).
  atari_max_frames          int >= 1, default 108000 (raw frames per episode before truncation).
  atari_noop_max            int >= 0, default 30 (0 disables the reset no-ops).
  atari_frame_size          int >= 8, default 84: observations are frame_size x frame_size (EfficientZero: 96).
  atari_vector_env          bool, default False; True steps the batch with ale-py's C++ threaded vector env
                            (`AleVectorEnvBatch`, see its docstring for where it departs from Table 9).
  atari_vector_threads      int >= 1, default 1: worker threads of the vector env.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import cv2
import numpy as np
from ale_py import Action, ALEInterface, LoggerMode, roms

from seed.envs.atari_config import Options
from seed.envs.base import (
    BatchStep,
    EnvBatch,
    EnvSpec,
    EpisodeStats,
    SequentialEnvBatch,
    StepResult,
    option_defaults,
)

OBSERVATION_SHAPE = (84, 84)  # (height, width) of one observation
FULL_ACTION_SET_SIZE = 18
STICKY_ACTION_PROBABILITY = 0.25
# Its flags' defaults (envs/atari_config.py: Options), and two options that are no flags.
DEFAULTS: dict[str, Any] = {"seed": 0, "action_repeat": 4, **option_defaults(Options), "atari_noop_max": 30,
                            "atari_vector_threads": 1}
FRAME_STACK = 4


ALEInterface.setLoggerMode(LoggerMode.Error)


# ----------------------------------------------------------------------------------------------- game names


def _rom_to_game(rom_id: str) -> str:
    """'ms_pacman' -> 'MsPacman' (the spelling of gymnasium's ALE ids)."""
    return rom_id.title().replace("_", "")


@functools.lru_cache(maxsize=1)
def _game_to_rom() -> dict[str, str]:
    return {_rom_to_game(rom_id): rom_id for rom_id in roms.get_all_rom_ids()}


def valid_games() -> list[str]:
    """The CamelCase game names accepted by `--env=atari:<Game>` (every ROM bundled with ale-py)."""
    return sorted(_game_to_rom())


def rom_id(game: str) -> str:
    """Maps a CamelCase game name ("MsPacman") to its ale-py ROM id ("ms_pacman"); ValueError if unknown."""
    table = _game_to_rom()
    if game in table:
        return table[game]
    close = [name for name in table if name.lower() == game.replace("_", "").lower()]
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ValueError(
        f"--env=atari:{game}: unknown game {game!r}, expected a CamelCase ALE game name such as 'Pong' or "
        f"'MsPacman'.{hint} Valid names: {', '.join(sorted(table))} "
        "(python -c 'import seed.envs.atari as a; print(a.valid_games())')."
    )


def _rom_path(game: str) -> str:
    path = roms.get_rom_path(rom_id(game))
    if path is None:
        raise ValueError(f"--env=atari:{game}: ale-py has no ROM file for {rom_id(game)!r}; reinstall ale-py")
    return str(path)


@functools.cache
def _game_info(game: str) -> tuple[int, tuple[int, int]]:
    """(minimal action set size, raw screen (height, width)) of a game; loads the ROM once."""
    ale = ALEInterface()
    ale.loadROM(_rom_path(game))
    height, width = ale.getScreenDims()
    return len(ale.getMinimalActionSet()), (int(height), int(width))


# ----------------------------------------------------------------------------------------------- options


def _int_option(options: dict[str, Any], key: str, minimum: int | None) -> int:
    value = options.get(key, DEFAULTS[key])
    expected = "an integer" if minimum is None else f"an integer >= {minimum}"
    if isinstance(value, bool) or not isinstance(value, (int, np.integer, str)):
        raise ValueError(f"{key}: got {value!r}, expected {expected}")
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"{key}: got {value!r}, expected {expected}") from None
    if minimum is not None and number < minimum:
        raise ValueError(f"{key}: got {number}, expected {expected}")
    return number


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def _bool_option(options: dict[str, Any], key: str) -> bool:
    value = options.get(key, DEFAULTS[key])
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise ValueError(f"{key}: got {value!r}, expected a boolean (True/False)")


@functools.cache
def _spec(game: str, action_repeat: int, minimal_action_set: bool, frame_size: int = OBSERVATION_SHAPE[0]) -> EnvSpec:
    num_actions = _game_info(game)[0] if minimal_action_set else FULL_ACTION_SET_SIZE
    return EnvSpec(
        name=f"atari:{game}",
        observation_shape=(frame_size, frame_size),
        observation_dtype="uint8",
        num_actions=num_actions,
        action_repeat=action_repeat,
        frame_stack=FRAME_STACK,
    )


def make_spec(name: str, options: dict[str, Any]) -> EnvSpec:
    """The spec of `--env=atari:<name>`: observation (84, 84) uint8 (option `atari_frame_size`), 18 actions (or the
    minimal set's size), action repeat 4 frames per agent step (option `action_repeat`), frame stack 4."""
    rom_id(name)  # validates the name first: its error is the most useful one
    return _spec(name, _int_option(options, "action_repeat", 1), _bool_option(options, "atari_minimal_action_set"),
                 _int_option(options, "atari_frame_size", 8))


# ----------------------------------------------------------------------------------------------- single env


def _resize(frame: np.ndarray, size: int = OBSERVATION_SHAPE[0]) -> np.ndarray:
    """[210, 160] uint8 -> [size, size] uint8 (default 84), bilinear."""
    return cv2.resize(frame, (size, size), interpolation=cv2.INTER_LINEAR)


def _check_options(action_repeat: int, noop_max: int, max_frames: int) -> None:
    if action_repeat < 1:
        raise ValueError(f"action_repeat: got {action_repeat}, expected an integer >= 1")
    if noop_max < 0:
        raise ValueError(f"atari_noop_max: got {noop_max}, expected an integer >= 0")
    if max_frames < 1:
        raise ValueError(f"atari_max_frames: got {max_frames}, expected an integer >= 1")

class AtariEnv:
    """One Atari game with the Table 9 preprocessing (see the module docstring), on `ale_py.ALEInterface`.

    `reset()` returns an [84, 84] uint8 observation; `step(action)` plays `action_repeat` raw frames and
    returns one agent step. `action` indexes the full 18-action set (or the minimal set). After an episode
    ends (terminated or truncated) call `reset()` before stepping again.
    """

    def __init__(
        self,
        game: str,
        seed: int,
        *,
        action_repeat: int = 4,
        noop_max: int = 30,
        max_frames: int = 108_000,
        sticky_actions: bool = False,
        minimal_action_set: bool = False,
        frame_size: int = OBSERVATION_SHAPE[0],
    ):
        _check_options(action_repeat, noop_max, max_frames)
        self.spec = _spec(game, action_repeat, minimal_action_set, frame_size)
        self.frame_size = frame_size
        self.game = game
        self.seed = int(seed)
        self.action_repeat = action_repeat
        self.noop_max = noop_max
        self.max_frames = max_frames

        self.ale = ALEInterface()
        # ALE's random_seed is a signed 32-bit int; its default sticky-action probability is 0.25, not 0.
        self.ale.setInt("random_seed", self.seed % (2**31))
        self.ale.setFloat("repeat_action_probability", STICKY_ACTION_PROBABILITY if sticky_actions else 0.0)
        self.ale.setInt("max_num_frames_per_episode", 0)  # the cap is counted here, to report truncation
        self.ale.loadROM(_rom_path(game))
        action_set = self.ale.getMinimalActionSet() if minimal_action_set else self.ale.getLegalActionSet()
        self.actions: list[Action] = list(action_set)
        if len(self.actions) != self.spec.num_actions:
            raise RuntimeError(f"{game}: ALE action set has {len(self.actions)} actions, spec {self.spec.num_actions}")
        height, width = self.ale.getScreenDims()
        # _pool[0]: last raw frame, _pool[1]: the one before it; both grayscale [height, width].
        self._pool = np.zeros((2, height, width), np.uint8)
        self._rng = np.random.default_rng(self.seed)
        self._episode_frames = 0  # raw frames since reset_game, no-ops included
        self._running = False
        self.last_noops = 0  # raw no-op frames played by the last reset

    def _grab(self, slot: int) -> None:
        self.ale.getScreenGrayscale(self._pool[slot])

    def _pooled_observation(self) -> np.ndarray:
        return _resize(np.maximum(self._pool[0], self._pool[1]), self.frame_size)

    def reset(self) -> np.ndarray:
        """Starts an episode: reset_game, then 1..noop_max raw NOOP frames. Returns [84, 84] uint8."""
        self.ale.reset_game()
        noops = int(self._rng.integers(1, self.noop_max + 1)) if self.noop_max > 0 else 0
        self._grab(0)
        for _ in range(noops):
            self._pool[1] = self._pool[0]
            self.ale.act(Action.NOOP)
            if self.ale.game_over():  # no game ends within 30 idle frames, but stay safe
                self.ale.reset_game()
            self._grab(0)
        if noops == 0:
            self._pool[1] = self._pool[0]
        self.last_noops = noops
        self._episode_frames = noops
        self._running = True
        return self._pooled_observation()

    def step(self, action: int) -> StepResult:
        """Plays `action` for `action_repeat` raw frames (fewer if the episode ends inside the repeat).

        Returns the [84, 84] uint8 observation (max of the last two raw frames; the last raw frame alone when
        the repeat is 1 or was cut short), the summed raw reward, and terminated (game over) / truncated
        (`max_frames` raw frames reached).
        """
        if not self._running:
            raise RuntimeError(f"atari:{self.game}: step() called before reset() or after the episode ended")
        if not 0 <= action < len(self.actions):
            raise ValueError(f"action: got {action}, expected an integer in [0, {len(self.actions)})")
        ale_action = self.actions[action]
        repeat = self.action_repeat
        reward = 0.0
        terminated = truncated = False
        played = 0
        for i in range(repeat):
            reward += self.ale.act(ale_action)
            played += 1
            self._episode_frames += 1
            if self.ale.game_over():
                terminated = True
            elif self._episode_frames >= self.max_frames:
                truncated = True
            if terminated or truncated:
                break
            if i == repeat - 2:
                self._grab(1)
        self._grab(0)
        if played == repeat and repeat > 1:
            observation = self._pooled_observation()
        else:
            observation = _resize(self._pool[0], self.frame_size)
        self._running = not (terminated or truncated)
        return StepResult(observation, reward, terminated, truncated, reward)

    def render_rgb(self) -> np.ndarray:
        """The colour screen of the last raw frame, uint8 [210, 160, 3] (ALE `getScreenRGB`; for videos, the
        observations are unaffected)."""
        return self.ale.getScreenRGB()

    def close(self) -> None:
        self._running = False


# ----------------------------------------------------------------------------------------------- vector env


class AleVectorEnvBatch:
    """K games stepped by ale-py's C++ vector env (`ale_py.vector_env.AtariVectorEnv`) on worker threads.

    Implements the `EnvBatch` protocol: `reset()` -> [K, 84, 84] uint8, `step(actions [K])` -> `BatchStep`
    with done[k] carrying the new episode's first frame (ALE's "SameStep" autoreset). The emulation, action
    repeat, grayscale and max-pool run in C++; the vector env returns raw 210 x 160 frames and the bilinear
    resize to 84 x 84 is done here with OpenCV, because ALE's own resize is hard-wired to `cv::INTER_AREA`.

    Differences from Table 9 / `AtariEnv` that ale-py 0.12 does not let us configure away:
    - reset no-ops: ALE draws n uniform in [0, noop_max - 1] (default [0, 29]) instead of [1, noop_max];
    - the episode cap counts raw frames from after the reset no-ops (so an episode may last up to
      noop_max - 1 frames longer than `atari_max_frames` raw frames since reset_game);
    - its random streams differ from `AtariEnv`'s, so equal seeds do not give equal episodes across the two.
    For that reason `SequentialEnvBatch` of `AtariEnv` is the default and this class is opt-in.
    """

    def __init__(
        self,
        game: str,
        num_envs: int,
        seeds: Sequence[int],
        *,
        action_repeat: int = 4,
        noop_max: int = 30,
        max_frames: int = 108_000,
        sticky_actions: bool = False,
        minimal_action_set: bool = False,
        num_threads: int = 1,
        frame_size: int = OBSERVATION_SHAPE[0],
    ):
        from ale_py.vector_env import AtariVectorEnv

        if num_envs < 1:
            raise ValueError(f"num_envs: got {num_envs}, expected at least 1")
        if len(seeds) != num_envs:
            raise ValueError(f"seeds: got {len(seeds)} seeds, expected {num_envs} (one per env)")
        if num_threads < 1:
            raise ValueError(f"atari_vector_threads: got {num_threads}, expected an integer >= 1")
        _check_options(action_repeat, noop_max, max_frames)
        self.spec = _spec(game, action_repeat, minimal_action_set, frame_size)
        self.num_envs = num_envs
        self.game = game
        self._seeds = np.asarray([int(s) % (2**31) for s in seeds], np.int64)
        height, width = _game_info(game)[1]
        self._vec = AtariVectorEnv(
            rom_id(game),
            num_envs,
            num_threads=num_threads,
            max_num_frames_per_episode=max_frames,
            repeat_action_probability=STICKY_ACTION_PROBABILITY if sticky_actions else 0.0,
            full_action_space=not minimal_action_set,
            autoreset_mode="SameStep",
            img_height=height,  # raw size: no C++ resize (it would be INTER_AREA)
            img_width=width,
            grayscale=True,
            stack_num=1,
            frameskip=action_repeat,
            maxpool=action_repeat > 1,
            noop_max=noop_max,
            episodic_life=False,
            life_loss_info=False,
            reward_clipping=False,
            use_fire_reset=False,
        )
        if self._vec.single_action_space.n != self.spec.num_actions:
            raise RuntimeError(
                f"{game}: vector env has {self._vec.single_action_space.n} actions, spec {self.spec.num_actions}"
            )
        self._observation = np.zeros((num_envs,) + self.spec.observation_shape, np.uint8)
        self._returns = np.zeros(num_envs, np.float64)
        self._steps = np.zeros(num_envs, np.int64)
        self._seeded = False
        self._ready = False

    def _resize_into(self, raw: np.ndarray) -> np.ndarray:
        # raw: [K, 1, height, width] uint8
        for k in range(self.num_envs):
            cv2.resize(raw[k, 0], self.spec.observation_shape[::-1], dst=self._observation[k],
                       interpolation=cv2.INTER_LINEAR)
        return self._observation.copy()

    def reset(self) -> np.ndarray:
        """Resets every env (seeded on the first call); returns [K, 84, 84] uint8."""
        seed = None if self._seeded else self._seeds
        raw, _ = self._vec.reset(seed=seed)
        self._seeded = True
        self._ready = True
        self._returns[:] = 0
        self._steps[:] = 0
        return self._resize_into(raw)

    def step(self, actions: np.ndarray) -> BatchStep:
        """Steps every env by one agent step (`action_repeat` raw frames); actions [K] ints."""
        if not self._ready:
            raise RuntimeError(f"atari:{self.game}: step() called before reset()")
        actions = np.asarray(actions)
        if actions.shape != (self.num_envs,):
            raise ValueError(f"actions shape: got {actions.shape}, expected ({self.num_envs},)")
        if actions.size and (actions.min() < 0 or actions.max() >= self.spec.num_actions):
            raise ValueError(f"actions: got values in [{actions.min()}, {actions.max()}], "
                             f"expected integers in [0, {self.spec.num_actions})")
        raw, reward, terminated, truncated, _ = self._vec.step(actions.astype(np.int32))
        reward = reward.astype(np.float32)
        terminated = terminated.astype(bool)
        done = terminated | truncated.astype(bool)
        truncated = done & ~terminated
        self._returns += reward
        self._steps += 1
        finished = []
        for k in np.flatnonzero(done):
            steps = int(self._steps[k])
            finished.append(EpisodeStats(int(k), float(self._returns[k]), float(self._returns[k]), steps,
                                         steps * self.spec.action_repeat, bool(truncated[k])))
        self._returns[done] = 0
        self._steps[done] = 0
        return BatchStep(self._resize_into(raw), reward, done, truncated, finished)

    def close(self) -> None:
        self._ready = False
        self._vec.close()


# ----------------------------------------------------------------------------------------------- batch


def make_batch(name: str, num_envs: int, first_env_id: int, options: dict[str, Any]) -> EnvBatch:
    """K = num_envs games; env i is seeded with options["seed"] + first_env_id + i.

    Returns a `SequentialEnvBatch` of `AtariEnv`, or an `AleVectorEnvBatch` with options["atari_vector_env"].
    """
    rom_id(name)
    if num_envs < 1:
        raise ValueError(f"num_envs: got {num_envs}, expected at least 1")
    seed = _int_option(options, "seed", None)
    seeds = [seed + first_env_id + i for i in range(num_envs)]
    kwargs = dict(
        action_repeat=_int_option(options, "action_repeat", 1),
        noop_max=_int_option(options, "atari_noop_max", 0),
        max_frames=_int_option(options, "atari_max_frames", 1),
        sticky_actions=_bool_option(options, "sticky_actions"),
        minimal_action_set=_bool_option(options, "atari_minimal_action_set"),
        frame_size=_int_option(options, "atari_frame_size", 8),
    )
    if _bool_option(options, "atari_vector_env"):
        threads = _int_option(options, "atari_vector_threads", 1)
        return AleVectorEnvBatch(name, num_envs, seeds, num_threads=threads, **kwargs)
    return SequentialEnvBatch([AtariEnv(name, s, **kwargs) for s in seeds])
