"""The actor: a thin loop around K environments that streams them to the learner.

One process, one link to the learner per run (seed/transport/link.py: `ActorLink`). Each step hands the K envs'
single frames, rewards, dones and truncations and finished-episode stats to the link, waits for K actions and steps
the envs (finished envs are reset at once; their new first frame goes out with done=True). The link is a gRPC
stream (seed/transport/grpc/link.py), or, with --transport=shm (or auto, the default, when --server_address is a
unix socket and the learner offers it), the learner's step slab itself (seed/transport/shm/link.py): handshake,
token, superseded runs and reconnection are the same.

Errors have one path: every link translates its own into LinkDown (the learner went away: reconnect with
exponential backoff, reset after a connection that streamed, and a new run id, whose envs restart their episodes)
or a LinkFatal, which ends the actor: ConfigurationError (a rejected handshake or a wrong token), SupersededError (a
newer actor run that handshook with this actor's index took it over: that is how a restarted actor replaces its
dead predecessor; this one ends rather than evict the newer one in turn) and InvalidReplyError. RunFinished (the
learner said its run is over: seed/learner/run_end.py) ends it with status 0 (--exit_when_done); a learner that
restarts only goes away, which is a LinkDown, so it is waited for. SIGTERM ends it cleanly.
With --tls_* flags the channel is mutual TLS; with --auth_token(_file) the token goes in the Stream
call's metadata or the shm hello (seed/transport/). With --compression=lz4 over TCP the actor asks for lz4 in its
handshake and, if the learner grants it, compresses every step's observations (seed/transport/grpc/compression.py);
on a unix socket it sends them raw.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable

import grpc
import numpy as np

from seed._proto import seed_pb2
from seed.actor.stats import ActorStats
from seed.config import ActorConfig
from seed.envs import make_batch
from seed.envs.base import BatchStep, EnvBatch
from seed.transport import TransportConfigError, TransportSecurity, open_channel, wire
from seed.transport.grpc import compression
from seed.transport.grpc.channel import unix_listener_problem
from seed.transport.grpc.link import GrpcLink, granted_codec
from seed.transport.link import ActorLink, LinkDown, LinkError, RunFinished
from seed.transport.shm.link import ShmLink, ShmUnavailable
from seed.transport.shm.protocol import handover_path

log = logging.getLogger(__name__)

# While the learner is away, a failed connection attempt is retried on a fresh channel (a fresh name lookup) at most
# this often (Actor._wait_for_learner).
REDIAL_INTERVAL_S = 1.0
# A channel still connecting after this long is replaced too: its lookup may have given the address of a learner
# that has gone (a removed container's name, before the network's DNS forgets it), and a connect to an address
# nobody holds hangs until gRPC's 20-s connect deadline.
STALLED_CONNECT_S = 3.0


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
    granted = granted_codec(asked, reply)
    _said_not_granted(config, asked, granted)
    return granted


def _said_not_granted(config: ActorConfig, asked: str, granted: str) -> None:
    if granted != asked:
        print(f"[actor {config.actor_index}] the learner did not grant --compression={asked}; sending raw "
              "observations", flush=True)


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
        self.run_finished = False  # the learner said its run is over (RunFinished)
        self.stats = ActorStats(config.stats_file, config.stats_interval_s, self.spec.action_repeat, config.actor_index)
        self._link: ActorLink | None = None  # of the current connection, for request_stop

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
        link = self._link
        if link is not None:
            link.cancel()

    def run(self) -> None:
        """Serves the learner until `stop`. Raises ConfigurationError (rejected by the learner), SupersededError (a
        newer actor run took over this actor's index) or InvalidReplyError (actions it will not step with)."""
        backoff = ReconnectBackoff(0.1, self.config.reconnect_max_backoff_s)
        try:
            while not self.stop.is_set():
                steps_before = self.agent_steps
                try:
                    self._run_connection()
                except LinkError as error:
                    if self.stop.is_set():
                        break  # stopping: however the link ended
                    if isinstance(error, RunFinished) and self.config.exit_when_done:
                        self.run_finished = True
                        print(f"[actor {self.config.actor_index}] {error}; exiting", flush=True)
                        break
                    if not isinstance(error, (LinkDown, RunFinished)):
                        raise  # a LinkFatal ends the actor
                    delay = backoff.after_failure(streamed=self.agent_steps > steps_before)
                    print(f"[actor {self.config.actor_index}] learner unavailable over {error.transport} ({error}); "
                          f"reconnecting in {delay:.1f}s", flush=True)
                    self.stop.wait(delay)
        finally:
            self.stats.write(final=True)
            self.envs.close()

    def _wait_for_learner(self) -> grpc.Channel | None:
        """A channel to --server_address once it connects and, for a unix: address, the listener runs as this
        actor's user or root (`unix_listener_problem`: the stream's call carries the token); None if the actor
        stops first. Says once when a connection attempt failed (no learner there yet, or one that refuses this
        actor's transport, e.g. plaintext against TLS) or another user listens, so a wrong flag or a taken path is
        visible.

        After a failed attempt (TRANSIENT_FAILURE) the channel is replaced by a fresh one, at most every
        REDIAL_INTERVAL_S: a fresh channel resolves the name at once, while a channel's own resolver re-resolves
        at most every 30 s, and after a failed lookup backs off up to 120 s. A learner that comes back at another
        address under the same name (a restarted container, a rescheduled job) is so found within about a
        second. A channel still connecting is left to finish, for at most STALLED_CONNECT_S."""
        reported = foreign_reported = False
        backoff = 0.1
        while not self.stop.is_set():
            channel = open_channel(self.config.server_address, self.security)
            failed = threading.Event()

            def on_state(state: grpc.ChannelConnectivity, failed=failed) -> None:
                if state == grpc.ChannelConnectivity.TRANSIENT_FAILURE:
                    failed.set()

            channel.subscribe(on_state)
            opened = time.monotonic()
            ready = grpc.channel_ready_future(channel)
            try:
                while not self.stop.is_set():
                    try:
                        ready.result(timeout=backoff)
                        problem = unix_listener_problem(self.config.server_address)
                        if problem is None:
                            channel.unsubscribe(on_state)
                            return channel
                        if not foreign_reported:  # the learner's user may claim the path later: keep checking
                            foreign_reported = True
                            print(f"[actor {self.config.actor_index}] {problem}; retrying", flush=True)
                        self.stop.wait(backoff)
                    except grpc.FutureTimeoutError:
                        pass
                    backoff = min(backoff * 2, self.config.reconnect_max_backoff_s, REDIAL_INTERVAL_S)
                    if failed.is_set() and not reported:
                        reported = True
                        print(f"[actor {self.config.actor_index}] cannot connect to {self.config.server_address} "
                              "(TRANSIENT_FAILURE: no learner there yet, or it refused this actor's transport "
                              "security); retrying", flush=True)
                    waited = time.monotonic() - opened
                    if (failed.is_set() and waited >= REDIAL_INTERVAL_S) or waited >= STALLED_CONNECT_S:
                        break  # redial on a fresh channel: it resolves the name anew
            except BaseException:
                ready.cancel()
                channel.close()
                raise
            ready.cancel()
            channel.close()
        return None

    def _handshake(self, run_id: int) -> seed_pb2.Handshake:
        return seed_pb2.Handshake(actor_index=self.config.actor_index, run_id=run_id,
                                  num_envs=self.config.envs_per_actor, spec=wire.spec_to_proto(self.spec),
                                  compression=self.asked_compression)

    def _run_connection(self) -> None:
        """One run: connect (a new run id), step until `stop` or a link error."""
        link = self._connect(random.SystemRandom().getrandbits(63))
        if link is None:
            return
        try:
            self._step_loop(link.step)
        finally:
            self._link = None
            link.close()

    def _connect(self, run_id: int) -> ActorLink | None:
        """This run's link, handshaken: shared memory when --transport allows it and the learner offers it, else
        gRPC; None if the actor stops while it waits for the learner."""
        # The learner's serving process offers shm before it serves gRPC: once gRPC answers, the handover socket is
        # there if the learner offers one.
        channel = self._wait_for_learner()
        if channel is None:
            return None
        grpc_link = None  # owns the channel once built
        try:
            if self.stop.is_set():
                channel.close()
                return None
            handshake = self._handshake(run_id)
            link = self._attach_shm(handshake) if self.shm_path else None
            if link is not None:
                channel.close()
                self.compression = compression.NONE
            else:
                link = grpc_link = GrpcLink(channel, self.security.call_metadata(), self.spec,
                                            self.config.envs_per_actor)
                self._link = grpc_link  # request_stop cancels a handshake that waits, too
                grpc_link.handshake(handshake)
                self.compression = grpc_link.codec
                _said_not_granted(self.config, self.asked_compression, grpc_link.codec)
        except BaseException:
            self._link = None
            if grpc_link is not None:
                grpc_link.close()
            else:
                channel.close()
            raise
        self._link = link
        self.connections += 1
        self.transport = link.transport
        print(f"[actor {self.config.actor_index}] connected to {self.config.server_address} over {link.transport} "
              f"(env ids from {link.first_env_id}, run {run_id:x})", flush=True)
        return link

    def _attach_shm(self, handshake: seed_pb2.Handshake) -> ShmLink | None:
        """The shared-memory link of this run, or None to use gRPC (--transport=auto and the learner offers no
        shm: no handover socket, e.g. --shm_actors=false). Raises ShmUnavailable for --transport=shm."""
        try:
            return ShmLink.connect(self.shm_path, handshake, self.security.call_metadata(), self.stop)
        except ShmUnavailable as error:
            if self.config.transport == "shm":
                raise
            print(f"[actor {self.config.actor_index}] no shared-memory path ({error}); using gRPC", flush=True)
            return None

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
