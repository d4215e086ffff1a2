"""The step slab: every env's latest step in shared memory, written by the serving process, read by inference.

One anonymous shared-memory file (memfd; never a name in /dev/shm, so a killed learner leaves nothing behind;
its size sealed, so no holder of the descriptor can shrink it under a mapping), mapped by the learner and by the
serving process, which inherits its file descriptor. Rows are indexed by env id, so actor `a` with K envs owns
rows [a*K, (a+1)*K) and an inference batch is one gather of the ready actors' rows, however many actors it
holds. Each actor has exactly one request in flight (the stream is request/reply), so one slot per actor is all
the buffering there is: no queue, no per-request Python object on the inference side.

Layout (N = num_actors * envs_per_actor rows, A = num_actors slots):

  observation    [N, *observation_shape]  the actor's dtype (uint16 frames stay uint16 bits)
  reward         float32 [N]
  done           bool [N]
  truncated      bool [N]
  action         int32 [N]          written by inference, read by the serving process for the reply
                 (float32 [N, D] for a Box action space: the layout's action_dtype and action_shape)
  request_run    int64 [A]          run id of the actor run whose step is in the slot
  request_seq    int64 [A]          increments with every request of the slot; negative while one is written
  arrival_s      float64 [A]        time.monotonic() when the request arrived (system-wide clock)
  live_run       int64 [A]          run id registered by the actor's latest handshake (0 = none yet)
  reply_seq      int64 [A]          request_seq of the request the slot's current reply answers
  reply_status   int8 [A]           REPLY_OK, REPLY_STALE, REPLY_FAILED or REPLY_INVALID
  reply_error    uint8 [A, 256]     REPLY_INVALID only: why, UTF-8, NUL-padded (names field, got, expected)
  run_finished   int64 [2]          written by the learner once its run is over: [1, env frames at its end];
                 [0, 0] while it trains (or restarts: a restarting learner never says finished)
  told_finished  uint8 [A]          1 once the slot's actor was told the run is finished (by whichever transport)

Protocol per request (serving side): mark the slot as being written (request_seq = -new seq), write the rows,
request_run and arrival_s, publish the new request_seq, then notify inference through a pipe (a syscall: the
writes are visible to the reader after it). Inference writes `action`, `reply_status` and `reply_seq` before
waking the actor's reply eventfd (seed/transport/notify.py), and the waiting side reads a reply only after it took
that wake-up.

One request in flight per slot: a slot is free once `reply_seq == request_seq`, and only a free slot is written.
The serving process's per-actor lock keeps this among its own streams; a new serving process (the old one died)
finds the request its predecessor left unanswered with `unanswered`, notifies it again and waits for its
answer before it writes, so inference never reads rows that a writer is changing. Inference reads a slot like
a seqlock all the same: request_seq and request_run before the rows, and again after; a slot that changed in
between is dropped (its new request has its own notification).

Actors on the learner's host may map the slab themselves (seed/transport/shm/link.py) and write their own slot, so
writers live in several processes. `lock_slot` is the cross-process part of "one writer per slot": a POSIX
record lock on byte `actor` of the slab's file, taken by every writer (the serving process's streams too) from
the live-run check until the reply is read, and released by the kernel when its holder dies.

The end of a run is in the slab too, so both transports say it alike: once the learner's run is over it writes
`run_finished` (`mark_finished`), and every writer, a gRPC stream thread or an shm actor, checks it before each
request and while it waits for a reply, tells its actor (`tell_finished` marks the slot's `told_finished`, which
the learner reads to know when every actor has heard) and serves no more steps.
"""

from __future__ import annotations

import dataclasses
import fcntl
import math
import mmap
import os
import tempfile
import time

import numpy as np

REPLY_OK, REPLY_STALE, REPLY_FAILED, REPLY_INVALID = 0, 1, 2, 3
REPLY_ERROR_BYTES = 256
_ALIGN = 64  # bytes; every array starts on a cache line


def finished_message(env_frames: int) -> str:
    """What an actor is told when the learner's run is over (both transports say the same)."""
    return (f"run finished: the learner reached its end (--total_environment_frames or --max_train_steps) at "
            f"env_frames={env_frames:,}; nothing more to act for")


