"""The learner's metrics around seed/metrics/recording.py: finished episodes counted as training or evaluation episodes,
the periodic metrics row (its own thread), and the summary a run ends with."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from seed.contracts import FinishedEpisodes
from seed.experience.training_batches import FifoExperience, ReplayExperience
from seed.metrics.recording import LearnerMetrics, MetricsWriter
from seed.runtime.supervised_thread import SupervisedThread


class EpisodeRecorder:
    """Records finished episodes in `metrics`: the last `num_eval_envs` of `num_envs` env ids only evaluate."""

    def __init__(self, metrics: LearnerMetrics, num_envs: int, num_eval_envs: int):
        self.metrics = metrics
        self.first_eval_env = num_envs - num_eval_envs

    def is_eval_env(self, env_ids: torch.Tensor) -> torch.Tensor:
        """bool [n]: which of the env ids int64 [n] only evaluate."""
        return env_ids >= self.first_eval_env

    def on_episodes(self, episodes: FinishedEpisodes) -> None:
        """The episodes inference saw end (returns of the rewards it was fed)."""
        is_eval = self.is_eval_env(torch.from_numpy(episodes.env_ids)).numpy()
        self.metrics.record_episodes(episodes.returns[~is_eval], episodes.lengths[~is_eval])
        if is_eval.any():
            self.metrics.record_eval_episodes(episodes.returns[is_eval], episodes.lengths[is_eval])

    def on_actor_episodes(self, episodes: list[tuple[int, float]]) -> None:
        """(env id, raw return) of episodes the actors reported finished (from the serving process)."""
        env_ids = torch.tensor([int(env_id) for env_id, _ in episodes], dtype=torch.int64)
        raw = np.array([float(score) for _, score in episodes], np.float64)
        is_eval = self.is_eval_env(env_ids).numpy()
        self.metrics.record_actor_episodes(raw[~is_eval].tolist())
        if is_eval.any():
            self.metrics.record_eval_scores(raw[is_eval].tolist())


def metrics_row(metrics: LearnerMetrics, experience: FifoExperience | ReplayExperience, elapsed_s: float,
                window_s: float, dropped_lagging_batches: int | None,
                reference_scores: tuple[float, float] | None) -> dict[str, Any]:
    """One metrics row: the window's values, the experience's stats, the batches --max_policy_lag dropped (None:
    the flag is off, no column) and, with (human, random) reference scores, human-normalised returns."""
    extra = {"window_s": window_s, **experience.stats()}
    if dropped_lagging_batches is not None:
        extra["policy_lag_dropped_batches"] = dropped_lagging_batches
    row = metrics.snapshot(elapsed_s, extra)
    if reference_scores is not None:
        human, random = reference_scores
        for key, name in (("episode_return_mean", "episode_human_normalized"),
                          ("eval_episode_return_mean", "eval_episode_human_normalized"),
                          ("eval/return_running_mean_100", "eval/human_normalized_running_mean_100")):
            if row[key] is not None:
                row[name] = (row[key] - random) / (human - random)
    return row


class PeriodicLogger:
    """Writes one metrics row every `interval_s` seconds from its own thread, however long a train step takes.

    `row(elapsed_s, window_s)` builds the row (seconds since `start`, a time.monotonic() value, and since the
    previous row); this adds `train_steps_per_sec` and hands it to `writer`.
    """

    def __init__(self, row: Callable[[float, float], dict[str, Any]], writer: MetricsWriter, metrics: LearnerMetrics,
                 interval_s: float, start: float):
        self.row = row
        self.writer = writer
        self.metrics = metrics
        self.interval_s = interval_s
        self.start_time = start
        self.last_time = start
        self.last_train_steps = metrics.train_steps
        self.last_return_mean: float | None = None
        self._done = threading.Event()
        self._lock = threading.Lock()
        self.thread = SupervisedThread(self._loop, "metrics-logger")

    def start(self) -> None:
        self.thread.start()

    def _loop(self) -> None:
        while not self._done.wait(self.interval_s):
            self.write()

    def write(self) -> None:
        with self._lock:
            now = time.monotonic()
            window = now - self.last_time
            row = self.row(now - self.start_time, window)
            row["train_steps_per_sec"] = (row["train_steps"] - self.last_train_steps) / max(window, 1e-9)
            self.writer.write(row)
            self.last_time, self.last_train_steps = now, row["train_steps"]
            if row["episode_return_mean"] is not None:
                self.last_return_mean = row["episode_return_mean"]

    def finish(self) -> None:
        self._done.set()
        self.thread.join(timeout=10)
        # The last row carries whatever the window holds: a short run (--max_train_steps) can train all its steps
        # within half a second of the previous row, and those steps' values must not be dropped.
        unlogged = self.metrics.train_steps != self.last_train_steps
        if self.thread.failure is None and (unlogged or time.monotonic() - self.last_time > 0.5):
            self.write()


def run_summary(metrics: LearnerMetrics, wall_s: float, start_frames: int, last_return_mean: float | None,
                seed: int) -> dict[str, Any]:
    """What `Learner.run` returns and writes to summary.json: counters, wall time (s), the run's mean env frames
    per second (frames since `start_frames`), the last logged return mean and the evaluation running means."""
    return {
        "env_frames": metrics.env_frames,
        "train_steps": metrics.train_steps,
        "wall_time_s": round(wall_s, 1),
        "mean_env_frames_per_sec": round((metrics.env_frames - start_frames) / max(wall_s, 1e-9), 1),
        "last_episode_return_mean": last_return_mean,
        "eval_return_running_mean_100": float(np.mean(metrics.eval_returns)) if metrics.eval_returns else None,
        "eval_episodes": metrics.eval_episodes,
        "eval_score_running_mean_100": float(np.mean(metrics.eval_scores)) if metrics.eval_scores else None,
        "seed": seed,
    }
