"""seed-report --curves on recorded metrics: wall-clock minutes across a resume, the time to reach a target,
the default metric, grouping by seed, the min-max band, the markdown table and the PNG, and the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from seed.bench import curves
from seed.runtime import checkpoint
from tests.conftest import REPO

CONFIG = {"agent": "vtrace", "env": "gym:CartPole-v1", "learning_rate": 0.001, "batch_size": 16,
          "logdir": "", "seed": 0, "server_address": "unix:x.sock"}


def write_run(logdir, rows: list[dict], config: dict | None = None, config_in_checkpoint: bool = False) -> str:
    """A logdir with metrics.jsonl rows and the run's configuration in config.json or in its checkpoint."""
    os.makedirs(logdir, exist_ok=True)
    with open(os.path.join(logdir, "metrics.jsonl"), "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    if config is not None:
        config = {**config, "logdir": str(logdir)}
        if config_in_checkpoint:
            checkpoint.save(str(logdir), {"agent": {}, "optimizer": {}, "counters": {}, "config": config})
        else:
            with open(os.path.join(logdir, "config.json"), "w") as f:
                json.dump(config, f)
    return str(logdir)


def rows(times, frames, values, key="episode_return_mean") -> list[dict]:
    return [{"time_s": t, "env_frames": f, key: v, "train_steps": 0} for t, f, v in zip(times, frames, values,
                                                                                           strict=True)]


# Seed 0: 3 minutes of learning, killed, resumed from a checkpoint at 2,500 frames or fewer (time_s restarts; the
# row at 3,000 frames was replaced), and reaching 450 at 90 s into the second segment: 180 + 90 = 270 s = 4.5
# minutes, at 4,000 frames.
RESUMED = rows([60, 120, 180, 30, 90], [1000, 2000, 3000, 2500, 4000], [100, None, 300, 350, 460])
SEED1 = rows([60, 120, 180, 240, 300], [1000, 2000, 3000, 4000, 5000], [120, 220, 320, 420, 440])


@pytest.fixture
def three_runs(tmp_path):
    """Seeds 0 and 1 of one configuration (configuration in config.json and in the checkpoint) and a run with
    another learning rate."""
    a = write_run(tmp_path / "seed0", RESUMED, {**CONFIG, "seed": 0})
    b = write_run(tmp_path / "seed1", SEED1, {**CONFIG, "seed": 1}, config_in_checkpoint=True)
    c = write_run(tmp_path / "lr", rows([60, 120], [1000, 2000], [50, 60]), {**CONFIG, "learning_rate": 0.01})
    return a, b, c


def test_minutes_continue_across_a_resume(three_runs):
    run = curves.load_run(three_runs[0])
    assert run.metric == "episode_return_mean"
    # The row without a value (2.0 min) is skipped, the one the restart replaced (3,000 frames, 3.0 min) left out;
    # its minutes still count in the second segment's.
    assert run.minutes.tolist() == [1.0, 3.5, 4.5]
    assert run.env_frames.tolist() == [1000, 2500, 4000]
    assert run.resumed_at_frames == [2500]
    assert (run.final_env_frames, run.total_minutes, run.final_value) == (4000, 4.5, 460.0)
    assert curves.first_reach(run, 450) == (4.5, 4000)
    assert curves.first_reach(run, 350) == (3.5, 2500)  # >= counts
    assert curves.first_reach(run, 300) == (3.5, 2500)  # not at 3,000 frames: the restart replaced that row
    assert curves.first_reach(run, 461) is None


def test_default_metric_is_the_eval_running_mean_where_logged(tmp_path):
    logged = rows([10, 20, 30], [100, 200, 300], [1, 2, 3])
    logged[1][curves.EVAL_METRIC] = 7.0
    logged[2][curves.EVAL_METRIC] = 9.0
    run = curves.load_run(write_run(tmp_path / "a", logged))
    assert run.metric == curves.EVAL_METRIC and run.values.tolist() == [7.0, 9.0]
    assert curves.load_run(str(tmp_path / "a"), "episode_return_mean").values.tolist() == [1, 2, 3]
    with pytest.raises(curves.CurvesError, match="no row has a value for 'losses/total'"):
        curves.load_run(str(tmp_path / "a"), "losses/total")
    # The evaluation score (Football's goals, without the shaped checkpoint rewards) wins where it is logged.
    logged[2][curves.EVAL_SCORE_METRIC] = 0.5
    run = curves.load_run(write_run(tmp_path / "b", logged))
    assert run.metric == curves.EVAL_SCORE_METRIC and run.values.tolist() == [0.5]


def test_runs_group_by_configuration_without_seed(three_runs):
    groups = curves.group_runs([curves.load_run(logdir) for logdir in three_runs])
    assert [(label, [os.path.basename(r.logdir) for r in runs]) for label, runs in groups] == [
        ("vtrace gym:CartPole-v1 learning_rate=0.001 (2 runs, seeds 0, 1)", ["seed0", "seed1"]),
        ("vtrace gym:CartPole-v1 learning_rate=0.01", ["lr"]),
    ]


def test_a_number_typed_as_a_float_groups_with_the_same_integer(tmp_path):
    a = write_run(tmp_path / "flag", SEED1, {**CONFIG, "seed": 0, "total_environment_frames": 1e6})
    b = write_run(tmp_path / "preset", SEED1, {**CONFIG, "seed": 1, "total_environment_frames": 1_000_000})
    c = write_run(tmp_path / "other", SEED1, {**CONFIG, "seed": 2, "total_environment_frames": 1_000_001.0})
    groups = curves.group_runs([curves.load_run(logdir) for logdir in (a, b, c)])
    assert [[os.path.basename(r.logdir) for r in runs] for _, runs in groups] == [["flag", "preset"], ["other"]]


def test_a_flag_an_older_run_lacks_groups_at_its_default_now(tmp_path):
    """A run written before a flag existed (no key in its config.json) is a seed of the runs at its default."""
    from seed.agents.vtrace.config import VTraceConfig

    default = VTraceConfig.clip_rho_threshold
    a = write_run(tmp_path / "older", SEED1, {**CONFIG, "seed": 0})
    b = write_run(tmp_path / "at_default", SEED1, {**CONFIG, "seed": 1, "clip_rho_threshold": default})
    c = write_run(tmp_path / "changed", SEED1, {**CONFIG, "seed": 2, "clip_rho_threshold": default + 1})
    groups = curves.group_runs([curves.load_run(logdir) for logdir in (a, b, c)])
    assert [[os.path.basename(r.logdir) for r in runs] for _, runs in groups] == [["older", "at_default"],
                                                                                 ["changed"]]
    assert "clip_rho_threshold=2.0" in groups[1][0]
    unknown = {"agent": "not_registered", "env": "gym:CartPole-v1"}
    assert curves.with_defaults_now(unknown) == unknown


def test_group_seeds_false_draws_every_run_on_its_own(three_runs):
    groups = curves.group_runs([curves.load_run(logdir) for logdir in three_runs], group_seeds=False)
    assert [[os.path.basename(r.logdir) for r in runs] for _, runs in groups] == [["seed0"], ["seed1"], ["lr"]]
    labels = [label for label, _ in groups]
    assert len(set(labels)) == 3, labels  # the two seeds' identical labels are told apart by their logdirs
    assert labels[0].endswith("[seed0]") and labels[1].endswith("[seed1]")


def test_band_is_mean_min_max_over_the_common_range(tmp_path):
    low = curves.load_run(write_run(tmp_path / "low", rows([60, 120, 180], [0, 100, 200], [0, 10, 20])))
    high = curves.load_run(write_run(tmp_path / "high", rows([60, 120, 180, 240], [0, 100, 200, 300],
                                                             [10, 20, 30, 40])))
    x, mean, lo, hi = curves.band([low, high], "env_frames")
    assert x[0] == 0 and x[-1] == 200  # the range both runs cover
    np.testing.assert_allclose(mean, x / 10 + 5)
    np.testing.assert_allclose(lo, x / 10)
    np.testing.assert_allclose(hi, x / 10 + 10)
    x, mean, _, _ = curves.band([low, high], "minutes")
    assert (x[0], x[-1]) == (1.0, 3.0)


def test_table_and_png(three_runs, tmp_path):
    out = str(tmp_path / "report")
    text, paths = curves.write_report(list(three_runs), out)
    png = os.path.join(out, "curves_gym_CartPole-v1.png")
    assert paths == [os.path.join(out, "curves.md"), png]
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    lines = text.splitlines()
    assert "| run | group | seed | metric | final value | final env frames | minutes | reaches 450 (minutes / env " \
           "frames) |" in lines  # CartPole's default target
    group = "vtrace gym:CartPole-v1 learning_rate=0.001 (2 runs, seeds 0, 1)"
    assert (f"| {three_runs[0]}, resumed at 2,500 | {group} | 0 | episode_return_mean | 460 | 4,000 | 4.5 "
            f"| 4.5 min / 4,000 |") in lines
    assert f"| {three_runs[1]} | {group} | 1 | episode_return_mean | 440 | 5,000 | 5.0 | not reached |" in lines
    text, _ = curves.write_report(list(three_runs[1:]), out, targets=(100.0, 400.0))
    assert text.splitlines()[-2].endswith("| 1.0 min / 1,000 | 4.0 min / 4,000 |")  # seed 1: 120 at 1 min, 420 at 4


def test_default_targets():
    assert curves.targets_for("atari:Pong", None) == (18.0,)
    assert curves.targets_for("football:academy_empty_goal_close", None) == (0.4, 0.8)
    assert curves.targets_for("atari:Breakout", None) == ()
    assert curves.targets_for("atari:Pong", (1.0,)) == (1.0,)
    with pytest.raises(curves.CurvesError, match="--targets: got 'x'"):
        curves.parse_targets(["0.4", "x"])


def seed_report(args: list[str], cwd: str) -> subprocess.CompletedProcess:
    code = f"import sys\nfrom seed.bench.report import run\nsys.argv = ['seed-report'] + {args!r}\nrun()"
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=REPO))


