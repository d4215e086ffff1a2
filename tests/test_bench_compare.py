"""The A/B bench (`seed-bench --compare=REV`, seed/bench/compare.py): its comparison logic on made-up rounds, and
one real comparison of the working tree against HEAD (a small configuration, 2 rounds)."""

import json
import os
import subprocess
import sys

import pytest

from seed.bench import compare
from seed.bench.measure import BenchError
from tests.conftest import REPO


def _round(a_fps, b_fps, a_ceiling=None, b_ceiling=None):
    return {"order": "a then b", "a": {"env_frames_per_sec": a_fps, "over_transport": a_ceiling,
                                       "other_processes_cores": 0.1},
            "b": {"env_frames_per_sec": b_fps, "over_transport": b_ceiling, "other_processes_cores": 0.0}}


def test_rounds_alternate_which_side_runs_first():
    assert [compare.round_order(i) for i in range(4)] == [(0, 1), (1, 0), (0, 1), (1, 0)]


def test_summary_is_the_median_of_per_round_ratios_with_their_spread():
    rounds = [_round(90, 100, 0.45, 0.50), _round(120, 100, 0.60, 0.50), _round(100, 80, 0.50, 0.40)]
    summary = compare.summarise(rounds)
    assert summary["ratios"] == pytest.approx([0.9, 1.2, 1.25])
    assert summary["median_ratio"] == pytest.approx(1.2)  # the median of the ratios, not the ratio of medians
    assert (summary["min_ratio"], summary["max_ratio"]) == pytest.approx((0.9, 1.25))
    assert summary["a_env_frames_per_sec"] == 100 and summary["b_env_frames_per_sec"] == 100
    assert summary["a_over_transport"] == pytest.approx(0.5) and summary["b_over_transport"] == pytest.approx(0.5)


def test_a_round_that_measured_nothing_gives_no_ratio():
    summary = compare.summarise([_round(None, 100), _round(110, 100), _round(90, 0)])
    assert summary["ratios"] == pytest.approx([1.1])
    assert summary["median_ratio"] == pytest.approx(1.1)
    assert summary["a_over_transport"] is None
    with pytest.raises(BenchError, match="--compare_rounds: got 0"):
        compare.summarise([])


def test_load_above_the_share_is_refused_naming_the_flag():
    assert compare.load_problem(0.4, 2, 0.25) is None
    problem = compare.load_problem(0.9, 2, 0.25)
    assert "0.90 of 2 cores" in problem and "0.50" in problem and "--compare_max_other_load" in problem


def test_busy_cores_refused_after_the_wait_unless_allowed():
    busy = lambda: 1.5
    with pytest.raises(BenchError, match="other processes hold 1.50"):
        compare.wait_for_quiet(0.25, 0.0, False, sample=busy)
    assert compare.wait_for_quiet(0.25, 0.0, True, sample=busy) == 1.5
    loads = iter([1.5, 0.1])
    assert compare.wait_for_quiet(0.25, 60.0, False, sample=lambda: next(loads)) == 0.1  # waited, then quiet


def test_report_has_every_round_and_the_docs_row():
    result = {"config": "fake_mlp", "duration_s": 25.0, "created_utc": "2026-12-01T10:00:00+00:00",
              "sides": [{"label": "abc+dirty"}, {"label": "9e0b7a4"}],
              "rounds": [_round(90, 100, 0.45, 0.5), _round(110, 100, 0.55, 0.5)],
              "machine": {"cpu_cores": 2, "cpu_model": "Xeon"}, "max_other_load": 0.1}
    result["summary"] = compare.summarise(result["rounds"])
    result["docs_row"] = compare.docs_row(result)
    text = compare.report_markdown(result)
    assert "| 1 | a then b | 90 |" in text and "| 2 | a then b | 110 |" in text
    assert "median 1.000 (min 0.900, max 1.100)" in text
    assert result["docs_row"].startswith("| 2026-12-01 | fake_mlp | abc+dirty / 9e0b7a4 | 1.000x (0.900-1.100) |")
    assert "over the gRPC ceiling a 0.50, b 0.50" in result["docs_row"]


def test_an_unknown_revision_is_refused_naming_the_flag(tmp_path):
    completed = subprocess.run([sys.executable, "-m", "seed.bench", "--config=fake_mlp", "--compare=no-such-rev",
                                f"--compare_cache_dir={tmp_path}", f"--out={tmp_path}/ab.json"],
                               capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert completed.returncode == 1
    assert "--compare: got 'no-such-rev', expected a commit of" in completed.stderr


def test_working_tree_against_head_two_rounds(tmp_path):
    """A real comparison: HEAD installed into a cached environment of its own, both sides run twice in flipped
    order; each side's runs import that side's own copy of seed. Load is allowed: the suite shares the cores."""
    command = [sys.executable, "-m", "seed.bench", "--config=fake_mlp", "--num_actors=2", "--envs_per_actor=8",
               "--batch_size=4", "--duration_s=6", "--warmup_s=2", "--compare=HEAD", "--compare_rounds=2",
               "--compare_allow_load", f"--compare_cache_dir={tmp_path / 'cache'}", "--out=ab.json"]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=400, cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr[-3000:]
    with open(tmp_path / "ab.json") as f:
        result = json.load(f)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    a, b = result["sides"]
    assert a["commit"] is None and a["label"].startswith(head[:10]) and b["commit"] == head
    assert b["python"].startswith(str(tmp_path / "cache" / head))
    assert [r["order"] for r in result["rounds"]] == ["a then b", "b then a"]
    for r in result["rounds"]:
        assert r["a"]["env_frames_per_sec"] > 0 and r["b"]["env_frames_per_sec"] > 0
        # The working tree's runs come from the checkout; the commit's from its installed copy (no checkout).
        assert r["a"]["git_commit"].startswith(head)
        assert r["b"]["git_commit"] is None
    assert len(result["summary"]["ratios"]) == 2 and result["summary"]["median_ratio"] > 0
    assert "Row for docs/performance:" in completed.stdout and "| fake_mlp |" in completed.stdout
    # The environment is cached: a second comparison does not install again.
    assert os.path.exists(tmp_path / "cache" / head / "installed.json")
