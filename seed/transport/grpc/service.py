"""The learner's gRPC service, run in the serving process: one bidirectional stream per actor.

Each stream runs on its own server thread: it validates the handshake, then for every step message decodes
and checks the tensors (seed/transport/wire.py: one copy of each payload out of the message), copies them into the
actor's rows of the step slab, notifies the actor's inference device and waits on the actor's reply eventfd for
the reply in the slab. All of this happens outside the learner process, so decoding never competes with
inference or training for the learner's GIL.

An actor on another host may ask for lz4-compressed observations (seed/transport/grpc/compression.py); the
service grants it on TCP connections only and decompresses each observation once here, bounded by the expected size.

A malformed message ends only that actor's stream (INVALID_ARGUMENT naming the field, the value received
and the value expected); a request of an actor run that a newer handshake for its index superseded ends with
FAILED_PRECONDITION (`wire.SUPERSEDED`), which tells a still-live actor to exit; the other actors never notice.
Once the learner's run is over (the slab's `run_finished`, seed/transport/slab.py) a new stream's handshake and a
stream's next step, or a step still waiting for its reply, end with OUT_OF_RANGE (`wire.RUN_FINISHED`) and the
details of `finished_message`: the actor exits 0.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator

import grpc
import numpy as np

from seed._proto import seed_pb2, seed_pb2_grpc
from seed.envs.base import EnvSpec
from seed.transport import notify, wire
from seed.transport.grpc import compression
from seed.transport.slab import REPLY_INVALID, REPLY_OK, REPLY_STALE, StepSlab


def read_handshake(request_iterator: Iterator[seed_pb2.ActorMessage], context: grpc.ServicerContext,
                   check: Callable[[seed_pb2.Handshake], str | None]) -> seed_pb2.Handshake | None:
    """The stream's first message, which must be a handshake that `check` finds no problem with.

    Aborts the stream with INVALID_ARGUMENT naming the problem; None if the actor closed the stream first.
    """
    try:
        first = next(request_iterator)
    except StopIteration:
        return None
    kind = first.WhichOneof("message")
    if kind != "handshake":
        context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                      f"first message: got {kind or 'an empty ActorMessage'}, expected handshake")
    problem = check(first.handshake)
    if problem:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"handshake rejected: {problem}")
    return first.handshake


class _Slot:
    """One actor's slot: a lock (one request in flight per actor index among this process's streams) and the
    waiter on the index's reply eventfd."""

    def __init__(self, reply_fd: int):
        self.lock = threading.Lock()
        self.replies = notify.ReplyWaiter(reply_fd)


