"""From completed unrolls to training batches: the FIFO queue (V-trace) or prioritized replay (R2D2).

V-trace is on-policy-ish: unrolls go through a bounded FIFO queue. When training falls behind, `put` blocks
the inference thread, which stalls the actors: back-pressure that bounds the policy lag. The prefetcher
stacks `batch_size` unrolls time-major ([T + 1, B, ...]) on its own thread, pins them when the training
device is a GPU and copies them there ahead of use.

R2D2 inserts unrolls into the central prioritized replay (seed/experience/replay.py) with initial priorities computed
by the agent, leaves out eval envs, samples by priority and writes back the priorities the loss computed.

Both expose the same interface to the learner: `sink(unrolls)` on the inference thread, and `next_batch`,
`after_step`, `stats` on the training thread.
"""

from __future__ import annotations

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

    def __init__(self, sink: Callable[[list[Unroll]], dict[str, float] | None], stop: threading.Event,
                 depth: int = 4, record: Callable[[dict[str, float]], None] | None = None):
        self._sink = sink
        self._stop = stop
        self._record = record
        self._queue: queue.Queue[list[Unroll]] = queue.Queue(maxsize=depth)
        self.thread = SupervisedThread(self._loop, "experience-sink")

    def start(self) -> None:
        self.thread.start()

    def put(self, unrolls: list[Unroll]) -> None:
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
    """Bounded FIFO of single unrolls; `put` blocks while full (until `stop`)."""

    def __init__(self, capacity: int, stop: threading.Event):
        if capacity < 1:
            raise ValueError(f"queue_capacity: got {capacity}, expected >= 1")
        self._queue: queue.Queue[Unroll] = queue.Queue(maxsize=capacity)
        self._stop = stop

    def put(self, unrolls: list[Unroll]) -> None:
        for unroll in unrolls:
            _put_until_stopped(self._queue, unroll, self._stop)

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
      sort_by_env: `--sync=hts`'s batches: one unroll of each env per batch (checked: a second unroll of an env
        before the batch is complete means a rollout lost unrolls, and the batch would mix two rollouts), ordered
        by env id instead of arrival (a batch then does not depend on arrival order).
    An exception ends the thread and is kept in `thread.failure` for the learner's watchdog.
    """

    def __init__(self, next_unroll: Callable[[float], Unroll | None], batch_size: int, device: torch.device,
                 stop: threading.Event, depth: int = 1, sort_by_env: bool = False):
        self._next_unroll = next_unroll
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
        pending: list[Unroll] = []
        envs: set[int] = set()  # sort_by_env: the env ids in `pending`
        while not self._stop.is_set():
            unroll = self._next_unroll(0.1)
            if unroll is None:
                continue
            if self._sort_by_env:
                env_id = int(unroll.env_id)
                if env_id in envs:  # rather than train on two rollouts of one env, or wait forever for another
                    raise RuntimeError(
                        f"HTS batch: got a second unroll of env {env_id} with {len(pending)} of {self._batch_size} "
                        f"unrolls collected (env ids {sorted(envs)}), expected one unroll of every training env "
                        "per batch (a rollout lost unrolls: see seed/inference/rollout_gate.py)")
                envs.add(env_id)
            pending.append(unroll)
            if len(pending) < self._batch_size:
                continue
            if self._sort_by_env:
                pending.sort(key=lambda u: int(u.env_id))
            batch = _to_device(Unroll.stack(pending), self._device)
            pending = []
            envs.clear()
            _put_until_stopped(self._batches, batch, self._stop)


def _to_device(batch: Unroll, device: torch.device) -> Unroll:
    if device.type == "cuda":
        return batch.pin_memory().to(device, non_blocking=True)
    return batch.to(device)


def training_unrolls(unrolls: list[Unroll], is_eval_env: Callable[[torch.Tensor], torch.Tensor]) -> list[Unroll]:
    """The unrolls of training envs: evaluation envs are never trained on (FIFO or replay)."""
    is_eval = is_eval_env(torch.stack([u.env_id for u in unrolls])).tolist()
    return [u for u, evaluates in zip(unrolls, is_eval, strict=True) if not evaluates]


class FifoExperience:
    """V-trace and PPO: completed unrolls of training envs -> bounded FIFO queue -> prefetched time-major
    batches. `is_eval_env`: int64 env ids [n] -> bool [n]; eval envs' unrolls are dropped."""

    def __init__(self, capacity: int, batch_size: int, device: torch.device, stop: threading.Event,
                 is_eval_env: Callable[[torch.Tensor], torch.Tensor], sort_by_env: bool = False):
        self.queue = UnrollQueue(capacity, stop)
        self.prefetcher = Prefetcher(self.queue.get, batch_size, device, stop, sort_by_env=sort_by_env)
        self.is_eval_env = is_eval_env

    def sink(self, unrolls: list[Unroll]) -> dict[str, float]:
        """Queues the training envs' unrolls; the time blocked on a full queue (training is behind), in ms."""
        start = time.perf_counter()
        self.queue.put(training_unrolls(unrolls, self.is_eval_env))
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
      initial_priorities: list of unrolls -> float64 [n], computed from the Q-values stored at inference.
      is_eval_env: int64 env ids [n] -> bool [n]; eval envs never enter replay.
      checkpoint: also save and restore the replay contents with the learner's checkpoint.
    """

    REPLAY_FILE = "replay.pt"
    PREVIOUS_REPLAY_FILE = "replay.previous.pt"  # the one before: restored when replay.pt does not load

    def __init__(self, replay: PrioritizedReplay, initial_priorities: Callable[[list[Unroll]], np.ndarray],
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

    def sink(self, unrolls: list[Unroll]) -> dict[str, float]:
        """Inserts the training envs' unrolls with their initial priorities; where the time went, in ms: the
        priorities, the copies into the replay, and the wait for the replay ratio (training is behind)."""
        training = training_unrolls(unrolls, self.is_eval_env)
        if not training:
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
