"""PPO and V-trace on Box action spaces (the tanh-Gaussian actor-critic, agents/gaussian_actor_critic.py): the
losses on a batch the agent acted itself (ratios exactly 1, finite gradients), the stored behaviour
log-probabilities, the evaluation policy (the mode), counter-based Gaussian draws, the input statistics' place in
the update and the checkpoint, and both agents trained by the real learner and actors on `gym:Pendulum-v1`."""

import math
import signal

import pytest
import torch

from seed.agents.gaussian_actor_critic import ACTION_LOG_PROB
from seed.agents.normalization import SCALED_REWARD
from seed.agents.ppo.agent import PPOAgent
from seed.agents.vtrace.agent import VTraceAgent
from seed.contracts import InferenceBatch
from seed.contracts.agent import UpdateStep
from seed.contracts.training import TrainingBatch, Unroll
from seed.envs.base import EnvSpec
from seed.learner.configuration import resolve_config
from tests.conftest import read_metrics, wait_for

# Two action dimensions with different bounds, so that the affine map is not the identity.
BOX = EnvSpec("fake:box", (4,), "float32", 0, action_shape=(2,), action_low=(-1.0, 0.0), action_high=(1.0, 4.0))


def _config(tmp_path, agent, **values):
    base = {"logdir": str(tmp_path / "run"), "agent": agent, "env": "gym:Pendulum-v1", "num_actors": 1,
            "envs_per_actor": 4, "use_lstm": False}
    if agent == "ppo":  # PPO's unroll length and batch follow from --sync_every and the env count (HTS)
        base["sync_every"] = 6
    else:
        base.update(unroll_length=6, batch_size=4)
    return resolve_config({**base, **values})


def _acted_batch(agent, steps=6, envs=4, seed=0):
    """An unroll [steps + 1, envs] whose actions and stored outputs come from the agent's own `act`."""
    generator = torch.Generator().manual_seed(seed)
    state = agent.initial_state(envs)
    observation = torch.randn(steps + 1, envs, 4, generator=generator) * 3 + 5
    done = torch.rand(steps + 1, envs, generator=generator) < 0.2
    done[0] = True
    reward = torch.randn(steps + 1, envs, generator=generator)
    columns = {"action": [], "prev_action": [], ACTION_LOG_PROB: [], "baseline": []}
    prev_action = torch.zeros(envs, 2)
    with torch.inference_mode():
        for t in range(steps + 1):
            batch = InferenceBatch(torch.arange(envs), observation[t], reward[t], done[t], prev_action)
            out = agent.act(agent.network, batch, state)
            columns["prev_action"].append(prev_action)
            columns["action"].append(out.action)
            columns[ACTION_LOG_PROB].append(out.outputs[ACTION_LOG_PROB])
            columns["baseline"].append(out.outputs["baseline"])
            prev_action, state = out.action, out.state
    steps_ = {k: torch.stack(v).clone() for k, v in columns.items()}
    steps_.update(observation=observation, reward=reward, done=done,
                  valid=torch.ones(steps + 1, envs, dtype=torch.bool))
    return TrainingBatch(Unroll(steps_, agent.initial_state(envs), torch.arange(envs)))


