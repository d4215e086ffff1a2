"""PPO math against written-out references, counter-based sampling, the HTS sync point, the PPO agent's update
and the configuration checks of --agent=ppo, --sync and --deterministic."""

import numpy as np
import pytest
import torch

from seed.agents.counter_rng import counter_uniforms, gumbel_max_sample
from seed.agents.ppo.agent import PPOAgent as Agent
from seed.agents.ppo.ppo import clipped_surrogate_loss, gae, normalize
from seed.contracts.training import TrainingBatch, Unroll
from seed.envs import make_spec
from seed.inference.rollout_gate import RolloutGate
from seed.learner.configuration import resolve_config
from seed.training.update import policy_lag


def _reference_gae(rewards, values, bootstrap, dones, gamma, lam):
    """GAE by an explicit loop over Python floats; dones[t] means the episode ended after step t."""
    T, B = len(rewards), len(rewards[0])
    advantages = [[0.0] * B for _ in range(T)]
    for b in range(B):
        next_advantage, next_value = 0.0, bootstrap[b]
        for t in reversed(range(T)):
            mask = 0.0 if dones[t][b] else 1.0
            delta = rewards[t][b] + gamma * mask * next_value - values[t][b]
            next_advantage = delta + gamma * lam * mask * next_advantage
            advantages[t][b] = next_advantage
            next_value = values[t][b]
    return advantages


def test_gae_matches_an_explicit_backward_loop_with_done_masking():
    rewards = [[1.0, 0.0], [0.5, 2.0], [-1.0, 1.0], [0.0, 0.25]]
    values = [[0.3, 1.0], [0.7, -0.2], [0.1, 0.4], [0.9, 0.6]]
    dones = [[False, False], [True, False], [False, False], [False, True]]
    bootstrap = [2.0, -3.0]
    gamma, lam = 0.9, 0.8
    out = gae(torch.tensor(rewards), torch.tensor(values), torch.tensor(bootstrap),
              (~torch.tensor(dones)).float() * gamma, lam)
    expected = torch.tensor(_reference_gae(rewards, values, bootstrap, dones, gamma, lam))
    torch.testing.assert_close(out.advantages, expected)
    torch.testing.assert_close(out.returns, expected + torch.tensor(values))
    # Hand check of one entry: env 0, t = 1 ends its episode, so A_1 = r_1 - V_1 exactly.
    assert out.advantages[1, 0].item() == pytest.approx(0.5 - 0.7)
    # Env 1's last step ends an episode: the bootstrap value -3 never enters its advantages.
    assert out.advantages[3, 1].item() == pytest.approx(0.25 - 0.6)


def test_gae_lambda_one_is_the_discounted_return_minus_the_value():
    rewards = torch.tensor([[1.0], [2.0], [3.0]])
    values = torch.tensor([[0.5], [0.25], [0.125]])
    out = gae(rewards, values, torch.tensor([4.0]), torch.full((3, 1), 0.5), 1.0)
    returns = [1 + 0.5 * 2 + 0.25 * 3 + 0.125 * 4, 2 + 0.5 * 3 + 0.25 * 4, 3 + 0.5 * 4]
    torch.testing.assert_close(out.returns[:, 0], torch.tensor(returns))


def test_gae_rejects_mismatched_shapes_naming_the_field():
    with pytest.raises(ValueError, match="values: got shape"):
        gae(torch.zeros(3, 2), torch.zeros(3, 1), torch.zeros(2), torch.zeros(3, 2), 0.9)
    with pytest.raises(ValueError, match="bootstrap: got shape"):
        gae(torch.zeros(3, 2), torch.zeros(3, 2), torch.zeros(3), torch.zeros(3, 2), 0.9)


