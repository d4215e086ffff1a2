"""The metrics sink contract: what every destination of the metrics rows implements (`MetricsSink`), and the
settings a sink factory reads (`SinkSettings`). The built-in sinks and their registry are in seed/metrics/sinks.py,
the W&B sink in seed/metrics/wandb_sink.py; both import this module, which imports neither.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any


class MetricsSink:
    """One destination of the metrics. Subclasses override what they use; the defaults do nothing."""

    name = "sink"  # how warnings name it

    def write(self, row: dict[str, Any], step: int) -> None:
        """One metrics row; `step`: its env frames."""

    def write_config(self, config: dict[str, Any]) -> None:
        """The run's resolved configuration (secrets already blanked), once at start."""

    def write_video(self, path: str, step: int) -> None:
        """A video file (.mp4 or .gif) recorded at `step` env frames."""

    def close(self) -> None:
        """Flushes and releases the sink; nothing is written after."""


@dataclasses.dataclass(frozen=True)
class SinkSettings:
    """What sink factories read.

    logdir: where the run's files go (metrics.jsonl, TensorBoard events, W&B's offline runs).
    config: the resolved configuration's fields; a sink reads its own flags there (e.g. wandb_project).
    show_raw_return: the progress line also shows the env's raw score (Football: goals beside shaped rewards).
    job_type: which program writes: learner or eval (seed-eval).
    """

    logdir: str
    config: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    show_raw_return: bool = False
    job_type: str = "learner"
