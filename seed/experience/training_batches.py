"""From completed unrolls to training batches: the FIFO queue (V-trace) or prioritized replay (R2D2).

Unrolls arrive as time-major batches ([T + 1, n, ...]): the n unrolls one inference batch completed
(seed/inference/unroll_store.py). Everything here handles such a batch with a fixed number of tensor operations,
whatever n is; no loop runs per unroll on the FIFO path.

V-trace is on-policy-ish: unrolls go through a bounded FIFO queue. When training falls behind, `put` blocks
the inference thread, which stalls the actors: back-pressure that bounds the policy lag. The prefetcher
joins and cuts the queued batches into training batches of `batch_size` unrolls ([T + 1, B, ...], one copy per
field) on its own thread, pins them when the training device is a GPU and copies them there ahead of use.

R2D2 inserts unrolls into the central prioritized replay (seed/experience/replay.py) with initial priorities computed
by the agent, leaves out eval envs, samples by priority and writes back the priorities the loss computed.

Both expose the same interface to the learner: `sink(unrolls)` on the inference thread, and `next_batch`,
`after_step`, `stats` on the training thread.
"""

from __future__ import annotations

import collections
import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from seed.contracts.training import TrainingBatch, Unroll
from seed.experience.replay import PrioritizedReplay
from seed.runtime import checkpoint
from seed.runtime.supervised_thread import SupervisedThread


def _put_until_stopped(target: queue.Queue, item: object, stop: threading.Event) -> None:
    """Blocking put that gives up when `stop` is set, so no thread hangs on a full queue at shutdown."""
    while not stop.is_set():
        try:
            target.put(item, timeout=0.1)
            return
        except queue.Full:
            continue


class SinkThread:
    """Hands completed unrolls to `sink` on its own thread, so the inference thread only enqueues them.

    The hand-off queue holds `depth` batches of unrolls, in order; nothing is dropped. When the sink blocks (FIFO
    full, replay ahead of its ratio) the queue fills and `put` blocks the inference thread: back-pressure still
    reaches the actors, and `inference/sink_ms` is that wait. Where the sink's own time goes is recorded with
    `record` (one sample per batch of unrolls, averaged over the metrics window):
      experience/sink_ms        the whole call of `sink` on this thread
      experience/<stage>_ms     the stages `sink` reports (a dict it returns): for the replay
                                `priorities_ms` (the agent's initial priorities), `insert_ms` (copies into the
                                replay) and `ratio_wait_ms` (blocked by the replay ratio: training is behind);
                                for the FIFO `queue_wait_ms` (blocked on a full queue)
    An exception in `sink` ends the thread and is kept in `thread.failure` for the learner's watchdog.
    """

    def __init__(self, sink: Callable[[Unroll], dict[str, float] | None], stop: threading.Event,
                 depth: int = 4, record: Callable[[dict[str, float]], None] | None = None):
        self._sink = sink
        self._stop = stop
        self._record = record
        self._queue: queue.Queue[Unroll] = queue.Queue(maxsize=depth)
        self.thread = SupervisedThread(self._loop, "experience-sink")

    def start(self) -> None:
        self.thread.start()

    def put(self, unrolls: Unroll) -> None:
        """Queues a time-major batch of unrolls for the sink; blocks while `depth` batches wait."""
        _put_until_stopped(self._queue, unrolls, self._stop)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                unrolls = self._queue.get(timeout=0.1)
            except queue.Empty:
                continue
            start = time.perf_counter()
            stages = self._sink(unrolls)
            if self._record is not None:
                self._record({"experience/sink_ms": (time.perf_counter() - start) * 1e3,
                              **{f"experience/{name}": value for name, value in (stages or {}).items()}})


