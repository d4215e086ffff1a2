"""`--env=football:<scenario>`: Google Research Football, as SEED RL ran it.

The env is gfootball's stacked "super mini-map" (SMM, representation 'extracted'): 4 binary planes (left team,
right team, ball, active player) for each of the last 4 frames, 16 planes of shape [H, W] with values 0 or 255.
The actor bit-packs them into one uint16 plane (bit i = plane i, planes ordered oldest frame first), so an
observation is uint16 [H, W], 8x less data than 16 uint8 planes; the learner unpacks with `unpack_smm`.

Options:
  smm_size          'default' (96x72), 'medium' (120x90) or 'large' (144x108), width x height.
  football_rewards  gfootball's reward spec, 'scoring' (default) or 'scoring,checkpoints'.
  seed              env i of the run is seeded from seed + first_env_id + i.

The reward is the env reward (shaped when checkpoints are on); the raw reward is the goal difference
(`info['score_reward']`). Episodes end when gfootball says done (terminated; never truncated). gfootball is
installed by `make football` (launch/install_football.sh); it needs gym==0.25.2 (old 4-tuple step API).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import pkgutil
import warnings
from typing import Any

import numpy as np
import torch

from seed.envs.base import EnvSpec, SequentialEnvBatch, StepResult, option_defaults
from seed.envs.football_config import Options

SMM_SIZES = {"default": (96, 72), "medium": (120, 90), "large": (144, 108)}  # (width, height)
NUM_PLANES = 16  # 4 SMM layers x 4 stacked frames
REWARD_COMPONENTS = ("scoring", "checkpoints")
DEFAULTS: dict[str, Any] = option_defaults(Options)  # its flags' (envs/football_config.py)

_INSTALL_HINT = "run `make football` (it calls launch/install_football.sh) to build and install it"


def _gfootball():
    """Imports gfootball.env, with an actionable error (ImportError) when it is missing."""
    # Never open a window: the engine runs headless (render=False) and SDL must not look for a display.
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    try:
        # gym 0.25.2 prints an "unmaintained" notice to stderr on import; we pin it knowingly (gfootball needs
        # its old API, and we never call gym.make, whose env checker is what breaks under NumPy 2).
        with contextlib.redirect_stderr(io.StringIO()):
            import gfootball.env as football_env
    except ImportError as e:
        raise ImportError(f"--env=football: gfootball is not importable ({e}); {_INSTALL_HINT}") from e
    _quiet_episode_lines()
    return football_env


class _NoEpisodeLines(logging.Filter):
    """Drops gfootball's INFO line per finished episode ("Episode reward: ... FPS: ..."): thousands of lines an
    hour per actor on stderr; the learner's metrics carry the same returns and scores. Warnings still pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno < logging.WARNING and record.module == "football_env_core")


def _quiet_episode_lines() -> None:
    absl_logger = logging.getLogger("absl")  # gfootball logs through absl.logging
    if not any(isinstance(f, _NoEpisodeLines) for f in absl_logger.filters):
        absl_logger.addFilter(_NoEpisodeLines())


def smm_size(options: dict[str, Any]) -> tuple[int, int]:
    """options['smm_size'] -> (width, height)."""
    value = options.get("smm_size", DEFAULTS["smm_size"])
    if not isinstance(value, str) or value not in SMM_SIZES:
        raise ValueError(f"smm_size: got {value!r}, expected one of {', '.join(SMM_SIZES)}")
    return SMM_SIZES[value]


def _rewards(options: dict[str, Any]) -> str:
    value = str(options.get("football_rewards", DEFAULTS["football_rewards"]))
    parts = [p.strip() for p in value.split(",") if p.strip()]
    if not parts or any(p not in REWARD_COMPONENTS for p in parts):
        raise ValueError(
            f"football_rewards: got {value!r}, expected a comma-separated list of {', '.join(REWARD_COMPONENTS)}"
        )
    return ",".join(parts)


def _check_scenario(name: str) -> None:
    import gfootball.scenarios as scenarios

    known = sorted(m.name for m in pkgutil.iter_modules(scenarios.__path__))
    if name not in known:
        raise ValueError(f"--env=football:{name}: unknown scenario {name!r}, expected one of {', '.join(known)}")


def make_spec(name: str, options: dict[str, Any]) -> EnvSpec:
    _gfootball()
    _check_scenario(name)
    width, height = smm_size(options)
    _rewards(options)
    from gfootball.env import football_action_set

    num_actions = len(football_action_set.get_action_set({"action_set": "default"}))
    return EnvSpec(
        name=f"football:{name}",
        observation_shape=(height, width),
        observation_dtype="uint16",
        num_actions=num_actions,
        action_repeat=1,
        frame_stack=1,  # gfootball already stacks 4 frames into the 16 planes
    )


def pack_smm(planes: np.ndarray) -> np.ndarray:
    """Bit-packs SMM planes [..., H, W, 16] (any nonzero value = on) into uint16 [..., H, W], bit i = plane i."""
    planes = np.asarray(planes)
    if planes.shape[-1:] != (NUM_PLANES,):
        raise ValueError(f"pack_smm: got planes of shape {planes.shape}, expected [..., H, W, {NUM_PLANES}]")
    packed = np.packbits(planes != 0, axis=-1, bitorder="little")  # [..., H, W, 2] bytes, low byte first
    return packed.view("<u2")[..., 0].astype(np.uint16, copy=False)


