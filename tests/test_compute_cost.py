"""seed.bench.compute_cost: the learner's inference and training time per agent step, on real agents."""

import json
import subprocess
import sys

import pytest
import torch

from seed.agents import agent_class
from seed.bench.compute_cost import make_unrolls, measure
from seed.envs import make_spec
from seed.learner.configuration import resolve_config


@pytest.mark.parametrize("agent", ["vtrace", "r2d2", "ppo", "sac"])
def test_measure_times_every_agent_and_derives_the_learner_bound(tmp_path, agent):
    shapes = {"ppo": {"sync_every": 5, "num_actors": 1, "envs_per_actor": 4},
              "r2d2": {"batch_size": 4, "unroll_length": 5, "burn_in": 2},
              "sac": {"batch_size": 4}}.get(agent, {"batch_size": 4, "unroll_length": 5})
    env = "gym:Pendulum-v1" if agent == "sac" else "gym:CartPole-v1"  # SAC takes Box actions only
    config = resolve_config({"logdir": str(tmp_path / "run"), "agent": agent, "env": env,
                             "torch_threads": 1, **shapes})
    result = measure(config, [2, 4], repeats=1)
    assert set(result["inference_ms"]) == {"2", "4"} and min(result["inference_ms"].values()) > 0
    assert result["train_step_ms"] > 0
    # A replay agent (R2D2, SAC) trains each agent step replay_ratio times on average; the others once.
    replay_ratio = config.replay_ratio if agent_class(agent).uses_replay else None
    times_trained = replay_ratio or 1.0
    assert result["replay_ratio"] == replay_ratio
    per_step = (result["inference_ms"]["4"] / 4
                + times_trained * result["train_step_ms"] / (config.batch_size * config.unroll_length))
    rounding = 0.005 * times_trained / (config.batch_size * config.unroll_length)  # train_step_ms has 2 decimals
    assert result["learner_ms_per_agent_step"] == pytest.approx(per_step, rel=1e-3, abs=1e-3 + rounding)
    assert result["learner_bound_fps"] == pytest.approx(1e3 / result["learner_ms_per_agent_step"], rel=1e-2)


def test_the_timed_step_is_the_agents_whole_update(tmp_path, monkeypatch):
    """SAC's update adds actor and temperature steps to the critic's loss: the timed step must run them (it
    used to time `loss` and one optimizer step, a third of SAC's update)."""
    config = resolve_config({"logdir": str(tmp_path / "run"), "agent": "sac", "env": "gym:Pendulum-v1",
                             "torch_threads": 1, "batch_size": 4})
    sac = agent_class("sac")
    policy_steps = []
    original = sac._policy_step
    monkeypatch.setattr(sac, "_policy_step",
                        lambda self, *args: policy_steps.append(1) or original(self, *args))
    measure(config, [2], repeats=4)
    assert len(policy_steps) > 0


def test_unrolls_are_played_by_the_agent_with_the_configured_shape(tmp_path):
    config = resolve_config({"logdir": str(tmp_path / "run"), "agent": "vtrace", "env": "fake:atari",
                             "batch_size": 3, "unroll_length": 4})
    spec = make_spec(config.env, config.env_options())
    agent = agent_class("vtrace")(spec, config)
    unrolls = make_unrolls(agent, spec, config, torch.Generator().manual_seed(0))
    assert unrolls.observation.shape == (5, 3, *spec.observation_shape)
    assert unrolls.observation.dtype == torch.uint8
    assert unrolls.policy_logits.shape == (5, 3, spec.num_actions)
    assert unrolls.done[0].all() and not unrolls.done[1:].any()


def test_cli_writes_the_result_file_and_rejects_a_bad_batch_size(tmp_path):
    out = tmp_path / "cost.json"
    args = [sys.executable, "-m", "seed.bench.compute_cost", "--agent=vtrace", "--env=gym:CartPole-v1",
            "--repeats=1", f"--logdir={tmp_path / 'run'}"]
    subprocess.run([*args, f"--out={out}"], check=True, capture_output=True, timeout=120)
    assert json.loads(out.read_text())["agent"] == "vtrace"
    bad = subprocess.run([*args, "--inference_batch_sizes=0"], capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "--inference_batch_sizes: got ['0']" in bad.stderr + bad.stdout