def test_cli(three_runs, tmp_path):
    done = seed_report(["--curves", *three_runs, "--targets=0.4,300"], str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    out = tmp_path / "bench_results" / "curves"
    table = [line for line in (out / "curves.md").read_text().splitlines() if line.startswith(f"| {three_runs[0]}")]
    # Seed 0 reaches 0.4 at once, 300 after the restart (its 300 at 3,000 frames was replaced).
    assert table[0].endswith("| 1.0 min / 1,000 | 3.5 min / 2,500 |")
    assert (out / "curves_gym_CartPole-v1.png").stat().st_size > 10_000
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "checkpoint.pt").write_bytes(b"")
    done = seed_report(["--curves", str(empty), f"--out={tmp_path / 'x'}"], str(tmp_path))
    assert done.returncode == 2
    assert "expected a metrics.jsonl" in done.stderr and "found: checkpoint.pt" in done.stderr


def test_a_plug_in_that_fails_stops_the_report_with_its_error(tmp_path):
    """SEED_RL_PLUGINS naming a module that does not import: seed-report --curves exits with that error (the
    variable, the module, the cause) instead of grouping the runs without it. Seen failing with the error caught
    once and the plug-ins then marked loaded: the two seeds of one configuration fell into two groups, silently."""
    from tests.test_env_plugins import write_plugins

    seeds = [write_run(tmp_path / f"seed{seed}", SEED1, {**CONFIG, "seed": seed}) for seed in (0, 1)]
    code = f"import sys\nfrom seed.bench.report import run\nsys.argv = ['seed-report', '--curves'] + {seeds!r}\nrun()"
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, **write_plugins(plugins)))
    assert done.returncode == 2, (done.stdout[-2000:], done.stderr[-3000:])
    assert "seed-report: SEED_RL_PLUGINS" in done.stderr and "'broken_import_plugin'" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr[-3000:]