@dataclasses.dataclass(frozen=True)
class SlabLayout:
    """What both processes need to map the same slab (plain values: it crosses the process boundary as JSON).

    fd: the learner's descriptor of the shared file; the serving process inherits the same number.
    action_shape, action_dtype: one env's action as the env spec has it on the wire: () and "int32" (Discrete),
      (D,) and "float32" (Box).
    """

    fd: int
    num_actors: int
    envs_per_actor: int
    observation_shape: tuple[int, ...]
    observation_dtype: str
    action_shape: tuple[int, ...] = ()
    action_dtype: str = "int32"

    def __post_init__(self):
        # JSON (the serving process's configuration, the shm handover) carries tuples as lists.
        object.__setattr__(self, "observation_shape", tuple(self.observation_shape))
        object.__setattr__(self, "action_shape", tuple(self.action_shape))

    @property
    def num_envs(self) -> int:
        return self.num_actors * self.envs_per_actor

    def fields(self) -> list[tuple[str, str, tuple[int, ...]]]:
        n, a = self.num_envs, self.num_actors
        return [
            ("observation", self.observation_dtype, (n, *self.observation_shape)),
            ("reward", "float32", (n,)), ("done", "bool", (n,)), ("truncated", "bool", (n,)),
            ("action", self.action_dtype, (n, *self.action_shape)),
            ("request_run", "int64", (a,)), ("request_seq", "int64", (a,)), ("arrival_s", "float64", (a,)),
            ("live_run", "int64", (a,)), ("reply_seq", "int64", (a,)), ("reply_status", "int8", (a,)),
            ("reply_error", "uint8", (a, REPLY_ERROR_BYTES)),
            ("run_finished", "int64", (2,)), ("told_finished", "uint8", (a,)),
        ]

    def offsets(self) -> tuple[dict[str, int], int]:
        """Byte offset of every field and the total size."""
        offsets, size = {}, 0
        for name, dtype, shape in self.fields():
            offsets[name] = size
            nbytes = math.prod(shape) * np.dtype(dtype).itemsize
            size += -(-nbytes // _ALIGN) * _ALIGN
        return offsets, size


_SIZE_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL if hasattr(fcntl, "F_ADD_SEALS") else 0


def _shared_file(nbytes: int) -> int:
    """A zero-filled shared file of `nbytes` with no name: memfd on Linux, else a temp file unlinked at once.

    The memfd's size is sealed (shrink, grow, and further seals): actors on this host get a writable descriptor of
    it (seed/transport/shm/handover.py), and one `ftruncate` from any of them would otherwise end the learner with
    SIGBUS at its next read of the slab. Writing the rows stays allowed: that is what the actors are for.
    """
    if hasattr(os, "memfd_create"):
        # no MFD_CLOEXEC: the serving process inherits it
        fd = os.memfd_create("seed-step-slab", os.MFD_ALLOW_SEALING if _SIZE_SEALS else 0)
        os.ftruncate(fd, nbytes)
        if _SIZE_SEALS:
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SIZE_SEALS)
        return fd
    fd, path = tempfile.mkstemp(prefix="seed-slab-")
    os.unlink(path)
    os.ftruncate(fd, nbytes)
    return fd


