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


# A resumed run's optimizer: the hyperparameters it was started with now, the state (moments, step counts) the
# checkpoint holds; an optimizer of another kind refused at resume, naming the flag.

RESUMED_HYPERPARAMETERS = {  # the flags a checkpoint is made with, and the other values a resume is given
    "adam": (dict(learning_rate=1e-3, adam_epsilon=1e-7, adam_beta1=0.9),
             dict(learning_rate=1e-4, adam_epsilon=1e-5, adam_beta1=0.8)),
    "clipped_lars": (dict(learning_rate=1e-3, lars_eta=1e-3, weight_decay=1e-4, momentum=0.9, lars_warmup_steps=0,
                          lars_bn_bias_eta=0.0),
                     dict(learning_rate=1e-4, lars_eta=2e-3, weight_decay=0.0, momentum=0.5, lars_warmup_steps=7,
                          lars_bn_bias_eta=0.05)),
}


def hyperparameters(optimizer) -> list[dict]:
    """Each parameter group's settings (everything but its tensors)."""
    return [{key: value for key, value in group.items() if key != "params"} for group in optimizer.param_groups]


def one_step_moves(learner) -> list[torch.Tensor]:
    """How far one optimizer step on fixed gradients moves each parameter of an in-process learner (undone)."""
    network = learner.parts.agent.network
    before = [p.detach().clone() for p in network.parameters()]
    generator = torch.Generator().manual_seed(7)
    for p in network.parameters():
        p.grad = torch.randn(p.shape, generator=generator)
    learner.parts.optimizer.step()
    moves = [p.detach() - b for p, b in zip(network.parameters(), before, strict=True)]
    return moves


@pytest.mark.parametrize("optimizer", sorted(RESUMED_HYPERPARAMETERS))
def test_a_resumed_in_process_optimizer_steps_with_the_configured_hyperparameters(tmp_path, optimizer):
    """--notraining_process: a checkpoint made at --learning_rate=1e-3 resumed with 1e-4 steps at 1e-4 (a tenth
    of the move the same state makes at 1e-3), with the checkpoint's moments; every other hyperparameter flag
    changed on resume is the one the optimizer holds too (torch's load_state_dict restores the saved ones)."""
    saved_flags, new_flags = RESUMED_HYPERPARAMETERS[optimizer]
    logdir = str(tmp_path / "run")
    first = make_learner(logdir, optimizer=optimizer, **saved_flags)
    train_in_process(first, 3)
    first.checkpoint()
    first._close()
    _, saved = checkpoint.latest(logdir)
    assert {group["lr"] for group in saved["optimizer"]["param_groups"]} == {1e-3}

    at_old_rate = make_learner(logdir, optimizer=optimizer, **saved_flags)
    at_new_rate = make_learner(logdir, optimizer=optimizer, **{**saved_flags, "learning_rate": 1e-4})
    changed = make_learner(logdir, optimizer=optimizer, **new_flags)
    fresh = make_learner(str(tmp_path / "fresh"), optimizer=optimizer, **new_flags)
    try:
        assert {group["lr"] for group in at_new_rate.parts.optimizer.param_groups} == {1e-4}
        assert at_new_rate.parts.optimizer.state_dict()["state"].keys() == saved["optimizer"]["state"].keys()
        old_moves, new_moves = one_step_moves(at_old_rate), one_step_moves(at_new_rate)
        total = sum(float(move.abs().sum()) for move in new_moves) / sum(float(m.abs().sum()) for m in old_moves)
        assert total == pytest.approx(0.1, rel=1e-3)
        for old, new in zip(old_moves, new_moves, strict=True):
            if float(old.abs().max()) > 1e-5:  # float32 parameters: tinier moves are their rounding (~1e-8)
                torch.testing.assert_close(new, 0.1 * old, rtol=1e-3, atol=1e-7)
        assert any(bool(move.abs().sum() > 0) for move in one_step_moves(changed))
        assert hyperparameters(changed.parts.optimizer) == hyperparameters(fresh.parts.optimizer)
    finally:
        for learner in (at_old_rate, at_new_rate, changed, fresh):
            learner._close()