def test_clipped_surrogate_by_hand_on_both_sides_of_the_clip():
    ratios = torch.tensor([0.5, 0.9, 1.1, 1.5, 0.5, 1.5])
    advantages = torch.tensor([1.0, 1.0, 1.0, 1.0, -1.0, -1.0])
    behaviour = torch.tensor([-1.0, -0.5, -2.0, -0.1, -0.3, -1.2])
    log_probs = (behaviour + ratios.log()).requires_grad_()
    out = clipped_surrogate_loss(log_probs, behaviour, advantages, clip=0.2)
    # min(r A, clip(r, 0.8, 1.2) A) per sample:
    #   A > 0: r=0.5 -> 0.5 (unclipped is smaller), 0.9 -> 0.9, 1.1 -> 1.1, 1.5 -> 1.2 (clipped)
    #   A < 0: r=0.5 -> -0.8 (clipped: min(-0.5, -0.8)), r=1.5 -> -1.5 (unclipped)
    expected = -(0.5 + 0.9 + 1.1 + 1.2 - 0.8 - 1.5) / 6
    assert out.loss.item() == pytest.approx(expected, abs=1e-6)
    assert out.clip_fraction.item() == pytest.approx(4 / 6)
    out.loss.backward()
    # Gradient flows only where the unclipped term is the minimum: d/dlogp (-r A / 6) = -r A / 6.
    grad = -(ratios * advantages) / 6
    expected_grad = torch.where(torch.tensor([True, True, True, False, False, True]), grad, torch.zeros(6))
    torch.testing.assert_close(log_probs.grad, expected_grad)


def test_normalize_gives_zero_mean_unit_std():
    x = normalize(torch.tensor([1.0, 2.0, 3.0, 10.0]))
    assert abs(x.mean().item()) < 1e-6 and x.std(unbiased=False).item() == pytest.approx(1.0, abs=1e-5)


def test_counter_uniforms_depend_only_on_seed_env_and_step():
    env_ids, steps = torch.tensor([0, 1, 2, 3]), torch.tensor([5, 5, 7, 0])
    u = counter_uniforms(3, env_ids, steps, 6)
    assert u.shape == (4, 6) and bool(((u > 0) & (u < 1)).all())
    # A row alone, or in another batch order, draws the same numbers.
    assert torch.equal(counter_uniforms(3, env_ids[2:3], steps[2:3], 6)[0], u[2])
    assert torch.equal(counter_uniforms(3, env_ids.flip(0), steps.flip(0), 6).flip(0), u)
    assert not torch.equal(counter_uniforms(4, env_ids, steps, 6), u)  # another seed
    assert not torch.equal(counter_uniforms(3, env_ids, steps + 1, 6), u)  # another step
    many = counter_uniforms(0, torch.arange(2000), torch.zeros(2000, dtype=torch.long), 1)
    assert abs(many.mean().item() - 0.5) < 0.03


def test_gumbel_max_on_counter_uniforms_samples_the_softmax():
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]])).expand(20000, 3)
    u = counter_uniforms(1, torch.arange(20000), torch.zeros(20000, dtype=torch.long), 3)
    frequencies = torch.bincount(gumbel_max_sample(logits, u), minlength=3).double() / 20000
    torch.testing.assert_close(frequencies, torch.tensor([0.7, 0.2, 0.1], dtype=torch.float64), atol=0.02, rtol=0)


def _serve(gate, actors, seqs, run=1):
    kept, _, _ = gate.admit(np.array(actors), np.array(seqs), np.full(len(actors), run))
    gate.stepped(kept)
    return kept.tolist()


def test_rollout_gate_holds_every_actor_at_the_sync_point_until_the_version_is_published():
    gate = RolloutGate(np.array([0, 1]), 2, rollout_steps=3)
    for step in range(3):  # rollout 0 (steps 0..2) for both actors
        assert _serve(gate, [0, 1], [step, step]) == [0, 1]
    assert _serve(gate, [1], [3]) == []  # actor 1 at the sync point: held
    assert gate.try_open(published_version=0) is None  # actor 0 is not there yet
    assert _serve(gate, [0], [3]) == []
    batches = gate.try_open(published_version=0)  # rollout 1 is played with version 0
    assert [a.tolist() for a, _ in batches] == [[0, 1]] and [s.tolist() for _, s in batches] == [[3, 3]]
    assert _serve(gate, [0, 1], [3, 3]) == [0, 1]  # served after opening
    for step in (4, 5):
        _serve(gate, [0, 1], [step, step])
    assert _serve(gate, [0, 1], [6, 6]) == []
    assert gate.try_open(published_version=0) is None  # rollout 2 needs version 1 (the update on rollout 0)
    assert gate.try_open(published_version=1) is not None
    with pytest.raises(RuntimeError, match="policy version: got 3"):
        for step in (6, 7, 8):
            _serve(gate, [0, 1], [step, step])
        _serve(gate, [0, 1], [9, 9])
        gate.try_open(published_version=3)