@pytest.mark.parametrize("agent_class", [PPOAgent, VTraceAgent])
def test_acting_gives_float32_actions_in_the_bounds_with_their_log_prob_and_evaluation_plays_the_mode(
        tmp_path, agent_class):
    torch.manual_seed(0)
    agent = agent_class(BOX, _config(tmp_path, "ppo" if agent_class is PPOAgent else "vtrace", num_eval_envs=1))
    batch = InferenceBatch(torch.arange(4), torch.randn(4, 4), torch.zeros(4), torch.ones(4, dtype=torch.bool),
                           torch.zeros(4, 2))
    with torch.inference_mode():
        out = agent.act(agent.network, batch, agent.initial_state(4))
        mean, _, _ = agent.network(batch.observation[None], None, None, batch.done[None], {})
        dist = agent.network.distribution(mean[0])
        evaluation = agent.evaluation_act(agent.network, batch, agent.initial_state(4))
    assert out.action.dtype == torch.float32 and out.action.shape == (4, 2)
    low, high = torch.tensor([-1.0, 0.0]), torch.tensor([1.0, 4.0])
    assert bool(((out.action >= low) & (out.action <= high)).all())
    torch.testing.assert_close(out.outputs[ACTION_LOG_PROB], dist.log_prob(out.action))
    # The mode: loc + scale tanh(mean) = (0, 2) + (1, 2) tanh(mean), on env 3 (the evaluation env) and in
    # evaluation_act on every row; the training envs sample (a std of 1 makes a tie impossible).
    mode = torch.tensor([0.0, 2.0]) + torch.tensor([1.0, 2.0]) * torch.tanh(mean[0])
    torch.testing.assert_close(out.action[3], mode[3])
    torch.testing.assert_close(evaluation.action, mode)
    assert not torch.allclose(out.action[:3], mode[:3])


def test_ppo_loss_on_its_own_rollout_has_ratios_of_one_and_finite_gradients(tmp_path):
    torch.manual_seed(1)
    agent = PPOAgent(BOX, _config(tmp_path, "ppo"))
    batch = _acted_batch(agent)
    out = agent.loss(batch)
    # Ratio exactly 1 everywhere: no clipping, KL 0, and the surrogate is -mean(normalised advantages) = 0.
    assert out.metrics["policy/clip_fraction"] == 0.0
    assert abs(out.metrics["policy/approx_kl"]) < 1e-6
    assert abs(out.metrics["losses/policy"]) < 1e-6
    assert out.metrics["policy/std"] == pytest.approx(1.0)  # exp(--initial_log_std 0)
    out.loss.backward()
    grads = {name: p.grad for name, p in agent.network.named_parameters()}
    assert all(g is not None and bool(torch.isfinite(g).all()) for g in grads.values()), grads
    assert float(grads["log_std"].abs().sum()) > 0 and float(grads["mean.weight"].abs().sum()) > 0


def test_vtrace_loss_on_its_own_unrolls_has_rhos_of_one_and_finite_gradients(tmp_path):
    torch.manual_seed(2)
    agent = VTraceAgent(BOX, _config(tmp_path, "vtrace"))
    batch = _acted_batch(agent)
    out = agent.loss(batch)
    # Exactly 1 up to float32 rounding (the batch's forward pass groups the rows differently from acting's).
    assert out.metrics["vtrace/rho_mean"] == pytest.approx(1.0, abs=1e-6)
    out.loss.backward()
    grads = {name: p.grad for name, p in agent.network.named_parameters()}
    assert all(g is not None and bool(torch.isfinite(g).all()) for g in grads.values()), grads
    # Off-policy: another network's behaviour log-probs give rhos != 1.
    batch.unrolls.steps[ACTION_LOG_PROB] -= 0.5
    assert agent.loss(batch).metrics["vtrace/rho_mean"] == pytest.approx(math.exp(0.5), rel=1e-5)


def test_deterministic_ppo_draws_depend_only_on_seed_env_and_step(tmp_path):
    agent = PPOAgent(BOX, _config(tmp_path, "ppo", deterministic=True, num_actors=1, envs_per_actor=4))
    state = agent.initial_state(4)
    observation = torch.randn(4, 4)

    def act(rows):
        batch = InferenceBatch(torch.tensor(rows), observation[rows], torch.zeros(len(rows)),
                               torch.ones(len(rows), dtype=torch.bool), torch.zeros(len(rows), 2))
        rows_state = {k: v[rows] for k, v in state.items()}
        with torch.inference_mode():
            return agent.act(agent.network, batch, rows_state)

    both, alone = act([1, 3]), act([3])
    torch.testing.assert_close(both.action[1], alone.action[0])  # env 3's draw with or without env 1 beside it
    assert both.state["sample_step"].tolist() == [1, 1]
    torch.manual_seed(123)  # the global generator plays no part
    torch.testing.assert_close(act([1, 3]).action, both.action)