def test_running_mean_counts_towards_a_target_only_once_its_window_is_full(tmp_path):
    key = "eval/return_running_mean_100"
    data = rows([60, 120, 180, 240], [1000, 2000, 3000, 4000], [0.9, 0.5, 0.85, 0.9], key=key)
    for row, episodes in zip(data, [5, 60, 100, 140], strict=True):
        row["eval/episodes"] = episodes
    run = curves.load_run(write_run(tmp_path / "run", data, CONFIG))
    assert run.metric == key
    # 0.9 after 5 episodes is noise: the first full window (100 episodes) is at 3 minutes.
    assert curves.first_reach(run, 0.8) == (3.0, 3000)
    assert curves.first_reach(run, 0.88) == (4.0, 4000)


def windowed(frames, means, counts) -> list[dict]:
    """Rows of training-episode windows: each row's episode_return_mean is over its episodes_in_window."""
    data = rows(list(range(30, 30 * len(frames) + 1, 30)), frames, means)
    for row, count in zip(data, counts, strict=True):
        row["episodes_in_window"] = count
    return data


def test_value_at_is_the_mean_of_the_last_100_training_episodes_by_then(tmp_path):
    # Windows newest first by 10,000 frames: 3.0 x 40, 2.0 x 50, 1.0 x 30 (stops at >= 100: the 1.0 x 30 window
    # completes it), and 9.0 x 80 is past 10,000 x 1.02. The empty window (None) adds nothing.
    data = windowed([2000, 4000, 6000, 7000, 8000, 10_100, 12_000],
                    [5.0, 0.0, 1.0, None, 2.0, 3.0, 9.0], [500, 20, 30, 0, 50, 40, 80])
    run = curves.load_run(write_run(tmp_path / "run", data, CONFIG), curves.TRAIN_METRIC)
    assert curves.value_at(run, 10_000) == pytest.approx((3.0 * 40 + 2.0 * 50 + 1.0 * 30) / 120)
    # Only windows from the second half of the first K count: at 4,000, the 0.0 x 20 window alone (2,000 is K/2).
    assert curves.value_at(run, 4000) == pytest.approx(0.0)
    assert curves.value_at(run, 20_000) is None  # the run stopped at 12,000
    assert curves.value_at(run, 1000) is None  # no row by then
    # A running mean over evaluation episodes is read as it is, from the last row by then.
    key = "eval/return_running_mean_100"
    run = curves.load_run(write_run(tmp_path / "eval", rows([30, 60], [1000, 2000], [0.5, 0.7], key=key), CONFIG))
    assert curves.value_at(run, 1500) == 0.5 and curves.value_at(run, 2000) == 0.7


