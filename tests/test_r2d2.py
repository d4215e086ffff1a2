"""R2D2 agent on the real inference path: burn-in alignment, eval envs, defaults, a training step."""

import copy
import json
import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from seed.agents.r2d2.agent import R2D2Agent as Agent
from seed.contracts.training import Unroll
from seed.envs.atari_config import AGENT_DEFAULTS as ATARI_DEFAULTS
from seed.learner.configuration import resolve_config
from seed.learner.learner import Learner
from tests.conftest import serve_steps


def _config(tmp_path, **overrides):
    values = dict(agent="r2d2", env="fake:vector", logdir=str(tmp_path), num_actors=2, envs_per_actor=2,
                  burn_in=3, unroll_length=5, batch_size=4, replay_min_size=4, replay_capacity=64,
                  torch_threads=1, server_address=f"unix:{tmp_path}/l.sock",
                  training_process=False)  # these tests call the learner's own train_step
    values.update(overrides)
    return resolve_config(values)


def _request(actor, g, k=2, rng=None, done=None):
    rng = rng or np.random.default_rng(g)
    observation = rng.normal(size=(k, 8)).astype(np.float32)
    return (actor, 1, observation, np.full(k, float(g), np.float32), np.zeros(k, bool) if done is None else done,
            np.zeros(k, bool))


def _learner(config):
    learner = Learner(config)
    learner.parts.channels.slab.live_run[:] = 1  # both actors handshook with run id 1
    learner.parts.inferences[0].sink = learner.parts.experience.sink  # no sink thread: unrolls go straight to replay
    return learner


def test_burn_in_reaches_the_state_inference_had_at_the_first_trained_step(tmp_path):
    learner = _learner(_config(tmp_path, num_eval_envs=0))
    inference = learner.parts.inferences[0]
    emitted: list[Unroll] = []
    inference.sink = lambda batch: emitted.extend(batch.unbind())
    states_after = {}  # global step g -> state row of env 0 after processing step g
    for g in range(20):
        done = np.array([g == 11, False])  # an episode boundary inside a burn-in prefix
        serve_steps(inference, [_request(0, g, done=done), _request(1, g)])
        states_after[g] = {k: v[0].clone() for k, v in inference.state_table.agent_state.items()}
    env0 = [u for u in emitted if int(u.env_id) == 0]
    assert len(env0) >= 3
    agent = learner.parts.agent
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
        serve_steps(learner.parts.inferences[0], [_request(0, g, done=done), _request(1, g, done=done)])
    replay = learner.parts.experience.replay
    assert replay.inserted > 0
    stored = set(replay._env_ids[: replay.size].tolist())
    assert stored == {0, 1}  # env ids 2 and 3 are the eval envs
    row = learner.parts.metrics.snapshot(1.0, {"window_s": 1.0})
    assert row["eval_episode_return_mean"] is not None and row["episode_return_mean"] is not None
    eps = learner.parts.agent.epsilons
    assert eps[:2].tolist() == pytest.approx([0.4, 0.4 ** 8]) and eps[2:].tolist() == pytest.approx([1e-3, 1e-3])


def test_training_step_updates_priorities_and_target_copy(tmp_path):
    learner = _learner(_config(tmp_path, target_update_interval=2, replay_ratio=1.0))
    for g in range(20):  # 3 sequences per env: within what the replay ratio lets run ahead
        serve_steps(learner.parts.inferences[0], [_request(0, g), _request(1, g)])
    replay = learner.parts.experience.replay
    assert learner.train_step()
    # The first step samples how far Adam moves the weights (seed/training/optimizer_stats.py): a fraction of lr.
    fraction = learner.parts.metrics.snapshot(1.0, {"window_s": 1.0})["optimizer/adam_step_fraction"]
    assert 0.0 < fraction < 1.0
    online = learner.parts.agent.network.state_dict()
    target = learner.parts.agent.target_network.state_dict()
    assert any(not torch.equal(online[k], target[k]) for k in online)
    # Inference, online and target nets started equal, so the first update's priorities matched the initial
    # ones; after one optimizer step the recomputed priorities differ.
    before = replay.tree.get(np.arange(replay.size)).copy()
    assert learner.train_step()  # step 2: also the hard target copy
    assert not np.allclose(before, replay.tree.get(np.arange(replay.size)))
    target = learner.parts.agent.target_network.state_dict()
    assert all(torch.equal(learner.parts.agent.network.state_dict()[k], target[k]) for k in online)



