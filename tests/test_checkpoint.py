"""Checkpoints: rotation, atomic and durable files, fallback past a corrupted newest file, files that would run
code refused, and what a resumed learner restores."""

from __future__ import annotations

import io
import logging
import os
import shlex
import subprocess
import sys

import numpy as np
import pytest
import torch

from seed.runtime import checkpoint


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
    with caplog.at_level(logging.WARNING, logger="seed.runtime.checkpoint"):
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


def test_save_fsyncs_the_file_before_the_rename_and_the_directory_after_it(tmp_path, monkeypatch):
    """What a power loss needs (it cannot be simulated here, so os.fsync is observed): the new file's bytes
    are synced under its temporary name, the logdir after the rename, and only then is the older checkpoint
    (--keep_checkpoints=1) deleted."""
    logdir = str(tmp_path)
    older = checkpoint.save(logdir, _state(1), keep=1)
    new = os.path.join(logdir, "checkpoint-00000002.pt")
    synced = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        target = os.readlink(f"/proc/self/fd/{fd}")
        synced.append({"target": target, "bytes": os.path.getsize(target) if os.path.isfile(target) else None,
                       "new_exists": os.path.exists(new), "older_exists": os.path.exists(older)})
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    assert checkpoint.save(logdir, _state(2), keep=1) == new
    size = os.path.getsize(new)
    assert synced == [
        {"target": new + ".tmp", "bytes": size, "new_exists": False, "older_exists": True},  # whole, not yet named
        {"target": logdir, "bytes": None, "new_exists": True, "older_exists": True},  # the rename, before deleting
    ]
    assert os.listdir(logdir) == ["checkpoint-00000002.pt"]


class RunsCode:
    """Unpickles as a call of os.system(command): what a malicious checkpoint would hold."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def write_code_running_checkpoint(path: str, marker: str) -> None:
    """A checkpoint-shaped file whose unpickling runs `touch marker`."""
    torch.save({"agent": {"network": {"w": torch.zeros(2)}}, "config": RunsCode(f"touch {shlex.quote(marker)}"),
                "counters": {"train_steps": 1}}, path)


def test_a_checkpoint_that_would_run_code_is_refused_and_skipped(tmp_path, caplog):
    logdir, marker = str(tmp_path / "run"), str(tmp_path / "code-ran")
    os.makedirs(logdir)
    good = checkpoint.save(logdir, _state(1))
    evil = os.path.join(logdir, "checkpoint-00000002.pt")
    write_code_running_checkpoint(evil, marker)
    with pytest.raises(checkpoint.UnsafeCheckpoint, match=f"checkpoint {evil}: got the Python object posix.system, "
                                                          "expected only tensors"):
        checkpoint.read(evil)
    with caplog.at_level(logging.WARNING, logger="seed.runtime.checkpoint"):
        path, state = checkpoint.latest(logdir)  # what a learner resuming on this logdir loads
    assert path == good and state["counters"]["train_steps"] == 1
    assert f"checkpoint {evil} does not load (UnsafeCheckpoint" in caplog.text
    assert not os.path.exists(marker)
    torch.load(evil, weights_only=False)  # the file is a real attack: unpickled in full, it runs the command
    assert os.path.exists(marker)


def test_random_states_load_and_so_do_numpy_1_files(tmp_path):
    """The learner's checkpoint holds np.random.get_state() (a uint32 array) beside tensors; a file written under
    NumPy 1 names the array's reconstructor numpy.core.multiarray._reconstruct, NumPy 2 numpy._core's."""
    states = {"numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    buffer = io.BytesIO()
    torch.save({"rng": states}, buffer, _use_new_zipfile_serialization=False)  # the legacy format: names as text
    data = buffer.getvalue()
    current = b"numpy._core.multiarray" if b"numpy._core.multiarray" in data else b"numpy.core.multiarray"
    for name in (b"numpy._core.multiarray", b"numpy.core.multiarray"):
        path = tmp_path / f"{name.decode()}.pt"
        path.write_bytes(data.replace(current, name))
        loaded = checkpoint.read(str(path))["rng"]
        assert loaded["numpy"][0] == "MT19937" and loaded["numpy"][1].dtype == np.uint32
        assert np.array_equal(loaded["numpy"][1], states["numpy"][1]) and loaded["numpy"][2:] == states["numpy"][2:]
        assert torch.equal(loaded["torch"], states["torch"])


def make_learner(logdir: str, training_process: bool = False, **options):
    """A learner built (not started) on the fake vector env; without the training process by default, so that
    the test can step its optimizer."""
    from seed.learner.configuration import resolve_config
    from seed.learner.learner import Learner

    config = resolve_config({**dict(env="fake:vector", logdir=logdir, server_address=f"unix:{logdir}/s", num_actors=1,
                                    envs_per_actor=2, inference_devices="cpu,cpu", torch_threads=1, keep_checkpoints=2,
                                    training_process=training_process), **options})
    return Learner(config)


def train_in_process(learner, steps: int) -> None:
    """`steps` optimizer steps of a learner built without the training process: they move every parameter and
    fill Adam's moments."""
    for _ in range(steps):
        loss = sum((p * p).sum() for p in learner.parts.agent.network.parameters())
        learner.parts.optimizer.zero_grad()
        loss.backward()
        learner.parts.optimizer.step()


