"""Builds fixed-length, overlapping unrolls from the stream of inference steps.

Each env has a row of `length = burn_in + unroll_length + 1` steps. When a row is full it is emitted and
its last `overlap = burn_in + 1` steps move to the front, so consecutive unrolls of one env share the
bootstrap step plus the burn-in prefix. Unrolls cross episode boundaries; they are never cut at episode
ends (the `done` flags inside tell the network and the loss where episodes start).

A fresh env (first contact, or a new actor run id) starts writing at index `overlap - 1 = burn_in`; the
prefix before it is zero padding with `valid = False`.

The state stored with an unroll is the agent state before its first stored step: for the first unroll of
a fresh env the zero state, afterwards the state snapshotted when the step that becomes index 0 of the next
unroll (index `unroll_length` of the current one) was processed.

The unrolls one `append` completes come out together, as one time-major batch ([L, n, ...], the layout of
`Unroll.stack`): one gather per field, whatever n is (the 64 envs of an actor complete their unrolls at the same
step). Building n single unrolls here cost 16% of the learner process's GIL time on fake_mlp (py-spy, 2 cores).

A step may be written in two parts (`--sync_lag=0`'s sync points, seed/inference/rollout_gate.py): `append` with
`complete=False` writes the fields it is given and zeros for the others (the action and the policy's outputs),
which may complete and emit an unroll whose bootstrap step that is; `complete_last` later writes the missing
fields into the envs' last written step, which the emission moved to the front of the next unroll.
"""

from __future__ import annotations

import numpy as np
import torch

from seed.contracts import State
from seed.contracts.training import Unroll


