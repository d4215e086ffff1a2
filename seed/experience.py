"""From completed unrolls to training batches: the bounded FIFO queue and the prefetcher.

V-trace is on-policy-ish: unrolls go through a bounded FIFO queue. When training falls behind, `put` blocks
the inference thread, which stalls the actors: back-pressure that bounds the policy lag. The prefetcher
stacks `batch_size` unrolls time-major ([T + 1, B, ...]) on its own thread, pins them when the training
device is a GPU and copies them there ahead of use.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

import torch

from seed.unroll import Unroll


class UnrollQueue:
    """Bounded FIFO of single unrolls; `put` blocks while full (until `stop`)."""

    def __init__(self, capacity: int, stop: threading.Event):
        if capacity < 1:
            raise ValueError(f"queue_capacity: got {capacity}, expected >= 1")
        self._queue: queue.Queue[Unroll] = queue.Queue(maxsize=capacity)
        self._stop = stop

    def put(self, unrolls: list[Unroll]) -> None:
        for unroll in unrolls:
            while not self._stop.is_set():
                try:
                    self._queue.put(unroll, timeout=0.1)
                    break
                except queue.Full:
                    continue

    def get(self, timeout: float) -> Unroll | None:
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def qsize(self) -> int:
        return self._queue.qsize()


class Prefetcher:
    """Builds training batches from `next_unroll` on a background thread, `depth` batches ahead.

    Args:
      next_unroll: timeout_s -> Unroll or None.
      batch_size: unrolls per batch (B).
      device: the training device; batches arrive there.
    """

    def __init__(self, next_unroll: Callable[[float], Unroll | None], batch_size: int, device: torch.device,
                 stop: threading.Event, depth: int = 1):
        self._next_unroll = next_unroll
        self._batch_size = batch_size
        self._device = device
        self._stop = stop
        self._batches: queue.Queue[Unroll] = queue.Queue(maxsize=depth)
        self._thread = threading.Thread(target=self._loop, name="prefetcher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def get(self, timeout: float) -> Unroll | None:
        try:
            return self._batches.get(timeout=timeout)
        except queue.Empty:
            return None

    def _loop(self) -> None:
        pending: list[Unroll] = []
        while not self._stop.is_set():
            unroll = self._next_unroll(0.1)
            if unroll is None:
                continue
            pending.append(unroll)
            if len(pending) < self._batch_size:
                continue
            batch = Unroll.stack(pending)
            pending = []
            if self._device.type == "cuda":
                batch = batch.pin_memory().to(self._device, non_blocking=True)
            else:
                batch = batch.to(self._device)
            while not self._stop.is_set():
                try:
                    self._batches.put(batch, timeout=0.1)
                    break
                except queue.Full:
                    continue
