"""Checkpoints in the logdir: the agent (networks), the optimizer and the learner's counters.

Each save writes a new file `checkpoint-<n>.pt` (n counts up, 8 digits) atomically (a temporary file, then
`os.replace`), then deletes all but the newest `keep` of them (`--keep_checkpoints`, default 3). A crash in
the middle of a save leaves at worst a `.tmp` file, never a torn checkpoint under a real name.

Loading takes the newest checkpoint that loads; one that fails to load (truncated, corrupted) is skipped with
a warning naming the file and the error, and the one before it is tried. A learner started on a logdir that
holds a checkpoint resumes from it: parameters, optimizer moments, env frames and train steps. A logdir
written before rotation existed holds `checkpoint.pt`; it counts as the oldest checkpoint.

For other tools (e.g. an evaluator reading a training run's logdir):

    found = checkpoint.latest(logdir)        # (path, state) of the newest loadable checkpoint, or None
    state = checkpoint.load(logdir)          # the state alone, or None
    path = checkpoint.checkpoint_path(logdir)  # the newest file by name (not opened)
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any

import torch

log = logging.getLogger(__name__)

LEGACY_NAME = "checkpoint.pt"  # the single file of logdirs written before rotation
_NAME = re.compile(r"^checkpoint-(\d{8,})\.pt$")


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
    """Writes `state` as the next `checkpoint-<n>.pt` (atomically), deletes all but the newest `keep`
    checkpoints and returns the new file's path."""
    if keep < 1:
        raise ValueError(f"keep_checkpoints: got {keep}, expected >= 1")
    numbers = [int(m.group(1)) for name in os.listdir(logdir) if (m := _NAME.match(name))]
    path = os.path.join(logdir, _format_name(max(numbers, default=0) + 1))
    tmp = path + ".tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)
    for old in checkpoint_paths(logdir)[:-keep]:
        try:
            os.remove(old)
        except FileNotFoundError:
            pass
    return path


def latest(logdir: str) -> tuple[str, dict[str, Any]] | None:
    """(path, state) of the newest checkpoint in `logdir` that loads, or None if none does (or there is none).

    A checkpoint that fails to load is skipped with a warning naming it; the previous one is tried next. The
    state is on the CPU: {"agent", "optimizer", "counters", "config"} as `seed.learner.Learner.checkpoint`
    writes it."""
    for path in reversed(checkpoint_paths(logdir)):
        try:
            return path, torch.load(path, map_location="cpu", weights_only=False)
        except Exception as error:  # noqa: BLE001 - any unreadable file: fall back to the previous checkpoint
            # Python's last-resort handler prints warnings to stderr when logging is not configured.
            log.warning("checkpoint %s does not load (%s: %s); trying the previous checkpoint",
                        path, type(error).__name__, error)
    return None


def load(logdir: str) -> dict[str, Any] | None:
    """The state of the newest loadable checkpoint in `logdir` (see `latest`), or None."""
    found = latest(logdir)
    return None if found is None else found[1]