def test_training_step_writes_each_sequence_priority_to_its_own_replay_slot(tmp_path):
    learner = _learner(_config(tmp_path, replay_ratio=1.0))
    for g in range(20):
        serve_steps(learner.parts.inferences[0], [_request(0, g), _request(1, g)])
    replay = learner.parts.experience.replay
    slots = np.arange(replay.capacity)
    before = replay.tree.get(slots).copy()
    seen = []
    loss = learner.parts.agent.loss
    learner.parts.agent.loss = lambda batch: seen.append((batch, loss(batch))) or seen[-1][1]
    assert learner.train_step()
    (batch, out), = seen
    sampled = np.asarray(batch.replay_indices)
    priorities = out.priorities.detach().double().numpy()
    assert len(np.unique(sampled)) > 1 and len(np.unique(priorities.round(6))) > 1  # a mix-up would show
    after = replay.tree.get(slots)
    # Sequence b's new priority lands in slot sampled[b] (as p^alpha); every other slot keeps its own.
    np.testing.assert_allclose(after[sampled], priorities ** replay.alpha, rtol=1e-6)
    untouched = np.setdiff1d(slots, sampled)
    np.testing.assert_array_equal(after[untouched], before[untouched])


def test_atari_defaults_are_paper_table_8():
    out = subprocess.run([sys.executable, "-m", "seed.learner.main", "--agent=r2d2", "--env=atari:Pong",
                          "--print_config"], capture_output=True, text=True, check=True)
    printed = json.loads(out.stdout)
    for key, value in ATARI_DEFAULTS["r2d2"].items():  # SEED paper Table 8, owned by the atari family
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


def test_dueling_hidden_zero_is_the_minatar_papers_linear_q_head(tmp_path):
    from seed.agents.r2d2.agent import DuelingQNetwork
    from seed.envs import make_spec

    spec = make_spec("minatar:asterix")
    config = _config(tmp_path, env="minatar:asterix", network="minatar", use_lstm=False, burn_in=0,
                     dueling_hidden=0)
    network = DuelingQNetwork(spec, config)
    features = 128 + spec.num_actions + 1  # fc 128, one-hot previous action, reward
    conv, fc, head = 4 * 16 * 9 + 16, 16 * 8 * 8 * 128 + 128, features * spec.num_actions + spec.num_actions
    assert sum(p.numel() for p in network.parameters()) == conv + fc + head
    steps, batch = 3, 2
    observation = torch.randint(0, 2, (steps, batch, 10, 10, 4), dtype=torch.bool)
    prev_action, reward = torch.randint(0, 6, (steps, batch)), torch.rand(steps, batch)
    done = torch.zeros(steps, batch, dtype=torch.bool)
    q, _ = network(observation, prev_action, reward, done, network.initial_state(batch))
    body, _ = network.body(observation, prev_action, reward, done, {})
    torch.testing.assert_close(q, network.q_head(body))  # no dueling mean subtracted
    assert q.shape == (steps, batch, spec.num_actions)
    dueling = DuelingQNetwork(spec, _config(tmp_path, env="minatar:asterix", network="minatar", use_lstm=False,
                                            burn_in=0, dueling_hidden=32))
    assert dueling.value[0].out_features == 32 and not hasattr(dueling, "q_head")


def test_negative_dueling_hidden_is_refused(tmp_path):
    with pytest.raises(ValueError, match="--dueling_hidden: got -1, expected >= 0"):
        _config(tmp_path, dueling_hidden=-1)


def test_checkpoint_keeps_target_network_and_optionally_the_replay(tmp_path):
    learner = _learner(_config(tmp_path, checkpoint_replay=True, replay_ratio=1.0))
    for g in range(20):
        serve_steps(learner.parts.inferences[0], [_request(0, g), _request(1, g)])
    assert learner.train_step()
    learner.checkpoint()
    saved_size = learner.parts.experience.replay.size
    target = {k: v.clone() for k, v in learner.parts.agent.target_network.state_dict().items()}

    resumed = Learner(_config(tmp_path, checkpoint_replay=True, replay_ratio=1.0))
    assert resumed.parts.metrics.train_steps == 1
    assert resumed.parts.experience.replay.size == saved_size > 0
    assert all(torch.equal(v, target[k]) for k, v in resumed.parts.agent.target_network.state_dict().items())

    without = Learner(_config(tmp_path, checkpoint_replay=False, replay_ratio=1.0))
    assert without.parts.experience.replay.size == 0  # the replay refills after a restart


