"""Notifications between the actors' writers and inference: a pipe per inference device, an eventfd per actor.

Request pipe (a writer -> one inference device): 16-byte messages (actor int64, request seq int64). Every
write is at most PIPE_BUF bytes, so the kernel never interleaves two writers' messages, and a read of a multiple
of the message size returns whole messages.

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
import logging
import os
import select
import time
from collections.abc import Sequence

import numpy as np

from seed.serving.slab import StepSlab

REQUEST_DTYPE = np.dtype([("actor", "<i8"), ("seq", "<i8")])

log = logging.getLogger(__name__)


def send_request(fd: int, actor: int, seq: int) -> None:
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

    Actors on the learner's host write this pipe themselves (seed/shm_actor_link.py), so a notification is not
    trusted: one naming an actor outside [0, num_actors) or served by another device (actor % num_devices !=
    device_index) is dropped and counted in `rejected`, never used as an index.
    """

    def __init__(self, fd: int, slab: StepSlab, batch_rows: int, timeout_s: float, device_index: int = 0,
                 num_devices: int = 1):
        if batch_rows < 1:
            raise ValueError(f"inference_batch_size: got {batch_rows}, expected >= 1")
        if timeout_s < 0:
            raise ValueError(f"batch_timeout_ms: got {timeout_s * 1000}, expected >= 0")
        self._fd = fd
        self._slab = slab
        self._rows_per_request = slab.envs_per_actor
        self._max_requests = max(1, -(-batch_rows // self._rows_per_request))
        self.timeout_s = timeout_s
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)
        self._pending = np.empty(0, REQUEST_DTYPE)
        self._partial = b""
        self._device_index, self._num_devices = device_index, num_devices
        self.rejected = 0  # notifications dropped as malformed

    def _fill(self, timeout_s: float) -> bool:
        """Reads whatever notifications arrive within `timeout_s`; whether any did."""
        if not self._poll.poll(max(0, int(timeout_s * 1000 + 0.999))):
            return False
        data = os.read(self._fd, 1 << 16)
        if not data:  # every writer closed (the learner holds one, so only at its exit)
            return False
        data = self._partial + data
        whole = len(data) - len(data) % REQUEST_DTYPE.itemsize
        self._partial = data[whole:]
        requests = np.frombuffer(data[:whole], REQUEST_DTYPE)
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

    def next_batch(self, wait_s: float) -> tuple[np.ndarray, np.ndarray] | None:
        if not len(self._pending):
            self._fill(wait_s)
            if not len(self._pending):  # nothing came, or only notifications that were dropped
                return None
        deadline = float(self._slab.arrival_s[self._pending["actor"]].min()) + self.timeout_s
        while len(self._pending) < self._max_requests:
            if not self._fill(max(0.0, deadline - time.monotonic())):
                break
        batch, self._pending = self._pending[:self._max_requests], self._pending[self._max_requests:]
        return batch["actor"].copy(), batch["seq"].copy()