def test_rollout_gate_lets_a_new_actor_run_join_the_rollout_in_progress():
    gate = RolloutGate(np.array([0, 1]), 2, rollout_steps=2, actors_per_batch=1)
    for step in range(2):
        _serve(gate, [0, 1], [step, step])
    _serve(gate, [0, 1], [2, 2])
    assert [a.tolist() for a, _ in gate.try_open(0)] == [[0], [1]]  # one actor per batch
    _serve(gate, [0, 1], [2, 2])  # rollout 1: steps 2 and 3
    assert _serve(gate, [0], [3]) == [0]
    assert _serve(gate, [0], [4]) == [] and set(gate.held) == {0}
    # Actor 1 restarts (run 2) in the middle of rollout 1: it plays the whole rollout from its start.
    assert _serve(gate, [1], [0], run=2) == [1]
    assert _serve(gate, [1], [1], run=2) == [1]
    assert gate.try_open(1) is None
    assert _serve(gate, [1], [2], run=2) == [] and set(gate.held) == {0, 1}
    assert [s.tolist() for _, s in gate.try_open(1)] == [[4], [2]]


def _config(tmp_path, **values):
    return resolve_config({"logdir": str(tmp_path / "run"), "num_actors": 2, "envs_per_actor": 2, **values})


def test_ppo_defaults_to_hts_with_one_rollout_per_unroll_and_every_env_per_batch(tmp_path):
    config = _config(tmp_path, agent="ppo", num_eval_envs=1)
    assert config.sync == "hts" and config.unroll_length == config.sync_every == 32  # the gym default
    assert config.batch_size == 3  # 4 envs, one evaluating
    assert _config(tmp_path, agent="vtrace").sync == "async"
    assert _config(tmp_path, agent="ppo", deterministic=True).inference_batch_size == 2


@pytest.mark.parametrize("values, message", [
    (dict(agent="vtrace", sync="hts"), "--sync=hts: not supported by --agent=vtrace"),
    (dict(agent="r2d2", sync="hts"), "--sync=hts: not supported by --agent=r2d2"),
    (dict(agent="ppo", sync="async", deterministic=True), "--deterministic: .*--sync=async"),
    (dict(agent="ppo", deterministic=True, inference_devices="cuda:0,cuda:1"),
     "--deterministic: .*--inference_devices"),
    (dict(agent="ppo", deterministic=True, inference_device="cuda:0"), "--deterministic: .*--cuda_graphs"),
    (dict(agent="ppo", batch_size=2), "--batch_size: got 2, expected 4"),
    (dict(agent="ppo", unroll_length=20), "--unroll_length: got 20, expected 32"),
    (dict(agent="ppo", ppo_minibatches=8), "--ppo_minibatches: got 8, expected >= 1 and <= batch_size \\(4\\)"),
    (dict(agent="ppo", sync="sometimes"), "--sync: got 'sometimes', expected hts or async"),
    (dict(agent="ppo", sync_lag=2), "--sync_lag: got 2, expected 0 \\(synchronous\\) or 1"),
    (dict(agent="vtrace", sync_lag=0), "--sync_lag: got 0 with --sync=async, expected 1"),
    (dict(agent="ppo", ppo_value_clip=-0.2), "--ppo_value_clip: got -0.2, expected >= 0"),
    (dict(agent="ppo", ppo_decoupled_weight_clip=-1.0), "--ppo_decoupled_weight_clip: got -1.0, expected >= 0"),
    (dict(agent="ppo", ppo_shuffle_steps=True, ppo_minibatches=129),
     "--ppo_minibatches: got 129, expected >= 1 and <= batch_size x unroll_length \\(128\\)"),
    (dict(agent="ppo", ppo_shuffle_steps=True, use_lstm=True), "--ppo_shuffle_steps: got True, expected False with "
                                                               "--use_lstm"),
])
def test_impossible_settings_are_refused_naming_the_flags(tmp_path, values, message):
    with pytest.raises(ValueError, match=message):
        _config(tmp_path, **values)


