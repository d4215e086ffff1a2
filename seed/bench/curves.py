"""Learning curves of learner logdirs: `seed-report --curves LOGDIR... [--out=DIR] [--metric=M] [--targets=a,b]`.

Reads each logdir's `metrics.jsonl` (one row per log interval, see seed/metrics/recording.py) and draws the metric
against env frames (agent steps x action repeat) and against the learner's wall-clock minutes, one PNG per env
(`curves_<env>.png`), and writes `curves.md`: per run, the minutes and env frames until the metric first
reached each target ("not reached" otherwise), the final value and the final env frames.

- Metric: `--metric`, else per run the first the file has a value for: `eval/score_running_mean_100` (the
  mean raw score of the last 100 evaluation episodes, HTS-RL's protocol: goals in Football even when training
  adds checkpoint rewards; the unclipped return in Atari), `eval/return_running_mean_100` (the same episodes'
  returns, in files written before the score was logged), `episode_return_mean`. Rows without a value (no
  episode finished in the window) are skipped.
- Resumed runs: `time_s` counts seconds since that learner process started, so it restarts after a resume while
  env_frames continue from the checkpoint. A row whose time_s is below the previous row's starts a new segment;
  a segment's times are offset by the last time_s of the segments before it. Wall-clock minutes are therefore
  the learner's own running time: the downtime between a crash and the restart is not in the logs and is not
  counted. A restart from a checkpoint older than the last rows before it (a crash between two checkpoints) plays
  their frames again: the rows logged after that checkpoint were replaced (`replaced_rows`) and are left out of the
  curve, the targets and the values at K frames (their minutes stay in the segment offsets: the learner spent them).
- Seeds: runs whose configuration is the same except for the seed and the logdir (read from
  `<logdir>/config.json`, else from the checkpoint's saved configuration) form one group, drawn as the mean
  over its runs with a min-max band (runs interpolated onto a common grid over the range all of them cover).
  A run without a configuration is a group of its own.
- Targets: `--targets`, else per env: Pong 18, Football 0.4 and 0.8 (goals), CartPole-v1 450, CleanRL's 1M-step
  MuJoCo means (Hopper 2,383, HalfCheetah 1,443 for PPO and 9,635 for SAC, Walker2d 2,288); drawn as
  horizontal lines. A target is reached at the first row whose value is >= the target.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
import re
import sys
from typing import Any

import numpy as np

EVAL_SCORE_METRIC = "eval/score_running_mean_100"
EVAL_METRIC = "eval/return_running_mean_100"
TRAIN_METRIC = "episode_return_mean"
# Per-env default targets: exact --env values, or a family prefix ending in ':'.
DEFAULT_TARGETS: dict[str, tuple[float, ...]] = {
    "atari:Pong": (18.0,),
    "football:": (0.4, 0.8),
    "gym:CartPole-v1": (450.0,),
    # CleanRL's 1M-step means on the v4 tasks: ppo_continuous_action (Hopper, HalfCheetah, Walker2d) and SAC
    # (HalfCheetah's second line).
    "gym:Hopper-v5": (2383.0,),
    "gym:HalfCheetah-v5": (1443.0, 9635.0),
    "gym:Walker2d-v5": (2288.0,),
}
# Configuration keys that do not change what a run learns: runs differing only in these are seeds of one group.
NOT_GROUPED = frozenset({"seed", "logdir", "server_address", "print_config", "log_interval_s",
                         "checkpoint_interval_s", "auth_token", "auth_token_file", "tls_cert", "tls_key", "tls_ca",
                         "allow_insecure_remote", "checkpoint_replay", "atari_scores_file"})
GRID_POINTS = 200


class CurvesError(ValueError):
    """A logdir or flag that cannot be used; the message names it and what was expected."""


@dataclasses.dataclass
class Run:
    """One logdir's curve. Arrays are [N], one entry per metrics row that has a value for `metric` and that no
    restart replaced (`replaced_rows`)."""

    logdir: str
    metric: str
    config: dict[str, Any] | None
    minutes: np.ndarray  # learner wall-clock minutes (segments concatenated, see the module docstring)
    env_frames: np.ndarray  # env frames at the row (agent steps x action repeat)
    values: np.ndarray  # the metric
    full_window: np.ndarray  # bool: the row counts towards targets (see _window_full)
    resumed_at_frames: list[int]  # env_frames of the first row of each segment after the first
    final_env_frames: int  # env_frames of the last row (with or without a value)
    total_minutes: float  # wall-clock minutes of the last row
    window_episodes: np.ndarray | None = None  # [N] episodes_in_window of each row (training episodes), if logged

    @property
    def env(self) -> str:
        return str(self.config.get("env", "unknown env")) if self.config else "unknown env"

    @property
    def seed(self) -> int | None:
        return self.config.get("seed") if self.config else None

    @property
    def final_value(self) -> float | None:
        return float(self.values[-1]) if len(self.values) else None


def read_rows(logdir: str) -> list[dict[str, Any]]:
    """The rows of `<logdir>/metrics.jsonl`; an error names the file and line of a malformed row."""
    path = os.path.join(logdir, "metrics.jsonl")
    if not os.path.isfile(path):
        found = ", ".join(sorted(os.listdir(logdir))) if os.path.isdir(logdir) else "no such directory"
        raise CurvesError(f"logdir {logdir!r}: expected a metrics.jsonl written by seed-learner; found: "
                          f"{found or 'nothing'}")
    rows = []
    with open(path) as f:
        for line_number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise CurvesError(f"{path}, line {line_number}: not JSON ({error})") from None
            for key in ("time_s", "env_frames"):
                if not isinstance(row.get(key), (int, float)):
                    raise CurvesError(f"{path}, line {line_number}: {key}: got {row.get(key)!r}, expected a number")
            rows.append(row)
    if not rows:
        raise CurvesError(f"{path}: has no rows, expected at least one metrics row")
    return rows


def wall_minutes(time_s: list[float]) -> tuple[np.ndarray, list[int]]:
    """Cumulative learner minutes [N] of rows whose `time_s` restarts from 0 after each resume, and the row
    indices where a segment (after the first) starts."""
    minutes = np.empty(len(time_s))
    starts, offset = [], 0.0
    for i, t in enumerate(time_s):
        if i and t < time_s[i - 1]:
            starts.append(i)
            offset += time_s[i - 1]
        minutes[i] = (offset + t) / 60.0
    return minutes, starts


def replaced_rows(rows: list[dict[str, Any]], starts: list[int]) -> np.ndarray:
    """Which rows a restart replaced, bool [N]: the rows of the segments before each segment start (`starts`, as
    `wall_minutes` gives them) logged after the checkpoint that segment resumed from, whose frames and episodes it
    played again. A row was logged after the checkpoint when it counts more env frames than the segment's first row,
    or more episodes or updates than the checkpoint held: the first row's counter less its window's (episodes -
    episodes_in_window, train_steps - window_train_steps; the counters resume from the checkpoint, the window from
    the restart), where the row has them."""
    replaced = np.zeros(len(rows), bool)
    for start in starts:
        first = rows[start]
        resumed_from = {"env_frames": first["env_frames"]}
        for counter, window in (("episodes", "episodes_in_window"), ("train_steps", "window_train_steps")):
            if isinstance(first.get(counter), int) and isinstance(first.get(window), int):
                resumed_from[counter] = first[counter] - first[window]
        for i in range(start):
            replaced[i] |= any(isinstance(rows[i].get(key), (int, float)) and rows[i][key] > limit
                               for key, limit in resumed_from.items())
    return replaced


def pick_metric(rows: list[dict[str, Any]], requested: str) -> str:
    if requested:
        return requested
    for metric in (EVAL_SCORE_METRIC, EVAL_METRIC):
        if any(row.get(metric) is not None for row in rows):
            return metric
    return TRAIN_METRIC


def read_config(logdir: str) -> dict[str, Any] | None:
    """The learner configuration of a run: `<logdir>/config.json`, else the checkpoint's, else None."""
    path = os.path.join(logdir, "config.json")
    if os.path.isfile(path):
        with open(path) as f:
            return json.load(f)
    from seed.runtime import checkpoint

    if not os.path.isfile(checkpoint.checkpoint_path(logdir)):
        return None
    try:
        state = checkpoint.load(logdir)
    except Exception as error:  # a corrupt checkpoint must not stop the report: the run is just ungrouped
        print(f"seed-report: {logdir}: cannot read the checkpoint's configuration ({error}); "
              f"the run is not grouped with others", file=sys.stderr)
        return None
    return dict(state["config"]) if state and "config" in state else None


