"""Notifications between the serving process and inference, over plain pipes.

Request pipe (serving -> one inference device): 16-byte messages (actor int64, request seq int64).
Reply pipe (inference -> serving): 8-byte actor indices, one write per batch.

Every write is at most PIPE_BUF bytes, so the kernel never interleaves two writers' messages, and a read of a
multiple of the message size returns whole messages. The data itself is in the step slab; a pipe only says
"slot a is ready" and doubles as the memory barrier between the two processes.
"""

from __future__ import annotations

import logging
import os
import select
import time

import numpy as np

from seed.serving.slab import StepSlab

REQUEST_DTYPE = np.dtype([("actor", "<i8"), ("seq", "<i8")])
_PIPE_BUF = 4096  # POSIX minimum; Linux's is the same

log = logging.getLogger(__name__)


def send_request(fd: int, actor: int, seq: int) -> None:
    os.write(fd, np.array([(actor, seq)], REQUEST_DTYPE).tobytes())


def send_replies(fd: int, actors: np.ndarray) -> None:
    data = np.ascontiguousarray(actors, dtype="<i8").tobytes()
    for start in range(0, len(data), _PIPE_BUF):
        os.write(fd, data[start:start + _PIPE_BUF])


class ReplyReader:
    """Blocking reader of the reply pipe: `read()` -> actor indices int64 [n], or None at end of file."""

    def __init__(self, fd: int):
        self._fd = fd

    def read(self) -> np.ndarray | None:
        data = os.read(self._fd, _PIPE_BUF)
        if not data:
            return None
        return np.frombuffer(data, "<i8")


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