@pytest.mark.parametrize("training_process", [False, True], ids=["in_process", "training_process"])
def test_a_checkpoint_of_another_optimizer_is_refused_at_resume_naming_the_flag(tmp_path, training_process):
    """An Adam checkpoint resumed with --optimizer=clipped_lars is refused when the learner resumes (before it
    serves), naming the flag, with the training process (whose child would fail only once started) and without
    (where torch's load_state_dict would say only "a different number of parameter groups")."""
    logdir = str(tmp_path / "run")
    first = make_learner(logdir)
    train_in_process(first, 1)
    first.checkpoint()
    first._close()
    with pytest.raises(ValueError, match=r"checkpoint-00000001.pt does not fit the optimizer .*"
                                                   r"--optimizer: was 'adam', now 'clipped_lars'"):
        make_learner(logdir, training_process=training_process, optimizer="clipped_lars")


RESUME_WITH_CLIPPED_LARS = """
import sys
from seed.learner.configuration import resolve_config
from seed.learner.learner import Learner
logdir = sys.argv[1]
config = resolve_config(dict(env="fake:vector", logdir=logdir, server_address=f"unix:{logdir}/s", num_actors=1,
                             envs_per_actor=2, inference_devices="cpu,cpu", torch_threads=1, keep_checkpoints=2,
                             training_process=True, optimizer="clipped_lars"))
try:
    Learner(config)
except ValueError as error:
    print("refused:", error)
print("dynamo imported:", "torch._dynamo" in sys.modules)
"""


def test_the_refusal_of_another_optimizer_builds_no_torch_optimizer_in_the_learner(tmp_path):
    """With the training process the learner compares the checkpoint's configuration: it builds no torch
    optimizer (which imports torch._dynamo) to find out that the state does not fit."""
    logdir = str(tmp_path / "run")
    first = make_learner(logdir)
    train_in_process(first, 1)
    first.checkpoint()
    first._close()
    completed = subprocess.run([sys.executable, "-c", RESUME_WITH_CLIPPED_LARS, logdir], capture_output=True,
                               text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "refused:" in completed.stdout and "--optimizer: was 'adam', now 'clipped_lars'" in completed.stdout, (
        completed.stdout + completed.stderr[-3000:])
    assert "dynamo imported: False" in completed.stdout, completed.stdout


def test_seed_learner_refuses_another_optimizer_in_one_line_before_it_serves(tmp_path):
    """The entry point: `seed-learner` on an Adam checkpoint with --optimizer=clipped_lars exits 2 with one line
    naming the flag, no traceback, and never opens its socket."""
    logdir = str(tmp_path / "run")
    first = make_learner(logdir)
    train_in_process(first, 1)
    first.checkpoint()
    first._close()
    flags = dict(env="fake:vector", logdir=logdir, server_address=f"unix:{logdir}/s", num_actors=1, envs_per_actor=2,
                 inference_devices="cpu,cpu", torch_threads=1, keep_checkpoints=2, optimizer="clipped_lars")
    completed = subprocess.run([sys.executable, "-m", "seed.learner.main", *[f"--{k}={v}" for k, v in flags.items()]],
                               capture_output=True, text=True, timeout=120)
    assert completed.returncode == 2, completed.stderr[-3000:]
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("seed-learner: --logdir "), completed.stderr[-3000:]
    assert "does not fit the optimizer" in lines[0] and "--optimizer: was 'adam', now 'clipped_lars'" in lines[0]
    assert not os.path.exists(f"{logdir}/s")


def test_a_resumed_ppo_anneals_from_the_configured_rate_at_its_update_count(tmp_path):
    """--anneal_learning_rate keeps its own schedule across a resume: update k trains at the configured rate x
    (1 - k / N), from the rate the run was resumed with, not from the checkpoint's first rate."""
    logdir = str(tmp_path / "run")
    options = dict(agent="ppo", anneal_learning_rate=True, total_environment_frames=64_000)
    first = make_learner(logdir, learning_rate=1e-3, **options)
    first.parts.agent.anneal_learning_rate(first.parts.optimizer, 50)
    train_in_process(first, 1)
    first.parts.metrics.train_steps = 50
    first.checkpoint()
    first._close()
    saved = checkpoint.latest(logdir)[1]["optimizer"]["param_groups"][0]
    assert saved["initial_lr"] == 1e-3 and saved["lr"] < 1e-3

    second = make_learner(logdir, learning_rate=1e-4, **options)
    try:
        agent, optimizer = second.parts.agent, second.parts.optimizer
        config = second.config
        updates = config.total_environment_frames / (config.num_envs * config.unroll_length * agent.spec.action_repeat)
        agent.anneal_learning_rate(optimizer, 60)
        assert [group["lr"] for group in optimizer.param_groups] == pytest.approx(
            [1e-4 * (1 - 60 / updates)] * len(optimizer.param_groups))
        assert 0 < 1 - 60 / updates < 1
    finally:
        second._close()