def load_run(logdir: str, metric: str = "") -> Run:
    rows = read_rows(logdir)
    metric = pick_metric(rows, metric)
    minutes, starts = wall_minutes([float(row["time_s"]) for row in rows])
    replaced = replaced_rows(rows, starts)
    keep = [i for i, row in enumerate(rows)
            if not replaced[i] and isinstance(row.get(metric), (int, float)) and math.isfinite(row[metric])]
    if not keep:
        raise CurvesError(f"{logdir}/metrics.jsonl: no row has a value for {metric!r}; expected one of the keys "
                          f"{sorted(k for k, v in rows[-1].items() if isinstance(v, (int, float)))}")
    return Run(
        logdir=logdir,
        metric=metric,
        config=read_config(logdir),
        minutes=minutes[keep],
        env_frames=np.array([rows[i]["env_frames"] for i in keep], np.int64),
        values=np.array([rows[i][metric] for i in keep], np.float64),
        full_window=np.array([_window_full(rows[i], metric) for i in keep], bool),
        resumed_at_frames=[int(rows[i]["env_frames"]) for i in starts],
        final_env_frames=int(rows[-1]["env_frames"]),
        total_minutes=float(minutes[-1]),
        window_episodes=(np.array([int(rows[i]["episodes_in_window"]) for i in keep], np.int64)
                         if all(isinstance(rows[i].get("episodes_in_window"), int) for i in keep) else None),
    )


