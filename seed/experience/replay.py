"""Central prioritized replay of sequences (R2D2), safe between the inserting inference thread and the
sampling training thread.

- `SumTree`: priorities p_i^alpha in a complete binary tree; batched proportional sampling and updates in
  O(B log N) vectorised NumPy steps.
- `PrioritizedReplay`: a FIFO ring of `capacity` sequences; each stores its steps once as single frames
  (uint8 for Atari) plus the agent state before its first step. Importance weights are
  w_i = (N P(i))^-beta / max_j (N P(j))^-beta over the sampled batch.
- The replay ratio (sequences sampled per sequence inserted, counted after `min_size` inserts) is enforced
  in both directions: training waits for inserts, and inserts block (back-pressure on the actors) when they
  run more than `max_insert_lead` sequences ahead of training.
- Every slot carries a generation (the insert count when its sequence was written). A sample returns the
  generations of its slots and `update_priorities` drops the updates of slots written since (the ring
  recycled them while the batch trained): the new sequence keeps its own initial priority.
- Priority Refresh (SpeedyZero; seed/experience/priority_refresh.py) reads slots with `read` (not counted as samples)
and
  writes the priorities the latest network gives with `refresh_priorities`, under the same generation check.
  Every slot keeps the time its priority was last set (insert, training update or refresh): the stats report
  the oldest one's age (`replay/oldest_priority_age_s`).
- Checkpoints are consistent: `frozen_state` holds the lock while the caller serialises, so no insert lands
  between reading the tensors and writing them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import threading
import time
from collections.abc import Iterator

import numpy as np
import torch

from seed.contracts.training import Unroll


class SumTree:
    """Leaves hold non-negative priorities; internal nodes hold the sum of their children."""

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"replay_capacity: got {capacity}, expected >= 1")
        self.capacity = capacity
        self._leaf_start = 1 << max(0, (capacity - 1).bit_length())
        self._nodes = np.zeros(2 * self._leaf_start, np.float64)  # node 1 is the root

    @property
    def total(self) -> float:
        return float(self._nodes[1])

    def get(self, indices: np.ndarray) -> np.ndarray:
        return self._nodes[self._leaf_start + np.asarray(indices)]

    def set(self, indices: np.ndarray, values: np.ndarray) -> None:
        """Sets leaves (the last write wins for duplicate indices) and refreshes their ancestors."""
        indices = np.asarray(indices, np.int64)
        values = np.asarray(values, np.float64)
        if indices.size == 0:
            return
        if (values < 0).any() or not np.isfinite(values).all():
            bad = values[(values < 0) | ~np.isfinite(values)][:3]
            raise ValueError(f"priorities: got {bad}, expected finite values >= 0")
        nodes = self._nodes
        nodes[self._leaf_start + indices] = values
        parents = np.unique((self._leaf_start + indices) // 2)
        while parents.size and parents[0] >= 1:
            nodes[parents] = nodes[2 * parents] + nodes[2 * parents + 1]
            if parents[0] == 1:
                break
            parents = np.unique(parents // 2)

    def find(self, targets: np.ndarray) -> np.ndarray:
        """For each target mass in [0, total), the leaf whose cumulative range contains it."""
        targets = np.asarray(targets, np.float64).copy()
        node = np.ones(len(targets), np.int64)
        nodes = self._nodes
        while node[0] < self._leaf_start:
            left = 2 * node
            left_mass = nodes[left]
            go_right = targets >= left_mass
            # Never step into an empty subtree because of float rounding.
            go_right &= nodes[left + 1] > 0
            go_right |= left_mass <= 0
            targets = np.where(go_right, targets - left_mass, targets)
            node = np.where(go_right, left + 1, left)
        return np.minimum(node - self._leaf_start, self.capacity - 1)

    def sample(self, batch_size: int, rng: np.random.Generator) -> np.ndarray:
        """Stratified proportional sampling: one uniform draw in each of `batch_size` equal mass segments."""
        total = self.total
        if total <= 0:
            raise ValueError("cannot sample from a replay whose priorities are all zero")
        bounds = np.arange(batch_size) * (total / batch_size)
        return self.find(bounds + rng.uniform(0, total / batch_size, batch_size))


@dataclasses.dataclass
class ReplaySample:
    unrolls: Unroll  # time-major [L, B, ...]
    indices: np.ndarray  # int64 [B] slots, for update_priorities
    importance_weights: torch.Tensor  # float32 [B], max-normalised
    generations: np.ndarray  # int64 [B] the slots' generations when sampled, for update_priorities


class ReplayDoesNotFit(ValueError):
    """--replay_capacity needs more memory than the machine has available."""


def available_memory_bytes() -> int:
    """Memory the system can give this process without swapping (MemAvailable), in bytes."""
    import psutil

    return int(psutil.virtual_memory().available)


def check_fits_in_memory(capacity: int, bytes_per_sequence: int, available_bytes: int) -> None:
    """Raises ReplayDoesNotFit (naming --replay_capacity, the bytes needed and available, and the capacity that
    would fit) when `capacity` sequences of `bytes_per_sequence` bytes exceed `available_bytes`."""
    needed = capacity * bytes_per_sequence
    if needed > available_bytes:
        fits = available_bytes // max(1, bytes_per_sequence)
        raise ReplayDoesNotFit(
            f"--replay_capacity: got {capacity:,} sequences x {bytes_per_sequence:,} bytes = {needed:,} bytes "
            f"({needed / 2**30:.1f} GiB), expected at most {fits:,} sequences: {available_bytes:,} bytes "
            f"({available_bytes / 2**30:.1f} GiB) of memory are available")


def checked_priorities(priorities: np.ndarray, where: str) -> np.ndarray:
    """`priorities` [n] as float64, after one vectorised check that each is finite and >= 0: the raw values, not
    p ** alpha (at alpha 0, uniform replay, a diverged loss's NaN would become 1.0). A bad one is refused naming
    `where` (insert, update, refresh), the first bad values and their rows."""
    values = np.asarray(priorities, np.float64)
    bad = ~(np.isfinite(values) & (values >= 0))
    if bad.any():
        rows = np.flatnonzero(bad)
        shown = ", ".join(f"{value:g}" for value in values[rows[:3]])
        where_rows = ("row " if len(rows) == 1 else "rows ") + ", ".join(str(row) for row in rows[:3])
        more = f" ({len(rows)} in all)" if len(rows) > 3 else ""
        raise ValueError(f"replay {where}: priorities got {shown} at {where_rows} of {values.size}{more}, "
                         "expected finite values >= 0 (a NaN or inf priority is a loss that diverged)")
    return values


class PrioritizedReplay:
    """Args:
      capacity: sequences held (FIFO ring).
      priority_exponent: alpha; sampling probability is p^alpha / sum p^alpha.
      importance_sampling_exponent: beta.
      min_size: sequences inserted before the first sample.
      replay_ratio: sequences sampled per sequence inserted (after min_size).
      batch_size: sequences per training batch.
      max_insert_lead: how many sequences inserts may run ahead of the ratio before `insert` blocks;
        default 4 batches' worth.
    """

    def __init__(self, capacity: int, priority_exponent: float, importance_sampling_exponent: float,
                 min_size: int, replay_ratio: float, batch_size: int, seed: int = 0,
                 max_insert_lead: int | None = None, stop: threading.Event | None = None):
        if min_size > capacity:
            raise ValueError(f"replay_min_size: got {min_size}, expected <= replay_capacity ({capacity})")
        if replay_ratio <= 0:
            raise ValueError(f"replay_ratio: got {replay_ratio}, expected > 0")
        if priority_exponent < 0:
            raise ValueError(f"priority_exponent: got {priority_exponent}, expected >= 0 (0: uniform sampling)")
        self.capacity = capacity
        self.alpha = priority_exponent
        self.beta = importance_sampling_exponent
        self.min_size = max(min_size, 1)
        self.replay_ratio = replay_ratio
        self.batch_size = batch_size
        if max_insert_lead is None:
            max_insert_lead = int(4 * batch_size / replay_ratio) + 1
        self.max_insert_lead = max_insert_lead
        self.tree = SumTree(capacity)
        self._rng = np.random.default_rng(seed)
        self._steps: dict[str, torch.Tensor] = {}
        self._state: dict[str, torch.Tensor] = {}
        self._env_ids = torch.zeros(capacity, dtype=torch.int64)
        self._generations = np.full(capacity, -1, np.int64)  # `inserted` before the slot's last write
        self._priority_set_s = np.zeros(capacity, np.float64)  # time.monotonic() when each priority was last set
        self.size = 0
        self.next_slot = 0
        self.inserted = 0
        self.sampled = 0
        self.stale_priority_updates = 0
        self.priority_updates = 0  # sequences whose priority an update set (stale ones not counted)
        self.refreshed_priorities = 0  # sequences whose priority a refresh set (stale ones not counted)
        self.stale_priority_refreshes = 0
        self._lock = threading.Condition()
        self._stop = stop or threading.Event()

    # -- storage ---------------------------------------------------------------------------------------------
    def _allocate(self, unrolls: Unroll) -> None:
        """Storage shaped after a time-major batch: steps [capacity, L, ...], state [capacity, ...]."""
        self._steps = {k: torch.zeros((self.capacity, v.shape[0], *v.shape[2:]), dtype=v.dtype)
                       for k, v in unrolls.steps.items()}
        self._state = {k: torch.zeros((self.capacity, *v.shape[1:]), dtype=v.dtype)
                       for k, v in unrolls.initial_state.items()}

    @property
    def nbytes(self) -> int:
        """Bytes held by the allocated storage (all `capacity` slots, filled or not)."""
        tensors = [*self._steps.values(), *self._state.values(), self._env_ids]
        return int(sum(t.numel() * t.element_size() for t in tensors))

    @staticmethod
    def bytes_per_sequence(unroll: Unroll) -> int:
        tensors = [*unroll.steps.values(), *unroll.initial_state.values()]
        return int(sum(t.numel() * t.element_size() for t in tensors)) + 8

    # -- rate limiting -------------------------------------------------------------------------------------------
    def _inserts_ahead(self) -> float:
        """Sequences inserted beyond what the replay ratio has consumed so far."""
        return max(0, self.inserted - self.min_size) - self.sampled / self.replay_ratio

    def can_sample(self) -> bool:
        return self.inserted >= self.min_size and self._inserts_ahead() >= 0

    # -- API ---------------------------------------------------------------------------------------------------
    def insert(self, unrolls: Unroll, priorities: np.ndarray) -> float:
        """Adds the n sequences of a time-major batch (steps [L, n, ...], state [n, ...], env ids [n]) with their
        initial priorities float64 [n], in order; blocks while inserts run too far ahead of sampling, each
        sequence as if inserted alone (the ones the ratio allows are written together, one copy per field).
        Returns the seconds it was blocked so (the replay ratio's back-pressure). A priority that is not finite
        and >= 0 refuses the whole batch before any is stored."""
        priorities = checked_priorities(priorities, "insert")
        n = unrolls.batch_size
        if len(priorities) != n:
            raise ValueError(f"replay insert: priorities got {len(priorities)} values, expected one per sequence "
                             f"({n})")
        waited_s = 0.0
        done = 0
        while done < n:
            with self._lock:
                if self._insert_room() == 0:
                    start = time.perf_counter()
                    while self._insert_room() == 0 and not self._stop.is_set():
                        self._lock.wait(timeout=0.1)
                    waited_s += time.perf_counter() - start
                if self._stop.is_set():
                    return waited_s
                if not self._steps:
                    self._allocate(unrolls)
                first = self.next_slot
                k = min(n - done, self._insert_room(), self.capacity - first)  # a run of slots, no wrap-around
                slots, rows = slice(first, first + k), slice(done, done + k)
                for key, value in unrolls.steps.items():
                    self._steps[key][slots] = value[:, rows].transpose(0, 1)
                for key, value in unrolls.initial_state.items():
                    self._state[key][slots] = value[rows]
                self._env_ids[slots] = unrolls.env_id[rows]
                self._generations[slots] = self.inserted + np.arange(k)
                self._priority_set_s[slots] = time.monotonic()
                self.tree.set(np.arange(first, first + k), priorities[rows] ** self.alpha)
                self.next_slot = (first + k) % self.capacity
                self.size = min(self.size + k, self.capacity)
                self.inserted += k
                done += k
                self._lock.notify_all()
        return waited_s

    def _insert_room(self) -> int:
        """How many sequences may be inserted now: every one before `min_size`, then as long as inserts stay
        less than `max_insert_lead` sequences ahead of what the replay ratio consumed (under the lock)."""
        bound = self.min_size + self.max_insert_lead + self.sampled / self.replay_ratio
        return max(0, math.ceil(bound - self.inserted))

    def sample(self, timeout_s: float) -> ReplaySample | None:
        """A batch once the replay ratio allows one (None if it does not within `timeout_s`)."""
        with self._lock:
            if not self._lock.wait_for(lambda: self.can_sample() or self._stop.is_set(), timeout=timeout_s):
                return None
            if self._stop.is_set():
                return None
            indices = self.tree.sample(self.batch_size, self._rng)
            probabilities = self.tree.get(indices) / self.tree.total
            weights = (self.size * probabilities) ** (-self.beta)
            weights = weights / weights.max()
            unrolls, generations = self._gather(indices)
            self.sampled += self.batch_size
            self._lock.notify_all()
        return ReplaySample(unrolls, indices, torch.from_numpy(weights.astype(np.float32)), generations)

    def _gather(self, indices: np.ndarray) -> tuple[Unroll, np.ndarray]:
        """Copies of the slots' sequences (time-major [L, B, ...]) and their generations [B]; under the lock."""
        index_t = torch.from_numpy(np.asarray(indices, np.int64))
        steps = {k: v.index_select(0, index_t).transpose(0, 1) for k, v in self._steps.items()}
        state = {k: v.index_select(0, index_t) for k, v in self._state.items()}
        return Unroll(steps, state, self._env_ids.index_select(0, index_t)), self._generations[indices]

    def read(self, indices: np.ndarray) -> tuple[Unroll, np.ndarray]:
        """Priority Refresh: copies of the sequences at slots `indices` [B] (filled slots, < `size`), time-major
        [L, B, ...], and their generations [B] for `refresh_priorities`. Not a sample: the replay ratio and the
        rate limits ignore it."""
        indices = np.asarray(indices, np.int64)
        with self._lock:
            if indices.size and (indices.min() < 0 or indices.max() >= self.size):
                raise ValueError(f"replay read: got slots in [{indices.min()}, {indices.max()}], expected slots in "
                                 f"[0, {self.size}) (the filled ones)")
            return self._gather(indices)

    def update_priorities(self, indices: np.ndarray, priorities: np.ndarray, generations: np.ndarray) -> None:
        """Sets the priorities [B] of sampled slots [B]; a slot whose generation is no longer the sampled one
        [B] holds a newer sequence, so its update is dropped (and counted in `stale_priority_updates`)."""
        priorities = checked_priorities(priorities, "update")
        with self._lock:
            written = self._set_current_priorities(indices, priorities, generations)
            self.stale_priority_updates += len(indices) - written
            self.priority_updates += written

    def refresh_priorities(self, indices: np.ndarray, priorities: np.ndarray, generations: np.ndarray) -> int:
        """Priority Refresh: as `update_priorities`, for slots [B] read with `read` at `generations` [B]; a slot
        written since keeps its new sequence's priority. Returns how many priorities were set."""
        priorities = checked_priorities(priorities, "refresh")
        with self._lock:
            written = self._set_current_priorities(indices, priorities, generations)
            self.stale_priority_refreshes += len(indices) - written
            self.refreshed_priorities += written
            return written

    def _set_current_priorities(self, indices: np.ndarray, priorities: np.ndarray, generations: np.ndarray) -> int:
        """Sets the priorities (checked float64 [B]) of the slots still holding the sampled generation; how many.
        Under the lock."""
        indices = np.asarray(indices, np.int64)
        current = self._generations[indices] == np.asarray(generations, np.int64)
        self.tree.set(indices[current], priorities[current] ** self.alpha)
        self._priority_set_s[indices[current]] = time.monotonic()
        return int(current.sum())

    def oldest_priority_age_s(self) -> float:
        """Seconds since the least recently set priority of a filled slot was set (0 while empty)."""
        with self._lock:
            if not self.size:
                return 0.0
            return time.monotonic() - float(self._priority_set_s[:self.size].min())

    def stats(self) -> dict[str, float]:
        with self._lock:
            leaves = self.tree.get(np.arange(self.size)) if self.size else np.zeros(1)
            priorities = leaves ** (1.0 / self.alpha) if self.alpha > 0 else leaves
            oldest = time.monotonic() - float(self._priority_set_s[:self.size].min()) if self.size else 0.0
            return {
                "replay_size": self.size,
                "replay_bytes": self.nbytes,
                "replay_inserted": self.inserted,
                "replay_sampled": self.sampled,
                "replay_priority_mean": float(priorities.mean()),
                "replay_priority_max": float(priorities.max()),
                "replay_priority_updates": self.priority_updates,
                "replay_stale_priority_updates": self.stale_priority_updates,
                "replay/oldest_priority_age_s": oldest,
                "replay/refreshed_priorities": self.refreshed_priorities,
                "replay/stale_priority_refreshes": self.stale_priority_refreshes,
            }

    # -- checkpointing -------------------------------------------------------------------------------------------
    def _live_state(self) -> dict:
        return {"steps": self._steps, "state": self._state, "env_ids": self._env_ids,
                "generations": self._generations, "priorities": self.tree.get(np.arange(self.capacity)),
                "size": self.size, "next_slot": self.next_slot, "inserted": self.inserted, "sampled": self.sampled}

    @contextlib.contextmanager
    def frozen_state(self) -> Iterator[dict]:
        """The live state (no copy), with inserts and sampling held off until the block ends: serialise it
        inside the block. Holding the lock rather than copying keeps a checkpoint of a many-GB replay from
        needing twice its memory; inserts (and so the actors) wait for the length of the save."""
        with self._lock:
            yield self._live_state()

    def state_dict(self) -> dict:
        """A consistent copy of the state (twice the replay's memory while it lives; prefer `frozen_state`)."""
        with self._lock:
            live = self._live_state()
            return {**live, "steps": {k: v.clone() for k, v in self._steps.items()},
                    "state": {k: v.clone() for k, v in self._state.items()}, "env_ids": self._env_ids.clone(),
                    "generations": self._generations.copy()}

    def load_state_dict(self, saved: dict) -> None:
        with self._lock:
            if len(saved["priorities"]) != self.capacity:
                raise ValueError(f"replay checkpoint capacity: got {len(saved['priorities'])}, "
                                 f"expected {self.capacity} (--replay_capacity)")
            self._steps, self._state, self._env_ids = saved["steps"], saved["state"], saved["env_ids"]
            # Files from before generations existed: no sample is in flight across a restart, any value will do.
            self._generations = np.asarray(saved.get("generations", np.zeros(self.capacity)), np.int64).copy()
            self.tree.set(np.arange(self.capacity), saved["priorities"])
            self.size, self.next_slot = saved["size"], saved["next_slot"]
            self.inserted, self.sampled = saved["inserted"], saved["sampled"]
            # A file does not say when its priorities were computed: count their age from the restore.
            self._priority_set_s[:] = time.monotonic()