def test_replay_file_naming_other_python_objects_is_refused_not_run(tmp_path, capsys):
    """The replay file is read with torch.load(weights_only=True) as checkpoints are: its NumPy priorities and
    generations load, an object of the file's choosing does not."""
    import datetime

    from seed.runtime.checkpoint import UnsafeCheckpoint, read

    learner = _learner(_config(tmp_path, checkpoint_replay=True, replay_ratio=1.0))
    for g in range(20):
        serve_steps(learner.parts.inferences[0], [_request(0, g), _request(1, g)])
    learner.checkpoint()
    priorities = learner.parts.experience.replay.tree.get(np.arange(learner.parts.experience.replay.capacity))
    resumed = Learner(_config(tmp_path, checkpoint_replay=True, replay_ratio=1.0))
    np.testing.assert_array_equal(resumed.parts.experience.replay.tree.get(np.arange(resumed.parts.experience.replay.capacity)),
                                  priorities)
    path = tmp_path / learner.parts.experience.REPLAY_FILE
    state = read(str(path))
    state["note"] = datetime.datetime(2026, 11, 26)  # any class beyond tensors and NumPy data
    torch.save(state, path)
    # Refused like a checkpoint that names such an object: passed over (no previous replay file here: empty).
    with pytest.raises(UnsafeCheckpoint, match=r"replay.pt: got the Python object datetime.datetime"):
        read(str(path))
    capsys.readouterr()
    Learner(_config(tmp_path, checkpoint_replay=True, replay_ratio=1.0))
    printed = capsys.readouterr()
    assert "replay.pt does not load (UnsafeCheckpoint" in printed.err and "restored replay" not in printed.out


def _meta_act(agent, network, env_ids):
    """`act` on the meta device: a device of its own that a CPU-only machine has (shapes only, no data)."""
    from seed.inference.central import InferenceBatch

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
    agent, (first, second) = learner.parts.agent, learner.parts.inferences
    host = agent.epsilons
    for g in range(2):  # actor a is served by device a % 2
        serve_steps(first, [_request(0, g)])
        serve_steps(second, [_request(1, g)])
    for inference in learner.parts.inferences:
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


def _h(x, eps):
    """Value rescaling written out by hand: h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x."""
    return math.copysign(math.sqrt(abs(x) + 1.0) - 1.0, x) + eps * x


def _tiny_agent(tmp_path, **overrides):
    from seed.envs import make_spec

    values = dict(burn_in=0, unroll_length=3, n_steps=2, discounting=0.5, value_rescaling_epsilon=1e-3,
                  priority_eta=0.5)
    values.update(overrides)
    return Agent(make_spec("fake:vector"), _config(tmp_path, **values))


def test_targets_are_double_q_rescaled_n_step_returns_masked_by_validity(tmp_path):
    eps = 1e-3
    agent = _tiny_agent(tmp_path, n_steps=2, discounting=0.5, value_rescaling_epsilon=eps)
    # T + 1 = 4 steps, one sequence, 3 actions. The online net picks actions 0, 1, 0, 1; the target net
    # prefers action 2 everywhere, with values (before rescaling) far from those the online net picks.
    values = torch.tensor([[1.0, 2.0, 50.0], [3.0, 4.0, 60.0], [5.0, 6.0, 70.0], [7.0, 8.0, 80.0]],
                          dtype=torch.float64)
    q_target = values.apply_(lambda v: _h(v, eps)).unsqueeze(1)  # [4, 1, 3]
    online_choice = [0, 1, 0, 1]
    q_online = torch.zeros(4, 1, 3, dtype=torch.float64)
    for t, a in enumerate(online_choice):
        q_online[t, 0, a] = 1.0
    bootstrap = [1.0, 4.0, 5.0, 8.0]  # target values at the online argmax: double Q
    segment = {"reward": torch.tensor([[0.0], [1.0], [2.0], [3.0]], dtype=torch.float64),
               "done": torch.zeros(4, 1, dtype=torch.bool), "truncated": torch.zeros(4, 1, dtype=torch.bool),
               "valid": torch.tensor([[False], [True], [True], [True]])}  # step 0 is padding
    targets, mask = agent._targets(q_online, q_target, segment)
    expected = [1 + 0.5 * 2 + 0.25 * bootstrap[2],  # rewards at steps 1, 2, then V(s2)
                2 + 0.5 * 3 + 0.25 * bootstrap[3],
                3 + 0.5 * bootstrap[3]]  # the segment ends: a 1-step horizon
    assert targets[:, 0].tolist() == pytest.approx([_h(x, eps) for x in expected], rel=1e-9)
    assert mask[:, 0].tolist() == [False, True, True]  # transition 0 starts on padding: no target