def _window_full(row: dict[str, Any], metric: str) -> bool:
    """Whether `metric` of this row counts towards a target: a running mean over the last 100 evaluation
    episodes counts once 100 episodes are in it (HTS-RL's protocol; a mean of the first few episodes is
    noise: a random policy's first 5 episodes of academy_empty_goal_close can average 0.6)."""
    if metric.endswith("running_mean_100") and isinstance(row.get("eval/episodes"), int):
        return row["eval/episodes"] >= 100
    return True


def first_reach(run: Run, target: float) -> tuple[float, int] | None:
    """(minutes, env frames) of the first row whose value is >= `target` with a full evaluation window (see
    `_window_full`), or None."""
    reached = np.flatnonzero((run.values >= target) & run.full_window)
    if not len(reached):
        return None
    i = int(reached[0])
    return float(run.minutes[i]), int(run.env_frames[i])


# Rows up to 2% past K still count at K: a run stops a few frames past its budget (its last batch of steps), and
# a row is written per log interval, not at K (the MinAtar tables in docs/learning were read this way).
AT_FRAMES_SLACK = 1.02
EPISODES_AT = 100


def value_at(run: Run, frames: float, episodes: int = EPISODES_AT) -> float | None:
    """The metric at `frames` env frames, from the rows logged by then (env_frames <= 1.02 x frames); None when
    the run stopped before `frames` or no row by then has a value.

    `episode_return_mean` is the mean over each row's log window: the windows are combined, newest first and
    weighted by their episode counts, into the mean of the last `episodes` training episodes that ended by then
    (whole windows, so it can be a few more), going no further back than frames / 2 (so fewer where fewer
    episodes ended in the second half of the first `frames`: Freeway's are 2,500 steps). Other metrics (running
    means over the last 100 evaluation episodes) are the last row's value by then."""
    if run.final_env_frames * AT_FRAMES_SLACK < frames:
        return None
    by_then = np.flatnonzero(run.env_frames <= frames * AT_FRAMES_SLACK)
    if not len(by_then):
        return None
    if run.metric != TRAIN_METRIC or run.window_episodes is None:
        return float(run.values[by_then[-1]])
    total, count = 0.0, 0
    for i in by_then[::-1]:
        if run.env_frames[i] <= frames / 2 or count >= episodes:
            break
        total += float(run.values[i]) * int(run.window_episodes[i])
        count += int(run.window_episodes[i])
    return total / count if count else None


