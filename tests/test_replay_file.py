"""The replay file (`replay.pt`, --checkpoint_replay, seed/experience/training_batches.py ReplayExperience) by the
checkpoints'
rules (seed/runtime/checkpoint.py): fsynced before its rename and the logdir after it, the previous file kept, and a
file
that does not load (truncated, corrupt) passed over for the previous one, or an empty replay, naming why."""

from __future__ import annotations

import os

import numpy as np
import torch

from seed.contracts.training import Unroll
from seed.experience.replay import PrioritizedReplay
from seed.experience.training_batches import ReplayExperience
from seed.learner.learner import Learner
from tests.test_r2d2 import _config
from tests.test_replay import _unroll

CAPACITY = 4


def _experience(*values: int, capacity: int = CAPACITY) -> ReplayExperience:
    """A replay of `capacity` slots holding sequences `values` (sequence v: reward v), priorities v + 1."""
    replay = PrioritizedReplay(capacity=capacity, priority_exponent=1.0, importance_sampling_exponent=0.0,
                               min_size=1, replay_ratio=1e9, batch_size=1, seed=0, max_insert_lead=100)
    if values:
        replay.insert(Unroll.stack([_unroll(v) for v in values]), np.array(values, float) + 1)
    return ReplayExperience(replay, lambda unrolls: np.ones(unrolls.batch_size), lambda ids: ids < 0,
                            torch.device("cpu"), checkpoint=True)


def _rewards(experience: ReplayExperience) -> list[float]:
    replay = experience.replay
    return sorted(float(replay.state_dict()["steps"]["reward"][i, 0]) for i in range(replay.size))


def test_save_fsyncs_the_file_before_its_rename_and_the_logdir_after(tmp_path, monkeypatch):
    """Before: torch.save to replay.pt.tmp and os.replace, no fsync at all (a power loss could leave an empty
    replay.pt under its real name)."""
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append(("fsync", os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))))
        real_fsync(fd)

    def replace(source: str, target: str) -> None:
        events.append(("replace", os.path.basename(source), os.path.basename(target)))
        real_replace(source, target)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    _experience(1).save(str(tmp_path))
    _experience(2).save(str(tmp_path))
    logdir = os.path.basename(tmp_path)
    once = [("fsync", "replay.pt.tmp"), ("replace", "replay.pt.tmp", "replay.pt"), ("fsync", logdir)]
    again = [("fsync", "replay.pt.tmp"), ("replace", "replay.pt", "replay.previous.pt"),
             ("replace", "replay.pt.tmp", "replay.pt"), ("fsync", logdir)]
    assert events == once + again, events


def test_a_truncated_replay_file_falls_back_to_the_previous_one_then_to_empty(tmp_path, capsys):
    """Before: a truncated replay.pt raised out of restore (the learner could not start on its logdir)."""
    logdir = str(tmp_path)
    _experience(1, 2).save(logdir)
    _experience(3).save(logdir)  # replay.pt: {3}; replay.previous.pt: {1, 2}
    path = os.path.join(logdir, ReplayExperience.REPLAY_FILE)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    restored = _experience()
    restored.restore(logdir)
    assert _rewards(restored) == [1.0, 2.0]
    err = capsys.readouterr().err
    assert f"replay {path} does not load (" in err and "trying the previous replay file" in err, err

    previous = os.path.join(logdir, ReplayExperience.PREVIOUS_REPLAY_FILE)
    with open(previous, "wb") as f:
        f.write(b"not a replay")
    empty = _experience()
    empty.restore(logdir)
    assert empty.replay.size == 0
    err = capsys.readouterr().err
    assert f"replay {path} does not load (" in err and f"replay {previous} does not load (" in err, err
    assert "restored replay" not in capsys.readouterr().out


def test_a_learner_resumes_past_a_truncated_replay_file_and_says_why(tmp_path, capsys):
    """A learner on a logdir with a checkpoint whose replay.pt is truncated resumes with the previous replay file.
    Before: it raised at start (torch's error for the file) and could not resume on its logdir."""
    config = _config(tmp_path, checkpoint_replay=True)
    Learner(config).checkpoint()  # a checkpoint to resume from (its replay empty)
    capacity = config.replay_capacity
    logdir = str(tmp_path)
    _experience(1, 2, capacity=capacity).save(logdir)  # replay.previous.pt: 2 sequences
    _experience(3, capacity=capacity).save(logdir)  # replay.pt: 1 sequence, then cut in its zip directory
    path = tmp_path / ReplayExperience.REPLAY_FILE
    path.write_bytes(path.read_bytes()[:-100])
    capsys.readouterr()
    Learner(config)
    printed = capsys.readouterr()
    assert f"replay {path} does not load (" in printed.err, printed.err
    previous = tmp_path / ReplayExperience.PREVIOUS_REPLAY_FILE
    assert f"restored replay from {previous}: 2 sequences" in printed.out, printed.out