def test_value_at_stops_at_exactly_100_episodes(tmp_path):
    """Windows of 60 and 40 episodes make exactly 100: the older window of 50 (in the second half of the first
    10,000 frames) does not count. Seen failing with `count > 100` (it added the 9.0 x 50 window: 4.07)."""
    data = windowed([6000, 8000, 10_000], [9.0, 1.0, 2.0], [50, 40, 60])
    run = curves.load_run(write_run(tmp_path / "run", data, CONFIG), curves.TRAIN_METRIC)
    assert curves.value_at(run, 10_000) == pytest.approx((2.0 * 60 + 1.0 * 40) / 100)
    assert curves.value_at(run, 10_000, episodes=101) == pytest.approx((2.0 * 60 + 1.0 * 40 + 9.0 * 50) / 150)


def counted(frames, means, counts, updates) -> list[dict]:
    """`windowed` rows with the learner's counters: cumulative episodes and train steps, and the window's."""
    data = windowed(frames, means, counts)
    for row, count, steps in zip(data, counts, updates, strict=True):
        row.update(episodes_in_window=count, window_train_steps=steps)
    return data


def resumed(first: list[dict], second: list[dict], checkpoint_counters: tuple[int, int]) -> list[dict]:
    """The rows of a run that restarted from a checkpoint holding (episodes, train steps): each segment's counters
    run on from where it started, its time_s from 0."""
    rows = []
    for segment, (episodes, train_steps) in ((first, (0, 0)), (second, checkpoint_counters)):
        for row in segment:
            episodes += row["episodes_in_window"]
            train_steps += row["window_train_steps"]
            rows.append({**row, "episodes": episodes, "train_steps": train_steps})
    return rows


