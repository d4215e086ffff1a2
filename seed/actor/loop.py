"""The actor: a thin loop around K environments that streams them to the learner.

One process, one bidirectional gRPC stream. Each step sends the K envs' single frames, rewards, dones and
truncations and finished-episode stats, waits for K actions and steps the envs (finished envs are reset at
once; their new first frame goes out with done=True). When the learner goes away the actor reconnects
with exponential backoff (reset after a connection that streamed) and a new run id (its envs restart their
episodes); a rejected handshake (INVALID_ARGUMENT) or a wrong token (UNAUTHENTICATED) is a configuration error
and ends the actor. A newer actor run that handshakes with this actor's index takes the index over (that is
how a restarted actor replaces its dead predecessor); if this actor is still alive, its stream ends with
`wire.SUPERSEDED` and the actor ends too, rather than evicting the newer one in turn. SIGTERM ends it
cleanly. With --tls_* flags the channel is mutual TLS; with --auth_token(_file) the token goes in the Stream
call's metadata (seed/transport/). With --transport=shm (or auto, the default, when --server_address is a unix
socket and the learner offers it) the actor attaches to the learner's step slab instead and its steps skip
protobuf and gRPC (seed/transport/shm/link.py); handshake, token, superseded runs and reconnection are the same.
With --compression=lz4 over TCP the actor asks for lz4 in its handshake and, if the learner grants it,
compresses every step's observations (seed/transport/grpc/compression.py); on a unix socket it sends them raw.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Iterator

import grpc
import numpy as np

from seed._proto import seed_pb2, seed_pb2_grpc
from seed.actor.stats import ActorStats
from seed.config import ActorConfig
from seed.envs import make_batch
from seed.envs.base import BatchStep, EnvBatch
from seed.transport import TransportConfigError, TransportSecurity, open_channel, wire
from seed.transport.grpc import compression
from seed.transport.grpc.channel import unix_listener_problem
from seed.transport.shm.link import ShmLink, ShmRejected, ShmSuperseded, ShmUnavailable
from seed.transport.shm.protocol import handover_path

log = logging.getLogger(__name__)


def _shm_path(config: ActorConfig, security: TransportSecurity) -> str | None:
    """The learner's handover socket this actor tries (--transport shm or auto), or None (gRPC only)."""
    if config.transport not in ("auto", "grpc", "shm"):
        raise TransportConfigError(f"--transport: got {config.transport!r}, expected auto, grpc or shm")
    path = handover_path(config.server_address) if config.transport != "grpc" else None
    if config.transport == "shm" and (path is None or security.tls):
        raise TransportConfigError(
            f"--transport=shm: got --server_address={config.server_address!r}"
            f"{' with mutual TLS' if security.tls else ''}, expected a unix: socket of a learner on this host "
            "without --tls_* (the shared-memory path cannot check a TLS identity)")
    return None if security.tls else path


class ConfigurationError(RuntimeError):
    """The learner rejected this actor (e.g. a different env spec): retrying cannot help."""


class SupersededError(RuntimeError):
    """A newer actor run took over this actor's index while this one was alive: reconnecting would evict it."""


class InvalidReplyError(RuntimeError):
    """The learner's reply is one the actor refuses to step its envs with (actions of the wrong dtype or shape, a
    NaN or inf in a Box action): the message names the field, the value received and the value expected."""


class ReconnectBackoff:
    """The wait before each reconnection: starts at `initial_s`, doubles after every connection that failed
    without streaming, up to `max_s`, and starts over after a connection that streamed (a step was answered),
    so a learner restarted after hours of training is rejoined at once, not after the longest wait."""

    def __init__(self, initial_s: float, max_s: float):
        if not 0 < initial_s:
            raise ValueError(f"initial_s: got {initial_s}, expected > 0")
        self.initial_s, self.max_s = initial_s, max(max_s, initial_s)
        self._next_s = initial_s

    def after_failure(self, streamed: bool) -> float:
        """Seconds to wait after a connection ended in an error; `streamed`: it had a step answered."""
        if streamed:
            self._next_s = self.initial_s
        delay = self._next_s
        self._next_s = min(self._next_s * 2, self.max_s)
        return delay


