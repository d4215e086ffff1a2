"""The actor's side of the gRPC transport: one actor run is one bidirectional Stream call (seed.proto).

`GrpcLink` opens the stream on a channel the actor dialled (channel.py: keepalive, capped redial), sends the
Handshake and reads the HandshakeReply (`handshake`), then sends one StepBatch per step and reads the ActionBatch.
Its errors are translated into the link family (seed/transport/link.py) by `link_error`: INVALID_ARGUMENT and
UNAUTHENTICATED are the learner's refusal (ConfigurationError), `wire.SUPERSEDED` a newer run of the index
(SupersededError), `wire.RUN_FINISHED` the end of the learner's run (RunFinished), every other status
(UNAVAILABLE, CANCELLED, a keepalive that timed out, ...) LinkDown; actions that fail `wire.decode_actions` are an
InvalidReplyError.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator

import grpc
import numpy as np

from seed._proto import seed_pb2, seed_pb2_grpc
from seed.envs.base import BatchStep, EnvSpec
from seed.transport import wire
from seed.transport.grpc import compression
from seed.transport.link import (
    ActorLink,
    ConfigurationError,
    InvalidReplyError,
    LinkDown,
    LinkError,
    RunFinished,
    SupersededError,
)


def link_error(error: grpc.RpcError) -> LinkError:
    """The link error of a failed Stream call (see the module docstring)."""
    code = error.code()
    if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAUTHENTICATED):
        return ConfigurationError(error.details())
    if code == wire.SUPERSEDED:
        return SupersededError(error.details())
    if code == wire.RUN_FINISHED:
        return RunFinished(error.details(), "grpc")
    return LinkDown(f"{code.name}: {error.details()}", "grpc")


def granted_codec(asked: str, reply: seed_pb2.HandshakeReply) -> str:
    """The codec of this run's observations: what the learner's reply granted (never more than `asked`)."""
    granted = reply.compression or compression.NONE
    if granted not in (asked, compression.NONE):
        raise ConfigurationError(f"handshake_reply.compression: got {reply.compression!r}, expected {asked!r} or ''")
    return granted


def step_message(step: BatchStep, codec: str = compression.NONE) -> seed_pb2.ActorMessage:
    """The StepBatch message of K envs' step: frames [K, *obs] (compressed with `codec`, see compression.py),
    rewards as float32, done/truncated flags [K], the episodes that ended, and the send time (unix seconds)."""
    return seed_pb2.ActorMessage(step=seed_pb2.StepBatch(
        observation=compression.encode_tensor(step.observation, codec),
        reward=wire.encode_tensor(step.reward.astype(np.float32, copy=False)),
        done=wire.encode_tensor(step.done),
        truncated=wire.encode_tensor(step.truncated),
        finished=[wire.episode_to_proto(e) for e in step.finished],
        actor_send_time=time.time()))


class Stream:
    """A bidirectional stream driven one request / one response at a time (raises grpc.RpcError)."""

    def __init__(self, stub: seed_pb2_grpc.LearnerStub, metadata: tuple = ()):
        self._outgoing: queue.SimpleQueue = queue.SimpleQueue()
        self._responses = stub.Stream(self._requests(), metadata=metadata or None)

    def _requests(self) -> Iterator[seed_pb2.ActorMessage]:
        while True:
            message = self._outgoing.get()
            if message is None:
                return
            yield message

    def call(self, message: seed_pb2.ActorMessage) -> seed_pb2.LearnerMessage:
        self._outgoing.put(message)
        return next(self._responses)

    def cancel(self) -> None:
        self._responses.cancel()

    def close(self) -> None:
        self._outgoing.put(None)
        self._responses.cancel()


class GrpcLink(ActorLink):
    """One actor run over a Stream call on `channel`, which the link owns from here on (closed by `close`).

    Build it, then `handshake`: the stream is open from the start, so `cancel` also ends a handshake that waits.
    `codec`: the observations' compression the learner granted (set by `handshake`).
    """

    def __init__(self, channel: grpc.Channel, metadata: tuple[tuple[str, str], ...], spec: EnvSpec, num_envs: int):
        self._channel = channel
        self.spec, self.num_envs = spec, num_envs
        self.codec = compression.NONE
        self.first_env_id = -1
        self.transport = "grpc"
        self._stream = Stream(seed_pb2_grpc.LearnerStub(channel), metadata)

    def handshake(self, handshake: seed_pb2.Handshake) -> None:
        """Sends `handshake` (asking for `handshake.compression`) and reads the learner's reply."""
        try:
            reply = self._stream.call(seed_pb2.ActorMessage(handshake=handshake)).handshake_reply
        except grpc.RpcError as error:
            raise link_error(error) from None
        self.codec = granted_codec(handshake.compression or compression.NONE, reply)
        self.first_env_id = reply.first_env_id
        self.transport = "grpc" if self.codec == compression.NONE else f"grpc+{self.codec}"

    def step(self, step: BatchStep) -> np.ndarray:
        try:
            reply = self._stream.call(step_message(step, self.codec))
            return wire.decode_actions(reply.actions.action, self.spec, self.num_envs)
        except grpc.RpcError as error:
            raise link_error(error) from None
        except wire.WireError as error:
            raise InvalidReplyError(str(error)) from None

    def cancel(self) -> None:
        self._stream.cancel()

    def close(self) -> None:
        self._stream.close()
        self._channel.close()