def targets_for(env: str, requested: tuple[float, ...] | None) -> tuple[float, ...]:
    if requested is not None:
        return requested
    if env in DEFAULT_TARGETS:
        return DEFAULT_TARGETS[env]
    family = env.split(":", 1)[0] + ":"
    return DEFAULT_TARGETS.get(family, ())


def parse_numbers(flag: str, values: list[str], example: str = "0.4,0.8") -> tuple[float, ...] | None:
    """A list flag's values -> floats; [] -> None. An error names the flag and the value."""
    if not values:
        return None
    out = []
    for value in values:
        try:
            out.append(float(value))
        except ValueError:
            raise CurvesError(f"{flag}: got {value!r}, expected numbers separated by commas, e.g. {example}") from None
    return tuple(out)


def parse_targets(values: list[str]) -> tuple[float, ...] | None:
    """--targets values -> floats; [] -> None (the per-env defaults)."""
    return parse_numbers("--targets", values)


# ----------------------------------------------------------------------------------------------- grouping


MAX_LABEL_KEYS = 3  # more differing values than this: the label is the logdir's name


def _same_number(value: Any) -> Any:
    """1e6 as 1000000: a flag typed as 1e6 and a preset's 1_000_000 are one configuration."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def with_defaults_now(config: dict[str, Any]) -> dict[str, Any]:
    """A run's configuration with every flag its config.json lacks at that flag's default now: a flag added after
    the run was made, which it ran without, so an old run and a new one at the flag's default are one
    configuration. The flags are the framework's and the run's agent's; with an agent not registered here the
    configuration comes back as it is. A plug-in that fails (SEED_RL_PLUGINS) is a CurvesError: without it the runs
    of its agents would group apart from runs that are the same."""
    from seed import envs
    from seed.agents import registry
    from seed.config import learner_config_class

    try:
        fields = dataclasses.fields(learner_config_class(registry.agent_class(config.get("agent", ""))))
    except envs.PluginError as error:
        raise CurvesError(str(error)) from error
    except ValueError:
        return config
    missing = {}
    for field in fields:
        if field.name in config:
            continue
        if field.default is not dataclasses.MISSING:
            missing[field.name] = field.default
        elif field.default_factory is not dataclasses.MISSING:
            missing[field.name] = field.default_factory()
    return {**config, **missing}


def group_key(run: Run) -> tuple:
    if run.config is None:
        return ("logdir", run.logdir, run.metric)
    items = sorted((k, json.dumps(_same_number(v), sort_keys=True)) for k, v in with_defaults_now(run.config).items()
                   if k not in NOT_GROUPED)
    return ("config", tuple(items), run.metric)


def group_runs(runs: list[Run], group_seeds: bool = True) -> list[tuple[str, list[Run]]]:
    """Runs grouped by configuration without seed and logdir (and by metric), in first-seen order, with labels:
    agent and env, the configuration values that differ between groups of the same env, the number of seeds.

    `group_seeds=False`: every run is a group of its own (for runs of one configuration made under different
    conditions, e.g. on a quiet and on a shared machine, whose minutes should not be averaged)."""
    groups: dict[tuple, list[Run]] = {}
    for run in runs:
        key = group_key(run) if group_seeds else ("logdir", run.logdir, run.metric)
        groups.setdefault(key, []).append(run)
    configs = [with_defaults_now(members[0].config or {}) for members in groups.values()]
    # Keys one configuration lacks (written by an older version) do not tell groups apart.
    differing = sorted({k for a in configs for b in configs if a.get("env") == b.get("env")
                        for k in set(a) & set(b) if k not in NOT_GROUPED and a.get(k) != b.get(k)})
    labelled = []
    for members in groups.values():
        first = members[0]
        if first.config is None or len(differing) > MAX_LABEL_KEYS:
            label = os.path.basename(os.path.normpath(first.logdir))
        else:
            label = f"{first.config.get('agent', '?')} {first.env}"
            label += "".join(f" {k}={first.config.get(k)}" for k in differing if k not in ("agent", "env"))
        seeds = sorted(str(run.seed) for run in members if run.seed is not None)
        if len(members) > 1:
            label += f" ({len(members)} runs, seeds {', '.join(seeds)})"
        labelled.append((label, members))
    # Groups that differ only in keys the label leaves out (or in code, not configuration): name their logdirs.
    counts = collections.Counter(label for label, _ in labelled)
    return [(f"{label} [{os.path.basename(os.path.normpath(members[0].logdir))}]" if counts[label] > 1 else label,
             members) for label, members in labelled]


def band(runs: list[Run], axis: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x, mean, min, max) [GRID_POINTS] of the runs' values interpolated onto a common x grid (`axis`:
    "env_frames" or "minutes") over the range every run covers; rows whose x does not exceed an earlier row's
    (env frames repeated after a resume) are left out of the interpolation."""
    curves = []
    for run in runs:
        x = getattr(run, axis).astype(np.float64)
        increasing = x > np.maximum.accumulate(np.concatenate([[-np.inf], x[:-1]]))
        curves.append((x[increasing], run.values[increasing]))
    low, high = max(x[0] for x, _ in curves), min(x[-1] for x, _ in curves)
    grid = np.linspace(low, high, GRID_POINTS) if high > low else np.array([low])
    values = np.stack([np.interp(grid, x, y) for x, y in curves])
    return grid, values.mean(0), values.min(0), values.max(0)