def asked_compression(config: ActorConfig) -> str:
    """The codec this actor asks the learner for: --compression, except on a unix socket (the learner's host,
    where compression only costs CPU), which is said once. Raises TransportConfigError for an unknown codec."""
    try:
        codec = compression.check_codec(config.compression)
    except ValueError as error:
        raise TransportConfigError(str(error)) from None
    if codec != compression.NONE and config.server_address.startswith(("unix:", "unix-abstract:")):
        print(f"[actor {config.actor_index}] --compression={codec} ignored: {config.server_address} is a unix "
              "socket on the learner's host (compression only pays across a network)", flush=True)
        return compression.NONE
    return codec


def granted_compression(config: ActorConfig, asked: str, reply: seed_pb2.HandshakeReply) -> str:
    """The codec of this connection's observations: what the learner's reply granted (never more than asked)."""
    granted = reply.compression or compression.NONE
    if granted not in (asked, compression.NONE):
        raise ConfigurationError(f"handshake_reply.compression: got {reply.compression!r}, expected {asked!r} or ''")
    if granted != asked:
        print(f"[actor {config.actor_index}] the learner did not grant --compression={asked}; sending raw "
              "observations", flush=True)
    return granted


def step_message(step: BatchStep, codec: str = compression.NONE) -> seed_pb2.ActorMessage:
    """The StepBatch message of K envs' step: frames [K, *obs] (compressed with `codec`, see
    seed/transport/grpc/compression.py),
    rewards as float32, done/truncated flags [K], the episodes that ended, and the send time (unix seconds)."""
    return seed_pb2.ActorMessage(step=seed_pb2.StepBatch(
        observation=compression.encode_tensor(step.observation, codec),
        reward=wire.encode_tensor(step.reward.astype(np.float32, copy=False)),
        done=wire.encode_tensor(step.done),
        truncated=wire.encode_tensor(step.truncated),
        finished=[wire.episode_to_proto(e) for e in step.finished],
        actor_send_time=time.time()))


class _Stream:
    """A bidirectional stream driven one request / one response at a time."""

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


