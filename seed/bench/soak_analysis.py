"""The soak test's figures, computed from what it observed: FPS samples, fault times, learner restart counters.

Pure functions over plain data, so they are testable without processes. Times are seconds since the soak run
started (its own clock), FPS is env frames per second as the learner's metrics.jsonl reports it per window.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any


@dataclasses.dataclass
class Sample:
    """One learner metrics row, stamped with the soak clock when it was read (the end of its window)."""

    t_s: float
    fps: float
    env_frames: int
    train_steps: int
    episode_return_mean: float | None
    learner: int  # 1 for the first learner process, 2 after the restart, ...


def pre_fault_fps(samples: list[Sample], fault_s: float, window_s: float) -> float | None:
    """Mean FPS of the rows read in [fault_s - window_s, fault_s); None if there are none."""
    values = [s.fps for s in samples if fault_s - window_s <= s.t_s < fault_s]
    return statistics.fmean(values) if values else None


def recovery_s(samples: list[Sample], fault_s: float, until_s: float, pre_fps: float, row_window_s: float,
               fraction: float = 0.8) -> float | None:
    """Seconds from the fault until the first row whose whole window lies after the fault and whose FPS is
    back to `fraction` of `pre_fps`; None if that does not happen before `until_s` (the next fault or the end).
    The resolution is one metrics row (`row_window_s`): a fault that costs nothing reads as about one window."""
    for sample in samples:
        if sample.t_s - row_window_s >= fault_s - 0.5 and sample.t_s <= until_s and sample.fps >= fraction * pre_fps:
            return round(sample.t_s - fault_s, 2)
    return None


def restart_losses(last_before: Sample, kill_s: float, resumed_env_frames: int, resumed_train_steps: int,
                   pre_fps: float, train_steps_per_s: float, checkpoint_interval_s: float,
                   row_window_s: float) -> dict[str, Any]:
    """What the learner restart lost: the progress at the kill that the checkpoint it resumed from lacks.

    The counters at the kill are the last metrics row before it, extrapolated at the pre-fault rates over the
    row's age (the row is up to one window old). The bound is one checkpoint interval of progress plus one
    metrics window (the extrapolation's uncertainty)."""
    age_s = max(0.0, kill_s - last_before.t_s)
    frames_at_kill = last_before.env_frames + pre_fps * age_s
    steps_at_kill = last_before.train_steps + train_steps_per_s * age_s
    lost_frames = int(max(0, frames_at_kill - resumed_env_frames))
    lost_steps = int(max(0, round(steps_at_kill - resumed_train_steps)))
    bound_s = checkpoint_interval_s + row_window_s
    lost_s = lost_frames / pre_fps if pre_fps > 0 else 0.0
    return {
        "env_frames_in_last_row": last_before.env_frames, "train_steps_in_last_row": last_before.train_steps,
        "last_row_age_s": round(age_s, 2), "estimated_env_frames_at_kill": int(frames_at_kill),
        "estimated_train_steps_at_kill": int(steps_at_kill),
        "resumed_env_frames": resumed_env_frames, "resumed_train_steps": resumed_train_steps,
        "lost_env_frames": lost_frames, "lost_train_steps": lost_steps,
        "lost_seconds_of_progress": round(lost_s, 2),
        "max_lost_env_frames": int(pre_fps * bound_s), "max_lost_train_steps": int(train_steps_per_s * bound_s) + 1,
        "within_one_checkpoint_interval": lost_frames <= pre_fps * bound_s
        and lost_steps <= train_steps_per_s * bound_s + 1,
    }


def return_trend(samples: list[Sample], fraction: float = 1 / 3) -> dict[str, Any]:
    """Mean episode return over the first and the last `fraction` of the rows that have one."""
    returns = [s.episode_return_mean for s in samples if s.episode_return_mean is not None]
    if len(returns) < 3:
        return {"first_window_mean": None, "last_window_mean": None, "improved": False, "rows": len(returns)}
    n = max(1, int(len(returns) * fraction))
    first, last = statistics.fmean(returns[:n]), statistics.fmean(returns[-n:])
    return {"first_window_mean": round(first, 3), "last_window_mean": round(last, 3), "improved": last > first,
            "rows": len(returns)}


def rate(samples: list[Sample], start_s: float, end_s: float, key: str) -> float:
    """Per-second increase of `key` (env_frames or train_steps) between the rows of one learner in [start, end]."""
    rows = [s for s in samples if start_s <= s.t_s <= end_s]
    if len(rows) < 2 or rows[-1].learner != rows[0].learner or rows[-1].t_s <= rows[0].t_s:
        return 0.0
    return (getattr(rows[-1], key) - getattr(rows[0], key)) / (rows[-1].t_s - rows[0].t_s)