@pytest.mark.parametrize("agent_name", ["ppo", "vtrace"])
def test_the_update_scales_rewards_and_updates_observation_statistics_after_training(tmp_path, agent_name):
    """Observation statistics join after the update (the update trained with the acting statistics, so PPO's
    first ratios are 1); the reward statistics are in the agent's checkpoint state."""
    torch.manual_seed(3)
    agent_class = PPOAgent if agent_name == "ppo" else VTraceAgent
    config = _config(tmp_path, agent_name, normalize_observations=True, normalize_rewards=True, ppo_epochs=1,
                     ppo_minibatches=1) if agent_name == "ppo" else _config(
        tmp_path, agent_name, normalize_observations=True, normalize_rewards=True)
    agent = agent_class(BOX, config)
    torch.nn.init.orthogonal_(agent.network.mean.weight, 1.0)  # a policy that depends on the observation
    batch = _acted_batch(agent)
    optimizer = torch.optim.Adam(agent.network.parameters(), lr=1e-3)
    metrics = agent.update(batch, optimizer, UpdateStep(train_steps=0)).values
    if agent_name == "ppo":  # one minibatch of the whole rollout, before any parameter changed
        assert metrics["policy/clip_fraction"] == 0.0 and abs(metrics["policy/approx_kl"]) < 1e-6
    moments = agent.network.normalizer.moments
    assert int(moments.count) == 6 * 4  # every step but the last of each column, which the next unroll repeats
    torch.testing.assert_close(moments.mean, batch.unrolls.observation[:-1].reshape(-1, 4).mean(0))
    assert int(agent.reward_scaler.moments.count) == 6 * 4
    state = agent.state_dict()
    assert "normalizer.moments.var" in state["network"] and "returns" in state["reward_scaler"]
    fresh = agent_class(BOX, config)
    fresh.load_state_dict(state)
    torch.testing.assert_close(fresh.reward_scaler.returns, agent.reward_scaler.returns)
    torch.testing.assert_close(fresh.network.normalizer.moments.var, moments.var)
    assert SCALED_REWARD not in batch.unrolls.steps  # the caller's batch is not written


def test_ppo_anneals_the_learning_rate_linearly_over_the_run(tmp_path):
    # 4 envs x 6 steps per rollout and 240 frames: 10 updates; update k trains at 3e-4 x (1 - k / 10).
    config = _config(tmp_path, "ppo", anneal_learning_rate=True, learning_rate=3e-4, total_environment_frames=240,
                     ppo_epochs=1, ppo_minibatches=1)
    agent = PPOAgent(BOX, config)
    optimizer = torch.optim.Adam(agent.network.parameters(), lr=3e-4)
    batch = _acted_batch(agent)
    for update, expected in ((0, 3e-4), (3, 2.1e-4), (9, 3e-5), (12, 0.0)):
        metrics = agent.update(batch, optimizer, UpdateStep(train_steps=update)).values
        assert optimizer.param_groups[0]["lr"] == pytest.approx(expected) == metrics["learning_rate"]
    assert optimizer.state_dict()["param_groups"][0]["initial_lr"] == 3e-4  # a resumed run keeps the schedule


def test_a_box_network_refuses_an_lstm_and_unbounded_actions(tmp_path):
    with pytest.raises(ValueError, match="--use_lstm: got True for fake:box's Box\\(2,\\) actions, expected False"):
        PPOAgent(BOX, _config(tmp_path, "ppo", use_lstm=True))
    unbounded = EnvSpec("fake:box", (4,), "float32", 0, action_shape=(1,), action_low=(-math.inf,),
                        action_high=(math.inf,))
    with pytest.raises(ValueError, match="action bounds: got low \\(-inf,\\), high \\(inf,\\), expected finite"):
        VTraceAgent(unbounded, _config(tmp_path, "vtrace"))