# ----------------------------------------------------------------------------------------------- outputs


def file_name(env: str) -> str:
    return "curves_" + re.sub(r"[^A-Za-z0-9_.-]+", "_", env) + ".png"


def plot(groups: list[tuple[str, list[Run]]], env: str, targets: tuple[float, ...], path: str) -> None:
    """One figure: the metric against env frames (left) and wall-clock minutes (right), a mean line and a
    min-max band per group, dashed target lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # The legend goes under both plots (one line per group), so it never covers a curve.
    legend_rows = (len(groups) + 1) // 2
    legend_inches = 0.25 + 0.2 * legend_rows
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5 + legend_inches))
    metrics = sorted({run.metric for _, runs in groups for run in runs})
    for axis, ax, xlabel in (("env_frames", axes[0], "env frames"), ("minutes", axes[1], "wall-clock minutes")):
        for index, (label, runs) in enumerate(groups):
            colour = f"C{index % 10}"
            if len(runs) == 1:
                ax.plot(getattr(runs[0], axis), runs[0].values, color=colour, label=label)
                continue
            x, mean, low, high = band(runs, axis)
            ax.plot(x, mean, color=colour, label=label)
            ax.fill_between(x, low, high, color=colour, alpha=0.2, linewidth=0)
        for target in targets:
            ax.axhline(target, color="0.4", linestyle="--", linewidth=1)
            ax.annotate(f"target {target:g}", (1.0, target), xycoords=("axes fraction", "data"), fontsize=8,
                        color="0.3", va="bottom", ha="right")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(metrics[0] if len(metrics) == 1 else "score or return (metrics in the title)")
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=2 if len(groups) > 1 else 1, fontsize=8, frameon=False)
    banded = any(len(runs) > 1 for _, runs in groups)
    note = " (mean over seeds, band min-max)" if banded else " (one line per run)"
    fig.suptitle(f"{env}: {' / '.join(metrics)}{note}", fontsize=10)
    fig.tight_layout(rect=(0, legend_inches / (4.5 + legend_inches), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def reach_cell(run: Run, target: float) -> str:
    reached = first_reach(run, target)
    return "not reached" if reached is None else f"{reached[0]:.1f} min / {reached[1]:,}"


def at_frames_table(groups: list[tuple[str, list[Run]]], at_frames: tuple[float, ...]) -> list[str]:
    """Markdown lines: per group, its runs' `value_at` each of `at_frames`, then (several runs) their mean with
    the min-max in brackets."""
    fmt = lambda v: "-" if v is None else f"{v:.2f}"
    lines = ["| run | seed | metric |" + "".join(f" at {k:,.0f} |" for k in at_frames),
             "|---|---:|---|" + "---:|" * len(at_frames)]
    for label, runs in groups:
        values = [[value_at(run, k) for k in at_frames] for run in runs]
        for run, row in zip(runs, values, strict=True):
            lines.append(f"| {os.path.basename(os.path.normpath(run.logdir))} | "
                         f"{'-' if run.seed is None else run.seed} | {run.metric} |"
                         + "".join(f" {fmt(v)} |" for v in row))
        if len(runs) > 1:
            cells = []
            for column in zip(*values, strict=True):
                known = [v for v in column if v is not None]
                cells.append(f" **{fmt(float(np.mean(known)))}** ({fmt(min(known))}-{fmt(max(known))}) |"
                             if len(known) == len(column) else " - |")
            lines.append(f"| {label}: mean over {len(runs)} runs | | |" + "".join(cells))
    return lines


def markdown(sections: list[tuple[str, list[tuple[str, list[Run]]], tuple[float, ...]]],
             at_frames: tuple[float, ...] = ()) -> str:
    """Per env, one row per run: group, seed, metric, segments, final value and env frames, learner minutes,
    and per target the minutes / env frames when the metric first reached it; with `at_frames`, a second table
    of each run's value at those env frames (`value_at`)."""
    lines = ["# Learning curves", "",
             "Minutes are the learner's wall-clock running time (segments of a resumed run added up); "
             "frames are env frames (agent steps x action repeat). A target is reached at the first metrics row "
             "whose value is >= the target."]
    for env, groups, targets in sections:
        lines += ["", f"## {env}", "", f"![{env}]({file_name(env)})", ""]
        header = "| run | group | seed | metric | final value | final env frames | minutes |"
        header += "".join(f" reaches {t:g} (minutes / env frames) |" for t in targets)
        lines += [header, "|---|---|---:|---|---:|---:|---:|" + "---:|" * len(targets)]
        for label, runs in groups:
            for run in runs:
                resumed = "".join(f", resumed at {f:,}" for f in run.resumed_at_frames)
                final = "-" if run.final_value is None else f"{run.final_value:.3g}"
                row = (f"| {run.logdir}{resumed} | {label} | {'-' if run.seed is None else run.seed} | {run.metric} "
                       f"| {final} | {run.final_env_frames:,} | {run.total_minutes:.1f} |")
                row += "".join(f" {reach_cell(run, t)} |" for t in targets)
                lines.append(row)
        if at_frames:
            lines += ["", "Value at K env frames: see `value_at` in seed/bench/curves.py (for episode_return_mean, "
                          "the mean of the last 100 training episodes that ended by K, from the second half of "
                          "the first K frames).", ""]
            lines += at_frames_table(groups, at_frames)
    return "\n".join(lines) + "\n"


