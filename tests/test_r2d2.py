"""R2D2 agent on the real inference path: burn-in alignment, eval envs, defaults, a training step."""

import copy
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from seed.agents.r2d2.agent import ATARI_TABLE_8, Agent
from seed.learner import Learner
from seed.learner_main import resolve_config
from seed.unroll import Unroll
from tests.conftest import serve_steps


def _config(tmp_path, **overrides):
    values = dict(agent="r2d2", env="fake:vector", logdir=str(tmp_path), num_actors=2, envs_per_actor=2,
                  burn_in=3, unroll_length=5, batch_size=4, replay_min_size=4, replay_capacity=64,
                  torch_threads=1, server_address=f"unix:{tmp_path}/l.sock")
    values.update(overrides)
    return resolve_config(values)


def _request(actor, g, k=2, rng=None, done=None):
    rng = rng or np.random.default_rng(g)
    observation = rng.normal(size=(k, 8)).astype(np.float32)
    return (actor, 1, observation, np.full(k, float(g), np.float32), np.zeros(k, bool) if done is None else done,
            np.zeros(k, bool))


def _learner(config):
    learner = Learner(config)
    learner.slab.live_run[:] = 1  # both actors handshook with run id 1
    learner.inference.sink = learner.experience.sink  # no sink thread: unrolls go straight to replay
    return learner