class StepSlab:
    """NumPy views of one mapped slab. `create` makes (and later `unlink`s) the file; `attach` maps it."""

    def __init__(self, layout: SlabLayout, owner: bool):
        self.layout = layout
        self.owner = owner
        offsets, self.nbytes = layout.offsets()
        self._map = mmap.mmap(layout.fd, self.nbytes)
        for name, dtype, shape in layout.fields():
            count = math.prod(shape)
            view = np.frombuffer(self._map, dtype=dtype, count=count, offset=offsets[name]).reshape(shape)
            setattr(self, name, view)
        self.envs_per_actor = layout.envs_per_actor

    @classmethod
    def create(cls, num_actors: int, envs_per_actor: int, observation_shape: tuple[int, ...],
               observation_dtype: str, action_shape: tuple[int, ...] = (), action_dtype: str = "int32") -> StepSlab:
        layout = SlabLayout(-1, num_actors, envs_per_actor, tuple(observation_shape), observation_dtype,
                            tuple(action_shape), action_dtype)
        fd = _shared_file(layout.offsets()[1])
        os.set_inheritable(fd, True)
        return cls(dataclasses.replace(layout, fd=fd), owner=True)

    @classmethod
    def attach(cls, layout: SlabLayout) -> StepSlab:
        """Maps the slab whose descriptor this process holds (inherited, or the owner's own)."""
        return cls(layout, owner=False)

    def rows(self, actor: int) -> slice:
        k = self.envs_per_actor
        return slice(actor * k, (actor + 1) * k)

    def write_request(self, actor: int, run_id: int, observation: np.ndarray, reward: np.ndarray,
                      done: np.ndarray, truncated: np.ndarray) -> int:
        """Copies one validated step of actor `actor` into its rows; returns the request's sequence number.

        The caller holds the actor's slot (one request in flight per actor) and notifies inference after.
        """
        rows = self.rows(actor)
        seq = abs(int(self.request_seq[actor])) + 1
        self.request_seq[actor] = -seq  # being written: a reader that sees this (or seq) drops what it read
        self.observation[rows] = observation
        self.reward[rows] = reward
        self.done[rows] = done
        self.truncated[rows] = truncated
        self.request_run[actor] = run_id
        self.arrival_s[actor] = time.monotonic()
        self.request_seq[actor] = seq
        return seq

    def answered(self, actor: int, seq: int) -> bool:
        return int(self.reply_seq[actor]) == seq

    def unanswered(self, actor: int) -> int | None:
        """The sequence number of the slot's published request if it has no reply yet, else None (the slot is
        free; a negative request_seq is a write that never finished, so never notified, so never read)."""
        seq = int(self.request_seq[actor])
        return seq if seq > 0 and int(self.reply_seq[actor]) != seq else None

    def set_error(self, actor: int, message: str) -> None:
        """Writes the reason of a REPLY_INVALID into the slot (truncated to REPLY_ERROR_BYTES)."""
        data = message.encode("utf-8", "replace")[:REPLY_ERROR_BYTES]
        self.reply_error[actor] = 0
        self.reply_error[actor, :len(data)] = np.frombuffer(data, np.uint8)

    def error(self, actor: int) -> str:
        return self.reply_error[actor].tobytes().rstrip(b"\0").decode("utf-8", "replace")

    def mark_finished(self, env_frames: int) -> None:
        """The learner's run is over (its --total_environment_frames or --max_train_steps reached) at `env_frames`:
        every writer tells its actor so instead of serving the next step (seed/transport/link.py: RunFinished)."""
        self.run_finished[1] = env_frames
        self.run_finished[0] = 1

    def finished_frames(self) -> int | None:
        """The env frames the learner's run finished at, or None while it runs."""
        return int(self.run_finished[1]) if self.run_finished[0] else None

    def tell_finished(self, actor: int) -> str | None:
        """None while the run goes on; once it is finished, records that slot `actor`'s actor is being told and
        returns what to tell it."""
        frames = self.finished_frames()
        if frames is None:
            return None
        self.told_finished[actor] = 1
        return finished_message(frames)

    def lock_slot(self, actor: int, blocking: bool = True) -> bool:
        """Takes the cross-process write lock of slot `actor`; False if `blocking` is off and another process
        holds it. Per process (POSIX record locks): threads of one process need their own lock besides."""
        try:
            fcntl.lockf(self.layout.fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB), 1, actor)
            return True
        except (BlockingIOError, PermissionError):
            return False

    def unlock_slot(self, actor: int) -> None:
        fcntl.lockf(self.layout.fd, fcntl.LOCK_UN, 1, actor)

    def close(self) -> None:
        for name, _, _ in self.layout.fields():
            setattr(self, name, None)
        try:
            self._map.close()
        except BufferError:  # a view is still alive somewhere; the mapping goes with the process
            pass

    def release(self) -> None:
        """The owner's descriptor is closed; the memory goes away with the last mapping."""
        if self.owner and self.layout.fd >= 0:
            try:
                os.close(self.layout.fd)
            except OSError:
                pass
            self.owner = False