def test_without_value_rescaling_targets_are_plain_double_q_n_step_returns(tmp_path):
    agent = _tiny_agent(tmp_path, n_steps=2, discounting=0.5, value_rescaling=False)
    q_target = torch.tensor([[1.0, 2.0, 50.0], [3.0, 4.0, 60.0], [5.0, 6.0, 70.0]], dtype=torch.float64)
    q_online = torch.zeros(3, 1, 3, dtype=torch.float64)
    q_online[:, 0, 1] = 1.0  # the online net picks action 1: the bootstrap is the target net's 2, 4, 6
    segment = {"reward": torch.tensor([[0.0], [1.0], [2.0]], dtype=torch.float64),
               "done": torch.zeros(3, 1, dtype=torch.bool), "truncated": torch.zeros(3, 1, dtype=torch.bool),
               "valid": torch.ones(3, 1, dtype=torch.bool)}
    targets, mask = agent._targets(q_online, q_target.unsqueeze(1), segment)
    assert targets[:, 0].tolist() == pytest.approx([1 + 0.5 * 2 + 0.25 * 6, 2 + 0.5 * 6])
    assert mask[:, 0].tolist() == [True, True]


class _QFromObservation(torch.nn.Module):
    """A stand-in Q-network whose Q-values [T, B, A] are its observations: every value is set by hand."""

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(()))

    def forward(self, observation, prev_action, reward, done, state):
        return observation * self.scale, state


def _vector_batch(env_ids: list[int]):
    """An inference batch of `env_ids`, each row observing [1, 0] (`_QFromObservation` then prefers action 0)."""
    from seed.inference.central import InferenceBatch

    n = len(env_ids)
    return InferenceBatch(torch.tensor(env_ids), torch.tensor([[1.0, 0.0]] * n), torch.zeros(n),
                          torch.zeros(n, dtype=torch.bool), torch.zeros(n, dtype=torch.int64))


def _hand_batch(with_burn_in=0):
    """Two sequences of T + 1 = 3 steps, A = 2, n = 1, discount 0.5, no value rescaling (eps = 0), so that
    h(x) = sqrt(x + 1) - 1 and h^-1(1) = 3, h^-1(2) = 8, h(3) = 1.

    Sequence 0: Q = [.5, 0], [1, 0], [0, 1]; rewards 1.5, 1.5; actions 0, 1.
      targets: 1.5 + .5 h^-1(1) = 3 -> 1 for both transitions; taken Q: .5, 0 -> td = .5, 1.
    Sequence 1: step 0 is padding (valid False); Q = [5, 0], [2, 0], [1, 0]; rewards 100, 3 (terminal: done
      at step 2); actions 0, 0. Transition 0 is masked out; transition 1: target h(3) = 1, taken 2 -> td = -1.
    """
    q = torch.tensor([[[0.5, 0.0], [5.0, 0.0]], [[1.0, 0.0], [2.0, 0.0]], [[0.0, 1.0], [1.0, 0.0]]])
    steps = {
        "observation": q, "q_values": q.clone(),
        "reward": torch.tensor([[0.0, 0.0], [1.5, 100.0], [1.5, 3.0]]),
        "done": torch.tensor([[False, False], [False, False], [False, True]]),
        "truncated": torch.zeros(3, 2, dtype=torch.bool),
        "valid": torch.tensor([[True, False], [True, True], [True, True]]),
        "action": torch.tensor([[0, 0], [1, 0], [0, 0]]),
        "prev_action": torch.zeros(3, 2, dtype=torch.int64),
    }
    if with_burn_in:  # steps in front that only the burn-in sees: garbage that must not count
        garbage = lambda v: torch.full_like(v[:1], 1 if v.dtype == torch.int64 else 7)  # a valid action index
        steps = {k: torch.cat([garbage(v).repeat(with_burn_in, *[1] * (v.dim() - 1)), v]) for k, v in steps.items()}
    return Unroll(steps, {}, torch.tensor([0, 1]))


