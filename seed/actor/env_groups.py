"""Double-buffered acting (`--env_groups=G`; Sample Factory's double-buffered sampling, Petrenko et al. 2020).

With one group an actor sends its K envs' step and then sits idle for the whole round trip (serialisation,
transport, batching, inference, reply) before it can step them again. With G groups the K envs are split
into G groups of K / G, and each group is its own stream to the learner, so the learner sees G actors of
K / G envs. The actor cycles through the groups: it waits for group g's actions, steps group g's envs, sends
their step and goes on to group g + 1, whose actions were being computed while group g stepped. The envs wait
only for the part of a round trip that stepping the other G - 1 groups does not cover; `waited_s` in the
actor's stats file (seed/actor/stats.py) measures that part.

Layout. Group g of actor i is the learner's actor stream s = i * G + g, with envs_per_stream = K / G envs and
env ids [i * K + g * K / G, i * K + (g + 1) * K / G): the same env ids, seeds and episode streams as with one
group. The learner creates one slab slot per stream (num_actors x G, LearnerConfig.actor_streams), so it
needs the same --env_groups as its actors; a mismatch is refused at the handshake (num_envs differs).

Connections. The G streams share one channel and live and die together: any stream's failure ends the
connection, the actor reconnects all of them with new run ids (seed/actor/loop.py's backoff), and every group's
envs restart their episodes. A newer actor run that takes this actor's index supersedes every group's stream;
the first one told (`wire.SUPERSEDED`) ends the actor with a SupersededError naming its index and group.
"""

from __future__ import annotations

import dataclasses
import random
import threading
import time

import grpc
import numpy as np

from seed._proto import seed_pb2, seed_pb2_grpc
from seed.actor.loop import Actor, granted_compression
from seed.config import ActorConfig
from seed.envs import make_batch
from seed.envs.base import BatchStep, EnvBatch, EnvSpec
from seed.transport import wire
from seed.transport.grpc.link import Stream, link_error, step_message
from seed.transport.link import ConfigurationError, InvalidReplyError, SupersededError


@dataclasses.dataclass(frozen=True)
class GroupSlot:
    """Where env group `group` of an actor sits on the learner: its stream index and its env ids."""

    group: int  # g in [0, G)
    stream_index: int  # actor_index * G + g: the actor index this group handshakes with
    first_env_id: int  # actor_index * K + g * K / G
    num_envs: int  # K / G


def group_slots(actor_index: int, envs_per_actor: int, env_groups: int) -> list[GroupSlot]:
    """The G groups of actor `actor_index` with K = `envs_per_actor` envs (env_groups must divide K)."""
    if env_groups < 1 or envs_per_actor % env_groups:
        raise ValueError(f"--env_groups: got {env_groups}, expected a divisor of --envs_per_actor "
                         f"({envs_per_actor}), >= 1")
    size = envs_per_actor // env_groups
    return [GroupSlot(g, actor_index * env_groups + g, actor_index * envs_per_actor + g * size, size)
            for g in range(env_groups)]


class GroupedEnvBatch:
    """An actor's K envs as G consecutive groups of K / G (one EnvBatch each); also an EnvBatch of all K.

    The grouped actor steps `groups[g]` one at a time; `reset` and `step` over all K (arrays [K, ...],
    finished episodes' env_index in [0, K)) keep the whole usable wherever an EnvBatch is expected.
    """

    def __init__(self, groups: list[EnvBatch]):
        if not groups:
            raise ValueError("groups: got 0, expected at least 1 env group")
        self.groups = groups
        self.spec: EnvSpec = groups[0].spec
        self.num_envs = sum(g.num_envs for g in groups)
        self._starts = [int(s) for s in np.cumsum([0] + [g.num_envs for g in groups])]  # G + 1 boundaries

    def reset(self) -> np.ndarray:
        return np.concatenate([group.reset() for group in self.groups])

    def step(self, actions: np.ndarray) -> BatchStep:
        if len(actions) != self.num_envs:
            raise ValueError(f"actions: got {len(actions)}, expected {self.num_envs} (one per env)")
        steps = [group.step(actions[start:end])
                 for group, start, end in zip(self.groups, self._starts[:-1], self._starts[1:], strict=True)]
        finished = [dataclasses.replace(e, env_index=e.env_index + start)
                    for step, start in zip(steps, self._starts[:-1], strict=True) for e in step.finished]
        return BatchStep(np.concatenate([s.observation for s in steps]), np.concatenate([s.reward for s in steps]),
                         np.concatenate([s.done for s in steps]), np.concatenate([s.truncated for s in steps]),
                         finished)

    def close(self) -> None:
        for group in self.groups:
            group.close()