def _rollout(agent, steps, envs, generator):
    spec = agent.spec
    observation = torch.randn((steps + 1, envs, *spec.observation_shape), generator=generator)
    logits = torch.randn((steps + 1, envs, spec.num_actions), generator=generator)
    unroll_steps = {
        "observation": observation, "reward": torch.rand((steps + 1, envs), generator=generator),
        "done": torch.rand((steps + 1, envs), generator=generator) < 0.1,
        "prev_action": torch.randint(spec.num_actions, (steps + 1, envs), generator=generator),
        "action": torch.randint(spec.num_actions, (steps + 1, envs), generator=generator),
        "policy_logits": logits, "baseline": torch.zeros(steps + 1, envs),
        "valid": torch.ones(steps + 1, envs, dtype=torch.bool),
    }
    return TrainingBatch(Unroll(unroll_steps, agent.initial_state(envs), torch.arange(envs)))


@pytest.mark.parametrize("name, scenario", [("football_close_ppo", "academy_empty_goal_close"),
                                            ("football_goal_ppo", "academy_empty_goal")])
def test_football_ppo_presets_have_hts_rl_hyperparameters(tmp_path, name, scenario):
    config = resolve_config({"logdir": str(tmp_path / "run"), "preset": name})
    assert config.env == f"football:{scenario}"
    assert (config.agent, config.sync, config.sync_every, config.unroll_length) == ("ppo", "hts", 128, 128)
    # HTS-RL's 16 training envs, plus 2 evaluation envs that the batch leaves out.
    assert (config.num_envs, config.num_eval_envs, config.batch_size) == (18, 2, 16)
    assert (config.ppo_epochs, config.ppo_minibatches) == (2, 8)
    assert config.learning_rate == 3.43e-4 and config.football_rewards == "scoring,checkpoints"
    assert config.network == "football_small"


def test_pong_ppo_preset_has_cleanrl_atari_hyperparameters(tmp_path):
    config = resolve_config({"logdir": str(tmp_path / "run"), "preset": "pong_ppo"})
    assert (config.agent, config.sync, config.sync_every, config.batch_size) == ("ppo", "hts", 128, 14)
    assert (config.ppo_epochs, config.ppo_minibatches, config.ppo_clip, config.learning_rate) == (4, 4, 0.1, 2.5e-4)
    assert (config.entropy_cost, config.grad_clip_norm, config.lambda_) == (0.01, 0.5, 0.95)


@pytest.mark.parametrize("flags, minibatches", [
    (dict(envs_per_actor=1, sync_every=1024), 32),  # single steps: 2 x 1,024 steps split 32 ways, as CleanRL's
    (dict(envs_per_actor=1, sync_every=8), 16),  # 16 steps in all: one step per minibatch
    (dict(envs_per_actor=1, sync_every=1024, ppo_shuffle_steps=False), 2),  # whole columns: one env each
])
def test_a_presets_minibatch_count_is_capped_by_what_the_rollout_splits_into(tmp_path, flags, minibatches):
    """hopper_ppo's 32 minibatches are kept with fewer envs when minibatches hold single steps; lowered only to the
    number of steps (--ppo_shuffle_steps) or env columns (without) the rollout has."""
    config = resolve_config({"logdir": str(tmp_path / "run"), "preset": "hopper_ppo", **flags})
    assert config.ppo_minibatches == minibatches


def test_train_rollout_is_epochs_times_minibatches_steps_and_repeatable(tmp_path):
    config = _config(tmp_path, agent="ppo", env="fake:vector", ppo_epochs=3, ppo_minibatches=2, sync_every=6)
    spec = make_spec(config.env, config.env_options())
    results = []
    for _ in range(2):
        torch.manual_seed(0)
        agent = Agent(spec, config)
        optimizer = torch.optim.Adam(agent.network.parameters(), lr=1e-3)
        batch = _rollout(agent, 6, config.batch_size, torch.Generator().manual_seed(1))
        metrics = agent.train_rollout(batch, optimizer, 0.5, update=7)
        results.append((agent.network.state_dict(), metrics, optimizer.state_dict()["state"]))
    (first, metrics, adam), (second, _, _) = results
    assert all(int(s["step"]) == 3 * 2 for s in adam.values())  # 3 epochs x 2 minibatches optimizer steps
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert {"losses/policy", "losses/V", "policy/clip_fraction", "policy/approx_kl", "gradient_norm"} <= set(metrics)


