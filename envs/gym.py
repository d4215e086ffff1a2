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

# Each agent's defaults on gym (envs/__init__.py: AGENT_DEFAULTS): small and fast settings that learn CartPole in
# minutes on 2 cores. vtrace: unrolls of 20, batches of 16, no LSTM. ppo: rl-baselines3-zoo's CartPole PPO (8 envs
# x 32 steps per update, 20 epochs of one minibatch, lr 1e-3, gamma 0.98, lambda 0.8, no entropy bonus): a mean
# return of 400 in under a minute; every family trains PPO synchronously (`--sync=hts`). fake: reuses r2d2's and
# muzero's.
AGENT_DEFAULTS: dict[str, dict[str, Any]] = {
    "vtrace": dict(network="mlp", use_lstm=False, unroll_length=20, batch_size=16, learning_rate=1e-3,
                   entropy_cost=0.01, discounting=0.99, total_environment_frames=2e6, log_interval_s=5.0),
    "r2d2": dict(network="mlp", mlp_sizes="64", use_lstm=True, lstm_size=64, unroll_length=20, burn_in=5,
                 batch_size=32, learning_rate=1e-3, adam_epsilon=1e-3, discounting=0.99, n_steps=3,
                 replay_capacity=4000, replay_min_size=100, replay_ratio=4.0, target_update_interval=100,
                 grad_clip_norm=40.0, total_environment_frames=1e6, log_interval_s=5.0),
    "ppo": dict(sync="hts", sync_every=32, use_lstm=False, lambda_=0.8, baseline_cost=0.5, network="mlp",
                learning_rate=1e-3, entropy_cost=0.0, discounting=0.98, ppo_epochs=20, ppo_minibatches=1,
                grad_clip_norm=0.5, total_environment_frames=2e6, log_interval_s=5.0),
    "muzero": dict(network="auto", mlp_sizes="64", latent_size=64, lstm_size=64, value_support_size=20,
                   reward_support_size=5, num_simulations=25, unroll_steps=5, td_steps=5, burn_in=9,
                   unroll_length=10, value_prefix_horizon=5, discounting=0.99, batch_size=16, learning_rate=1e-3,
                   grad_clip_norm=10.0, priority_exponent=0.6, importance_sampling_exponent=0.4,
                   replay_capacity=5_000, replay_min_size=20, replay_ratio=8.0, target_update_interval=100,
                   td_age_updates=0, visit_temperature=1.0, total_environment_frames=1e6, log_interval_s=5.0),
}

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
        try:
            self._env = gymnasium.make(env_id, render_mode="rgb_array" if render_rgb else None)
        except (gymnasium.error.UnregisteredEnv, gymnasium.error.DeprecatedEnv) as error:  # a name it lacks
            raise ValueError(f"--env=gym:{env_id}: unknown gymnasium id ({error}), expected a registered gymnasium "
                             "id such as CartPole-v1 or Hopper-v5 (python -c 'import gymnasium; "
                             "gymnasium.pprint_registry()' lists them)") from None
        except gymnasium.error.DependencyNotInstalled as error:  # a package to install, not a wrong name
            raise ImportError(f"--env=gym:{env_id}: {error}") from error
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