class UnrollStore:
    """Partial unrolls for `num_envs` envs, kept on the host.

    Field buffers are allocated on the first `append` from the dtypes and shapes it receives, time-major
    ([length, num_envs, ...], as training batches are), so an emission gathers contiguous time-major columns.
    The per-step writes go through NumPy views of the torch buffers: for the few rows of one inference batch,
    NumPy's fancy indexing costs a fraction of torch's per-op overhead (this is on the learner's hot path).
    """

    def __init__(self, num_envs: int, unroll_length: int, burn_in: int = 0):
        if unroll_length < 1:
            raise ValueError(f"unroll_length: got {unroll_length}, expected >= 1")
        if not 0 <= burn_in < unroll_length:
            # The state for the next unroll is snapshotted at index unroll_length, which must be a step
            # written in every cycle (writing resumes at burn_in + 1).
            raise ValueError(f"burn_in: got {burn_in}, expected 0 <= burn_in < unroll_length ({unroll_length})")
        self.num_envs = num_envs
        self.unroll_length = unroll_length
        self.burn_in = burn_in
        self.length = burn_in + unroll_length + 1
        self.overlap = burn_in + 1
        self.write_index = torch.full((num_envs,), self.overlap - 1, dtype=torch.int64)
        self._write_index = self.write_index.numpy()
        self.steps: dict[str, torch.Tensor] = {}
        self._step_views: dict[str, np.ndarray] = {}
        self.initial_state: State = {}
        self._next_initial_state: State = {}

    def _allocate(self, step: dict[str, torch.Tensor], state_before: State) -> None:
        for key, value in step.items():
            self.steps[key] = torch.zeros((self.length, self.num_envs) + value.shape[1:], dtype=value.dtype)
        self.steps["valid"] = torch.zeros((self.length, self.num_envs), dtype=torch.bool)
        self._step_views = {key: buffer.numpy() for key, buffer in self.steps.items()}
        # The same buffers as [length * num_envs, ...]: a step's writes index one flat position per env, a third of
        # the cost of NumPy's two-index assignment for the scalar fields (1.7 us -> 0.4 us for 128 rows).
        self._flat_views = {key: view.reshape(self.length * self.num_envs, *view.shape[2:])
                            for key, view in self._step_views.items()}
        for key, value in state_before.items():
            self.initial_state[key] = torch.zeros((self.num_envs,) + value.shape[1:], dtype=value.dtype)
            self._next_initial_state[key] = torch.zeros_like(self.initial_state[key])

    def reset(self, env_ids: torch.Tensor) -> None:
        """Discards the partial unrolls of `env_ids` (their actor restarted); they restart as fresh envs."""
        self.write_index[env_ids] = self.overlap - 1
        for buffer in self.steps.values():
            buffer[:, env_ids] = 0
        for buffer in (*self.initial_state.values(), *self._next_initial_state.values()):
            buffer[env_ids] = 0

    def append(self, env_ids: torch.Tensor, step: dict[str, torch.Tensor], state_before: State,
               complete: bool = True) -> Unroll | None:
        """Writes one step for each env in `env_ids`; returns the unrolls this completed as one time-major batch
        (steps [L, n, ...], initial state [n, ...], env ids [n], in `env_ids` order), or None.

        Args:
          env_ids: int64 [B], distinct env ids.
          step: field -> [B, ...] values of this step (any device; moved to the host).
          state_before: key -> [B, ...] agent state fed into this step.
          complete: False: `step` may lack fields of the earlier steps; they are written as zeros until
            `complete_last` gives them.
        """
        ids = env_ids.cpu().numpy()
        if not self.steps:
            if not complete:
                raise ValueError("UnrollStore.append: got complete=False before any complete step, expected a "
                                 "complete step first (it sets the fields and their shapes)")
            self._allocate(step, state_before)
        missing = () if complete else set(self.steps) - set(step) - {"valid"}
        index = self._write_index[ids]
        snapshot = index == self.unroll_length
        if snapshot.any():
            rows = torch.from_numpy(ids[snapshot])
            positions = torch.from_numpy(np.flatnonzero(snapshot))
            for key, value in state_before.items():
                self._next_initial_state[key][rows] = value.index_select(0, positions.to(value.device)).cpu()
        views, positions = self._flat_views, index * self.num_envs + ids
        for key, value in step.items():
            views[key][positions] = (value if value.device.type == "cpu" else value.cpu()).numpy()
        for key in missing:
            views[key][positions] = 0
        views["valid"][positions] = True
        self._write_index[ids] = index + 1
        full = ids[index + 1 == self.length]
        return self._emit(full) if len(full) else None

    def complete_last(self, env_ids: torch.Tensor, fields: dict[str, torch.Tensor]) -> None:
        """Writes `fields` (field -> [B, ...], e.g. the action and outputs an `append(complete=False)` lacked)
        into the last step written for each env of `env_ids` (int64 [B], distinct)."""
        ids = env_ids.cpu().numpy()
        unknown = set(fields) - set(self.steps)
        if unknown:
            raise ValueError(f"UnrollStore.complete_last fields: got unknown {sorted(unknown)}, expected some of "
                             f"{sorted(self.steps)}")
        index = self._write_index[ids] - 1
        valid = self._step_views.get("valid")  # None before any step
        written = (index >= 0) & (valid[np.maximum(index, 0), ids] if valid is not None else False)
        if not written.all():
            raise ValueError(f"UnrollStore.complete_last env_ids: got {ids[~written].tolist()} with no step "
                             "written, expected envs with a step to complete")
        for key, value in fields.items():
            self._step_views[key][index, ids] = value.cpu().numpy()

    def _emit(self, ids: np.ndarray) -> Unroll:
        """The full rows `ids` (int64 [n]) as a time-major batch; their last `overlap` steps move to the front."""
        # NumPy gathers rather than torch advanced indexing: cheaper for a few rows, and they never wake torch's
        # intra-op thread pool on the inference thread. A contiguous time-major copy: cutting it into training
        # batches copies runs of rows (a batch-major copy seen transposed made that copy 3x slower).
        steps = {k: torch.from_numpy(np.take(v, ids, axis=1)) for k, v in self._step_views.items()}
        env_ids = torch.from_numpy(ids)
        state = {k: v[env_ids] for k, v in self.initial_state.items()}
        tail = slice(self.length - self.overlap, self.length)
        for view in self._step_views.values():
            view[: self.overlap, ids] = view[tail, ids]
        for key in self.initial_state:
            self.initial_state[key][env_ids] = self._next_initial_state[key][env_ids]
        self._write_index[ids] = self.overlap
        return Unroll(steps, state, env_ids)