def test_policy_lag_counts_updates_since_the_oldest_valid_acting_version():
    versions = torch.tensor([[3, 5], [4, 5], [2, 0]])  # [T + 1, B]; the last step is only the bootstrap
    valid = torch.tensor([[False, True], [True, True], [True, True]])
    unrolls = Unroll({"policy_version": versions, "valid": valid, "reward": torch.zeros(3, 2)}, {}, torch.arange(2))
    assert policy_lag(unrolls, train_steps=6) == 6 - 4  # version 3 is padding, 2 and 0 only bootstrap


def test_single_step_columns_hold_each_step_and_its_successor(tmp_path):
    from seed.agents.ppo.agent import single_step_columns

    config = _config(tmp_path, agent="ppo", env="fake:vector", sync_every=5)
    agent = Agent(make_spec(config.env, config.env_options()), config)
    unrolls = _rollout(agent, 5, config.batch_size, torch.Generator().manual_seed(2)).unrolls
    advantages, returns = torch.randn(5, 4), torch.randn(5, 4)
    columns, column_advantages, column_returns = single_step_columns(unrolls, advantages, returns)
    assert columns.observation.shape == (2, 20, *unrolls.observation.shape[2:])
    for j in range(20):
        t, b = divmod(j, 4)
        for key in unrolls.steps:
            assert torch.equal(columns.steps[key][0, j], unrolls.steps[key][t, b])
            assert torch.equal(columns.steps[key][1, j], unrolls.steps[key][t + 1, b])
        assert int(columns.env_id[j]) == b
        assert column_advantages[0, j] == advantages[t, b] and column_returns[0, j] == returns[t, b]


