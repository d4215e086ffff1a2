"""Learner metrics: thread-safe accumulation, and one row per log interval handed to every metrics sink
(seed/metrics/sinks.py: stdout, metrics.jsonl, TensorBoard event files in the logdir, ...).

Frames are env frames (agent steps x action repeat). Latencies are learner-side: request arrival at the
learner to the reply, in milliseconds.
"""

from __future__ import annotations

import collections
import math
import threading
from typing import Any

import numpy as np

from seed.metrics.sinks import MetricsSink, SinkSettings, open_sinks, warn_dropped


class LearnerMetrics:
    """Counters and per-window samples, written by the inference, gRPC and training threads."""

    EVAL_WINDOW = 100  # HTS-RL's protocol: the running mean of the most recent 100 evaluation episodes

    def __init__(self, action_repeat: int, env_frames: int = 0, train_steps: int = 0, episodes: int = 0,
                 eval_returns: list[float] | None = None, eval_episodes: int = 0,
                 eval_scores: list[float] | None = None):
        self._lock = threading.Lock()
        # Evaluation episodes across windows (and across a resume: the checkpoint keeps them).
        self.eval_returns: collections.deque[float] = collections.deque(eval_returns or (), self.EVAL_WINDOW)
        self.eval_episodes = eval_episodes
        # The same episodes' raw scores as the actors report them (Football: goals, without shaped rewards).
        self.eval_scores: collections.deque[float] = collections.deque(eval_scores or (), self.EVAL_WINDOW)
        self.action_repeat = action_repeat
        self.env_frames = env_frames
        self.train_steps = train_steps
        self.episodes = episodes
        self._reset_window()

    def _reset_window(self) -> None:
        self._batch_sizes: list[int] = []
        self._latencies_s: list[float] = []
        self._returns: list[float] = []
        self._lengths: list[int] = []
        self._raw_returns: list[float] = []
        self._eval_returns: list[float] = []
        self._eval_lengths: list[int] = []
        self._train: dict[str, list[float]] = {}
        self._window_env_frames = 0
        self._window_train_steps = 0

    def record_batch(self, rows: int, latencies_s: list[float]) -> None:
        with self._lock:
            frames = rows * self.action_repeat
            self.env_frames += frames
            self._window_env_frames += frames
            self._batch_sizes.append(rows)
            self._latencies_s.extend(latencies_s)

    def record_episodes(self, returns: np.ndarray, lengths: np.ndarray) -> None:
        with self._lock:
            self.episodes += len(returns)
            self._returns.extend(returns.tolist())
            self._lengths.extend(lengths.tolist())

    def record_eval_episodes(self, returns: np.ndarray, lengths: np.ndarray) -> None:
        with self._lock:
            self._eval_returns.extend(returns.tolist())
            self._eval_lengths.extend(lengths.tolist())
            self.eval_returns.extend(returns.tolist())
            self.eval_episodes += len(returns)

    def record_actor_episodes(self, raw_returns: list[float]) -> None:
        with self._lock:
            self._raw_returns.extend(raw_returns)

    def record_eval_scores(self, raw_returns: list[float]) -> None:
        """Raw scores of evaluation episodes, as the actors report them (Football: the goal difference)."""
        with self._lock:
            self.eval_scores.extend(raw_returns)

    def record_train_step(self, values: dict[str, float]) -> None:
        with self._lock:
            self.train_steps += 1
            self._window_train_steps += 1
            for key, value in values.items():
                self._train.setdefault(key, []).append(value)

    def record_values(self, values: dict[str, float]) -> None:
        """Samples averaged over the window (e.g. the inference loop's time per stage)."""
        with self._lock:
            for key, value in values.items():
                self._train.setdefault(key, []).append(value)

    def record_value(self, key: str, value: float) -> None:
        """A training-side sample averaged over the window (e.g. replay statistics)."""
        with self._lock:
            self._train.setdefault(key, []).append(value)

    def snapshot(self, elapsed_s: float, extra: dict[str, Any]) -> dict[str, Any]:
        """One row for the window since the previous snapshot; resets the window."""
        with self._lock:
            mean = lambda xs: float(np.mean(xs)) if xs else None
            row = {
                "time_s": round(elapsed_s, 3),
                "env_frames": self.env_frames,
                "env_frames_per_sec": self._window_env_frames / max(extra.pop("window_s"), 1e-9),
                "train_steps": self.train_steps,
                "episodes": self.episodes,
                "episode_return_mean": mean(self._returns),
                "episode_length_mean": mean(self._lengths),
                "episode_raw_return_mean": mean(self._raw_returns),
                "episodes_in_window": len(self._returns),
                "eval_episode_return_mean": mean(self._eval_returns),
                "eval_episode_length_mean": mean(self._eval_lengths),
                "eval/return_running_mean_100": mean(self.eval_returns),
                "eval/episodes": self.eval_episodes,
                # HTS-RL's evaluation score: goals in Football, where training may add shaped rewards.
                "eval/score_running_mean_100": mean(self.eval_scores),
                "inference_batch_size_mean": mean(self._batch_sizes),
                "inference_latency_ms_p50": (float(np.percentile(self._latencies_s, 50)) * 1e3
                                             if self._latencies_s else None),
                "inference_latency_ms_p99": (float(np.percentile(self._latencies_s, 99)) * 1e3
                                             if self._latencies_s else None),
                "window_train_steps": self._window_train_steps,
                **{key: mean(values) for key, values in self._train.items()},
            }
            self._reset_window()
        row.update(extra)
        return row


class MetricsWriter:
    """Hands each row to every sink (seed/metrics/sinks.py; by default, in this order: `<logdir>/metrics.jsonl`,
    the progress line on stdout, TensorBoard), with its env frames as the step. A sink that raises is dropped
    with one warning naming it and the error; the other sinks, and training, go on."""

    def __init__(self, sinks: list[MetricsSink]):
        self.sinks = list(sinks)
        self._lock = threading.Lock()  # the metrics-logger thread writes rows; others may write videos

    @classmethod
    def open(cls, settings: SinkSettings, names: list[str] | None = None) -> MetricsWriter:
        """The sinks of `names` (default: every registered one) that are on for `settings`."""
        return cls(open_sinks(settings, names))

    def write(self, row: dict[str, Any]) -> None:
        """One row; non-finite floats become None (JSON has no NaN) before any sink sees it."""
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
        self._each("write", clean, int(clean["env_frames"]))

    def write_config(self, config: dict[str, Any]) -> None:
        self._each("write_config", config)

    def write_video(self, path: str, step: int) -> None:
        """A video file recorded at `step` env frames."""
        self._each("write_video", path, step)

    def close(self) -> None:
        self._each("close")
        self.sinks = []

    def _each(self, method: str, *args: Any) -> None:
        with self._lock:
            for sink in list(self.sinks):
                try:
                    getattr(sink, method)(*args)
                except Exception as error:  # noqa: BLE001 - a failing sink must not stop training
                    self.sinks.remove(sink)
                    warn_dropped(sink.name, method, error)
