"""The learner's gRPC service: one bidirectional stream per actor process.

Each stream runs on its own server thread: it validates the handshake, then decodes every step message
(zero-copy), submits it to its inference batcher and waits for the actions. A malformed message ends
only that actor's stream (INVALID_ARGUMENT naming the field); the other actors are never affected.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

import grpc
import numpy as np

from seed import wire
from seed._proto import seed_pb2, seed_pb2_grpc
from seed.batcher import InferenceBatcher, StaleRequest, StepRequest
from seed.envs.base import EnvSpec
from seed.metrics import LearnerMetrics

log = logging.getLogger(__name__)


def read_handshake(request_iterator: Iterator[seed_pb2.ActorMessage], context: grpc.ServicerContext,
                   check: Callable[[seed_pb2.Handshake], str | None]) -> seed_pb2.Handshake | None:
    """The stream's first message, which must be a handshake that `check` finds no problem with.

    Aborts the stream with INVALID_ARGUMENT naming the problem; None if the actor closed the stream first.
    """
    try:
        first = next(request_iterator)
    except StopIteration:
        return None
    if first.WhichOneof("message") != "handshake":
        context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                      f"first message: got {first.WhichOneof('message')}, expected handshake")
    problem = check(first.handshake)
    if problem:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"handshake rejected: {problem}")
    return first.handshake


class LearnerService(seed_pb2_grpc.LearnerServicer):
    """Args:
      spec: the learner's env spec; actors must send the same.
      num_actors, envs_per_actor: the accepted actor indices and envs per actor.
      registry: actor_index -> run id of its live run, shared with inference (which drops stale requests).
      batchers: one per inference device; actor a uses batchers[a % len(batchers)].
    """

    def __init__(self, spec: EnvSpec, num_actors: int, envs_per_actor: int, registry: dict[int, int],
                 batchers: list[InferenceBatcher], metrics: LearnerMetrics, stop: threading.Event):
        self.spec = spec
        self.num_actors = num_actors
        self.envs_per_actor = envs_per_actor
        self.registry = registry
        self.batchers = batchers
        self.metrics = metrics
        self.stop = stop
        self.learner_run = uuid.uuid4().hex[:12]

    def _check_handshake(self, handshake: seed_pb2.Handshake) -> str | None:
        if not 0 <= handshake.actor_index < self.num_actors:
            return (f"actor_index: got {handshake.actor_index}, "
                    f"expected 0 <= actor_index < {self.num_actors} (--num_actors)")
        if handshake.num_envs != self.envs_per_actor:
            return f"num_envs: got {handshake.num_envs}, expected {self.envs_per_actor} (--envs_per_actor)"
        return wire.spec_mismatch(wire.spec_from_proto(handshake.spec), self.spec)

    def _wait(self, future: Future) -> np.ndarray:
        """The request's actions; gives up when the learner stops so no server thread outlives it."""
        while True:
            try:
                return future.result(timeout=0.5)
            except FutureTimeout:
                if self.stop.is_set():
                    raise StaleRequest("learner is shutting down") from None

    def Stream(self, request_iterator: Iterator[seed_pb2.ActorMessage], context: grpc.ServicerContext):
        handshake = read_handshake(request_iterator, context, self._check_handshake)
        if handshake is None:
            return
        actor, run_id, num_envs = handshake.actor_index, handshake.run_id, handshake.num_envs
        first_env_id = actor * num_envs
        self.registry[actor] = run_id  # from now on, requests of an older run of this actor are stale
        batcher = self.batchers[actor % len(self.batchers)]
        log.info("actor %d connected (run %x, env ids %d..%d)", actor, run_id, first_env_id,
                 first_env_id + num_envs - 1)
        yield seed_pb2.LearnerMessage(
            handshake_reply=seed_pb2.HandshakeReply(first_env_id=first_env_id, learner_run=self.learner_run))

        observation_shape = (num_envs, *self.spec.observation_shape)
        for message in request_iterator:
            if message.WhichOneof("message") != "step":
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              f"message: got {message.WhichOneof('message')}, expected step")
            step = message.step
            try:
                request = StepRequest(
                    actor_index=actor, run_id=run_id, first_env_id=first_env_id,
                    observation=wire.decode_tensor(step.observation, "step.observation",
                                                   self.spec.observation_dtype, observation_shape),
                    reward=wire.decode_tensor(step.reward, "step.reward", "float32", (num_envs,)),
                    done=wire.decode_tensor(step.done, "step.done", "bool", (num_envs,)),
                    truncated=wire.decode_tensor(step.truncated, "step.truncated", "bool", (num_envs,)),
                )
                if not np.isfinite(request.reward).all():
                    raise wire.WireError("step.reward: got a non-finite value, expected finite rewards")
            except wire.WireError as error:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"actor {actor}: {error}")
            try:
                actions = self._wait(batcher.submit(request))
            except StaleRequest as error:
                context.abort(grpc.StatusCode.ABORTED, str(error))
            except Exception as error:  # inference failed for this batch; the actor reconnects
                context.abort(grpc.StatusCode.INTERNAL, f"inference failed: {error}")
            if step.finished:
                self.metrics.record_actor_episodes([e.raw_return for e in step.finished])
            yield seed_pb2.LearnerMessage(
                actions=seed_pb2.ActionBatch(action=wire.encode_tensor(actions.astype(np.int32, copy=False))))
