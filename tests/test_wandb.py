"""The Weights & Biases sink (seed/metrics/wandb_sink.py) with the real library in offline mode (no network): a real
learner
and actor log the configuration and every metrics row against env frames, seed-eval logs its summary and video,
read back from the runs' .wandb files; a bad --wandb_mode is refused; a missing or failing wandb is one warning."""

from __future__ import annotations

import glob
import json
import os
import struct
import subprocess
import sys

import pytest

from seed.metrics.recording import MetricsWriter
from seed.metrics.sinks import SinkSettings
from tests.conftest import REPO, read_metrics, wait_for

ENV = "gym:CartPole-v1"
TRAIN_STEPS = 12


@pytest.fixture
def wandb(tmp_path, monkeypatch):
    """The wandb module, offline and writing under tmp_path; the test skips without the wandb extra."""
    module = pytest.importorskip("wandb", reason="wandb is not installed (the wandb extra: "
                                                 "pip install 'seed-rl-torch[wandb]')")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_dir"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    os.makedirs(tmp_path / "wandb_dir")
    return module


def wandb_records(path: str) -> list:
    """The records of a run's .wandb file: a 7-byte header (':W&B', magic, version), then LevelDB-log blocks of
    32 KiB holding chunks (crc32c uint32, length uint16, type uint8: 1 full, 2 first, 3 middle, 4 last), each
    record a serialized wandb_internal_pb2.Record."""
    from wandb.proto import wandb_internal_pb2

    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b":W&B", data[:7]
    records, chunks, pos, block = [], [], 7, 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a chunk header is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:
            break
        chunks.append(data[pos + 7:pos + 7 + length])
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(chunks))
            records.append(record)
            chunks = []
    return records


def _key(item) -> str:
    return item.key or ".".join(item.nested_key)


class OfflineRun:
    """What an offline run's .wandb file holds: the run record, the merged configuration, the metric
    definitions, the history rows (values JSON-decoded; nested values as 'video.path') and the files."""

    def __init__(self, path: str):
        self.dir = os.path.dirname(path)
        by_type: dict[str, list] = {}
        for record in wandb_records(path):
            by_type.setdefault(record.WhichOneof("record_type"), []).append(record)
        self.finished = "run" in by_type and "exit" in by_type
        if not self.finished:
            return
        self.run = by_type["run"][0].run
        self.config = {u.key: json.loads(u.value_json) for u in self.run.config.update}
        for record in by_type.get("config", []):
            self.config.update({_key(u): json.loads(u.value_json) for u in record.config.update})
        self.metrics = [r.metric for r in by_type.get("metric", [])]
        self.history = [{_key(i): json.loads(i.value_json) for i in r.history.item} for r in by_type.get("history", [])]
        self.files = [f.path for r in by_type.get("files", []) for f in r.files.files]


def offline_runs(wandb_dir: str, job_types: set[str]) -> dict[str, OfflineRun]:
    """job type -> the finished offline run under $WANDB_DIR, one per job type. wandb's service process writes
    the file after `finish()` returns (seen 7 bytes long right after it, complete within 3 s): wait for its
    exit record."""

    def finished() -> dict[str, OfflineRun] | None:
        paths = glob.glob(os.path.join(wandb_dir, "wandb", "offline-run-*", "run-*.wandb"))
        runs = [OfflineRun(path) for path in paths]
        if len(runs) != len(job_types) or not all(run.finished for run in runs):
            return None
        by_job = {run.run.job_type: run for run in runs}
        assert set(by_job) == job_types, sorted(by_job)
        return by_job

    return wait_for(finished, 60, f"finished offline W&B runs of job types {sorted(job_types)}")


