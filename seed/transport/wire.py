"""Encoding between numpy arrays and the wire protocol's messages (protos/seed.proto).

Tensors travel as raw bytes plus dtype and shape. Decoding reads a tensor's `data` field once: under the
upb protobuf runtime that read is itself a copy of the payload into a Python bytes object; the returned array
is a read-only view of that copy (no second copy). Bool tensors are checked to hold only bytes 0 and 1: NumPy
would take any other byte as True, yet pass it on unchanged into the step slab and the unroll store.
"""

from __future__ import annotations

import grpc
import numpy as np

from seed._proto import seed_pb2
from seed.envs.base import EnvSpec, EpisodeStats

# The status that ends a stream whose actor index a newer handshake took over while the stream was alive
# (protos/seed.proto): the actor must exit instead of reconnecting, or two live actors of one index would
# evict each other for ever. gRPC never produces this code by itself.
SUPERSEDED = grpc.StatusCode.FAILED_PRECONDITION
# The status that tells an actor the learner's run is over (its --total_environment_frames or --max_train_steps
# reached): the actor exits 0 instead of reconnecting. A learner that stops for any other reason (SIGTERM, a
# restart, a crash) never sends it, so UNAVAILABLE and a refused connection still mean "wait for it". gRPC never
# produces this code by itself.
RUN_FINISHED = grpc.StatusCode.OUT_OF_RANGE


class WireError(ValueError):
    """A message that does not match the protocol (wrong dtype, shape or size)."""


def encode_tensor(array: np.ndarray) -> seed_pb2.Tensor:
    array = np.ascontiguousarray(array)
    return seed_pb2.Tensor(dtype=array.dtype.name, shape=array.shape, data=array.tobytes())