def test_loss_weights_each_sequence_and_ignores_masked_steps(tmp_path):
    agent = _tiny_agent(tmp_path, unroll_length=2, n_steps=1, discounting=0.5, value_rescaling_epsilon=0.0,
                        priority_eta=0.5)
    agent.network = _QFromObservation()
    agent.target_network = _QFromObservation().requires_grad_(False)
    from seed.contracts.training import TrainingBatch

    out = agent.loss(TrainingBatch(_hand_batch(), importance_weights=torch.tensor([0.25, 1.0])))
    per_sequence = [0.5 * (0.5 ** 2 + 1.0 ** 2), 0.5 * 1.0 ** 2]
    assert out.loss.item() == pytest.approx((0.25 * per_sequence[0] + 1.0 * per_sequence[1]) / 2)
    # Priorities: eta max|td| + (1 - eta) mean|td| over the valid transitions only.
    assert out.priorities.tolist() == pytest.approx([0.5 * 1.0 + 0.5 * 0.75, 0.5 * 1.0 + 0.5 * 1.0])
    assert out.metrics["td/abs_mean"] == pytest.approx((0.5 + 1.0 + 1.0) / 3)
    # The gradient flows through the taken Q-values only: d loss / d scale = mean_b w_b sum_t -td_t Q_taken.
    out.loss.backward()
    expected_grad = (0.25 * -(0.5 * 0.5 + 1.0 * 0.0) + 1.0 * -(-1.0 * 2.0)) / 2
    assert agent.network.scale.grad.item() == pytest.approx(expected_grad)


def test_initial_priorities_use_the_stored_q_values_after_the_burn_in(tmp_path):
    agent = _tiny_agent(tmp_path, burn_in=1, unroll_length=2, n_steps=1, discounting=0.5,
                        value_rescaling_epsilon=0.0, priority_eta=0.9)
    batch = _hand_batch(with_burn_in=1)
    priorities = agent.initial_priorities(Unroll(batch.steps, {}, batch.env_id))  # as the replay sink hands it
    # |td| = (.5, 1) and (masked, 1): eta max + (1 - eta) mean over the valid transitions.
    assert priorities.tolist() == pytest.approx([0.9 * 1.0 + 0.1 * 0.75, 0.9 * 1.0 + 0.1 * 1.0])


def test_annealed_epsilons_go_from_one_to_each_envs_own_on_training_rows_only():
    from seed.agents.r2d2.r2d2 import annealed_epsilons

    own = torch.tensor([0.4, 0.01, 0.001, 0.001])
    training = torch.tensor([True, True, False, False])  # an eval row and a padded row keep their epsilon
    for acted, remaining in ((0, 1.0), (25, 0.75), (100, 0.0), (500, 0.0)):
        got = annealed_epsilons(own, training, torch.tensor(acted), 100)
        want = torch.tensor([0.4 + 0.6 * remaining, 0.01 + 0.99 * remaining, 0.001, 0.001])
        torch.testing.assert_close(got, want)


def test_act_anneals_epsilons_over_the_training_envs_steps(tmp_path, monkeypatch):
    agent = _tiny_agent(tmp_path, num_actors=2, envs_per_actor=2, num_eval_envs=1, epsilon_base=0.4,
                        epsilon_alpha=7.0, eval_epsilon=0.01, epsilon_anneal_steps=6)
    batch = _vector_batch([0, 1, 2, 3, 4])  # 3 training envs, the eval env, a padded row
    monkeypatch.setattr(torch, "randint", lambda low, high, size, device=None: torch.ones(size, dtype=torch.int64))
    # A draw of 0.95 explores while a training env's epsilon is above it: 1 at step 0, 0.5 + own / 2 after the
    # first batch (3 of 6 steps), own after the second; the eval row (0.01) and the padded row never explore.
    monkeypatch.setattr(torch, "rand", lambda n, device=None: torch.full((n,), 0.95))
    actions = [agent.act(_QFromObservation(), batch, {}).action.tolist() for _ in range(3)]
    assert actions == [[1, 1, 1, 0, 0], [0, 0, 0, 0, 0], [0, 0, 0, 0, 0]]
    assert agent.acted_on(torch.device("cpu")).tolist() == [3, 3, 3, 0]  # per env id: training envs only
    monkeypatch.setattr(torch, "rand", lambda n, device=None: torch.full((n,), 0.69))  # 0.5 + 0.4 / 2 = 0.7
    fresh = _tiny_agent(tmp_path, num_actors=2, envs_per_actor=2, num_eval_envs=1, epsilon_base=0.4,
                        epsilon_alpha=7.0, eval_epsilon=0.01, epsilon_anneal_steps=6)
    fresh.act(_QFromObservation(), batch, {})
    assert fresh.act(_QFromObservation(), batch, {}).action.tolist() == [1, 0, 0, 0, 0]


