"""`--env=gym:<id>`: any gymnasium env with a Discrete or a one-dimensional Box action space and a Box observation
(`gym:CartPole-v1`; `gym:Pendulum-v1`, Box(1,); the MuJoCo tasks `gym:Hopper-v5`, `gym:HalfCheetah-v5`,
`gym:Walker2d-v5`, `gym:Ant-v5`, `gym:Humanoid-v5` with the `mujoco` extra).

Observations are sent as float32 vectors (Box observations are flattened); action repeat is 1. A Box action is
float32 [D] in the env's units, clipped into the space's bounds before the env steps (a policy's Gaussian sample
may fall outside them; MuJoCo would otherwise apply it unclipped).

Options: `seed` (env i of the run is seeded with seed + first_env_id + i) and `render_rgb` (default False:
make the envs with `render_mode="rgb_array"` so that `GymEnv.render_rgb()` returns the screen, for seed-eval's
videos; classic-control envs need pygame for it). Observations are the same either way.
"""

from __future__ import annotations

import os
from typing import Any

import gymnasium
import numpy as np

from seed.envs.base import EnvSpec, SequentialEnvBatch, StepResult


class GymEnv:
    def __init__(self, env_id: str, seed: int, render_rgb: bool = False):
        if render_rgb:  # classic-control rendering calls pygame.init(), which would look for an audio device
            os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
            if not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"):
                # rgb_array draws off-screen; with no display SDL's probe of a real video driver only prints
                # "error: XDG_RUNTIME_DIR is invalid or not set" (a driver the user chose is kept, errors and all).
                os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
                # MuJoCo's renderer defaults to GLFW, which needs a display ("an OpenGL platform library has not
                # been loaded"); headless, it draws through EGL (read when the env's renderer starts).
                os.environ.setdefault("MUJOCO_GL", "egl")
        self._env = gymnasium.make(env_id, render_mode="rgb_array" if render_rgb else None)
        if not isinstance(self._env.observation_space, gymnasium.spaces.Box):
            raise ValueError(f"--env=gym:{env_id}: observation space is {self._env.observation_space}, expected Box")
        self._seed = seed
        self._reset_count = 0
        shape = (int(np.prod(self._env.observation_space.shape)),)
        self.spec = EnvSpec(f"gym:{env_id}", shape, "float32", **action_fields(env_id, self._env.action_space))
        self._low = np.asarray(self.spec.action_low, np.float32)
        self._high = np.asarray(self.spec.action_high, np.float32)

    def reset(self) -> np.ndarray:
        # Seed the first reset only; later resets continue the env's own random stream.
        seed = self._seed if self._reset_count == 0 else None
        self._reset_count += 1
        observation, _ = self._env.reset(seed=seed)
        return np.asarray(observation, np.float32).reshape(-1)

    def step(self, action: int | np.ndarray) -> StepResult:
        """`action`: an int (Discrete) or float32 [D] (Box, clipped into the bounds here)."""
        if self.spec.continuous:
            action = np.clip(np.asarray(action, np.float32), self._low, self._high)
        observation, reward, terminated, truncated, _ = self._env.step(action)
        observation = np.asarray(observation, np.float32).reshape(-1)
        return StepResult(observation, float(reward), bool(terminated), bool(truncated), float(reward))

    def render_rgb(self) -> np.ndarray:
        """The env's current screen, uint8 [H, W, 3] (needs the `render_rgb` option)."""
        if self._env.render_mode != "rgb_array":
            raise RuntimeError(f"{self.spec.name}: render_rgb() needs the env made with the render_rgb option, "
                               f"got render_mode={self._env.render_mode!r}")
        return np.asarray(self._env.render(), np.uint8)

    def close(self) -> None:
        self._env.close()


def action_fields(env_id: str, space: gymnasium.Space) -> dict[str, Any]:
    """EnvSpec's action fields of a gymnasium action space: num_actions for a Discrete one; action_shape and the
    bounds for a one-dimensional Box. Anything else is refused naming the space."""
    if isinstance(space, gymnasium.spaces.Discrete):
        return {"num_actions": int(space.n)}
    if isinstance(space, gymnasium.spaces.Box) and len(space.shape) == 1:
        return {"num_actions": 0, "action_shape": tuple(space.shape),
                "action_low": tuple(space.low.astype(np.float32).tolist()),
                "action_high": tuple(space.high.astype(np.float32).tolist())}
    raise ValueError(f"--env=gym:{env_id}: action space is {space}, expected Discrete or a one-dimensional Box")


def make_spec(name: str, options: dict[str, Any]) -> EnvSpec:
    env = GymEnv(name, seed=0)
    env.close()
    return env.spec


def make_batch(name: str, num_envs: int, first_env_id: int, options: dict[str, Any]) -> SequentialEnvBatch:
    seed = int(options.get("seed", 0))
    render_rgb = bool(options.get("render_rgb", False))
    return SequentialEnvBatch([GymEnv(name, seed + first_env_id + i, render_rgb) for i in range(num_envs)])
