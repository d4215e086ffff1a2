"""Notifications between the actors' writers and inference: a pipe per inference device, an eventfd per actor.

Request pipe (writers -> one inference device): 16-byte messages (actor int64, request seq int64), in a
packet-mode pipe (`new_request_channel`, O_DIRECT): the kernel keeps each write a packet of its own and a read
returns at most one packet, so message boundaries survive many writers. Actors on this host write the pipe
themselves; one of them writing 5 bytes drops that one packet (`RequestBatcher` logs its size) instead of
shifting every later message of every writer, as a byte stream would. The pipe is sized for
REQUEST_PIPE_PACKETS packets (a packet takes a page of the pipe's buffer); past that a writer blocks until
inference reads, which it would have waited for anyway.

Reply eventfd (inference -> whoever waits on actor a's slot): one per actor index (per actor stream with
--env_groups), created by the learner, inherited by the serving process and handed to an actor that attaches over
shared memory. Inference adds 1 to the eventfd of every actor a batch answered; the slot's lock holder (a gRPC
stream in the serving process or an shm actor: one at a time per index) waits on it. A wake-up says only
"look at the slot": it may be left over from an earlier request, so the slab's reply_seq says whose reply it is.

The data itself is in the step slab; a notification only says "slot a is ready" and, being a syscall pair,
doubles as the memory barrier between the two processes.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import math
import mmap
import os
import select
import time
from collections.abc import Sequence

import numpy as np

from seed.transport.slab import StepSlab

REQUEST_DTYPE = np.dtype([("actor", "<i8"), ("seq", "<i8")])
REQUEST_PIPE_PACKETS = 256  # notifications a request pipe holds (a page each); the unprivileged maximum by default
# Read per `_fill` at most, so a flood (of notifications or of malformed packets) cannot keep the reader there.
_DRAIN_READS, _DRAIN_BYTES = 4096, 4096 * REQUEST_DTYPE.itemsize
_DROP_LOG_INTERVAL_S = 10.0

log = logging.getLogger(__name__)


def new_request_channel() -> tuple[int, int]:
    """A request pipe in packet mode: (read end, write end), both close-on-exec (passed on explicitly).

    Sized for REQUEST_PIPE_PACKETS notifications where the system allows (F_SETPIPE_SZ; the default holds 16)."""
    read_fd, write_fd = os.pipe2(os.O_DIRECT | os.O_CLOEXEC)
    for packets in (REQUEST_PIPE_PACKETS, REQUEST_PIPE_PACKETS // 4):
        try:  # above /proc/sys/fs/pipe-max-size, or the user's pipe pages used up: EPERM; keep what it has
            fcntl.fcntl(write_fd, fcntl.F_SETPIPE_SZ, packets * mmap.PAGESIZE)
            break
        except OSError:
            continue
    return read_fd, write_fd


def send_request(fd: int, actor: int, seq: int) -> None:
    """Notifies that slot `actor` holds request `seq`: one 16-byte packet on a request pipe's write end."""
    os.write(fd, np.array([(actor, seq)], REQUEST_DTYPE).tobytes())


def new_reply_fd() -> int:
    """A reply eventfd: non-blocking, so a wake-up someone else consumed first never blocks the reader."""
    return os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)


def send_replies(reply_fds: Sequence[int], actors: np.ndarray) -> None:
    """Wakes the reply eventfd of each actor index in `actors` (int64 [n]), after inference wrote their replies."""
    for actor in actors.tolist():
        os.eventfd_write(reply_fds[actor], 1)


def consume_wake(fd: int) -> bool:
    """Takes the wake-ups waiting on a reply eventfd; whether there were any."""
    with contextlib.suppress(BlockingIOError):
        return os.eventfd_read(fd) > 0
    return False


class ReplyWaiter:
    """Waits for wake-ups on one actor index's reply eventfd (one waiter at a time: the slot's lock holder)."""

    def __init__(self, fd: int):
        self.fd = fd
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)

    def wait(self, timeout_s: float) -> bool:
        """Whether a wake-up arrived within `timeout_s` seconds (taken: the eventfd reads zero again)."""
        return bool(self._poll.poll(int(timeout_s * 1000))) and consume_wake(self.fd)