def test_learner_and_seed_eval_log_to_an_offline_run(wandb, processes, tmp_path):
    pytest.importorskip("imageio", reason="the video extra (pip install 'seed-rl-torch[video]') is not installed")
    logdir = str(tmp_path / "cartpole-run")
    address = f"unix:{tmp_path}/learner.sock"
    learner = processes.learner([
        f"--env={ENV}", f"--logdir={logdir}", f"--server_address={address}", "--num_actors=1", "--envs_per_actor=4",
        "--batch_size=4", "--unroll_length=10", "--log_interval_s=0.5", f"--max_train_steps={TRAIN_STEPS}",
        "--torch_threads=1", "--checkpoint_interval_s=3600", "--wandb_project=test", "--wandb_mode=offline"])
    processes.actor([f"--env={ENV}", f"--server_address={address}", "--actor_index=0", "--envs_per_actor=4"],
                    "actor0")
    try:
        assert learner.wait(timeout=240) == 0, processes.output(learner)
    finally:
        output = processes.output(learner)
    assert "metrics sink" not in output, output  # no sink was dropped

    rows = read_metrics(logdir)
    run = offline_runs(str(tmp_path / "wandb_dir"), {"learner"})["learner"]
    assert run.run.project == "test" and run.run.display_name == "cartpole-run" and run.run.run_group == "cartpole-run"
    # The resolved configuration, flags and derived values.
    assert run.config["wandb_project"] == "test" and run.config["wandb_mode"] == "offline"
    assert run.config["env"] == ENV and run.config["batch_size"] == 4 and run.config["logdir"] == logdir
    assert run.config["max_train_steps"] == TRAIN_STEPS and run.config["auth_token"] == ""
    # Every metric is plotted against env frames.
    assert any(m.glob_name == "*" and m.step_metric == "env_frames" for m in run.metrics), run.metrics
    # One W&B row per metrics.jsonl row, with the same env frames and values.
    assert len(rows) >= 2 and rows[-1]["train_steps"] == TRAIN_STEPS, rows
    assert [(h["env_frames"], h["train_steps"]) for h in run.history] == \
        [(r["env_frames"], r["train_steps"]) for r in rows]
    trained = [(h, r) for h, r in zip(run.history, rows, strict=True) if r.get("losses/total") is not None]
    assert trained and trained[-1][0]["env_frames"] > 0
    for logged, row in trained:
        assert logged["losses/total"] == pytest.approx(row["losses/total"], rel=1e-6)
        assert logged["episodes"] == row["episodes"]

    # seed-eval on the learner's checkpoint: its summary and video in a run of job type eval, same group.
    video = str(tmp_path / "episode.mp4")
    done = subprocess.run([sys.executable, "-m", "seed.evaluate", f"--logdir={logdir}", "--episodes=2",
                           "--num_envs=1", f"--video={video}", "--wandb_project=test", "--wandb_mode=offline"],
                          cwd=REPO, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    with open(os.path.join(logdir, "eval.json")) as f:
        report = json.load(f)
    evaluation = offline_runs(str(tmp_path / "wandb_dir"), {"learner", "eval"})["eval"]
    assert evaluation.run.run_group == "cartpole-run"
    assert evaluation.config["episodes"] == 2 and evaluation.config["env"] == ENV
    step = report["counters"]["env_frames"]
    assert 0 < step <= rows[-1]["env_frames"]  # the checkpoint written at exit, before the last row
    summary = next(h for h in evaluation.history if "eval/return_mean" in h)
    assert summary["eval/return_mean"] == pytest.approx(report["return_mean"]) and summary["env_frames"] == step
    logged_video = next(h for h in evaluation.history if "video.path" in h)
    assert logged_video["env_frames"] == step and logged_video["video.path"].endswith(".mp4")
    copied = os.path.join(evaluation.dir, "files", logged_video["video.path"])
    assert os.path.getsize(copied) == os.path.getsize(video) > 0


def test_an_invalid_wandb_mode_is_refused():
    done = subprocess.run([sys.executable, "-m", "seed.learner.main", "--wandb_project=test", "--wandb_mode=cloud",
                           "--print_config"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip() == "seed-learner: --wandb_mode: got 'cloud', expected online, offline or disabled"
    done = subprocess.run([sys.executable, "-m", "seed.evaluate", "--logdir=/nonexistent", "--wandb_project=test",
                           "--wandb_mode=cloud"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip() == "seed-eval: --wandb_mode: got 'cloud', expected online, offline or disabled"


def _row(env_frames: int) -> dict:
    return {"time_s": 1.0, "env_frames": env_frames, "env_frames_per_sec": 10.0, "train_steps": 1, "episodes": 0,
            "episode_return_mean": None, "inference_batch_size_mean": 4.0, "inference_latency_ms_p50": 0.1}


def test_missing_wandb_is_one_warning_and_the_other_sinks_stay(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if the wandb extra were not installed
    writer = MetricsWriter.open(SinkSettings(str(tmp_path), {"wandb_project": "test"}))
    assert [sink.name for sink in writer.sinks] == ["jsonl", "progress", "tensorboard"]
    writer.write(_row(8))
    writer.close()
    assert len(read_metrics(str(tmp_path))) == 1
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warnings) == 1, warnings
    assert "'wandb'" in warnings[0] and "'wandb' is not installed" in warnings[0], warnings
    assert "pip install 'seed-rl-torch[wandb]'" in warnings[0]


def test_wandb_raising_in_log_is_dropped_and_training_metrics_go_on(wandb, tmp_path, capsys, monkeypatch):
    logdir = str(tmp_path / "run")
    os.makedirs(logdir)
    writer = MetricsWriter.open(SinkSettings(logdir, {"wandb_project": "test", "wandb_mode": "offline"}))
    sink = writer.sinks[-1]
    assert sink.name == "wandb"
    try:
        writer.write(_row(8))

        def refuse(*args, **kwargs):
            raise ConnectionError("the W&B server went away")

        monkeypatch.setattr(sink.run, "log", refuse)
        writer.write(_row(16))
        writer.write(_row(24))
        writer.close()
    finally:
        sink.run.finish()
    assert [row["env_frames"] for row in read_metrics(logdir)] == [8, 16, 24]
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warnings) == 1, warnings
    assert "'wandb'" in warnings[0] and "ConnectionError: the W&B server went away" in warnings[0]
    run = offline_runs(str(tmp_path / "wandb_dir"), {"learner"})["learner"]
    assert [h["env_frames"] for h in run.history] == [8]