def test_rows_a_restart_replaced_do_not_count(tmp_path):
    """A run logged rows at 1,000 - 3,500 frames (mean return 1.0, 25 episodes a window), crashed, and restarted
    from its checkpoint at 2,000 frames (50 episodes, 20 updates): the restart's rows at 3,000 and 4,000 frames
    (2.0) replace the first segment's at 2,500 (more episodes than the checkpoint held, though fewer frames than
    the restart's first row) and 3,500. At 4,000 frames the last training episodes (second half) are the restart's
    50, mean 2.0; seen failing before the fix: 1.5, the replaced episodes counted too. A restart from the last
    row's counters (a clean stop) replaces nothing."""
    first = counted([1000, 2000, 2500, 3500], [1.0] * 4, [25] * 4, [10, 10, 5, 10])
    second = counted([3000, 4000], [2.0, 2.0], [25, 25], [10, 10])
    data = resumed(first, second, (50, 20))
    run = curves.load_run(write_run(tmp_path / "crashed", data, CONFIG), curves.TRAIN_METRIC)
    assert curves.value_at(run, 4000) == pytest.approx(2.0)
    assert run.env_frames.tolist() == [1000, 2000, 3000, 4000] and run.values.tolist() == [1.0, 1.0, 2.0, 2.0]
    assert run.resumed_at_frames == [3000]
    assert run.minutes.tolist() == [0.5, 1.0, 2.5, 3.0]  # the replaced rows' 2 minutes stay spent
    assert curves.first_reach(run, 1.5) == (2.5, 3000)
    assert curves.replaced_rows(data, [4]).tolist() == [False, False, True, True, False, False]

    clean = resumed(first, counted([4500], [2.0], [25], [10]), (100, 35))
    run = curves.load_run(write_run(tmp_path / "stopped", clean, CONFIG), curves.TRAIN_METRIC)
    assert run.env_frames.tolist() == [1000, 2000, 2500, 3500, 4500]
    assert curves.value_at(run, 4500) == pytest.approx((2.0 * 25 + 1.0 * 50) / 75)  # windows past 2,250 frames


def test_cli_at_frames_table_gives_each_run_and_the_mean_over_seeds(tmp_path):
    a = write_run(tmp_path / "s0", windowed([500, 1000], [1.0, 2.0], [100, 100]), {**CONFIG, "seed": 0})
    b = write_run(tmp_path / "s1", windowed([500, 1000], [3.0, 4.0], [100, 100]), {**CONFIG, "seed": 1})
    done = seed_report(["--curves", a, b, "--metric=episode_return_mean", "--at_frames=500,1e3",
                        f"--out={tmp_path / 'out'}"], str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    text = (tmp_path / "out" / "curves.md").read_text()
    assert "| s0 | 0 | episode_return_mean | 1.00 | 2.00 |" in text
    assert "| s1 | 1 | episode_return_mean | 3.00 | 4.00 |" in text
    assert "mean over 2 runs | | | **2.00** (1.00-3.00) | **3.00** (2.00-4.00) |" in text
    done = seed_report(["--curves", a, "--at_frames=1e5,lots", f"--out={tmp_path / 'x'}"], str(tmp_path))
    assert done.returncode == 2 and "--at_frames: got 'lots', expected numbers" in done.stderr