def unpack_smm(packed: torch.Tensor | np.ndarray) -> torch.Tensor:
    """Unpacks uint16 [..., H, W] into float32 planes [..., 16, H, W] with values in {0, 1}.

    Also accepts the same bits as int16 (how the learner stores uint16, see
    seed.contracts.storage.torch_dtype) or wider ints.
    """
    if isinstance(packed, np.ndarray):
        packed = torch.from_numpy(np.ascontiguousarray(packed))
    if packed.dtype not in (torch.uint16, torch.int16, torch.int32, torch.int64):
        raise ValueError(f"unpack_smm: got dtype {packed.dtype}, expected torch.uint16, int16 or int32")
    # torch.uint16 supports few ops (no shifts): widen to int32 first; the mask undoes int16 sign extension.
    words = torch.bitwise_and(packed.to(torch.int32), 0xFFFF).unsqueeze(-3)  # [..., 1, H, W]
    shifts = torch.arange(NUM_PLANES, dtype=torch.int32, device=packed.device).view(NUM_PLANES, 1, 1)
    return torch.bitwise_and(torch.bitwise_right_shift(words, shifts), 1).to(torch.float32)


# Colours of the SMM layers (left team, right team, ball, active player) in `smm_to_rgb`, over a pitch green.
SMM_COLOURS = np.array([[255, 220, 0], [40, 110, 255], [255, 255, 255], [255, 40, 40]], np.uint8)
PITCH_COLOUR = np.array([30, 110, 40], np.uint8)


def smm_to_rgb(planes: np.ndarray, scale: int = 4) -> np.ndarray:
    """Paints the newest frame of stacked SMM planes [H, W, 16] (or one frame's [H, W, 4]) as an RGB image
    uint8 [H * scale, W * scale, 3]: a picture of the super mini-map for videos, since gfootball renders its
    3D view only with a display. Later layers paint over earlier ones (the ball over the players)."""
    planes = np.asarray(planes)
    if planes.ndim != 3 or planes.shape[-1] not in (4, NUM_PLANES):
        raise ValueError(f"smm_to_rgb: got planes of shape {planes.shape}, expected [H, W, 4] or [H, W, {NUM_PLANES}]")
    newest = planes[..., -4:] != 0  # planes are ordered oldest frame first
    image = np.empty(planes.shape[:2] + (3,), np.uint8)
    image[:] = PITCH_COLOUR
    for layer, colour in enumerate(SMM_COLOURS):
        image[newest[..., layer]] = colour
    return np.repeat(np.repeat(image, scale, axis=0), scale, axis=1)


class FootballEnv:
    """One gfootball env; observations are packed SMM planes uint16 [H, W]."""

    def __init__(self, scenario: str, spec: EnvSpec, rewards: str, seed: int):
        football_env = _gfootball()
        self.spec = spec
        self._planes = np.zeros(spec.observation_shape + (NUM_PLANES,), np.uint8)  # the last SMM, for render_rgb
        height, width = spec.observation_shape
        # The engine reuses game_engine_random_seed for every episode, so draw a fresh one before each reset
        # from a generator seeded once: episodes differ, runs repeat.
        self._rng = np.random.default_rng(seed)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*old step API.*")  # gfootball uses it on purpose
            self._env = football_env.create_environment(
                env_name=scenario,
                stacked=True,
                representation="extracted",
                rewards=rewards,
                channel_dimensions=(width, height),
                render=False,
                write_goal_dumps=False,
                write_full_episode_dumps=False,
                write_video=False,
                logdir="",
                other_config_options={"game_engine_random_seed": self._next_seed()},
            )
        if self._env.action_space.n != spec.num_actions:
            raise ValueError(f"--env={spec.name}: env has {self._env.action_space.n} actions, spec {spec.num_actions}")

    def _next_seed(self) -> int:
        return int(self._rng.integers(0, 2**31 - 1))

    def _observe(self, planes: np.ndarray) -> np.ndarray:
        self._planes = planes
        observation = pack_smm(planes)
        if observation.shape != self.spec.observation_shape:
            self.spec.check_observation(observation)
        return observation

    def reset(self) -> np.ndarray:
        self._env.unwrapped._config["game_engine_random_seed"] = self._next_seed()
        return self._observe(self._env.reset())

    def step(self, action: int) -> StepResult:
        planes, reward, done, info = self._env.step(int(action))
        return StepResult(self._observe(planes), float(reward), bool(done), False, float(info["score_reward"]))

    def render_rgb(self) -> np.ndarray:
        """The super mini-map of the current step painted in colour (`smm_to_rgb`), uint8 [4H, 4W, 3]."""
        return smm_to_rgb(self._planes)

    def close(self) -> None:
        self._env.close()


def make_batch(name: str, num_envs: int, first_env_id: int, options: dict[str, Any]) -> SequentialEnvBatch:
    spec = make_spec(name, options)
    rewards = _rewards(options)
    seed = int(options.get("seed", 0))
    return SequentialEnvBatch([FootballEnv(name, spec, rewards, seed + first_env_id + i) for i in range(num_envs)])
