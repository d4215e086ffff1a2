"""Where metrics rows go: the built-in sinks (the progress line on stdout, `<logdir>/metrics.jsonl`, TensorBoard
event files; the contract they implement is seed/metrics/sink.py), and the registry of sink factories that
`MetricsWriter` (seed/metrics/recording.py) opens and iterates.

A row is one dict per log interval (seed/metrics/recording.py `LearnerMetrics.snapshot`) whose non-finite floats are
already None; `step` is its `env_frames` (env frames: agent steps x action repeat), the x axis every sink plots
against. A sink that raises is dropped by its caller with one warning (`warn_dropped`): no sink can stop
training.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from seed.metrics.sink import MetricsSink, SinkSettings


class ProgressSink(MetricsSink):
    """One progress line per row on stdout."""

    name = "progress"

    def __init__(self, show_raw_return: bool = False):
        self.show_raw_return = show_raw_return

    def write(self, row: dict[str, Any], step: int) -> None:
        print(progress_line(row, self.show_raw_return), flush=True)


class JsonlSink(MetricsSink):
    """One JSON object per row, appended to `<logdir>/metrics.jsonl` (seed-report and seed-bench read it)."""

    name = "jsonl"

    def __init__(self, logdir: str):
        self.path = os.path.join(logdir, "metrics.jsonl")

    def write(self, row: dict[str, Any], step: int) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")


class TensorBoardSink(MetricsSink):
    """Every number of a row (bools, None and strings left out) as a TensorBoard scalar at `step` env frames, in
    event files in the logdir."""

    name = "tensorboard"

    def __init__(self, writer: Any):
        self._writer = writer  # a torch.utils.tensorboard.SummaryWriter

    def write(self, row: dict[str, Any], step: int) -> None:
        for key, value in row.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "env_frames":
                self._writer.add_scalar(key, value, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def open_tensorboard(settings: SinkSettings) -> TensorBoardSink | None:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # tensorboard is a dependency; stay usable without it
        return None
    return TensorBoardSink(SummaryWriter(settings.logdir))


def open_wandb(settings: SinkSettings) -> MetricsSink | None:
    from seed.metrics.wandb_sink import open_wandb_sink  # seed/metrics/wandb_sink.py imports wandb only with a project

    return open_wandb_sink(settings)


# name -> factory: a sink for these settings, or None when it is off for them (e.g. W&B without a project). A
# factory that raises (a missing package, a refused login) is skipped with a warning. Rows go to the sinks in
# this order.
SinkFactory = Callable[[SinkSettings], "MetricsSink | None"]
SINKS: dict[str, SinkFactory] = {
    "jsonl": lambda settings: JsonlSink(settings.logdir),
    "progress": lambda settings: ProgressSink(settings.show_raw_return),
    "tensorboard": open_tensorboard,
    "wandb": open_wandb,
}


def register_sink(name: str, factory: SinkFactory) -> None:
    """Adds (or replaces) a sink factory; every MetricsWriter opened afterwards tries it."""
    SINKS[name] = factory


def open_sinks(settings: SinkSettings, names: list[str] | None = None) -> list[MetricsSink]:
    """The sinks of `names` (default: every registered one) that are on for `settings`; one that fails to open
    is left out with a warning."""
    sinks = []
    for name in SINKS if names is None else names:
        if name not in SINKS:
            raise ValueError(f"metrics sink: got {name!r}, expected one of {sorted(SINKS)}")
        try:
            sink = SINKS[name](settings)
        except Exception as error:  # noqa: BLE001 - any failure of an optional sink must not stop the run
            warn_dropped(name, "open", error)
            continue
        if sink is not None:
            sink.name = name
            sinks.append(sink)
    return sinks


def warn_dropped(name: str, stage: str, error: BaseException) -> None:
    """The one warning a failing sink gets, one line on stderr: which sink, where it failed and why."""
    reason = " ".join(str(error).split())  # wandb's messages span several lines
    print(f"[metrics] warning: metrics sink {name!r} failed in {stage} and is dropped "
          f"({type(error).__name__}: {reason}); the run goes on without it", file=sys.stderr, flush=True)


def progress_line(row: dict[str, Any], show_raw_return: bool = False) -> str:
    fmt = lambda v, spec: "-" if v is None else format(v, spec)
    line = (f"[learner {time.strftime('%H:%M:%S')}] frames={row['env_frames']:,} "
            f"fps={fmt(row['env_frames_per_sec'], ',.0f')} train_steps={row['train_steps']:,} "
            f"({fmt(row.get('train_steps_per_sec'), '.1f')}/s) episodes={row['episodes']:,} "
            f"return={fmt(row['episode_return_mean'], '.1f')}")
    # Optional parts: the raw score (football goals), eval envs, replay.
    if show_raw_return and row.get("episode_raw_return_mean") is not None:
        line += f" score={row['episode_raw_return_mean']:.2f}"
    if row.get("eval/return_running_mean_100") is not None:
        line += f" eval_mean100={row['eval/return_running_mean_100']:.2f} ({row['eval/episodes']} eps)"
    if show_raw_return and row.get("eval/score_running_mean_100") is not None:
        line += f" eval_score100={row['eval/score_running_mean_100']:.2f}"
    line += (f" batch={fmt(row['inference_batch_size_mean'], '.1f')}"
             f" latency_p50={fmt(row['inference_latency_ms_p50'], '.2f')}ms")
    if "replay_size" in row:
        line += f" replay={row['replay_size']:,} ({row['replay_bytes'] / 2**20:,.0f} MiB)"
    else:
        line += f" queue={row.get('queue_size', '-')}"
    return line