class UnrollQueue:
    """Bounded FIFO of time-major batches of unrolls, counted in unrolls: it never holds more than `capacity`.

    `put` blocks (until `stop`) while the queue is full and queues a batch in pieces as room opens (views of its
    columns, in order), so the bound on queued unrolls, and with it the policy lag, is what it was with single
    unrolls. `get` returns the oldest batch or piece."""

    def __init__(self, capacity: int, stop: threading.Event):
        if capacity < 1:
            raise ValueError(f"queue_capacity: got {capacity}, expected >= 1")
        self.capacity = capacity
        self._batches: collections.deque[Unroll] = collections.deque()
        self._count = 0  # unrolls in _batches
        self._changed = threading.Condition()
        self._stop = stop

    def put(self, unrolls: Unroll) -> None:
        n, start = unrolls.batch_size, 0
        with self._changed:
            while start < n:
                while self._count >= self.capacity:
                    if self._stop.is_set():
                        return
                    self._changed.wait(timeout=0.1)
                take = min(n - start, self.capacity - self._count)
                self._batches.append(unrolls if take == n else unrolls.columns(slice(start, start + take)))
                self._count += take
                start += take
                self._changed.notify_all()

    def get(self, timeout: float) -> Unroll | None:
        with self._changed:
            if not self._changed.wait_for(lambda: self._batches, timeout=timeout):
                return None
            unrolls = self._batches.popleft()
            self._count -= unrolls.batch_size
            self._changed.notify_all()
            return unrolls

    def qsize(self) -> int:
        """Unrolls queued."""
        return self._count


class Prefetcher:
    """Builds training batches from `next_unrolls` on a background thread, `depth` batches ahead.

    Args:
      next_unrolls: timeout_s -> a time-major batch of any number of unrolls, or None.
      batch_size: unrolls per training batch (B); the incoming batches are joined and cut in arrival order.
      device: the training device; batches arrive there.
      sort_by_env: `--sync=hts`'s batches: one unroll of each env per batch (checked: a second unroll of an env
        in one batch means a rollout lost unrolls, and the batch would mix two rollouts), ordered by env id
        instead of arrival (a batch then does not depend on arrival order).
    An exception ends the thread and is kept in `thread.failure` for the learner's watchdog.
    """

    def __init__(self, next_unrolls: Callable[[float], Unroll | None], batch_size: int, device: torch.device,
                 stop: threading.Event, depth: int = 1, sort_by_env: bool = False):
        self._next_unrolls = next_unrolls
        self._sort_by_env = sort_by_env
        self._batch_size = batch_size
        self._device = device
        self._stop = stop
        self._batches: queue.Queue[Unroll] = queue.Queue(maxsize=depth)
        self.thread = SupervisedThread(self._loop, "prefetcher")

    def start(self) -> None:
        self.thread.start()

    def get(self, timeout: float) -> Unroll | None:
        try:
            return self._batches.get(timeout=timeout)
        except queue.Empty:
            return None

    def _loop(self) -> None:
        pending: list[Unroll] = []  # incoming batches not yet trained on, in arrival order
        count = 0
        while not self._stop.is_set():
            unrolls = self._next_unrolls(0.1)
            if unrolls is None:
                continue
            pending.append(unrolls)
            count += unrolls.batch_size
            while count >= self._batch_size:
                parts, pending = _take_columns(pending, self._batch_size)
                count -= self._batch_size
                batch = Unroll.concat(parts)
                if self._sort_by_env:
                    batch = _by_env(batch)
                _put_until_stopped(self._batches, _to_device(batch, self._device), self._stop)


def _take_columns(batches: list[Unroll], n: int) -> tuple[list[Unroll], list[Unroll]]:
    """The first `n` unrolls of `batches` (time-major, in order) and the rest, cutting one batch if needed."""
    taken: list[Unroll] = []
    for i, batch in enumerate(batches):
        size = batch.batch_size
        if size >= n:
            if size == n:
                return taken + [batch], batches[i + 1:]
            return taken + [batch.columns(slice(0, n))], [batch.columns(slice(n, None))] + batches[i + 1:]
        taken.append(batch)
        n -= size
    raise ValueError(f"_take_columns: got batches of {sum(b.batch_size for b in batches)} unrolls, expected "
                     f"at least {n} more")


