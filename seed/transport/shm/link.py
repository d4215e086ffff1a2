"""An actor's shared-memory link to a learner on its host: steps go straight into the learner's step slab.

`ShmLink.connect` dials the learner's handover socket (`<unix socket>.shm`, seed/transport/shm/protocol.py),
checks that its listener runs as this actor's user (or root), sends the same Handshake and token a gRPC stream
would and receives the slab's memfd, the request pipe of its inference device and its own reply eventfd. Each
`exchange` then does what the serving process's stream thread does for a gRPC actor (seed/transport/grpc/service.py),
with the same slab protocol (seed/transport/slab.py):

  take the slot's cross-process lock  ->  check that this run is still the index's live run (else superseded)
  ->  finish a predecessor's unanswered request (notify it again, wait for its answer)  ->  write the K rows
  (`StepSlab.write_request`)  ->  a 16-byte packet on the request pipe  ->  wait for the eventfd, then read the reply
  status and K actions  ->  release the lock.

No protobuf, no gRPC and no other process is on the step's path: one memcpy of the rows, one pipe write, one
eventfd read. The reply is read only after an eventfd read (the kernel orders inference's slab writes before
it), never by polling `reply_seq`. Inference checks the rows like the serving process checks a StepBatch and
answers a bad one REPLY_INVALID with the reason. The handover connection stays open for the run: the learner
closing it (serving process or learner gone, shutdown) ends the run and the actor reconnects.

`ShmLink` is the shared-memory `ActorLink` (seed/transport/link.py): `step` is `exchange` plus the actions' check
and the finished episodes' frame. Its errors are of the link family: ShmUnavailable is a LinkDown, ShmSuperseded a
SupersededError, ShmRejected (INVALID_ARGUMENT, UNAUTHENTICATED: what the gRPC path refuses with) a
ConfigurationError; the end of the learner's run (a hello refused with OUT_OF_RANGE, `wire.RUN_FINISHED`, or the
slab's `run_finished` seen before a request or while waiting for its reply) a RunFinished; a refusal with any
other code (DEADLINE_EXCEEDED for a slow hello) is a ShmUnavailable.
"""

from __future__ import annotations

import base64
import contextlib
import os
import select
import socket
import struct
import threading
import time

import numpy as np

from seed._proto import seed_pb2
from seed.envs.base import BatchStep, EnvSpec
from seed.transport import notify, wire
from seed.transport.link import (
    ActorLink,
    ConfigurationError,
    InvalidReplyError,
    LinkDown,
    RunFinished,
    SupersededError,
)
from seed.transport.shm import protocol as shm_protocol
from seed.transport.slab import REPLY_INVALID, REPLY_OK, REPLY_STALE, SlabLayout, StepSlab

_POLL_MS = 100  # how often a wait checks the actor's stop event


class ShmUnavailable(LinkDown):
    """The learner cannot be reached over shared memory now (no handover socket, connection closed, inference
    failed): reconnect later, like after a gRPC stream's UNAVAILABLE."""

    def __init__(self, message: str):
        super().__init__(message, "shm")


class ShmRejected(ConfigurationError):
    """The learner refused this actor; `code` is the gRPC status name it would have used (INVALID_ARGUMENT or
    UNAUTHENTICATED): retrying cannot help."""

    def __init__(self, code: str, details: str):
        super().__init__(details)
        self.code, self.details = code, details


FATAL_CODES = ("INVALID_ARGUMENT", "UNAUTHENTICATED")  # the refusals a gRPC actor ends on too


def refusal(code: str, details: str) -> ShmRejected | ShmUnavailable | RunFinished:
    """The error of the learner's refusal frame: ShmRejected for FATAL_CODES, RunFinished for `wire.RUN_FINISHED`
    (the learner's run is over), else ShmUnavailable (reconnect)."""
    if code == wire.RUN_FINISHED.name:
        return RunFinished(details, "shm")
    return ShmRejected(code, details) if code in FATAL_CODES else ShmUnavailable(f"{code}: {details}")


class ShmSuperseded(SupersededError):
    """A newer run of this actor index handshook while this one was alive."""


def check_peer(sock: socket.socket, path: str) -> None:
    """Raises ShmUnavailable unless the process listening on the handover socket runs as this actor's user or as
    root (SO_PEERCRED: its credentials when it called listen()).

    The learner's handover socket is mode 0600, so an actor of another user cannot connect to it anyway; but in a
    directory others can write (/tmp), another user may have created `P.shm` first and be listening there. Root
    is accepted as well: it can read this process's memory anyway, so the token tells it nothing new.
    """
    pid, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    if uid not in (os.getuid(), 0):
        raise ShmUnavailable(f"handover socket {path}: peer uid: got {uid} (pid {pid}), expected this actor's uid "
                             f"{os.getuid()} or root (0): another user listens there; the hello (with the token) "
                             "was not sent")


