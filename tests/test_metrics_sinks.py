"""Metrics sinks (seed/metrics/sinks.py) behind MetricsWriter (seed/metrics/recording.py): metrics.jsonl and TensorBoard
rows, the registry, and a sink that fails being dropped with one warning while the others go on."""

import json
import math
import os

import pytest

from seed.metrics.recording import MetricsWriter
from seed.metrics.sinks import SINKS, MetricsSink, SinkSettings


def _row(env_frames, **values):
    """A metrics row with the keys the progress line reads."""
    row = {"time_s": 1.5, "env_frames": env_frames, "env_frames_per_sec": 200.0, "train_steps": 3,
           "train_steps_per_sec": 1.5, "episodes": 2, "episode_return_mean": None,
           "inference_batch_size_mean": 4.0, "inference_latency_ms_p50": 0.25, "queue_size": 1}
    row.update(values)
    return row


def _tensorboard_scalars(logdir):
    """{tag: [(step, value), ...]} of the event files in `logdir`."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(logdir)
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_default_sinks_write_jsonl_tensorboard_and_progress_lines(tmp_path, capsys):
    logdir = str(tmp_path)
    writer = MetricsWriter.open(SinkSettings(logdir))
    assert [sink.name for sink in writer.sinks] == ["jsonl", "progress", "tensorboard"]
    writer.write(_row(400, env_frames_per_sec=math.nan, **{"losses/total": math.inf, "flag": True, "name": "x"}))
    writer.write(_row(800, train_steps=5, **{"losses/total": 0.5}))
    writer.close()

    with open(os.path.join(logdir, "metrics.jsonl")) as f:
        lines = f.read().splitlines()
    # Non-finite floats are null, keys keep the row's order, one line per row.
    expected_first = ('{"time_s": 1.5, "env_frames": 400, "env_frames_per_sec": null, "train_steps": 3, '
                      '"train_steps_per_sec": 1.5, "episodes": 2, "episode_return_mean": null, '
                      '"inference_batch_size_mean": 4.0, "inference_latency_ms_p50": 0.25, "queue_size": 1, '
                      '"losses/total": null, "flag": true, "name": "x"}')
    assert lines[0] == expected_first
    assert json.loads(lines[1]) == _row(800, train_steps=5, **{"losses/total": 0.5})
    assert len(lines) == 2

    # TensorBoard: every number but env_frames (the step), at env frames; None, bools and strings left out.
    scalars = _tensorboard_scalars(logdir)
    assert set(scalars) == {"time_s", "env_frames_per_sec", "train_steps", "train_steps_per_sec", "episodes",
                            "inference_batch_size_mean", "inference_latency_ms_p50", "queue_size", "losses/total"}
    assert scalars["train_steps"] == [(400, 3.0), (800, 5.0)]
    assert scalars["losses/total"] == [(800, 0.5)]
    assert scalars["env_frames_per_sec"] == [(800, 200.0)]

    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and "frames=400 fps=- train_steps=3 (1.5/s) episodes=2 return=-" in out[0], out
    assert "frames=800 fps=200" in out[1] and "queue=1" in out[1], out


class Recording(MetricsSink):
    def __init__(self):
        self.calls = []

    def write(self, row, step):
        self.calls.append(("write", row["train_steps"], step))

    def write_config(self, config):
        self.calls.append(("config", config))

    def write_video(self, path, step):
        self.calls.append(("video", path, step))

    def close(self):
        self.calls.append(("close",))


class Broken(Recording):
    """Fails on its second row, like a W&B run whose `log` raises."""

    name = "broken"

    def write(self, row, step):
        super().write(row, step)
        if len([c for c in self.calls if c[0] == "write"]) == 2:
            raise RuntimeError("upload\n  refused")  # one warning line, even for a message of several


def test_a_sink_that_raises_is_dropped_with_one_warning_and_the_others_go_on(capsys):
    recording, broken = Recording(), Broken()
    writer = MetricsWriter([broken, recording])
    writer.write_config({"seed": 1})
    for steps in range(4):
        writer.write(_row(100 * steps, train_steps=steps))
    writer.write_video("/tmp/v.mp4", 300)
    writer.close()

    assert recording.calls == [("config", {"seed": 1}), ("write", 0, 0), ("write", 1, 100), ("write", 2, 200),
                               ("write", 3, 300), ("video", "/tmp/v.mp4", 300), ("close",)]
    # Nothing reaches the broken sink after its failure (not even close).
    assert broken.calls == [("config", {"seed": 1}), ("write", 0, 0), ("write", 1, 100)]
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warnings) == 1, warnings
    assert "'broken'" in warnings[0] and "in write" in warnings[0] and "RuntimeError: upload refused" in warnings[0]


def test_registered_sinks_are_opened_and_one_that_fails_to_open_is_left_out(tmp_path, monkeypatch, capsys):
    opened = []

    def recording(settings):
        sink = Recording()
        opened.append((sink, settings))
        return sink

    def refuses(settings):
        raise PermissionError("no key")

    monkeypatch.setitem(SINKS, "recording", recording)
    monkeypatch.setitem(SINKS, "refuses", refuses)
    monkeypatch.setitem(SINKS, "off", lambda settings: None)
    settings = SinkSettings(str(tmp_path), {"seed": 3})
    writer = MetricsWriter.open(settings)
    assert [sink.name for sink in writer.sinks] == ["jsonl", "progress", "tensorboard", "recording"]
    assert opened[0][1] is settings
    writer.write(_row(40))
    writer.close()
    assert opened[0][0].calls == [("write", 3, 40), ("close",)]
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "'refuses'" in warnings[0] and "PermissionError: no key" in warnings[0], warnings


def test_an_unknown_sink_name_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"metrics sink: got 'nope', expected one of \[.*'jsonl'"):
        MetricsWriter.open(SinkSettings(str(tmp_path)), ["nope"])