class Actor:
    """Runs `config.envs_per_actor` envs against the learner at `config.server_address`."""

    def __init__(self, config: ActorConfig, stop: threading.Event | None = None):
        self.config = config
        self.stop = stop or threading.Event()
        self.envs: EnvBatch = self._make_envs()
        self.spec = self.envs.spec
        self.security = TransportSecurity.from_config(config)
        self.shm_path = _shm_path(config, self.security)
        self.asked_compression = asked_compression(config)
        self.compression = compression.NONE  # of the current connection, as the learner granted it
        self.transport = ""  # of the current connection: grpc or shm
        self.agent_steps = 0
        self.latencies_s: list[float] = []  # round trips of the current log window
        self.connections = 0
        self.stats = ActorStats(config.stats_file, config.stats_interval_s, self.spec.action_repeat, config.actor_index)
        self._stream: _Stream | None = None

    def _make_envs(self) -> EnvBatch:
        """The K envs, env ids [actor_index * K, (actor_index + 1) * K). Env groups: seed/actor/env_groups.py."""
        config = self.config
        if config.env_groups != 1:
            raise ValueError(f"--env_groups: got {config.env_groups}, expected 1 for seed.actor.loop.Actor; "
                             "seed.actor.env_groups.make_actor builds the actor of any --env_groups")
        return make_batch(config.env, config.envs_per_actor, config.actor_index * config.envs_per_actor,
                          config.env_options())

    def request_stop(self) -> None:
        """Stops the actor from any thread or a signal handler, also while it waits for the learner."""
        self.stop.set()
        stream = self._stream
        if stream is not None:
            stream.cancel()

    def run(self) -> None:
        """Serves the learner until `stop`. Raises ConfigurationError (rejected by the learner) or
        SupersededError (a newer actor run took over this actor's index)."""
        backoff = ReconnectBackoff(0.1, self.config.reconnect_max_backoff_s)
        try:
            while not self.stop.is_set():
                steps_before = self.agent_steps
                try:
                    self._run_connection()
                except grpc.RpcError as error:
                    if self.stop.is_set():
                        break
                    if error.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAUTHENTICATED):
                        raise ConfigurationError(error.details()) from None
                    if error.code() == wire.SUPERSEDED:
                        raise SupersededError(error.details()) from None
                    delay = backoff.after_failure(streamed=self.agent_steps > steps_before)
                    print(f"[actor {self.config.actor_index}] learner unavailable ({error.code().name}: "
                          f"{error.details()}); reconnecting in {delay:.1f}s", flush=True)
                    self.stop.wait(delay)
                except ShmRejected as error:
                    if self.stop.is_set():
                        break
                    if error.code in ("INVALID_ARGUMENT", "UNAUTHENTICATED"):
                        raise ConfigurationError(error.details) from None
                    self._shm_failed(backoff, error, steps_before)
                except ShmSuperseded as error:
                    raise SupersededError(str(error)) from None
                except wire.WireError as error:
                    raise InvalidReplyError(str(error)) from None
                except ShmUnavailable as error:
                    if self.stop.is_set():
                        break
                    self._shm_failed(backoff, error, steps_before)
        finally:
            self.stats.write(final=True)
            self.envs.close()

    def _shm_failed(self, backoff: ReconnectBackoff, error: Exception, steps_before: int) -> None:
        delay = backoff.after_failure(streamed=self.agent_steps > steps_before)
        print(f"[actor {self.config.actor_index}] learner unavailable over shm ({error}); reconnecting in "
              f"{delay:.1f}s", flush=True)
        self.stop.wait(delay)

    def _wait_for_learner(self, channel: grpc.Channel) -> None:
        """Waits until the channel connects and, for a unix: address, the listener runs as this actor's user or
        root (`unix_listener_problem`: the stream's call carries the token); says once when a connection attempt
        failed (no learner there yet, or one that refuses this actor's transport, e.g. plaintext against TLS) or
        another user listens, so a wrong flag or a taken path is visible."""
        failed = threading.Event()

        def on_state(state: grpc.ChannelConnectivity) -> None:
            if state == grpc.ChannelConnectivity.TRANSIENT_FAILURE:
                failed.set()

        channel.subscribe(on_state)
        reported = foreign_reported = False
        backoff = 0.1
        try:
            while not self.stop.is_set():
                try:
                    grpc.channel_ready_future(channel).result(timeout=backoff)
                    problem = unix_listener_problem(self.config.server_address)
                    if problem is None:
                        return
                    if not foreign_reported:  # the learner's user may claim the path later: keep checking
                        foreign_reported = True
                        print(f"[actor {self.config.actor_index}] {problem}; retrying", flush=True)
                    self.stop.wait(backoff)
                except grpc.FutureTimeoutError:
                    pass
                backoff = min(backoff * 2, self.config.reconnect_max_backoff_s)
                if failed.is_set() and not reported:
                    reported = True
                    print(f"[actor {self.config.actor_index}] cannot connect to {self.config.server_address} "
                          "(TRANSIENT_FAILURE: no learner there yet, or it refused this actor's transport "
                          "security); retrying", flush=True)
        finally:
            channel.unsubscribe(on_state)

    def _handshake(self, run_id: int) -> seed_pb2.Handshake:
        return seed_pb2.Handshake(actor_index=self.config.actor_index, run_id=run_id,
                                  num_envs=self.config.envs_per_actor, spec=wire.spec_to_proto(self.spec),
                                  compression=self.asked_compression)

    def _run_connection(self) -> None:
        run_id = random.SystemRandom().getrandbits(63)
        link = None
        with open_channel(self.config.server_address, self.security) as channel:
            self._wait_for_learner(channel)  # the learner serves gRPC before it offers shm: wait on either path
            if self.stop.is_set():
                return
            if self.shm_path:
                link = self._attach_shm(run_id)
            if link is None:
                self._stream = stream = _Stream(seed_pb2_grpc.LearnerStub(channel), self.security.call_metadata())
                try:
                    self._serve(stream, run_id)
                finally:
                    self._stream = None
                    stream.close()
                return
        try:
            self._serve_shm(link, run_id)
        finally:
            link.close()

    def _attach_shm(self, run_id: int) -> ShmLink | None:
        """The shared-memory link of this run, or None to use gRPC (--transport=auto and the learner offers no
        shm: no handover socket, e.g. --shm_actors=false). Raises ShmUnavailable for --transport=shm."""
        try:
            return ShmLink.connect(self.shm_path, self._handshake(run_id), self.security.call_metadata(), self.stop)
        except ShmUnavailable as error:
            if self.config.transport == "shm":
                raise
            print(f"[actor {self.config.actor_index}] no shared-memory path ({error}); using gRPC", flush=True)
            return None

    def _serve_shm(self, link: ShmLink, run_id: int) -> None:
        self._connected(link.first_env_id, run_id, "shm")

        def exchange(step: BatchStep) -> np.ndarray:
            actions = link.step(step.observation, step.reward.astype(np.float32, copy=False), step.done,
                                step.truncated)
            wire.check_actions(actions, self.spec, "slab.action")
            if step.finished:
                link.send_episodes([wire.episode_to_proto(e) for e in step.finished])
            return actions

        self._step_loop(exchange)

    def _connected(self, first_env_id: int, run_id: int, transport: str) -> None:
        self.connections += 1
        self.transport = transport
        print(f"[actor {self.config.actor_index}] connected to {self.config.server_address} over {transport} "
              f"(env ids from {first_env_id}, run {run_id:x})", flush=True)

    def _serve(self, stream: _Stream, run_id: int) -> None:
        reply = stream.call(seed_pb2.ActorMessage(handshake=self._handshake(run_id)))
        self.compression = codec = granted_compression(self.config, self.asked_compression, reply.handshake_reply)
        self._connected(reply.handshake_reply.first_env_id, run_id,
                        "grpc" if codec == compression.NONE else f"grpc+{codec}")
        k = self.config.envs_per_actor

        def exchange(step: BatchStep) -> np.ndarray:
            reply = stream.call(step_message(step, codec))
            return wire.decode_actions(reply.actions.action, self.spec, k)

        self._step_loop(exchange)

    def _step_loop(self, exchange: Callable[[BatchStep], np.ndarray]) -> None:
        """Steps the envs until `stop`; `exchange` hands one step to the learner and returns its actions."""
        config = self.config
        k = config.envs_per_actor
        # A new run starts every env afresh: the learner treats first contact as an episode start.
        step = BatchStep(self.envs.reset(), np.zeros(k, np.float32), np.zeros(k, bool), np.zeros(k, bool), [])
        last_log = time.monotonic()
        steps_at_last_log = self.agent_steps
        while not self.stop.is_set():
            sent = time.perf_counter()
            actions = exchange(step)  # the round trip: encoding and decoding included on gRPC
            latency = time.perf_counter() - sent
            self.latencies_s.append(latency)
            step = self.envs.step(actions)
            self.agent_steps += k
            self.stats.record(k, latency)
            now = time.monotonic()
            if now - last_log >= config.log_interval_s:
                fps = (self.agent_steps - steps_at_last_log) * self.spec.action_repeat / (now - last_log)
                p50 = np.percentile(self.latencies_s, 50) * 1e3
                print(f"[actor {config.actor_index}] env_frames/s={fps:,.0f} round_trip_p50={p50:.2f}ms", flush=True)
                self.latencies_s.clear()
                last_log, steps_at_last_log = now, self.agent_steps