def _box_rows(logdir, min_steps):
    rows = [r for r in read_metrics(logdir) if "policy/std" in r]
    return rows if rows and rows[-1]["train_steps"] >= min_steps else None


@pytest.mark.parametrize("agent, extra", [
    ("ppo", ["--sync_every=50", "--ppo_epochs=2", "--ppo_minibatches=2"]),
    ("vtrace", ["--unroll_length=50", "--batch_size=4"]),
])
def test_pendulum_trains_through_the_real_learner_and_actor(processes, tmp_path, agent, extra):
    """A few updates on gym:Pendulum-v1 with both normalisations: the metrics carry the Box policy's std, the
    logged episode returns are Pendulum's raw ones (-1.2K..0 per 200-step episode; the scaled rewards the loss
    sees would sum to a few units), and the checkpoint holds the observation and reward statistics."""
    from seed.runtime import checkpoint

    logdir, address = str(tmp_path / "run"), f"unix:{tmp_path}/learner.sock"
    learner = processes.learner([
        f"--agent={agent}", "--env=gym:Pendulum-v1", f"--logdir={logdir}", f"--server_address={address}",
        "--num_actors=1", "--envs_per_actor=4", "--log_interval_s=0.5", "--torch_threads=1",
        "--checkpoint_interval_s=3600", "--normalize_observations", "--normalize_rewards", *extra])
    processes.actor(["--env=gym:Pendulum-v1", f"--server_address={address}", "--actor_index=0",
                     "--envs_per_actor=4"], "actor0")
    # Pendulum's episodes are 200 steps: 4 updates of 50-step unrolls of the 4 envs see the first ones end.
    rows = wait_for(lambda: _box_rows(logdir, 5) if any(r.get("episode_return_mean") is not None
                                                        for r in read_metrics(logdir)) else None,
                    90, f"5 {agent} updates and an episode", on_timeout=lambda: processes.output(learner))
    assert all(0.0 < r["policy/std"] < 2.0 and math.isfinite(r["losses/total"]) for r in rows), rows
    returns = [r["episode_return_mean"] for r in read_metrics(logdir) if r.get("episode_return_mean") is not None]
    assert all(-3300.0 < value < -50.0 for value in returns), returns  # 200 steps of rewards in [-16.3, 0]
    learner.send_signal(signal.SIGTERM)
    assert learner.wait(timeout=60) == 0, processes.output(learner)
    _, saved = checkpoint.latest(logdir)
    assert int(saved["agent"]["network"]["normalizer.moments.count"]) > 0
    assert int(saved["agent"]["reward_scaler"]["moments.count"]) > 0


@pytest.mark.parametrize("agent", ["ppo", "vtrace"])
def test_ppo_and_vtrace_take_both_action_spaces(agent):
    from seed.agents import registry
    from seed.contracts.agent import check_action_space
    from seed.envs import make_spec

    for spec in (make_spec("gym:Pendulum-v1"), make_spec("gym:CartPole-v1"), BOX):
        check_action_space(registry.agent_class(agent), spec, agent)


@pytest.mark.parametrize("name, env", [("hopper_ppo", "gym:Hopper-v5"), ("halfcheetah_ppo", "gym:HalfCheetah-v5"),
                                       ("walker2d_ppo", "gym:Walker2d-v5"),
                                       ("halfcheetah_ppo_gpu", "gym:HalfCheetah-v5")])
