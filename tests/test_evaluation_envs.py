"""Evaluation envs (`--num_eval_envs`): never trained on, they play the evaluation policy, and their episodes
feed `eval/return_running_mean_100`. Also the flags that contradict V-trace (`--burn_in`)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import torch

from seed.agents import agent_class
from seed.contracts import InferenceBatch
from seed.contracts.training import Unroll
from seed.envs import make_spec
from seed.learner.configuration import resolve_config
from seed.learner.learner import Learner
from seed.metrics.recording import LearnerMetrics
from tests.conftest import REPO


def _config(tmp_path, **values):
    return resolve_config({"logdir": str(tmp_path / "run"), "num_actors": 2, "envs_per_actor": 2, **values})


def _unroll(env_id: int, length: int = 3) -> Unroll:
    steps = {"observation": torch.zeros(length, 4), "reward": torch.zeros(length),
             "done": torch.zeros(length, dtype=torch.bool),
             "truncated": torch.zeros(length, dtype=torch.bool), "prev_action": torch.zeros(length, dtype=torch.long),
             "action": torch.zeros(length, dtype=torch.long), "valid": torch.ones(length, dtype=torch.bool),
             "policy_logits": torch.zeros(length, 2)}
    return Unroll(steps, {}, torch.tensor(env_id))


def test_vtrace_never_trains_on_eval_envs(tmp_path):
    learner = Learner(_config(tmp_path, num_eval_envs=1, batch_size=1))
    try:
        learner.parts.sink.start()
        # One batch of the four envs' unrolls, as the unroll store emits it; env 3 is the eval env (the last of 4).
        learner.parts.sink.put(Unroll.stack([_unroll(e) for e in range(4)]))
        queued = []
        while (batch := learner.parts.experience.queue.get(1.0)) is not None:
            queued.extend(batch.env_id.tolist())
        assert sorted(queued) == [0, 1, 2]
    finally:
        learner.parts.stop_event.set()
        learner._close()


def _vtrace_agent_with_fixed_logits(tmp_path, **values):
    config = _config(tmp_path, **values)
    agent = agent_class("vtrace")(make_spec(config.env, config.env_options()), config)
    with torch.no_grad():  # logits [0, 0.2] whatever the input: argmax 1, a sample is 0 about 45% of the time
        agent.network.policy.weight.zero_()
        agent.network.policy.bias.copy_(torch.tensor([0.0, 0.2]))
    return config, agent


def _act(agent, act, env_ids):
    n = len(env_ids)
    batch = InferenceBatch(torch.tensor(env_ids), torch.zeros(n, 4), torch.zeros(n), torch.ones(n, dtype=torch.bool),
                           torch.zeros(n, dtype=torch.long))
    return act(agent.network, batch, agent.initial_state(n)).action


def test_vtrace_eval_envs_play_greedy_with_eval_greedy(tmp_path):
    torch.manual_seed(0)
    config, agent = _vtrace_agent_with_fixed_logits(tmp_path, num_eval_envs=1, eval_greedy=True)
    env_ids = [0, 1, 2, 3] * 250  # env 3 evaluates
    actions = _act(agent, agent.act, env_ids).view(250, 4)
    assert (actions[:, 3] == 1).all()  # greedy
    assert (actions[:, :3] == 0).float().mean() > 0.3  # training envs sample
    assert (_act(agent, agent.evaluation_act, [0] * 200) == 1).all()


def test_vtrace_eval_envs_sample_by_default(tmp_path):
    torch.manual_seed(0)
    config, agent = _vtrace_agent_with_fixed_logits(tmp_path, num_eval_envs=1)
    actions = _act(agent, agent.act, [3] * 1000)
    assert 0.3 < (actions == 0).float().mean() < 0.6
    assert 0.3 < (_act(agent, agent.evaluation_act, [0] * 1000) == 0).float().mean() < 0.6


def test_r2d2_evaluation_policy_uses_eval_epsilon(tmp_path):
    torch.manual_seed(0)
    config = _config(tmp_path, agent="r2d2", eval_epsilon=0.5)
    agent = agent_class("r2d2")(make_spec(config.env, config.env_options()), config)
    n = 2000
    batch = InferenceBatch(torch.zeros(n, dtype=torch.long), torch.zeros(n, 4), torch.zeros(n),
                           torch.ones(n, dtype=torch.bool), torch.zeros(n, dtype=torch.long))
    out = agent.evaluation_act(agent.network, batch, agent.initial_state(n))
    greedy = out.outputs["q_values"].argmax(-1)
    # eps 0.5 over 2 actions: the greedy action 75% of the time.
    assert 0.7 < (out.action == greedy).float().mean() < 0.8


def test_eval_running_mean_keeps_the_last_100_episodes_across_windows_and_resume():
    metrics = LearnerMetrics(1)
    metrics.record_eval_episodes(np.arange(150, dtype=np.float64), np.ones(150, np.int64))
    row = metrics.snapshot(1.0, {"window_s": 1.0})
    assert row["eval/return_running_mean_100"] == np.mean(np.arange(50, 150))
    assert row["eval/episodes"] == 150
    row = metrics.snapshot(2.0, {"window_s": 1.0})  # a window without eval episodes keeps the running mean
    assert row["eval/return_running_mean_100"] == np.mean(np.arange(50, 150))
    resumed = LearnerMetrics(1, eval_returns=list(metrics.eval_returns), eval_episodes=metrics.eval_episodes)
    resumed.record_eval_episodes(np.array([1000.0]), np.array([1]))
    assert resumed.snapshot(1.0, {"window_s": 1.0})["eval/return_running_mean_100"] == np.mean(
        [*range(51, 150), 1000.0])


def test_vtrace_refuses_burn_in_and_too_many_eval_envs():
    for flags, field in ((["--burn_in=4"], "--burn_in: got 4"), (["--num_eval_envs=8"], "--num_eval_envs: got 8")):
        result = subprocess.run([sys.executable, "-m", "seed.learner.main", "--agent=vtrace", "--num_actors=2",
                                 "--envs_per_actor=4", "--print_config", *flags], capture_output=True, text=True,
                                cwd=REPO)
        assert result.returncode == 2, result.stderr
        assert field in result.stderr


def test_eval_score_comes_from_the_eval_envs_raw_returns_and_survives_a_resume(tmp_path):
    """The actors' raw scores (Football's goals) are split by env id: evaluation envs feed
    eval/score_running_mean_100, the others episode_raw_return_mean; the checkpoint keeps the window."""
    learner = Learner(_config(tmp_path, num_eval_envs=1))  # 4 envs: env id 3 evaluates
    try:
        learner._on_actor_episodes([(0, 2.0), (3, 1.0), (1, 4.0), (3, 0.0)])
        row = learner.parts.metrics.snapshot(1.0, {"window_s": 1.0})
        assert row["episode_raw_return_mean"] == 3.0
        assert row["eval/score_running_mean_100"] == 0.5
        learner.checkpoint(with_experience=False)
    finally:
        learner.parts.stop_event.set()
        learner._close()
    resumed = Learner(_config(tmp_path, num_eval_envs=1))
    try:
        assert list(resumed.parts.metrics.eval_scores) == [1.0, 0.0]
    finally:
        resumed.parts.stop_event.set()
        resumed._close()