def _by_env(batch: Unroll) -> Unroll:
    """`--sync=hts`: the batch ordered by env id, refused if one env has two unrolls in it."""
    env_ids = batch.env_id
    order = torch.argsort(env_ids)
    ordered = env_ids[order]
    repeated = ordered[1:] == ordered[:-1]
    if repeated.any():
        env_id = int(ordered[1:][repeated][0])
        first, second = torch.nonzero(env_ids == env_id).flatten()[:2].tolist()
        raise RuntimeError(
            f"HTS batch: got a second unroll of env {env_id} at position {second} of {batch.batch_size} (the first "
            f"at {first}; env ids in arrival order {env_ids.tolist()}), expected one unroll of every training env "
            "per batch (a rollout lost unrolls: see seed/inference/rollout_gate.py)")
    return batch.columns(order)


def _to_device(batch: Unroll, device: torch.device) -> Unroll:
    if device.type == "cuda":
        return batch.pin_memory().to(device, non_blocking=True)
    return batch.to(device)


def training_unrolls(unrolls: Unroll, is_eval_env: Callable[[torch.Tensor], torch.Tensor]) -> Unroll | None:
    """The unrolls of training envs in a time-major batch (None if none): evaluation envs are never trained on
    (FIFO or replay)."""
    is_eval = is_eval_env(unrolls.env_id)
    if not bool(is_eval.any()):
        return unrolls
    keep = torch.nonzero(~is_eval).flatten()
    return unrolls.columns(keep) if len(keep) else None


class FifoExperience:
    """V-trace and PPO: completed unrolls of training envs -> bounded FIFO queue -> prefetched time-major
    batches. `is_eval_env`: int64 env ids [n] -> bool [n]; eval envs' unrolls are dropped."""

    def __init__(self, capacity: int, batch_size: int, device: torch.device, stop: threading.Event,
                 is_eval_env: Callable[[torch.Tensor], torch.Tensor], sort_by_env: bool = False):
        self.queue = UnrollQueue(capacity, stop)
        self.prefetcher = Prefetcher(self.queue.get, batch_size, device, stop, sort_by_env=sort_by_env)
        self.is_eval_env = is_eval_env

    def sink(self, unrolls: Unroll) -> dict[str, float]:
        """Queues the training envs' unrolls (a time-major batch); the time blocked on a full queue (training is
        behind), in ms."""
        training = training_unrolls(unrolls, self.is_eval_env)
        if training is None:
            return {}
        start = time.perf_counter()
        self.queue.put(training)
        return {"queue_wait_ms": (time.perf_counter() - start) * 1e3}

    def start(self) -> None:
        self.prefetcher.start()

    def threads(self) -> list[threading.Thread]:
        """The threads `start` started, for the learner's watchdog."""
        return [self.prefetcher.thread]

    def next_batch(self, timeout_s: float) -> TrainingBatch | None:
        batch = self.prefetcher.get(timeout_s)
        return None if batch is None else TrainingBatch(batch)

    def after_step(self, batch: TrainingBatch, priorities: torch.Tensor | None) -> None:
        pass

    def stats(self) -> dict[str, Any]:
        return {"queue_size": self.queue.qsize()}

    def save(self, logdir: str) -> None:
        pass

    def restore(self, logdir: str) -> None:
        pass


