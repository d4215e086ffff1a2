"""The Weights & Biases metrics sink: the run's configuration, every metrics row plotted against env frames, and
evaluation videos, in one W&B run per learner (or seed-eval) process.

On with `--wandb_project` (flags `--wandb_entity`, `--wandb_mode=online|offline|disabled`); needs the `wandb`
extra (`pip install 'seed-rl-torch[wandb]'`). Offline runs are written under `<logdir>/wandb` (or $WANDB_DIR) and
uploaded later with `wandb sync`. Like every sink (seed/metrics/sinks.py), one that fails to start (wandb
missing, a refused key, no network within INIT_TIMEOUT_S) or raises later is dropped with one warning and the
run goes on.
"""

from __future__ import annotations

import os
from typing import Any

from seed.metrics.sink import MetricsSink, SinkSettings

WANDB_MODES = ("online", "offline", "disabled")
INSTALL_HINT = "pip install 'seed-rl-torch[wandb]' (or: pip install wandb)"
INIT_TIMEOUT_S = 60.0  # an unreachable server fails wandb.init after this long instead of wandb's 90 s
STEP_METRIC = "env_frames"  # the x axis of every W&B chart: env frames (agent steps x action repeat)


class WandbSink(MetricsSink):
    """Logs to one W&B run (`wandb.init`'s result)."""

    name = "wandb"

    def __init__(self, run: Any, wandb: Any):
        self.run = run
        self._wandb = wandb  # the module, for wandb.Video
        # Every metric is plotted against env frames (a value of each row), not W&B's own call counter.
        run.define_metric(STEP_METRIC)
        run.define_metric("*", step_metric=STEP_METRIC)

    def write(self, row: dict[str, Any], step: int) -> None:
        """The row's numbers (None, bools and strings left out, like TensorBoard) at `step` env frames."""
        values = {key: value for key, value in row.items()
                  if isinstance(value, (int, float)) and not isinstance(value, bool)}
        self.run.log({**values, STEP_METRIC: step})

    def write_config(self, config: dict[str, Any]) -> None:
        self.run.config.update(config, allow_val_change=True)

    def write_video(self, path: str, step: int) -> None:
        """The .mp4 or .gif file at `path` as the run's `video` at `step` env frames."""
        video_format = os.path.splitext(path)[1].lstrip(".").lower()
        self.run.log({"video": self._wandb.Video(path, format=video_format), STEP_METRIC: step})

    def close(self) -> None:
        self.run.finish()


def check_wandb_mode(mode: str) -> str | None:
    """Why `mode` is no --wandb_mode (a message naming the value and the choices), or None."""
    if mode in WANDB_MODES:
        return None
    return f"--wandb_mode: got {mode!r}, expected {', '.join(WANDB_MODES[:-1])} or {WANDB_MODES[-1]}"


def open_wandb_sink(settings: SinkSettings) -> WandbSink | None:
    """A W&B run for `settings.config`'s wandb_project / wandb_entity / wandb_mode; None without a project.

    The run is named after the logdir and grouped by it, so a learner and the seed-eval runs of its checkpoints
    sit together; `job_type` tells them apart. Raises (and the caller drops the sink) when wandb is missing or
    the run cannot start.
    """
    config = settings.config
    project = config.get("wandb_project", "")
    if not project:
        return None
    mode = config.get("wandb_mode", "online")
    error = check_wandb_mode(mode)
    if error:
        raise ValueError(error)
    try:
        import wandb
    except ImportError as missing:
        raise ImportError(f"the Python package 'wandb' is not installed: {INSTALL_HINT}") from missing
    name = os.path.basename(os.path.normpath(os.path.abspath(settings.logdir)))
    run = wandb.init(
        project=project, entity=config.get("wandb_entity") or None, mode=mode, name=name, group=name,
        job_type=settings.job_type,
        # $WANDB_DIR wins over the logdir (a `dir` argument would override it).
        dir=None if os.environ.get("WANDB_DIR") else settings.logdir,
        # console="off": the learner's stdout stays the user's; W&B does not wrap it.
        settings=wandb.Settings(console="off", init_timeout=INIT_TIMEOUT_S),
    )
    return WandbSink(run, wandb)