def decode_tensor(tensor: seed_pb2.Tensor, field: str, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Returns `tensor` as a read-only array, checked against the expected dtype, shape and (bool) values."""
    if tensor.dtype != dtype:
        raise WireError(f"{field}.dtype: got {tensor.dtype!r}, expected {dtype!r}")
    if tuple(tensor.shape) != tuple(shape):
        raise WireError(f"{field}.shape: got {list(tensor.shape)}, expected {list(shape)}")
    expected_bytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    data = tensor.data  # one read: each access copies the payload (upb)
    if len(data) != expected_bytes:
        raise WireError(f"{field}.data: got {len(data)} bytes, expected {expected_bytes}")
    if dtype == "bool":
        check_bool_bytes(f"{field}.data", np.frombuffer(data, dtype=np.uint8))
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def check_bool_bytes(field: str, raw: np.ndarray) -> None:
    """Raises WireError unless every byte of `raw` (uint8, any shape) is 0 or 1."""
    raw = raw.reshape(-1)
    bad = np.flatnonzero(raw > 1)
    if len(bad):
        raise WireError(f"{field}: got byte value {raw[bad[0]]} at index {bad[0]} ({len(bad)} such bytes), "
                        "expected 0 or 1 for dtype 'bool'")


def invalid_step_values(reward: np.ndarray, done: np.ndarray, truncated: np.ndarray) -> np.ndarray:
    """bool, element-wise: where `check_step_values` would object (a non-finite reward, or a done/truncated byte
    other than 0 and 1); the vectorised form for many actors' rows at once."""
    return (~np.isfinite(reward) | (np.asarray(done).view(np.uint8) > 1)
            | (np.asarray(truncated).view(np.uint8) > 1))


def check_step_values(reward: np.ndarray, done: np.ndarray, truncated: np.ndarray) -> None:
    """The value checks of one step of K envs, whatever carried it: rewards float32 [K] finite, done and
    truncated bool [K] holding only bytes 0 and 1 (read as uint8, so a byte 2 is seen, not taken as True).
    Raises WireError naming the field (as in a StepBatch), the value received and the value expected."""
    if not np.isfinite(reward).all():
        index = int(np.flatnonzero(~np.isfinite(reward))[0])
        raise WireError(f"step.reward: got a non-finite value, expected finite rewards "
                        f"({reward.reshape(-1)[index]} at index {index})")
    check_bool_bytes("step.done.data", np.asarray(done).view(np.uint8))
    check_bool_bytes("step.truncated.data", np.asarray(truncated).view(np.uint8))


def invalid_observations(observation: np.ndarray, k: int) -> np.ndarray:
    """bool [n]: which of n requests' observations (float rows [n * k, ...]; other dtypes are never invalid) hold
    a NaN or an inf; the vectorised form of `check_observation_values`."""
    finite = np.isfinite(observation) if observation.dtype.kind == "f" else None
    if finite is None or finite.all():
        return np.zeros(len(observation) // k, bool)
    return ~finite.reshape(len(observation) // k, -1).all(axis=1)


def check_observation_values(observation: np.ndarray, field: str = "step.observation") -> None:
    """Raises WireError naming the first NaN or inf of float observations [K, *shape] (env row, flat index)."""
    if observation.dtype.kind != "f" or np.isfinite(observation).all():
        return
    flat = observation.reshape(len(observation), -1)
    bad = np.argwhere(~np.isfinite(flat))
    if len(bad):
        env, index = (int(v) for v in bad[0])
        raise WireError(f"{field}: got {flat[env, index]} at env {env}, element {index} ({len(bad)} non-finite "
                        f"values), expected finite {observation.dtype.name} observations")


def decode_actions(tensor: seed_pb2.Tensor, spec: EnvSpec, num_envs: int, field: str = "actions.action"
                   ) -> np.ndarray:
    """The learner's actions for K envs, as the actor steps them: Discrete int32 [K], Box float32 [K, D]; checked
    like `check_actions`."""
    actions = decode_tensor(tensor, field, spec.action_dtype, (num_envs, *spec.action_shape))
    check_actions(actions, spec, field)
    return actions


def check_actions(actions: np.ndarray, spec: EnvSpec, field: str = "actions.action") -> None:
    """Raises WireError unless a Box's actions [K, D] are all finite (out of bounds is allowed: the env clips);
    names the first NaN or inf by env and dimension. Discrete actions need no value check here (the env's own)."""
    if not spec.continuous or np.isfinite(actions).all():
        return
    bad = np.argwhere(~np.isfinite(actions))
    if len(bad):
        env, dim = (int(v) for v in bad[0])
        raise WireError(f"{field}: got {actions[env, dim]} at env {env}, dimension {dim} ({len(bad)} non-finite "
                        f"values), expected finite float32 actions of {spec.action_space} (bounds "
                        f"{list(spec.action_low)}..{list(spec.action_high)}, clipped by the env)")


def spec_to_proto(spec: EnvSpec) -> seed_pb2.EnvSpec:
    return seed_pb2.EnvSpec(
        env=spec.name,
        observation_shape=spec.observation_shape,
        observation_dtype=spec.observation_dtype,
        num_actions=spec.num_actions,
        action_repeat=spec.action_repeat,
        frame_stack=spec.frame_stack,
        action_shape=spec.action_shape,
        action_low=spec.action_low,
        action_high=spec.action_high,
    )


def spec_from_proto(message: seed_pb2.EnvSpec) -> EnvSpec:
    """The actor's spec; raises WireError naming the field for action fields that describe no action space."""
    try:
        return EnvSpec(
            name=message.env,
            observation_shape=tuple(message.observation_shape),
            observation_dtype=message.observation_dtype,
            num_actions=message.num_actions,
            action_repeat=message.action_repeat,
            frame_stack=message.frame_stack,
            action_shape=tuple(message.action_shape),
            action_low=tuple(message.action_low),
            action_high=tuple(message.action_high),
        )
    except ValueError as error:
        raise WireError(f"spec: {error}") from None


SPEC_FIELDS = ("name", "observation_shape", "observation_dtype", "num_actions", "action_repeat", "frame_stack",
               "action_shape", "action_low", "action_high")


def spec_mismatch(received: EnvSpec, expected: EnvSpec) -> str | None:
    """A message naming every field where the actor's spec differs from the learner's, or None."""
    problems = [
        f"spec.{field}: got {getattr(received, field)!r}, expected {getattr(expected, field)!r}"
        for field in SPEC_FIELDS
        if getattr(received, field) != getattr(expected, field)
    ]
    return "; ".join(problems) or None


def episode_to_proto(stats: EpisodeStats) -> seed_pb2.EpisodeStats:
    return seed_pb2.EpisodeStats(
        env_index=stats.env_index,
        episode_return=stats.episode_return,
        raw_return=stats.raw_return,
        steps=stats.steps,
        frames=stats.frames,
        truncated=stats.truncated,
    )