class ReplayExperience:
    """R2D2: completed unrolls -> initial priorities -> prioritized replay -> sampled batches.

    Args:
      replay: the buffer (it enforces the replay ratio; `insert` may block the inference thread).
      initial_priorities: a time-major batch of n unrolls -> float64 [n] (the agent's `initial_priorities`).
      is_eval_env: int64 env ids [n] -> bool [n]; eval envs never enter replay.
      checkpoint: also save and restore the replay contents with the learner's checkpoint.
    """

    REPLAY_FILE = "replay.pt"
    PREVIOUS_REPLAY_FILE = "replay.previous.pt"  # the one before: restored when replay.pt does not load

    def __init__(self, replay: PrioritizedReplay, initial_priorities: Callable[[Unroll], np.ndarray],
                 is_eval_env: Callable[[torch.Tensor], torch.Tensor], device: torch.device, checkpoint: bool):
        self.replay = replay
        self.initial_priorities = initial_priorities
        self.is_eval_env = is_eval_env
        self.device = device
        self.checkpoint = checkpoint

    def start(self) -> None:
        pass

    def threads(self) -> list[threading.Thread]:
        return []

    def sink(self, unrolls: Unroll) -> dict[str, float]:
        """Inserts the training envs' unrolls (a time-major batch) with their initial priorities; where the time
        went, in ms: the priorities, the copies into the replay, and the wait for the replay ratio (training is
        behind)."""
        training = training_unrolls(unrolls, self.is_eval_env)
        if training is None:
            return {}
        start = time.perf_counter()
        priorities = self.initial_priorities(training)
        computed = time.perf_counter()
        ratio_wait_s = self.replay.insert(training, priorities)
        inserted = time.perf_counter()
        return {"priorities_ms": (computed - start) * 1e3, "ratio_wait_ms": ratio_wait_s * 1e3,
                "insert_ms": (inserted - computed - ratio_wait_s) * 1e3}

    def next_batch(self, timeout_s: float) -> TrainingBatch | None:
        sample = self.replay.sample(timeout_s)
        if sample is None:
            return None
        return TrainingBatch(_to_device(sample.unrolls, self.device),
                             sample.importance_weights.to(self.device), sample.indices, sample.generations)

    def after_step(self, batch: TrainingBatch, priorities: torch.Tensor | None) -> None:
        if priorities is not None:
            self.update_priorities(batch.replay_indices, batch.replay_generations,
                                   priorities.detach().cpu().double().numpy())

    def update_priorities(self, indices: np.ndarray, generations: np.ndarray, priorities: np.ndarray) -> None:
        """The new priorities (float64 [B]) of the sampled sequences at replay slots `indices` [B], sampled at
        `generations` [B] (--training_process: the training process's result, written by the learner)."""
        self.replay.update_priorities(indices, priorities, generations)

    def stats(self) -> dict[str, Any]:
        return self.replay.stats()

    def save(self, logdir: str) -> None:
        """Writes the replay to `replay.pt` by the checkpoints' rules (seed/runtime/checkpoint.py): a temporary file,
        fsynced, renamed over `replay.pt` once the file it replaces is kept as `replay.previous.pt`, then the
        logdir fsynced. Inserts wait while the state is written (`frozen_state`), not during the fsync."""
        if not self.checkpoint:
            return
        path = os.path.join(logdir, self.REPLAY_FILE)
        with open(path + ".tmp", "wb") as f:
            with self.replay.frozen_state() as state:
                torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk before any name points at them
        if os.path.exists(path):
            os.replace(path, os.path.join(logdir, self.PREVIOUS_REPLAY_FILE))
        os.replace(path + ".tmp", path)
        checkpoint.fsync_directory(logdir)  # the renames are on disk

    def restore(self, logdir: str) -> None:
        """Loads `replay.pt`, or if it does not load (truncated, corrupt, refused as unsafe, another capacity)
        `replay.previous.pt`, or else starts empty; each file passed over is named with why on stderr."""
        if not self.checkpoint:
            return
        for name in (self.REPLAY_FILE, self.PREVIOUS_REPLAY_FILE):
            path = os.path.join(logdir, name)
            if not os.path.exists(path):
                continue
            try:
                # weights_only: tensors, NumPy arrays and plain data; a file naming other objects is refused, not run.
                self.replay.load_state_dict(checkpoint.read(path))
            except Exception as error:  # noqa: BLE001 - any unreadable file: the previous one, else empty
                print(f"[learner] replay {path} does not load ({type(error).__name__}: {error}); trying the "
                      f"previous replay file, else starting with an empty replay", file=sys.stderr, flush=True)
                continue
            print(f"[learner] restored replay from {path}: {self.replay.size:,} sequences", flush=True)
            return
