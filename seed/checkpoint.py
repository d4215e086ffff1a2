"""Checkpoints in the logdir: the agent (networks), the optimizer and the learner's counters.

Written atomically (temporary file, then rename), periodically and on exit. A learner started on a logdir
that holds a checkpoint resumes from it: parameters, optimizer moments, env frames and train steps.
"""

from __future__ import annotations

import os
from typing import Any

import torch

CHECKPOINT_NAME = "checkpoint.pt"


def checkpoint_path(logdir: str) -> str:
    return os.path.join(logdir, CHECKPOINT_NAME)


def save(logdir: str, state: dict[str, Any]) -> str:
    path = checkpoint_path(logdir)
    tmp = path + ".tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)
    return path


def load(logdir: str) -> dict[str, Any] | None:
    path = checkpoint_path(logdir)
    if not os.path.exists(path):
        return None
    return torch.load(path, map_location="cpu", weights_only=False)
