"""Dynamic batching of actor step requests for one inference device.

Requests from all actor streams queue here. A single thread takes them in arrival order and runs one
inference when `batch_size` env rows are waiting, or `timeout_s` after the oldest waiting request arrived,
whichever comes first; so a run with fewer live envs than the batch size never hangs. Requests are never
split: a batch may exceed `batch_size` by less than one request. A request that fills a batch on its own
while nothing else waits runs on the submitting thread: no hand-off to the batcher thread and back.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

import numpy as np

log = logging.getLogger(__name__)


class StaleRequest(Exception):
    """The request came from an actor run that has since been replaced (the actor restarted)."""


@dataclasses.dataclass
class StepRequest:
    """One actor's step: all its K envs. Arrays are [K, ...]; `future` gets the int64 actions [K]."""

    actor_index: int
    run_id: int
    first_env_id: int
    observation: np.ndarray
    reward: np.ndarray
    done: np.ndarray
    truncated: np.ndarray
    arrival_time: float = dataclasses.field(default_factory=time.monotonic)
    future: Future = dataclasses.field(default_factory=Future)

    @property
    def num_envs(self) -> int:
        return len(self.reward)


class InferenceBatcher:
    """Groups `StepRequest`s and hands each group to `run_batch` on the batcher's own thread.

    `run_batch(requests)` must resolve every request's future; if it raises, the batcher fails the
    futures it left unresolved and keeps serving.
    """

    def __init__(self, batch_size: int, timeout_s: float, run_batch: Callable[[list[StepRequest]], None],
                 name: str = "inference-batcher"):
        if batch_size < 1:
            raise ValueError(f"inference_batch_size: got {batch_size}, expected >= 1")
        if timeout_s < 0:
            raise ValueError(f"batch_timeout_ms: got {timeout_s * 1000}, expected >= 0")
        self.batch_size = batch_size
        self.timeout_s = timeout_s
        self._run_batch = run_batch
        self._queue: queue.SimpleQueue[StepRequest] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._submit_lock = threading.Lock()
        self._run_lock = threading.Lock()  # run_batch is never run by two threads at once
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._submit_lock:
            self._stop.set()
        self._thread.join(timeout=10)
        # Whatever is left will never run.
        while True:
            try:
                request = self._queue.get_nowait()
            except queue.Empty:
                break
            request.future.set_exception(StaleRequest("learner is shutting down"))

    def submit(self, request: StepRequest) -> Future:
        with self._submit_lock:
            if self._stop.is_set():
                request.future.set_exception(StaleRequest("learner is shutting down"))
                return request.future
            inline = request.num_envs >= self.batch_size and self._queue.empty()
            if not inline:
                self._queue.put(request)
                return request.future
        self._run([request])
        return request.future

    def _next_batch(self) -> list[StepRequest] | None:
        try:
            first = self._queue.get(timeout=0.1)
        except queue.Empty:
            return None
        batch, rows = [first], first.num_envs
        deadline = first.arrival_time + self.timeout_s
        while rows < self.batch_size:
            remaining = deadline - time.monotonic()
            try:
                # Past the deadline, still take what is already waiting.
                request = self._queue.get(timeout=remaining) if remaining > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            batch.append(request)
            rows += request.num_envs
        return batch

    def _run(self, batch: list[StepRequest]) -> None:
        with self._run_lock:
            try:
                self._run_batch(batch)
            except Exception as error:  # one bad batch must not stop inference for everyone
                log.exception("inference batch failed")
                for request in batch:
                    if not request.future.done():
                        request.future.set_exception(error)

    def _loop(self) -> None:
        while not self._stop.is_set():
            batch = self._next_batch()
            if batch:
                self._run(batch)