class RequestBatcher:
    """Groups request notifications into inference batches for one device.

    A batch is ready when its requests hold `batch_rows` env rows, or `timeout_s` after its oldest request
    arrived (arrival times come from the slab), whichever is first; past the deadline it still takes what is
    already waiting. Requests are never split; surplus requests wait for the next batch.

    `next_batch(wait_s)` -> (actors int64 [n], seqs int64 [n]) in arrival order, or None if nothing arrived
    within `wait_s` seconds (so the caller can check for shutdown).

    Actors on the learner's host write this pipe and their slot's `arrival_s` themselves (seed/transport/shm/link.py),
    so neither is trusted: a packet that is not whole 16-byte messages, or a message naming an actor outside
    [0, num_actors) or served by another device (actor % num_devices != device_index), is dropped alone and
    counted in `rejected`, never used as an index; a batch's deadline is kept within `timeout_s` of now whatever
    the slab's arrival times say (a NaN counts as now), so an absurd one can neither stall nor crash the batcher.

    `fd` is the read end of a `new_request_channel` pipe (packet mode: the write end decides, so it cannot be
    checked here); the batcher makes it non-blocking.
    """

    def __init__(self, fd: int, slab: StepSlab, batch_rows: int, timeout_s: float, device_index: int = 0,
                 num_devices: int = 1):
        if batch_rows < 1:
            raise ValueError(f"inference_batch_size: got {batch_rows}, expected >= 1")
        if timeout_s < 0:
            raise ValueError(f"batch_timeout_ms: got {timeout_s * 1000}, expected >= 0")
        self._fd = fd
        os.set_blocking(fd, False)
        self._file = open(fd, "rb", buffering=0, closefd=False)  # noqa: SIM115 - readinto without a buffer copy
        self._buffer = bytearray(_DRAIN_BYTES + mmap.PAGESIZE)  # a packet is at most a page
        self._slab = slab
        self._rows_per_request = slab.envs_per_actor
        self._max_requests = max(1, -(-batch_rows // self._rows_per_request))
        self.timeout_s = timeout_s
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)
        self._pending = np.empty(0, REQUEST_DTYPE)
        self._device_index, self._num_devices = device_index, num_devices
        self.rejected = 0  # notifications dropped as malformed
        self._malformed_sizes: dict[int, int] = {}  # packet size -> count, since the last log line
        self._malformed_logged = -math.inf

    def _fill(self, timeout_s: float) -> bool:
        """Reads whatever notifications arrive within `timeout_s`; whether any packet did."""
        if not self._poll.poll(max(0, int(timeout_s * 1000 + 0.999))):
            return False
        # Packets go straight into one buffer, one read each (a read returns at most one packet); a malformed one
        # is overwritten by the next.
        view, filled, malformed, size = memoryview(self._buffer), 0, 0, REQUEST_DTYPE.itemsize
        for _ in range(_DRAIN_READS):
            if filled + mmap.PAGESIZE > len(self._buffer):
                break
            n = self._file.readinto(view[filled:filled + mmap.PAGESIZE])
            if not n:  # None: nothing more now; 0: every writer closed (the learner holds one: only at its exit)
                break
            if n % size == 0:  # one message, or several that one writer wrote at once
                filled += n
            else:
                malformed += 1
                self._malformed_sizes[n] = self._malformed_sizes.get(n, 0) + 1
        if malformed:
            self.rejected += malformed
            self._log_malformed()
        if not filled:
            return malformed > 0
        requests = np.frombuffer(self._buffer, REQUEST_DTYPE, count=filled // size)  # copied below
        actors = requests["actor"]
        in_range = (actors >= 0) & (actors < self._slab.layout.num_actors)
        ours = in_range & (actors % self._num_devices == self._device_index)
        if not ours.all():
            self.rejected += int((~ours).sum())
            log.warning("request pipe of device %d: dropped %d notifications naming actors %s, expected "
                        "0 <= actor < %d with actor %% %d == %d", self._device_index, int((~ours).sum()),
                        actors[~ours][:5].tolist(), self._slab.layout.num_actors, self._num_devices,
                        self._device_index)
            requests = requests[ours]
        self._pending = np.concatenate([self._pending, requests])
        return True

    def _log_malformed(self) -> None:
        """Says which packet sizes were dropped, at most once per _DROP_LOG_INTERVAL_S (a writer flooding the pipe
        with bad packets must not flood the log too); the sizes seen meanwhile go into the next line."""
        now = time.monotonic()
        if now - self._malformed_logged < _DROP_LOG_INTERVAL_S:
            return
        self._malformed_logged = now
        sizes = ", ".join(f"{n} of {size} bytes" for size, n in sorted(self._malformed_sizes.items()))
        log.warning("request pipe of device %d: dropped malformed notifications (%s), expected packets of %d "
                    "bytes (actor int64, seq int64); %d notifications dropped so far", self._device_index, sizes,
                    REQUEST_DTYPE.itemsize, self.rejected)
        self._malformed_sizes.clear()

    def _deadline(self) -> float:
        """When the batch of the pending requests is due (time.monotonic() seconds): `timeout_s` after the oldest
        arrival, kept within [now - timeout_s, now + timeout_s] (no true arrival is later than now; a NaN
        counts as now), so an actor's +inf or 1e300 neither overflows the poll timeout nor holds the batch."""
        now = time.monotonic()
        oldest = float(np.fmin.reduce(self._slab.arrival_s[self._pending["actor"]]))  # fmin skips NaNs
        deadline = (now if math.isnan(oldest) else oldest) + self.timeout_s
        return min(max(deadline, now - self.timeout_s), now + self.timeout_s)

    def next_batch(self, wait_s: float) -> tuple[np.ndarray, np.ndarray] | None:
        if not len(self._pending):
            self._fill(wait_s)
            if not len(self._pending):  # nothing came, or only notifications that were dropped
                return None
        deadline = self._deadline()
        while len(self._pending) < self._max_requests:
            if not self._fill(max(0.0, deadline - time.monotonic())):
                break
        batch, self._pending = self._pending[:self._max_requests], self._pending[self._max_requests:]
        return batch["actor"].copy(), batch["seq"].copy()