def test_shuffled_steps_train_like_columns_when_one_minibatch_holds_the_rollout(tmp_path):
    """One epoch of one minibatch holds every step either way: the same loss, so the same update; with 8
    minibatches of single steps each optimizer step sees 5 x 4 / 8 steps drawn across envs and times."""
    parameters = []
    for shuffle, minibatches in ((False, 1), (True, 1), (True, 8)):
        config = _config(tmp_path, agent="ppo", env="fake:vector", ppo_epochs=1, ppo_minibatches=minibatches,
                         sync_every=5, ppo_shuffle_steps=shuffle)
        torch.manual_seed(0)
        agent = Agent(make_spec(config.env, config.env_options()), config)
        optimizer = torch.optim.Adam(agent.network.parameters(), lr=1e-2)
        batch = _rollout(agent, 5, config.batch_size, torch.Generator().manual_seed(1))
        agent.train_rollout(batch, optimizer, 0.5, update=0)
        assert all(int(s["step"]) == minibatches for s in optimizer.state_dict()["state"].values())
        parameters.append(torch.cat([p.detach().flatten() for p in agent.network.parameters()]))
    columns, steps, eight = parameters
    torch.testing.assert_close(steps, columns, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(eight, columns, atol=1e-4)


def test_shuffled_steps_are_refused_for_a_frame_stacking_env(tmp_path):
    config = _config(tmp_path, agent="ppo", env="fake:atari", ppo_shuffle_steps=True)
    with pytest.raises(ValueError, match="--ppo_shuffle_steps: got True, expected False for fake:atari: the network "
                                         "stacks its 4 frames"):
        Agent(make_spec(config.env, config.env_options()), config)


@pytest.mark.parametrize("env, values", [("fake:vector", {}), ("fake:vector", {"use_lstm": True}),
                                         ("fake:atari", {})])
def test_the_loss_network_run_drops_the_bootstrap_row_without_changing_the_other_rows(tmp_path, env, values):
    """minibatch_loss runs the network on steps 0..T-1 only: that holds because every network is causal (an LSTM's
    or a frame stack's output at t reads inputs up to t), so those rows equal the [T + 1] run's first T."""
    config = _config(tmp_path, agent="ppo", env=env, sync_every=5, **values)
    torch.manual_seed(0)
    agent = Agent(make_spec(config.env, config.env_options()), config)
    generator = torch.Generator().manual_seed(3)
    unrolls = _rollout(agent, 5, config.batch_size, generator).unrolls
    if env == "fake:atari":  # uint8 frames, as the env sends them
        unrolls.steps["observation"] = torch.randint(0, 256, unrolls.observation.shape, generator=generator,
                                                     dtype=torch.uint8)
    full_logits, full_values = agent._run(unrolls)
    first_steps = Unroll({k: v[:-1] for k, v in unrolls.steps.items()}, unrolls.initial_state, unrolls.env_id)
    logits, values_ = agent._run(first_steps)
    assert logits.shape[0] == 5 and full_logits.shape[0] == 6
    torch.testing.assert_close(logits, full_logits[:-1], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(values_, full_values[:-1], rtol=1e-6, atol=1e-6)


def test_decoupled_surrogate_clips_against_the_proximal_policy_and_weights_by_it():
    """Hilton et al.'s decoupled objective: rho = pi / pi_prox is clipped, each sample weighted by pi_prox / mu."""
    behaviour = torch.tensor([-1.0, -1.0, -1.0, -1.0])
    proximal = behaviour + torch.tensor([1.4, 1.4, 0.7, 1.0]).log()  # pi_prox / mu per sample
    rho = torch.tensor([1.1, 1.3, 0.7, 1.0])  # pi / pi_prox
    advantages = torch.tensor([1.0, 1.0, -1.0, 2.0])
    log_probs = (proximal + rho.log()).requires_grad_()
    out = clipped_surrogate_loss(log_probs, proximal, advantages, clip=0.2, weights=(proximal - behaviour).exp())
    # w min(rho A, clip(rho) A): 1.4 x 1.1, 1.4 x 1.2 (clipped), 0.7 x -0.8 (clipped), 1.0 x 2.0
    assert out.loss.item() == pytest.approx(-(1.4 * 1.1 + 1.4 * 1.2 - 0.7 * 0.8 + 2.0) / 4, abs=1e-6)
    assert out.clip_fraction.item() == pytest.approx(2 / 4)
    out.loss.backward()
    # Unclipped samples keep the plain importance-sampled gradient -(pi / mu) A / 4; pi / mu = 1.54 would clip the
    # first sample in the plain objective (1.54 > 1.2), the decoupled one still trains on it.
    expected = torch.tensor([-1.4 * 1.1 * 1.0, 0.0, 0.0, -1.0 * 1.0 * 2.0]) / 4
    torch.testing.assert_close(log_probs.grad, expected)
    plain = clipped_surrogate_loss(log_probs.detach().requires_grad_(), behaviour, advantages, clip=0.2)
    plain.loss.backward()
    assert plain.clip_fraction.item() == pytest.approx(3 / 4)
    # Where the behaviour is the proximal policy (weights 1) both objectives are the plain one.
    same = clipped_surrogate_loss(log_probs.detach(), behaviour, advantages, 0.2, weights=torch.ones(4))
    assert same.loss.item() == pytest.approx(plain.loss.item(), abs=1e-7)
    with pytest.raises(ValueError, match=r"weights: got shape \[3\], expected \[4\]"):
        clipped_surrogate_loss(log_probs, behaviour, advantages, 0.2, weights=torch.ones(3))


@pytest.mark.parametrize("box", [False, True])
def test_decoupled_ppo_equals_plain_ppo_on_fresh_data_and_reports_the_acting_lag(tmp_path, box):
    """With behaviour policies from the network being trained (no lag) --ppo_decoupled makes the same update as
    plain PPO; acted by an older network (here a perturbed copy) the lag metric is positive and the updates differ."""
    from tests.test_box_policies import BOX, _acted_batch

    results = {}
    for decoupled in (False, True):
        for stale in (False, True):
            env = "gym:Pendulum-v1" if box else "fake:vector"
            config = _config(tmp_path, agent="ppo", env=env, ppo_epochs=2, ppo_minibatches=2, sync_every=6,
                             ppo_decoupled=decoupled)
            spec = BOX if box else make_spec(config.env, config.env_options())
            torch.manual_seed(0)
            agent = Agent(spec, config)
            trained = {k: v.clone() for k, v in agent.network.state_dict().items()}
            if stale:
                with torch.no_grad():
                    for p in agent.network.parameters():
                        p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
            if box:
                batch = _acted_batch(agent, steps=6, envs=config.batch_size)
            else:
                batch = _rollout(agent, 6, config.batch_size, torch.Generator().manual_seed(1))
                with torch.no_grad():
                    batch.unrolls.steps["policy_logits"] = agent._run(batch.unrolls)[0]
            agent.network.load_state_dict(trained)
            optimizer = torch.optim.Adam(agent.network.parameters(), lr=1e-2)
            metrics = agent.train_rollout(batch, optimizer, 0.5, update=3)
            results[decoupled, stale] = (torch.cat([p.detach().flatten() for p in agent.network.parameters()]),
                                         metrics["policy/behaviour_lag_kl"])
    assert results[False, False][1] == pytest.approx(0.0, abs=1e-5)
    assert results[True, True][1] > 1e-4
    torch.testing.assert_close(results[True, False][0], results[False, False][0], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(results[True, True][0], results[False, True][0], atol=1e-5)


def test_value_clip_takes_the_larger_error_of_the_clipped_and_unclipped_value(tmp_path):
    """CleanRL's clip_vloss: 0.5 max((R - V)^2, (R - V_clip)^2), V_clip = V_start + clip(V - V_start, -c, c)."""
    from seed.agents.ppo.agent import START_VALUE

    config = _config(tmp_path, agent="ppo", env="fake:vector", sync_every=5, ppo_value_clip=0.2)
    torch.manual_seed(0)
    agent = Agent(make_spec(config.env, config.env_options()), config)
    generator = torch.Generator().manual_seed(4)
    unrolls = _rollout(agent, 5, config.batch_size, generator).unrolls
    with torch.no_grad():
        _, values = agent._run(unrolls)
    start = values + torch.rand(values.shape, generator=generator) - 0.5  # some within 0.2 of V, some not
    advantages, returns = torch.randn(5, 4, generator=generator), torch.randn(5, 4, generator=generator)
    clipped_unrolls = Unroll({**unrolls.steps, START_VALUE: start}, unrolls.initial_state, unrolls.env_id)
    out = agent.minibatch_loss(clipped_unrolls, advantages, returns)
    v, s = values[:-1], start[:-1]
    clipped = s + (v - s).clamp(-0.2, 0.2)
    expected = config.baseline_cost * 0.5 * torch.max((returns - v) ** 2, (returns - clipped) ** 2).mean()
    assert out.metrics["losses/V"] == pytest.approx(expected.item(), rel=1e-5)
    plain = agent.minibatch_loss(unrolls, advantages, returns).metrics["losses/V"]
    assert plain == pytest.approx((config.baseline_cost * 0.5 * ((returns - v) ** 2).mean()).item(), rel=1e-5)
    assert out.metrics["losses/V"] > plain + 1e-4


def test_decoupled_weights_are_truncated_at_the_weight_clip(tmp_path):
    """--ppo_decoupled_weight_clip=c: each sample's weight pi_prox / mu is min(w, c) in the surrogate."""
    from seed.agents.ppo.agent import PROXIMAL_LOG_PROB

    losses = {}
    for weight_clip in (0.0, 1.0):
        config = _config(tmp_path, agent="ppo", env="fake:vector", sync_every=5, ppo_decoupled=True,
                         ppo_decoupled_weight_clip=weight_clip)
        torch.manual_seed(0)
        agent = Agent(make_spec(config.env, config.env_options()), config)
        generator = torch.Generator().manual_seed(5)
        unrolls = _rollout(agent, 5, config.batch_size, generator).unrolls
        with torch.no_grad():
            logits, _ = agent._run(unrolls)
        actions = unrolls.action[:-1].unsqueeze(-1)
        proximal = torch.log_softmax(logits[:-1], -1).gather(-1, actions).squeeze(-1)
        behaviour = torch.log_softmax(unrolls.policy_logits[:-1], -1).gather(-1, actions).squeeze(-1)
        steps = {**unrolls.steps, PROXIMAL_LOG_PROB: torch.cat([proximal, torch.zeros(1, 4)])}
        advantages = torch.randn(5, 4, generator=generator)
        out = agent.minibatch_loss(Unroll(steps, unrolls.initial_state, unrolls.env_id), advantages,
                                   torch.zeros(5, 4))
        weights = (proximal - behaviour).exp()
        if weight_clip:
            weights = weights.clamp(max=weight_clip)
        assert bool((weights < (proximal - behaviour).exp()).any()) or not weight_clip
        # At the update's start rho = 1, so the surrogate is -mean(w A) over the normalised advantages.
        expected = -(weights * normalize(advantages)).mean()
        assert out.metrics["losses/policy"] == pytest.approx(expected.item(), rel=1e-5, abs=1e-7)
        losses[weight_clip] = out.metrics["losses/policy"]
    assert losses[0.0] != pytest.approx(losses[1.0], abs=1e-6)