def test_resumed_learner_restores_parameters_optimizer_counters_and_serves_the_restored_network(tmp_path):
    logdir = str(tmp_path / "run")
    first = make_learner(logdir)
    train_in_process(first, 3)
    first.parts.metrics.env_frames, first.parts.metrics.train_steps, first.parts.metrics.episodes = 1234, 3, 17
    first.checkpoint()
    first._close()
    path, saved = checkpoint.latest(logdir)

    second = make_learner(logdir)
    fresh = make_learner(str(tmp_path / "fresh"))  # what a learner that ignored its checkpoint would hold
    try:
        assert path.endswith("checkpoint-00000001.pt")
        for name, value in second.parts.agent.network.state_dict().items():
            assert torch.equal(value, first.parts.agent.network.state_dict()[name]), name
        assert any(not torch.equal(v, fresh.parts.agent.network.state_dict()[k])
                   for k, v in second.parts.agent.network.state_dict().items())
        # Adam's step count and moments came back (a fresh optimizer has no state at all).
        restored_state = second.parts.optimizer.state_dict()["state"]
        assert len(restored_state) == len(saved["optimizer"]["state"]) > 0
        for index, moments in saved["optimizer"]["state"].items():
            for key in ("step", "exp_avg", "exp_avg_sq"):
                assert torch.equal(restored_state[index][key], moments[key]), (index, key)
        metrics = second.parts.metrics
        assert (metrics.env_frames, metrics.train_steps, metrics.episodes) == (1234, 3, 17)
        # Every inference device starts from the restored network, not from a fresh initialisation.
        expected = first.parts.agent.network.state_dict()
        for inference in second.parts.inferences:
            for name, value in inference.network.state_dict().items():
                assert torch.equal(value, expected[name]), name
    finally:
        second._close()
        fresh._close()


def test_a_resumed_r2d2_learner_anneals_epsilon_on_from_the_checkpoints_agent_steps(tmp_path):
    """--epsilon_anneal_steps does not start again from epsilon 1 after a restart: each env counts on from its
    share of the checkpoint's agent steps, on every inference device."""
    logdir = str(tmp_path / "run")
    options = dict(agent="r2d2", envs_per_actor=4, num_eval_envs=1, epsilon_anneal_steps=1000, replay_min_size=1)
    first = make_learner(logdir, **options)
    first.parts.metrics.env_frames = 400  # 400 agent steps of 4 envs (the fake env repeats no action)
    first.checkpoint()
    first._close()
    second = make_learner(logdir, **options)
    try:
        assert [second.parts.agent.acted_on(inference.device).tolist() for inference in second.parts.inferences
                ] == [[100] * 4] * 2
    finally:
        second._close()


def test_a_checkpoint_of_another_network_is_refused_naming_the_changed_flags(tmp_path):
    """A run resumed with a preset whose network changed since (minatar_r2d2's dueling heads) says which flags
    differ from the checkpoint's instead of torch's bare size mismatch."""
    logdir = str(tmp_path / "run")
    first = make_learner(logdir, agent="r2d2", dueling_hidden=16)
    first.checkpoint()
    first._close()
    with pytest.raises(ValueError, match=r"checkpoint-00000001.pt does not fit .*--dueling_hidden: was 16, now 0"):
        make_learner(logdir, agent="r2d2", dueling_hidden=0)


def test_with_the_training_process_the_learner_holds_only_the_optimizer_state(tmp_path):
    """The training process owns the optimizer: the learner holds its state (None when fresh) and hands on a
    resumed one; a checkpoint without optimizer state resumes an in-process learner with a fresh optimizer."""
    from seed.training.optimizers import HeldOptimizerState

    logdir = str(tmp_path / "run")
    first = make_learner(logdir)
    train_in_process(first, 2)
    first.checkpoint()
    first._close()
    _, saved = checkpoint.latest(logdir)

    held = make_learner(logdir, training_process=True)
    fresh = make_learner(str(tmp_path / "fresh"), training_process=True)
    try:
        assert isinstance(held.parts.optimizer, HeldOptimizerState)
        restored = held.parts.optimizer.state_dict()["state"]
        assert len(restored) == len(saved["optimizer"]["state"]) > 0
        for index, moments in saved["optimizer"]["state"].items():
            assert torch.equal(restored[index]["exp_avg"], moments["exp_avg"]), index
        assert fresh.parts.optimizer.state_dict() is None
        fresh.checkpoint()  # the child never ran: nothing to ask, no optimizer state yet
    finally:
        held._close()
        fresh._close()
    fresh_logdir = str(tmp_path / "fresh")
    assert checkpoint.latest(fresh_logdir)[1]["optimizer"] is None
    resumed = make_learner(fresh_logdir)
    try:
        assert isinstance(resumed.parts.optimizer, torch.optim.Optimizer)
        assert resumed.parts.optimizer.state_dict()["state"] == {}
    finally:
        resumed._close()


BUILD_A_LEARNER = """
import sys
from seed.learner.configuration import resolve_config
from seed.learner.learner import Learner
logdir = sys.argv[1]
config = resolve_config(dict(env="fake:vector", logdir=logdir, server_address=f"unix:{logdir}/s", num_actors=1,
                             torch_threads=1))
learner = Learner(config)
print("dynamo imported:", "torch._dynamo" in sys.modules)
learner._close()
"""


def test_a_learner_with_the_training_process_does_not_import_dynamo(tmp_path):
    """Building a torch optimizer imports torch._dynamo (about 2 s); the learner's process, which does not step
    one with --training_process, must not pay for it (its training process does)."""
    completed = subprocess.run([sys.executable, "-c", BUILD_A_LEARNER, str(tmp_path)], capture_output=True,
                               text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "dynamo imported: False" in completed.stdout, completed.stdout + completed.stderr[-3000:]