def test_annealing_counts_each_envs_own_steps(tmp_path, monkeypatch):
    """An env anneals over its own steps times the number of training envs, whichever device or batch serves
    it: env 0 after 2 steps is at 2 x 3 = 6 of 6 (its own epsilon) while env 1, never served, is still at 1."""
    agent = _tiny_agent(tmp_path, num_actors=2, envs_per_actor=2, num_eval_envs=1, epsilon_base=0.4,
                        epsilon_alpha=7.0, eval_epsilon=0.01, epsilon_anneal_steps=6)
    only_env_0 = _vector_batch([0])
    for _ in range(2):
        agent.act(_QFromObservation(), only_env_0, {})
    assert agent.acted_on(torch.device("cpu")).tolist() == [2, 0, 0, 0]
    monkeypatch.setattr(torch, "randint", lambda low, high, size, device=None: torch.ones(size, dtype=torch.int64))
    monkeypatch.setattr(torch, "rand", lambda n, device=None: torch.full((n,), 0.5))
    both = _vector_batch([0, 1])
    assert agent.act(_QFromObservation(), both, {}).action.tolist() == [0, 1]  # env 0 at 0.4, env 1 at 1


def test_a_resumed_agent_anneals_on_from_the_checkpoints_steps(tmp_path, monkeypatch):
    agent = _tiny_agent(tmp_path, num_actors=2, envs_per_actor=2, num_eval_envs=1, epsilon_base=0.4,
                        epsilon_alpha=7.0, eval_epsilon=0.01, epsilon_anneal_steps=6)
    agent.resume_acting(4)  # 4 agent steps of 4 envs: one each, so 3 of the 3 training envs' 6 annealing steps
    assert agent.acted_on(torch.device("cpu")).tolist() == [1, 1, 1, 1]
    batch = _vector_batch([0, 1, 2])
    monkeypatch.setattr(torch, "randint", lambda low, high, size, device=None: torch.ones(size, dtype=torch.int64))
    monkeypatch.setattr(torch, "rand", lambda n, device=None: torch.full((n,), 0.69))  # env 0's: 0.5 + 0.4 / 2
    assert agent.act(_QFromObservation(), batch, {}).action.tolist() == [1, 0, 0]
    agent.resume_acting(8)  # a device that already counts is set too
    assert agent.acted_on(torch.device("cpu")).tolist() == [2, 2, 2, 2]


def test_negative_epsilon_anneal_steps_is_refused(tmp_path):
    with pytest.raises(ValueError, match="--epsilon_anneal_steps: got -5, expected >= 0"):
        _config(tmp_path, epsilon_anneal_steps=-5)


def test_act_explores_with_each_env_ids_own_epsilon(tmp_path, monkeypatch):
    agent = _tiny_agent(tmp_path, num_actors=2, envs_per_actor=2, num_eval_envs=1, epsilon_base=0.4,
                        epsilon_alpha=7.0, eval_epsilon=0.01)
    # 3 training envs: 0.4^(1 + 7 i / 2) for i = 0, 1, 2; env 3 is the eval env; row 4 is a padded row past
    # the last env id (it gets the last epsilon).
    epsilons = [0.4, 0.4 ** 4.5, 0.4 ** 8, 0.01, 0.01]
    batch = _vector_batch([0, 1, 2, 3, 4])
    monkeypatch.setattr(torch, "randint", lambda low, high, size, device=None: torch.ones(size, dtype=torch.int64))
    for factor, explores in ((0.99, True), (1.01, False)):  # a draw just under / just over each env's epsilon
        draws = torch.tensor(epsilons) * factor
        monkeypatch.setattr(torch, "rand", lambda n, device=None, draws=draws: draws[:n].clone())
        action = agent.act(_QFromObservation(), batch, {}).action
        assert action.tolist() == [1 if explores else 0] * 5, (factor, action.tolist())
