"""Checkpoints in the logdir: the agent (networks), the optimizer and the learner's counters.

Each save writes a new file `checkpoint-<n>.pt` (n counts up, 8 digits) atomically and durably: a temporary
file, fsynced, then `os.replace`, then an fsync of the logdir so that the rename itself is on disk; only then
are all but the newest `keep` of them deleted (`--keep_checkpoints`, default 3). A crash (or a power loss) in
the middle of a save leaves at worst a `.tmp` file, never a torn or empty checkpoint under a real name, and
never fewer checkpoints than before.

Loading takes the newest checkpoint that loads; one that fails to load (truncated, corrupted) is skipped with
a warning naming the file and the error, and the one before it is tried. A learner started on a logdir that
holds a checkpoint resumes from it: parameters, optimizer moments, env frames and train steps. A logdir
written before rotation existed holds `checkpoint.pt`; it counts as the oldest checkpoint.

Files are read with `torch.load(weights_only=True)`: tensors, plain Python data and the NumPy arrays of the
random generators' states (SAFE_GLOBALS), nothing else. Unpickling anything else can run code of the file's
choosing, so a checkpoint that names another Python object is refused (`UnsafeCheckpoint`), never run.

For other tools (e.g. an evaluator reading a training run's logdir):

    found = checkpoint.latest(logdir)        # (path, state) of the newest loadable checkpoint, or None
    state = checkpoint.load(logdir)          # the state alone, or None
    path = checkpoint.checkpoint_path(logdir)  # the newest file by name (not opened)
    state = checkpoint.read(path)            # one file (raises UnsafeCheckpoint, or the error of a bad file)
"""

from __future__ import annotations

import logging
import os
import pickle
import re
from typing import Any

import numpy as np
import torch

log = logging.getLogger(__name__)

LEGACY_NAME = "checkpoint.pt"  # the single file of logdirs written before rotation
_NAME = re.compile(r"^checkpoint-(\d{8,})\.pt$")


# What NumPy arrays pickle as (the learner saves np.random.get_state(), a uint32 [624] key among plain values; the
# replay file holds float64 priorities and int64 generations): numpy 2 names its reconstructor
# numpy._core.multiarray._reconstruct, numpy 1 numpy.core.multiarray's. Data types only: nothing here runs code.
_RECONSTRUCT = np._core.multiarray._reconstruct if hasattr(np, "_core") else np.core.multiarray._reconstruct
SAFE_GLOBALS = [_RECONSTRUCT, (_RECONSTRUCT, "numpy.core.multiarray._reconstruct"), np.ndarray, np.dtype,
                *(type(np.dtype(t)) for t in (np.uint32, np.int64, np.float64))]


class UnsafeCheckpoint(pickle.UnpicklingError):
    """A checkpoint file that holds more than tensors, NumPy arrays and plain data: loading it could run code."""


def _format_name(number: int) -> str:
    return f"checkpoint-{number:08d}.pt"


def checkpoint_paths(logdir: str) -> list[str]:
    """Every checkpoint file in `logdir`, oldest first (a legacy `checkpoint.pt` before the numbered ones)."""
    if not os.path.isdir(logdir):
        return []
    numbered = sorted((int(m.group(1)), name) for name in os.listdir(logdir) if (m := _NAME.match(name)))
    paths = [os.path.join(logdir, name) for _, name in numbered]
    legacy = os.path.join(logdir, LEGACY_NAME)
    return ([legacy] if os.path.isfile(legacy) else []) + paths


def checkpoint_path(logdir: str) -> str:
    """The newest checkpoint file in `logdir` by name (not opened; see `latest` for one that loads), or, if
    there is none, the path the first `save` will write."""
    paths = checkpoint_paths(logdir)
    return paths[-1] if paths else os.path.join(logdir, _format_name(1))


def save(logdir: str, state: dict[str, Any], keep: int = 3) -> str:
    """Writes `state` as the next `checkpoint-<n>.pt` (atomically and durably), deletes all but the newest `keep`
    checkpoints and returns the new file's path."""
    if keep < 1:
        raise ValueError(f"keep_checkpoints: got {keep}, expected >= 1")
    numbers = [int(m.group(1)) for name in os.listdir(logdir) if (m := _NAME.match(name))]
    path = os.path.join(logdir, _format_name(max(numbers, default=0) + 1))
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())  # the bytes are on disk before any name points at them
    os.replace(tmp, path)
    fsync_directory(logdir)  # the rename is on disk before an older checkpoint is deleted
    for old in checkpoint_paths(logdir)[:-keep]:
        try:
            os.remove(old)
        except FileNotFoundError:
            pass
    return path


def fsync_directory(directory: str) -> None:
    """Puts `directory`'s entries (a rename, a new name) on disk."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read(path: str) -> dict[str, Any]:
    """One checkpoint file's state, on the CPU, loaded with `torch.load(weights_only=True)`.

    Raises UnsafeCheckpoint (naming the file and what it holds) for a file that holds Python objects beyond
    tensors, plain data and SAFE_GLOBALS; a truncated or foreign file raises whatever torch raises for it."""
    try:
        with torch.serialization.safe_globals(SAFE_GLOBALS):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        if "weights only load failed" not in str(error).lower():
            raise
        raise UnsafeCheckpoint(
            f"checkpoint {path}: got {_refused(str(error))}, expected only tensors, NumPy arrays and plain Python "
            f"data; not loaded, since unpickling other objects can run code of the file's choosing "
            f"(torch.load weights_only=True)") from None


def _refused(message: str) -> str:
    """What torch's weights_only unpickler refused, from its error message (which also advises weights_only=False:
    not repeated)."""
    named = re.search(r"GLOBAL ([\w.]+)", message)
    if named:
        return f"the Python object {named.group(1)}"
    details = [line.strip() for line in message.splitlines()
               if line.strip() and not line.startswith(("Weights only load failed", "Check the documentation"))]
    return details[-1] if details else "an object torch's weights_only unpickler refuses"


def latest(logdir: str) -> tuple[str, dict[str, Any]] | None:
    """(path, state) of the newest checkpoint in `logdir` that loads, or None if none does (or there is none).

    A checkpoint that fails to load (`read`: corrupt, or refused as unsafe) is skipped with a warning naming it
    and the error; the previous one is tried next. The state is on the CPU: {"agent", "optimizer", "counters",
    "seed", "rng", "config"} as `seed.learner.learner.Learner.checkpoint` writes it."""
    for path in reversed(checkpoint_paths(logdir)):
        try:
            return path, read(path)
        except Exception as error:  # noqa: BLE001 - any unreadable file: fall back to the previous checkpoint
            # Python's last-resort handler prints warnings to stderr when logging is not configured.
            log.warning("checkpoint %s does not load (%s: %s); trying the previous checkpoint",
                        path, type(error).__name__, error)
    return None


def load(logdir: str) -> dict[str, Any] | None:
    """The state of the newest loadable checkpoint in `logdir` (see `latest`), or None."""
    found = latest(logdir)
    return None if found is None else found[1]