def test_mujoco_ppo_presets_have_cleanrl_s_hyperparameters(tmp_path, name, env):
    config = resolve_config({"logdir": str(tmp_path / "run"), "preset": name})
    assert (config.agent, config.env, config.sync) == ("ppo", env, "hts")
    # 2048 agent steps per rollout in 32 minibatches of 64 steps shuffled over the whole rollout, 10 epochs, as
    # CleanRL's one env x 2048 steps.
    assert config.batch_size * config.unroll_length == 2048 and config.batch_size == config.num_envs
    assert config.ppo_shuffle_steps
    assert config.batch_size * config.unroll_length // config.ppo_minibatches == 64 and config.ppo_epochs == 10
    assert (config.learning_rate, config.anneal_learning_rate, config.adam_epsilon) == (3e-4, True, 1e-5)
    assert (config.discounting, config.lambda_, config.ppo_clip, config.entropy_cost) == (0.99, 0.95, 0.2, 0.0)
    assert (config.baseline_cost, config.grad_clip_norm, config.mlp_sizes) == (0.5, 0.5, "64,64")
    assert config.normalize_observations and config.normalize_rewards and not config.use_lstm
    assert config.total_environment_frames == 1e6


def test_hopper_ppo_is_cleanrl_s_whole_algorithm_in_16_envs(tmp_path):
    """hopper_ppo adds CleanRL's policy, value clipping and synchronous rollouts to the shared hyperparameters; the
    other two MuJoCo presets keep the tanh squash and HTS's lag on 64 envs."""
    config = resolve_config({"logdir": str(tmp_path / "run"), "preset": "hopper_ppo"})
    assert (config.sync_lag, config.box_policy, config.ppo_value_clip) == (0, "clipped", 0.2)
    assert (config.num_envs, config.unroll_length, config.ppo_minibatches) == (16, 128, 32)
    other = resolve_config({"logdir": str(tmp_path / "run"), "preset": "walker2d_ppo"})
    assert (other.sync_lag, other.box_policy, other.ppo_value_clip, other.num_envs) == (1, "tanh", 0.0, 64)


def test_published_parameters_carry_the_observation_statistics_to_inference(tmp_path):
    """The learner publishes the trained network's state dict; inference's copy then normalises the same way
    (the statistics are buffers, so no separate channel carries them)."""
    from seed.inference.parameter_publisher import ParameterPublisher

    config = _config(tmp_path, "ppo", normalize_observations=True)
    trained, inference = PPOAgent(BOX, config), PPOAgent(BOX, config)
    trained.network.normalizer.update(torch.randn(100, 4) * 3 + 5)
    publisher = ParameterPublisher(inference.network, torch.device("cpu"))
    publisher.publish(trained.network.state_dict(), version=1)
    assert publisher.refresh()
    x = torch.randn(1, 2, 4) * 3 + 5
    done = torch.zeros(1, 2, dtype=torch.bool)
    acted = inference.network(x, None, None, done, {})[0]
    torch.testing.assert_close(acted, trained.network(x, None, None, done, {})[0])
    assert int(inference.network.normalizer.moments.count) == 100


@pytest.mark.parametrize("agent_name", ["ppo", "vtrace"])
def test_the_clipped_box_policy_acts_out_of_the_box_and_its_loss_has_ratios_of_one(tmp_path, agent_name):
    """--box_policy=clipped: actions are unsquashed Gaussian samples (the env clips), stored with their own
    density, so the loss on the agent's own rollout sees ratios of exactly 1; an unknown policy is refused."""
    agent_class = PPOAgent if agent_name == "ppo" else VTraceAgent
    torch.manual_seed(3)
    agent = agent_class(BOX, _config(tmp_path, agent_name, box_policy="clipped", initial_log_std=1.0))
    batch = _acted_batch(agent)
    actions = batch.unrolls.action
    low, high = torch.tensor([-1.0, 0.0]), torch.tensor([1.0, 4.0])
    assert bool(((actions < low) | (actions > high)).any())  # a std of e gives samples beyond the bounds
    metrics = agent.loss(batch).metrics
    if agent_name == "ppo":
        assert metrics["policy/clip_fraction"] == 0.0 and abs(metrics["policy/approx_kl"]) < 1e-6
    else:
        assert metrics["vtrace/rho_mean"] == pytest.approx(1.0, abs=1e-6)
    with pytest.raises(ValueError, match="--box_policy: got 'squashed', expected tanh or clipped"):
        _config(tmp_path, agent_name, box_policy="squashed")
