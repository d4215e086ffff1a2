"""Checkpoints: rotation, atomic files, fallback past a corrupted newest file, and what a resumed learner restores."""

from __future__ import annotations

import logging
import os

import pytest
import torch

from seed import checkpoint


def _state(step: int) -> dict:
    return {"agent": {"w": torch.full((3,), float(step))}, "counters": {"train_steps": step}}


def test_rotation_keeps_the_newest_files_and_loads_the_newest(tmp_path):
    logdir = str(tmp_path)
    assert checkpoint.latest(logdir) is None and checkpoint.load(logdir) is None
    paths = [checkpoint.save(logdir, _state(step), keep=3) for step in range(1, 6)]
    assert sorted(os.listdir(logdir)) == ["checkpoint-00000003.pt", "checkpoint-00000004.pt", "checkpoint-00000005.pt"]
    assert checkpoint.checkpoint_paths(logdir) == paths[2:]
    assert checkpoint.checkpoint_path(logdir) == paths[-1]
    path, state = checkpoint.latest(logdir)
    assert path == paths[-1] and state["counters"]["train_steps"] == 5
    assert checkpoint.load(logdir)["agent"]["w"].tolist() == [5.0, 5.0, 5.0]
    # A smaller --keep_checkpoints on a later run trims the older files.
    checkpoint.save(logdir, _state(6), keep=1)
    assert os.listdir(logdir) == ["checkpoint-00000006.pt"]
    with pytest.raises(ValueError, match="keep_checkpoints: got 0, expected >= 1"):
        checkpoint.save(logdir, _state(7), keep=0)


def test_a_corrupted_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, caplog):
    logdir = str(tmp_path)
    for step in (1, 2, 3):
        checkpoint.save(logdir, _state(step))
    newest = checkpoint.checkpoint_path(logdir)
    with open(newest, "r+b") as f:  # a torn write: the file ends half-way
        f.truncate(os.path.getsize(newest) // 2)
    with caplog.at_level(logging.WARNING, logger="seed.checkpoint"):
        path, state = checkpoint.latest(logdir)
    assert path.endswith("checkpoint-00000002.pt") and state["counters"]["train_steps"] == 2
    assert f"checkpoint {newest} does not load" in caplog.text
    # The next save still numbers past the bad file, so it never shadows a newer good one.
    assert checkpoint.save(logdir, _state(4)).endswith("checkpoint-00000004.pt")
    assert checkpoint.load(logdir)["counters"]["train_steps"] == 4
    for path in checkpoint.checkpoint_paths(logdir):
        with open(path, "wb") as f:
            f.write(b"not a checkpoint")
    assert checkpoint.latest(logdir) is None


def test_a_logdir_from_before_rotation_resumes_from_checkpoint_pt(tmp_path):
    logdir = str(tmp_path)
    torch.save(_state(9), os.path.join(logdir, checkpoint.LEGACY_NAME))
    assert checkpoint.latest(logdir)[0] == os.path.join(logdir, "checkpoint.pt")
    checkpoint.save(logdir, _state(10), keep=2)
    checkpoint.save(logdir, _state(11), keep=2)
    assert sorted(os.listdir(logdir)) == ["checkpoint-00000001.pt", "checkpoint-00000002.pt"]
    assert checkpoint.load(logdir)["counters"]["train_steps"] == 11


def _learner(logdir: str):
    from seed.learner import Learner
    from seed.learner_main import resolve_config

    config = resolve_config(dict(env="fake:vector", logdir=logdir, server_address=f"unix:{logdir}/s", num_actors=1,
                                 envs_per_actor=2, inference_devices="cpu,cpu", torch_threads=1, keep_checkpoints=2))
    return Learner(config)


def test_resumed_learner_restores_parameters_optimizer_counters_and_serves_the_restored_network(tmp_path):
    logdir = str(tmp_path / "run")
    first = _learner(logdir)
    # Training that moves every parameter and fills Adam's moments.
    for _ in range(3):
        loss = sum((p * p).sum() for p in first.agent.network.parameters())
        first.optimizer.zero_grad()
        loss.backward()
        first.optimizer.step()
    first.metrics.env_frames, first.metrics.train_steps, first.metrics.episodes = 1234, 3, 17
    first.checkpoint()
    first._close()
    path, saved = checkpoint.latest(logdir)

    second = _learner(logdir)
    fresh = _learner(str(tmp_path / "fresh"))  # what a learner that ignored its checkpoint would hold
    try:
        assert path.endswith("checkpoint-00000001.pt")
        for name, value in second.agent.network.state_dict().items():
            assert torch.equal(value, first.agent.network.state_dict()[name]), name
        assert any(not torch.equal(v, fresh.agent.network.state_dict()[k])
                   for k, v in second.agent.network.state_dict().items())
        # Adam's step count and moments came back (a fresh optimizer has no state at all).
        restored_state = second.optimizer.state_dict()["state"]
        assert len(restored_state) == len(saved["optimizer"]["state"]) > 0
        for index, moments in saved["optimizer"]["state"].items():
            for key in ("step", "exp_avg", "exp_avg_sq"):
                assert torch.equal(restored_state[index][key], moments[key]), (index, key)
        assert (second.metrics.env_frames, second.metrics.train_steps, second.metrics.episodes) == (1234, 3, 17)
        # Every inference device starts from the restored network, not from a fresh initialisation.
        expected = first.agent.network.state_dict()
        for inference in second.inferences:
            for name, value in inference.network.state_dict().items():
                assert torch.equal(value, expected[name]), name
    finally:
        second._close()
        fresh._close()