def test_burn_in_reaches_the_state_inference_had_at_the_first_trained_step(tmp_path):
    learner = _learner(_config(tmp_path, num_eval_envs=0))
    inference = learner.inference
    emitted: list[Unroll] = []
    inference.sink = emitted.extend
    states_after = {}  # global step g -> state row of env 0 after processing step g
    for g in range(20):
        done = np.array([g == 11, False])  # an episode boundary inside a burn-in prefix
        serve_steps(inference, [_request(0, g, done=done), _request(1, g)])
        states_after[g] = {k: v[0].clone() for k, v in inference.state_table.agent_state.items()}
    env0 = [u for u in emitted if int(u.env_id) == 0]
    assert len(env0) >= 3
    agent = learner.agent
    # Inference and learner share the frozen weights here.
    agent.network.load_state_dict(inference.network.state_dict())
    agent.target_network.load_state_dict(inference.network.state_dict())
    b = learner.config.burn_in
    for unroll in env0:
        online, target = agent.burn_in(Unroll.stack([unroll]))
        first_trained_step = int(unroll.reward[b].item())  # rewards carry the global step number
        zero = {k: torch.zeros_like(v) for k, v in states_after[0].items()}
        expected = states_after[first_trained_step - 1] if first_trained_step > 0 else zero
        for key in ("lstm_h", "lstm_c"):
            torch.testing.assert_close(online[key][0], expected[key], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(target[key][0], expected[key], atol=1e-5, rtol=1e-5)
    # The first unroll's burn-in runs over padding only and yields the zero state of a fresh env.
    assert env0[0].valid[:b].logical_not().all() and env0[0].valid[b:].all()


def test_eval_envs_never_enter_replay_and_are_logged_apart(tmp_path):
    learner = _learner(_config(tmp_path, num_eval_envs=2, fake_episode_length=5, replay_ratio=0.01))
    for g in range(40):
        done = np.full(2, g % 7 == 6)
        serve_steps(learner.inference, [_request(0, g, done=done), _request(1, g, done=done)])
    replay = learner.experience.replay
    assert replay.inserted > 0
    stored = set(replay._env_ids[: replay.size].tolist())
    assert stored == {0, 1}  # env ids 2 and 3 are the eval envs
    row = learner.metrics.snapshot(1.0, {"window_s": 1.0})
    assert row["eval_episode_return_mean"] is not None and row["episode_return_mean"] is not None
    eps = learner.agent.epsilons
    assert eps[:2].tolist() == pytest.approx([0.4, 0.4 ** 8]) and eps[2:].tolist() == pytest.approx([1e-3, 1e-3])


def test_training_step_updates_priorities_and_target_copy(tmp_path):
    learner = _learner(_config(tmp_path, target_update_interval=2, replay_ratio=1.0))
    for g in range(20):  # 3 sequences per env: within what the replay ratio lets run ahead
        serve_steps(learner.inference, [_request(0, g), _request(1, g)])
    replay = learner.experience.replay
    assert learner.train_step()
    online = learner.agent.network.state_dict()
    target = learner.agent.target_network.state_dict()
    assert any(not torch.equal(online[k], target[k]) for k in online)
    # Inference, online and target nets started equal, so the first update's priorities matched the initial
    # ones; after one optimizer step the recomputed priorities differ.
    before = replay.tree.get(np.arange(replay.size)).copy()
    assert learner.train_step()  # step 2: also the hard target copy
    assert not np.allclose(before, replay.tree.get(np.arange(replay.size)))
    target = learner.agent.target_network.state_dict()
    assert all(torch.equal(learner.agent.network.state_dict()[k], target[k]) for k in online)


def test_atari_defaults_are_paper_table_8():
    out = subprocess.run([sys.executable, "-m", "seed.learner_main", "--agent=r2d2", "--env=atari:Pong",
                          "--print_config"], capture_output=True, text=True, check=True)
    printed = json.loads(out.stdout)
    for key, value in ATARI_TABLE_8.items():
        assert printed[key] == value, key
    assert printed["burn_in"] + printed["unroll_length"] == 120  # sequence of 120 incl. 40 burn-in (+ bootstrap)
    assert printed["replay_expected_bytes"] == printed["replay_bytes_per_sequence"] * 100_000
    assert printed["replay_expected_gib"] > 50  # 1e5 x 121 single 84x84 frames


def test_agent_rejects_burn_in_longer_than_unroll(tmp_path):
    config = _config(tmp_path)
    config.burn_in = 10
    from seed.envs import make_spec

    with pytest.raises(ValueError, match="burn_in: got 10"):
        Agent(make_spec("fake:vector"), config)


def test_checkpoint_keeps_target_network_and_optionally_the_replay(tmp_path):
    learner = _learner(_config(tmp_path, checkpoint_replay=True, replay_ratio=1.0))
    for g in range(20):
        serve_steps(learner.inference, [_request(0, g), _request(1, g)])
    assert learner.train_step()
    learner.checkpoint()
    saved_size = learner.experience.replay.size
    target = {k: v.clone() for k, v in learner.agent.target_network.state_dict().items()}

    resumed = Learner(_config(tmp_path, checkpoint_replay=True, replay_ratio=1.0))
    assert resumed.metrics.train_steps == 1
    assert resumed.experience.replay.size == saved_size > 0
    assert all(torch.equal(v, target[k]) for k, v in resumed.agent.target_network.state_dict().items())

    without = Learner(_config(tmp_path, checkpoint_replay=False, replay_ratio=1.0))
    assert without.experience.replay.size == 0  # the replay refills after a restart


def _meta_act(agent, network, env_ids):
    """`act` on the meta device: a device of its own that a CPU-only machine has (shapes only, no data)."""
    from seed.inference import InferenceBatch

    b = len(env_ids)
    batch = InferenceBatch(torch.tensor(env_ids, device="meta"), torch.zeros(b, 8, device="meta"),
                           torch.zeros(b, device="meta"), torch.zeros(b, dtype=torch.bool, device="meta"),
                           torch.zeros(b, dtype=torch.int64, device="meta"))
    state = {k: v.to("meta") for k, v in agent.initial_state(b).items()}
    return agent.act(copy.deepcopy(network).to("meta"), batch, state)


def test_each_inference_device_reads_its_own_epsilons(tmp_path):
    """Two inference devices share one agent. Each reads epsilons that live on its own device, and acting on
    another device never replaces the tensor a device (or a CUDA graph captured on it) reads."""
    learner = _learner(_config(tmp_path, inference_devices="cpu,cpu"))
    agent, (first, second) = learner.agent, learner.inferences
    host = agent.epsilons
    for g in range(2):  # actor a is served by device a % 2
        serve_steps(first, [_request(0, g)])
        serve_steps(second, [_request(1, g)])
    for inference in learner.inferences:
        epsilons = agent.epsilons_on(inference.device)
        assert epsilons.device == inference.device
        torch.testing.assert_close(epsilons, host)
    on_first = agent.epsilons_on(first.device)
    address = on_first.data_ptr()
    # A second kind of device acts in between (meta stands in for another accelerator).
    assert _meta_act(agent, first.network, [0, 1]).action.device.type == "meta"
    assert agent.epsilons_on(torch.device("meta")).device.type == "meta"
    serve_steps(second, [_request(1, 2)])
    serve_steps(first, [_request(0, 2)])
    assert agent.epsilons is host and host.device.type == "cpu"  # the host copy is never rebound
    assert agent.epsilons_on(first.device) is on_first and on_first.data_ptr() == address
    assert on_first.device == first.device