def make_env_groups(config: ActorConfig) -> GroupedEnvBatch:
    """The actor's K envs in --env_groups groups, each built with its own env ids (and so its own seeds)."""
    slots = group_slots(config.actor_index, config.envs_per_actor, config.env_groups)
    return GroupedEnvBatch([make_batch(config.env, slot.num_envs, slot.first_env_id, config.env_options())
                            for slot in slots])


class _PipelinedStream(Stream):
    """A stream whose request and reply are separate calls, so other groups run between them."""

    def send(self, message: seed_pb2.ActorMessage) -> None:
        self._outgoing.put(message)

    def receive(self) -> seed_pb2.LearnerMessage:
        return next(self._responses)


class _GroupStreams:
    """The G streams of one connection; cancelling (request_stop) or closing acts on all of them."""

    def __init__(self, streams: list[_PipelinedStream]):
        self.streams = streams

    def cancel(self) -> None:
        for stream in self.streams:
            stream.cancel()

    def close(self) -> None:
        for stream in self.streams:
            stream.close()


class GroupedActor(Actor):
    """An actor whose K envs are G groups with a stream each, stepped in turn (see the module docstring)."""

    envs: GroupedEnvBatch

    def __init__(self, config: ActorConfig, stop: threading.Event | None = None):
        self.slots = group_slots(config.actor_index, config.envs_per_actor, config.env_groups)
        super().__init__(config, stop)

    def _make_envs(self) -> GroupedEnvBatch:
        return make_env_groups(self.config)

    def _run_connection(self) -> None:
        """One run of every group over gRPC; its errors translated like a GrpcLink's (seed/transport/link.py)."""
        run_ids = [random.SystemRandom().getrandbits(63) for _ in self.slots]
        channel = self._wait_for_learner()  # a fresh channel after each failed attempt (Actor._wait_for_learner)
        if channel is None:
            return
        with channel:
            stub = seed_pb2_grpc.LearnerStub(channel)
            metadata = self.security.call_metadata()
            streams = _GroupStreams([_PipelinedStream(stub, metadata) for _ in self.slots])
            self._link = streams  # request_stop cancels every group's stream
            try:
                self._serve_groups(streams.streams, run_ids)
            except grpc.RpcError as error:
                raise link_error(error) from None
            except wire.WireError as error:
                raise InvalidReplyError(str(error)) from None
            finally:
                self._link = None
                streams.close()

    def _receive(self, slot: GroupSlot, stream: _PipelinedStream) -> seed_pb2.LearnerMessage:
        """The next reply of `slot`'s stream; the learner's refusals are told with this actor's own flags."""
        try:
            return stream.receive()
        except grpc.RpcError as error:
            config = self.config
            where = (f"--actor_index={config.actor_index} env group {slot.group} (learner actor {slot.stream_index}, "
                     f"env ids {slot.first_env_id}..{slot.first_env_id + slot.num_envs - 1})")
            if error.code() == wire.SUPERSEDED and not self.stop.is_set():
                raise SupersededError(f"{where}: {error.details()}") from None
            if error.code() == grpc.StatusCode.INVALID_ARGUMENT:
                raise ConfigurationError(
                    f"{error.details()}; {where} handshakes with {slot.num_envs} envs (--envs_per_actor="
                    f"{config.envs_per_actor} / --env_groups={config.env_groups}): the learner needs the same "
                    "--envs_per_actor and --env_groups") from None
            raise

    def _serve_groups(self, streams: list[_PipelinedStream], run_ids: list[int]) -> None:
        config = self.config
        for slot, stream, run_id in zip(self.slots, streams, run_ids, strict=True):
            stream.send(seed_pb2.ActorMessage(handshake=seed_pb2.Handshake(
                actor_index=slot.stream_index, run_id=run_id, num_envs=slot.num_envs,
                spec=wire.spec_to_proto(self.spec), compression=self.asked_compression)))
        for slot, stream in zip(self.slots, streams, strict=True):
            reply = self._receive(slot, stream).handshake_reply
            self.compression = granted_compression(self.config, self.asked_compression, reply)
            first = reply.first_env_id
            if first != slot.first_env_id:
                raise ConfigurationError(f"handshake_reply.first_env_id: got {first}, expected {slot.first_env_id} "
                                         f"for env group {slot.group} of --actor_index={config.actor_index}")
        self.connections += 1
        ranges = ", ".join(f"{s.first_env_id}..{s.first_env_id + s.num_envs - 1} as learner actor {s.stream_index}"
                           for s in self.slots)
        print(f"[actor {config.actor_index}] connected to {config.server_address} with {len(self.slots)} env "
              f"groups (env ids {ranges}; runs {', '.join(f'{r:x}' for r in run_ids)})", flush=True)
        # A new run starts every env afresh: the learner treats first contact as an episode start. Every
        # group's first step goes out at once; from then on each group is stepped as its actions come back.
        sent = []
        for group, stream in zip(self.envs.groups, streams, strict=True):
            k = group.num_envs
            stream.send(step_message(BatchStep(group.reset(), np.zeros(k, np.float32), np.zeros(k, bool),
                                               np.zeros(k, bool), []), self.compression))
            sent.append(time.perf_counter())
        last_log, steps_at_last_log, waited_at_last_log = time.monotonic(), self.agent_steps, self.stats.waited_s
        while not self.stop.is_set():
            for g, (slot, group, stream) in enumerate(zip(self.slots, self.envs.groups, streams, strict=True)):
                waiting = time.perf_counter()
                reply = self._receive(slot, stream)
                received = time.perf_counter()
                latency = received - sent[g]
                actions = wire.decode_actions(reply.actions.action, self.spec, slot.num_envs)
                step = group.step(actions)
                stream.send(step_message(step, self.compression))
                sent[g] = time.perf_counter()
                self.agent_steps += slot.num_envs
                self.latencies_s.append(latency)
                self.stats.record(slot.num_envs, latency, waited_s=received - waiting)
                if self.stop.is_set():
                    return
            now = time.monotonic()
            if now - last_log >= config.log_interval_s:
                seconds = now - last_log
                fps = (self.agent_steps - steps_at_last_log) * self.spec.action_repeat / seconds
                p50 = np.percentile(self.latencies_s, 50) * 1e3
                waited = 100.0 * (self.stats.waited_s - waited_at_last_log) / seconds
                print(f"[actor {config.actor_index}] env_frames/s={fps:,.0f} round_trip_p50={p50:.2f}ms "
                      f"waiting={waited:.0f}% ({len(self.slots)} env groups)", flush=True)
                self.latencies_s.clear()
                last_log, steps_at_last_log, waited_at_last_log = now, self.agent_steps, self.stats.waited_s


def make_actor(config: ActorConfig, stop: threading.Event | None = None) -> Actor:
    """The actor for `config`: the plain one for --env_groups=1 (one stream), else a GroupedActor."""
    if config.env_groups == 1:
        return Actor(config, stop)
    return GroupedActor(config, stop)