class SlabService(seed_pb2_grpc.LearnerServicer):
    """Args:
      spec: the learner's env spec; actors must send the same.
      slab: the shared step slab (num_actors x envs_per_actor rows).
      request_fds: one request pipe per inference device; actor a notifies request_fds[a % n].
      reply_fds: one reply eventfd per actor index (seed/transport/notify.py), woken by inference.
      on_episodes: receives (env id, raw return) of each episode the actors report finished.
      stop: set when the serving process shuts down; waiting streams end with UNAVAILABLE.
    """

    def __init__(self, spec: EnvSpec, slab: StepSlab, request_fds: list[int], reply_fds: list[int],
                 on_episodes: Callable[[list[tuple[int, float]]], None], stop: threading.Event):
        if len(reply_fds) != slab.layout.num_actors:
            raise ValueError(f"reply_fds: got {len(reply_fds)}, expected one per actor ({slab.layout.num_actors})")
        self.spec = spec
        self.slab = slab
        self.num_actors = slab.layout.num_actors
        self.envs_per_actor = slab.envs_per_actor
        self.request_fds = request_fds
        self.reply_fds = reply_fds
        self.on_episodes = on_episodes
        self.stop = stop
        self.slots = [_Slot(fd) for fd in reply_fds]
        self.learner_run = uuid.uuid4().hex[:12]

    def check_handshake(self, handshake: seed_pb2.Handshake) -> str | None:
        if not 0 <= handshake.actor_index < self.num_actors:
            return (f"actor_index: got {handshake.actor_index}, "
                    f"expected 0 <= actor_index < {self.num_actors} (--num_actors)")
        if handshake.num_envs != self.envs_per_actor:
            return f"num_envs: got {handshake.num_envs}, expected {self.envs_per_actor} (--envs_per_actor)"
        if handshake.run_id == 0:
            return "run_id: got 0, expected a nonzero random id drawn at actor start"
        try:
            compression.check_codec(handshake.compression, "compression")
        except ValueError as error:
            return str(error)
        try:
            return wire.spec_mismatch(wire.spec_from_proto(handshake.spec), self.spec)
        except wire.WireError as error:
            return str(error)

    def grant_compression(self, handshake: seed_pb2.Handshake, context: grpc.ServicerContext) -> str:
        """The codec this stream's observations may use: the one asked for (checked by check_handshake), except on
        a unix socket, where compression only costs CPU (the actor is told none in the reply)."""
        asked = compression.check_codec(handshake.compression)
        if asked != compression.NONE and context.peer().startswith("unix:"):
            print(f"[learner] actor {handshake.actor_index} asked for --compression={asked} over a unix socket; "
                  "sending observations raw (compression only pays across a network)", flush=True)
            return compression.NONE
        return asked

    def _decode(self, step: seed_pb2.StepBatch, shape: tuple[int, ...], codec: str = compression.NONE
                ) -> tuple[np.ndarray, ...]:
        k = self.envs_per_actor
        observation = compression.decode_tensor(step.observation, "step.observation", self.spec.observation_dtype,
                                                shape, codec)
        reward = wire.decode_tensor(step.reward, "step.reward", "float32", (k,))
        done = wire.decode_tensor(step.done, "step.done", "bool", (k,))
        truncated = wire.decode_tensor(step.truncated, "step.truncated", "bool", (k,))
        wire.check_step_values(reward, done, truncated)
        wire.check_observation_values(observation)
        for i, episode in enumerate(step.finished):
            self.check_episode(i, episode)
        return observation, reward, done, truncated

    def check_episode(self, i: int, episode: seed_pb2.EpisodeStats) -> None:
        field = f"step.finished[{i}]"
        if not 0 <= episode.env_index < self.envs_per_actor:
            raise wire.WireError(f"{field}.env_index: got {episode.env_index}, "
                                 f"expected 0 <= env_index < {self.envs_per_actor}")
        for name in ("episode_return", "raw_return"):
            value = getattr(episode, name)
            if not np.isfinite(value):
                raise wire.WireError(f"{field}.{name}: got {value}, expected a finite value")
        for name in ("steps", "frames"):
            value = getattr(episode, name)
            if value < 0:
                raise wire.WireError(f"{field}.{name}: got {value}, expected >= 0")

    def _infer(self, actor: int, run_id: int, arrays: tuple[np.ndarray, ...], context: grpc.ServicerContext
               ) -> np.ndarray:
        """Hands one step to inference through the slab and waits for its actions (int32 [K], or float32 [K, D]
        for a Box)."""
        slot, slab = self.slots[actor], self.slab
        request_fd = self.request_fds[actor % len(self.request_fds)]
        with slot.lock:
            self._lock_slot(actor, context)
            try:
                status, actions = self._write_and_wait(actor, run_id, arrays, request_fd, context)
            finally:
                slab.unlock_slot(actor)
        if status == REPLY_STALE:
            context.abort(wire.SUPERSEDED, self._replaced(actor, run_id))
        if status == REPLY_INVALID:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"actor {actor}: {slab.error(actor)}")
        if status != REPLY_OK:
            context.abort(grpc.StatusCode.INTERNAL, "inference failed for this batch; reconnect")
        return actions

    def _lock_slot(self, actor: int, context: grpc.ServicerContext) -> None:
        """Takes the slot's cross-process lock (an shm actor of this index may hold it for one round trip);
        polls rather than blocks, so a shutdown or a cancelled stream is not stuck behind a stopped process."""
        while not self.slab.lock_slot(actor, blocking=False):
            self.end_if_finished(actor, context)
            if self.stop.is_set() or not context.is_active():
                context.abort(grpc.StatusCode.UNAVAILABLE, "learner is shutting down")
            time.sleep(0.001)

    def end_if_finished(self, actor: int, context: grpc.ServicerContext) -> None:
        """Ends the stream with `wire.RUN_FINISHED` once the learner's run is over (the actor then exits 0)."""
        told = self.slab.tell_finished(actor)
        if told is not None:
            context.abort(wire.RUN_FINISHED, told)

    def _write_and_wait(self, actor: int, run_id: int, arrays: tuple[np.ndarray, ...], request_fd: int,
                        context: grpc.ServicerContext) -> tuple[int, np.ndarray]:
        """With the slot's locks held: (reply status, actions int32 [K] or float32 [K, D]) of one request."""
        slab = self.slab
        if int(slab.live_run[actor]) != run_id:
            context.abort(wire.SUPERSEDED, self._replaced(actor, run_id))
        self.end_if_finished(actor, context)
        left = slab.unanswered(actor)
        if left is not None:
            # A writer before us (a serving process before this one, or an shm actor) wrote this request and
            # died waiting for its reply (our own requests are always answered before the locks are released).
            # Inference may be reading its rows right now, so the slot is ours only once it is answered. It may
            # never have been notified: notify it again (inference answers it, stale since our handshake, or
            # re-wakes it if it did).
            notify.send_request(request_fd, actor, left)
            self._await_reply(actor, left, context)
        seq = slab.write_request(actor, run_id, *arrays)
        notify.send_request(request_fd, actor, seq)
        self._await_reply(actor, seq, context)
        return int(slab.reply_status[actor]), slab.action[slab.rows(actor)].copy()

    def _await_reply(self, actor: int, seq: int, context: grpc.ServicerContext) -> None:
        """Returns once the slot's reply answers request `seq`; UNAVAILABLE if the process stops first.

        The slab's reply is read only after a wake-up, never on a timeout: a wake-up is this thread's read of the
        actor's reply eventfd, and that read (paired with inference's eventfd write) is what orders inference's
        slab writes (actions, status, reply_seq) before our reads of them. Polled without it, a weakly ordered
        CPU (aarch64) may show the new reply_seq before the actions it guards; x86 shows stores in order, which
        is why polling seemed to work. A wake-up may belong to an earlier request; only the reply's sequence
        number says it is ours. The stream thread waits on the eventfd itself: no reader thread hands it on.
        """
        replies = self.slots[actor].replies
        while True:
            if replies.wait(0.5):
                if self.slab.answered(actor, seq):
                    return
            elif self.stop.is_set():
                context.abort(grpc.StatusCode.UNAVAILABLE, "learner is shutting down")
            else:  # inference may never answer a run that is over (its sink or rollout gate waits on training)
                self.end_if_finished(actor, context)

    def _replaced(self, actor: int, run_id: int) -> str:
        # Only a stream that is still alive reads this: a dead predecessor's stream has no one to tell.
        return (f"actor_index {actor}: superseded by a newer actor run (run 0x{int(self.slab.live_run[actor]):x} "
                f"handshook after this run 0x{run_id:x}); expected one live actor per --actor_index, but another "
                f"actor with --actor_index={actor} connected while this one was alive")

    def register(self, handshake: seed_pb2.Handshake, transport: str) -> int:
        """Makes a checked handshake's run the live run of its actor index; returns its first env id.
        `transport`: "grpc" or "shm" (for the log line)."""
        actor, run_id, num_envs = handshake.actor_index, handshake.run_id, handshake.num_envs
        first_env_id = actor * num_envs
        self.slab.live_run[actor] = run_id  # from now on, requests of an older run of this actor are stale
        print(f"[learner] actor {actor} connected over {transport} (run {run_id:x}, env ids {first_env_id}.."
              f"{first_env_id + num_envs - 1})", flush=True)
        return first_env_id

    def report_episodes(self, first_env_id: int, finished) -> None:
        """Hands the finished episodes of one actor's step (EpisodeStats, already checked) to `on_episodes` as
        (env id, raw return) pairs; `first_env_id`: the actor's, from `register`."""
        if finished:
            self.on_episodes([(first_env_id + e.env_index, e.raw_return) for e in finished])

    def Stream(self, request_iterator: Iterator[seed_pb2.ActorMessage], context: grpc.ServicerContext):
        handshake = read_handshake(request_iterator, context, self.check_handshake)
        if handshake is None:
            return
        actor, run_id, num_envs = handshake.actor_index, handshake.run_id, handshake.num_envs
        self.end_if_finished(actor, context)  # an actor that reconnects after the run ended learns it here
        codec = self.grant_compression(handshake, context)
        first_env_id = self.register(handshake, "grpc" if codec == compression.NONE else f"grpc+{codec}")
        yield seed_pb2.LearnerMessage(handshake_reply=seed_pb2.HandshakeReply(
            first_env_id=first_env_id, learner_run=self.learner_run,
            compression="" if codec == compression.NONE else codec))

        observation_shape = (num_envs, *self.spec.observation_shape)
        for message in request_iterator:
            kind = message.WhichOneof("message")
            if kind != "step":
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"message: got {kind}, expected step")
            try:
                arrays = self._decode(message.step, observation_shape, codec)
            except wire.WireError as error:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"actor {actor}: {error}")
            actions = self._infer(actor, run_id, arrays, context)
            self.report_episodes(first_env_id, message.step.finished)
            yield seed_pb2.LearnerMessage(actions=seed_pb2.ActionBatch(action=wire.encode_tensor(actions)))