def write_report(logdirs: list[str], out_dir: str, metric: str = "",
                 targets: tuple[float, ...] | None = None, group_seeds: bool = True,
                 at_frames: tuple[float, ...] = ()) -> tuple[str, list[str]]:
    """Reads the runs, writes `curves.md` and one PNG per env into `out_dir`; returns (markdown, paths).
    `group_seeds`: see `group_runs`; `at_frames`: see `at_frames_table`."""
    if not logdirs:
        raise CurvesError("--curves: got no logdirs, expected one or more learner logdirs")
    runs = [load_run(logdir, metric) for logdir in logdirs]
    os.makedirs(out_dir, exist_ok=True)
    by_env: dict[str, list[Run]] = {}
    for run in runs:
        by_env.setdefault(run.env, []).append(run)
    sections, paths = [], []
    for env, env_runs in by_env.items():
        groups = group_runs(env_runs, group_seeds)
        env_targets = targets_for(env, targets)
        path = os.path.join(out_dir, file_name(env))
        plot(groups, env, env_targets, path)
        paths.append(path)
        sections.append((env, groups, env_targets))
    text = markdown(sections, at_frames)
    md_path = os.path.join(out_dir, "curves.md")
    with open(md_path, "w") as f:
        f.write(text)
    return text, [md_path, *paths]
