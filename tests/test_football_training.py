"""A short V-trace run on academy_empty_goal_close through the real learner and actor processes."""

import pytest

from tests.conftest import read_metrics, wait_for

pytest.importorskip("gfootball.env", reason="gfootball is not installed: run `make football`")


def test_vtrace_trains_on_football_and_logs_goals(processes, tmp_path):
    logdir = str(tmp_path / "run")
    address = f"unix:{tmp_path}/learner.sock"
    env = ["--env=football:academy_empty_goal_close", "--envs_per_actor=2"]
    learner = processes.learner([*env, "--agent=vtrace", f"--logdir={logdir}", f"--server_address={address}",
                                 "--num_actors=1", "--batch_size=2", "--unroll_length=8", "--log_interval_s=1",
                                 "--torch_threads=1"])
    processes.actor([*env, f"--server_address={address}", "--actor_index=0"], "actor0")

    def trained_with_episodes():
        rows = read_metrics(logdir)
        return rows if rows and rows[-1]["train_steps"] >= 3 and any(
            r["episode_raw_return_mean"] is not None for r in rows) else None

    rows = wait_for(trained_with_episodes, 240, "training steps and a finished football episode",
                    on_timeout=lambda: processes.output(learner)[-3000:])
    scored = [r["episode_raw_return_mean"] for r in rows if r["episode_raw_return_mean"] is not None]
    assert all(0.0 <= s <= 1.0 for s in scored)  # goals per episode in this scenario
    assert max(r["env_frames_per_sec"] for r in rows) > 0
    assert rows[-1]["env_frames"] > 0