class ShmLink(ActorLink):
    """One actor run attached to the learner's step slab. Build with `connect`; `close` when the run ends."""

    transport = "shm"

    def __init__(self, sock: socket.socket, slab: StepSlab, request_fd: int, reply_fd: int, actor: int,
                 run_id: int, first_env_id: int, stop: threading.Event, spec: EnvSpec):
        self._sock = sock
        self.slab = slab
        self._request_fd, self._reply_fd = request_fd, reply_fd
        self.actor, self.run_id, self.first_env_id = actor, run_id, first_env_id
        self._stop = stop
        self.spec = spec
        self._poll = select.poll()
        self._poll.register(reply_fd, select.POLLIN)
        self._poll.register(sock.fileno(), select.POLLIN)

    @classmethod
    def connect(cls, path: str, handshake: seed_pb2.Handshake, metadata: tuple[tuple[str, str], ...],
                stop: threading.Event, timeout_s: float = 10.0) -> ShmLink:
        """Dials `path`, authenticates with `metadata` (the gRPC call metadata: the token, if any), handshakes.

        Raises ShmUnavailable (no learner offers shm there now), ShmRejected (the learner refused this actor).
        """
        try:
            spec = wire.spec_from_proto(handshake.spec)  # for the actions' check
        except wire.WireError as error:  # what the learner's handshake check would refuse
            raise ShmRejected("INVALID_ARGUMENT", f"handshake.{error}") from None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        fds: list[int] = []
        try:
            sock.settimeout(timeout_s)
            try:
                sock.connect(path)
            except (FileNotFoundError, ConnectionRefusedError) as error:
                raise ShmUnavailable(f"handover socket {path}: {error.strerror}") from None
            check_peer(sock, path)  # before the hello: it carries the token
            hello = {"metadata": [list(pair) for pair in metadata],
                     "handshake": base64.b64encode(handshake.SerializeToString()).decode()}
            shm_protocol.send_json(sock, hello)
            payload, fds = shm_protocol.read_frame_with_fds(sock)
            if payload is None:
                raise ShmUnavailable(f"handover socket {path}: closed before the handshake reply")
            reply = shm_protocol.read_json(payload, "handshake reply")
            if not reply.get("ok"):
                raise refusal(str(reply.get("code", "UNKNOWN")), str(reply.get("details", "")))
            if len(fds) != shm_protocol.NUM_FDS:
                raise ShmUnavailable(f"handshake reply: got {len(fds)} descriptors, expected {shm_protocol.NUM_FDS}")
            memfd, request_fd, reply_fd = fds
            values = dict(reply["layout"], fd=memfd, observation_shape=tuple(reply["layout"]["observation_shape"]))
            layout = SlabLayout(**values)
            if (layout.envs_per_actor != handshake.num_envs or not handshake.actor_index < layout.num_actors
                    or layout.action_shape != tuple(handshake.spec.action_shape)):
                raise ShmUnavailable(f"handshake reply layout: got {layout}, expected envs_per_actor "
                                     f"{handshake.num_envs}, more than {handshake.actor_index} actors and "
                                     f"action_shape {tuple(handshake.spec.action_shape)}")
            slab = StepSlab.attach(layout)
            sock.settimeout(None)
            link = cls(sock, slab, request_fd, reply_fd, handshake.actor_index, handshake.run_id,
                       int(reply["first_env_id"]), stop, spec)
        except (OSError, shm_protocol.FrameError, KeyError, TypeError) as error:
            cls._discard(sock, fds)
            raise ShmUnavailable(f"handover socket {path}: {type(error).__name__}: {error}") from None
        except BaseException:
            cls._discard(sock, fds)
            raise
        # Wake-ups already in the index's eventfd are left there: a live older run of this index may be waiting
        # for one of them (it holds the slot until its reply; draining here stole it and deadlocked both runs).
        # A wake-up that answers nothing of ours costs one more look at `reply_seq` in `_await_reply`.
        return link

    @staticmethod
    def _discard(sock: socket.socket, fds: list[int]) -> None:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        sock.close()

    def step(self, step: BatchStep) -> np.ndarray:
        actions = self.exchange(step.observation, step.reward.astype(np.float32, copy=False), step.done,
                                step.truncated)
        try:
            wire.check_actions(actions, self.spec, "slab.action")
        except wire.WireError as error:
            raise InvalidReplyError(str(error)) from None
        if step.finished:
            self.send_episodes([wire.episode_to_proto(e) for e in step.finished])
        return actions

    def exchange(self, observation: np.ndarray, reward: np.ndarray, done: np.ndarray, truncated: np.ndarray
                 ) -> np.ndarray:
        """Hands one step of the K envs to inference through the slab; their actions (a copy: int32 [K], or
        float32 [K, D] for a Box; unchecked: `step` checks them, `wire.check_actions`)."""
        slab, actor = self.slab, self.actor
        self._lock()
        try:
            if int(slab.live_run[actor]) != self.run_id:
                raise ShmSuperseded(self._superseded())
            self._end_if_finished()
            left = slab.unanswered(actor)
            if left is not None:  # our predecessor died waiting (or before notifying): finish its request first
                notify.send_request(self._request_fd, actor, left)
                self._await_reply(left)
            seq = slab.write_request(actor, self.run_id, observation, reward, done, truncated)
            notify.send_request(self._request_fd, actor, seq)
            self._await_reply(seq)
            status = int(slab.reply_status[actor])
            actions = slab.action[slab.rows(actor)].copy()
            error = slab.error(actor) if status == REPLY_INVALID else ""
        finally:
            slab.unlock_slot(actor)
        if status == REPLY_STALE:
            raise ShmSuperseded(self._superseded())
        if status == REPLY_INVALID:
            raise ShmRejected("INVALID_ARGUMENT", f"actor {actor}: {error}")
        if status != REPLY_OK:
            raise ShmUnavailable("inference failed for this batch; reconnect")
        return actions

    def send_episodes(self, finished: list[seed_pb2.EpisodeStats]) -> None:
        """Reports finished episodes (checked by the serving process like a StepBatch's `finished`)."""
        try:
            shm_protocol.send_frame(self._sock, seed_pb2.StepBatch(finished=finished).SerializeToString())
        except OSError as error:
            raise ShmUnavailable(f"handover connection: {error}") from None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.close()
        self.slab.close()
        for fd in (self._request_fd, self._reply_fd, self.slab.layout.fd):
            with contextlib.suppress(OSError):
                os.close(fd)

    def _lock(self) -> None:
        """The slot's cross-process lock; waits (polling) while a predecessor's request holds it."""
        while not self.slab.lock_slot(self.actor, blocking=False):
            self._check_connection(0)
            self._end_if_finished()
            if self._stop.is_set():
                raise ShmUnavailable("actor stopping")
            time.sleep(0.001)

    def _await_reply(self, seq: int) -> None:
        """Returns once the slot's reply answers request `seq` (read after an eventfd wake-up only)."""
        while True:
            events = dict(self._poll.poll(_POLL_MS))
            if self._sock.fileno() in events:
                self._check_connection(0)
            if self._reply_fd in events:
                # The kernel orders inference's slab writes before this read. No wake-up left (a newer run of this
                # index took it; the eventfd is non-blocking): look at the slot all the same, then wait again.
                notify.consume_wake(self._reply_fd)
                if self.slab.answered(self.actor, seq):
                    return
            if self._stop.is_set():
                raise ShmUnavailable("actor stopping")
            if not events:  # inference may never answer a run that is over (its sink or gate waits on training)
                self._end_if_finished()

    def _end_if_finished(self) -> None:
        """Raises RunFinished once the learner's run is over (the slab's `run_finished`)."""
        told = self.slab.tell_finished(self.actor)
        if told is not None:
            raise RunFinished(told, "shm")

    def _check_connection(self, timeout_ms: int) -> None:
        """Raises if the learner closed the handover connection or sent an error frame."""
        if not select.select([self._sock], [], [], timeout_ms / 1000)[0]:
            return
        try:
            payload = shm_protocol.read_frame(self._sock)
        except (OSError, shm_protocol.FrameError) as error:
            raise ShmUnavailable(f"handover connection: {error}") from None
        if payload is None:
            raise ShmUnavailable("the learner closed the shm connection (serving process or learner gone)")
        reply = shm_protocol.read_json(payload, "learner message")
        raise refusal(str(reply.get("code", "UNKNOWN")), str(reply.get("details", "")))

    def _superseded(self) -> str:
        return (f"actor_index {self.actor}: superseded by a newer actor run (run "
                f"0x{int(self.slab.live_run[self.actor]):x} handshook after this run 0x{self.run_id:x}); expected "
                f"one live actor per --actor_index, but another actor with --actor_index={self.actor} connected "
                "while this one was alive")

