"""Learner metrics: thread-safe accumulation, and one row per log interval to stdout, metrics.jsonl and
TensorBoard (event files in the logdir).

Frames are env frames (agent steps x action repeat). Latencies are learner-side: request arrival at the
learner to the reply, in milliseconds.
"""

from __future__ import annotations

import collections
import json
import math
import os
import threading
import time
from typing import Any

import numpy as np


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
    """Writes rows to stdout (one progress line), `<logdir>/metrics.jsonl` and TensorBoard."""

    def __init__(self, logdir: str, show_raw_return: bool = False):
        self.path = os.path.join(logdir, "metrics.jsonl")
        self.show_raw_return = show_raw_return
        self._tensorboard = None
        try:
            from torch.utils.tensorboard import SummaryWriter

            self._tensorboard = SummaryWriter(logdir)
        except ImportError:  # tensorboard is a dependency; stay usable without it
            pass

    def write(self, row: dict[str, Any]) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
        with open(self.path, "a") as f:
            f.write(json.dumps(clean) + "\n")
        print(progress_line(clean, self.show_raw_return), flush=True)
        if self._tensorboard is not None:
            step = int(clean["env_frames"])
            for key, value in clean.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "env_frames":
                    self._tensorboard.add_scalar(key, value, step)
            self._tensorboard.flush()

    def close(self) -> None:
        if self._tensorboard is not None:
            self._tensorboard.close()


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
