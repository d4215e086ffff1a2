"""SAC (agents/sac/): the soft target and the three losses by hand, the transitions' masks, the Polyak step, the
temperature's direction, acting, the optimizer's groups, the refusal of a Discrete env, and a run through the real
learner, training process and two actors on Pendulum-v1."""

import json
import math
import signal

import numpy as np
import pytest
import torch

from seed.agents.sac import sac
from seed.agents.sac.agent import CLEANRL_DEFAULTS, SACAgent
from seed.contracts import InferenceBatch
from seed.contracts import agent as contract
from seed.contracts.training import TrainingBatch, Unroll
from seed.envs.base import EnvSpec
from seed.learner.configuration import resolve_config
from seed.runtime import checkpoint
from tests.conftest import read_metrics, wait_for

# A Pendulum-shaped spec: 3 observation values, one action in [-2, 2].
SPEC = EnvSpec("gym:Pendulum-v1", (3,), "float32", 0, action_shape=(1,), action_low=(-2.0,), action_high=(2.0,))


def _config(tmp_path, **overrides):
    values = dict(agent="sac", env="gym:Pendulum-v1", logdir=str(tmp_path), num_actors=1, envs_per_actor=4,
                  batch_size=4, sac_hidden_sizes="8,8", replay_min_size=4, replay_capacity=64, torch_threads=1)
    values.update(overrides)
    return resolve_config(values)


def _sequences(batch: int, length: int = 2, seed: int = 0, **fields) -> Unroll:
    """Random sequences [length, batch] of Pendulum-shaped steps (all valid, no episode end unless given)."""
    g = torch.Generator().manual_seed(seed)
    steps = {
        "observation": torch.randn(length, batch, 3, generator=g),
        "reward": torch.randn(length, batch, generator=g),
        "done": torch.zeros(length, batch, dtype=torch.bool),
        "truncated": torch.zeros(length, batch, dtype=torch.bool),
        "prev_action": torch.rand(length, batch, 1, generator=g) * 4 - 2,
        "action": torch.rand(length, batch, 1, generator=g) * 4 - 2,
        "valid": torch.ones(length, batch, dtype=torch.bool),
        "policy_version": torch.zeros(length, batch, dtype=torch.int64),
    }
    steps.update(fields)
    return Unroll(steps, {}, torch.arange(batch))


def test_soft_target_critic_actor_and_temperature_losses_by_hand():
    # Two transitions (T = 1, B = 2); the second ends its episode in a terminal state.
    reward, terminal = torch.tensor([[0.5, -1.0]]), torch.tensor([[False, True]])
    targets = sac.soft_targets(reward, terminal, next_q1=torch.tensor([[2.0, 3.0]]),
                               next_q2=torch.tensor([[1.5, 4.0]]), next_log_prob=torch.tensor([[-0.5, 0.2]]),
                               alpha=0.2, discount=0.9)
    # y0 = 0.5 + 0.9 (min(2, 1.5) - 0.2 (-0.5)) = 0.5 + 0.9 * 1.6; y1 = -1 (no bootstrap)
    torch.testing.assert_close(targets, torch.tensor([[1.94, -1.0]]))
    q1, q2, trained = torch.tensor([[1.0, -2.0]]), torch.tensor([[2.0, 0.0]]), torch.ones(1, 2, dtype=torch.bool)
    loss, q1_loss, q2_loss = sac.critic_loss(q1, q2, targets, trained)
    # Q1: ((1 - 1.94)^2 + (-2 + 1)^2) / 2 = (0.8836 + 1) / 2; Q2: ((2 - 1.94)^2 + (0 + 1)^2) / 2 = (0.0036 + 1) / 2
    torch.testing.assert_close((loss, q1_loss, q2_loss),
                               (torch.tensor(1.4436), torch.tensor(0.9418), torch.tensor(0.5018)))
    # Importance weights [2, 0.5] per sequence, over the same 2 transitions.
    loss, q1_loss, q2_loss = sac.critic_loss(q1, q2, targets, trained, torch.tensor([2.0, 0.5]))
    torch.testing.assert_close((q1_loss, q2_loss), (torch.tensor((2 * 0.8836 + 0.5) / 2),
                                                    torch.tensor((2 * 0.0036 + 0.5) / 2)))
    # An untrained transition (a time-limit end) counts for nothing, not even in the mean's denominator.
    _, q1_loss, _ = sac.critic_loss(q1, q2, targets, torch.tensor([[True, False]]))
    torch.testing.assert_close(q1_loss, torch.tensor(0.8836))

    # Actor: alpha log pi - min(Q1, Q2): 0.1 (-1) - 2 = -2.1 and 0.1 * 0.5 - 1 = -0.95.
    log_prob, valid = torch.tensor([[-1.0, 0.5]]), torch.ones(1, 2, dtype=torch.bool)
    pi_q1, pi_q2 = torch.tensor([[3.0, 1.0]]), torch.tensor([[2.0, 4.0]])
    torch.testing.assert_close(sac.actor_loss(log_prob, pi_q1, pi_q2, 0.1, valid), torch.tensor(-1.525))
    torch.testing.assert_close(sac.actor_loss(log_prob, pi_q1, pi_q2, 0.1, torch.tensor([[True, False]])),
                               torch.tensor(-2.1))

    # Temperature: -alpha (log pi + target entropy), alpha 0.5, target -1: -0.5 (-2) = 1 and -0.5 (-0.5) = 0.25.
    log_alpha = torch.tensor(math.log(0.5), requires_grad=True)
    alpha_loss = sac.temperature_loss(log_alpha, log_prob, -1.0, valid)
    torch.testing.assert_close(alpha_loss, torch.tensor(0.625))
    alpha_loss.backward()
    # d/dlog_alpha = the loss itself here: positive, so descent lowers alpha (entropy 0.25 is above -1).
    torch.testing.assert_close(log_alpha.grad, torch.tensor(0.625))


def test_transitions_mask_padding_terminal_ends_and_time_limits():
    # Four sequences of 3 steps (2 transitions each): plain; terminal at step 1; time limit at step 1; padding at 0.
    done = torch.tensor([[False, False, False, False], [False, True, True, False], [False, False, False, False]])
    truncated = torch.tensor([[False, False, False, False], [False, False, True, False],
                              [False, False, False, False]])
    valid = torch.tensor([[True, True, True, False], [True, True, True, True], [True, True, True, True]])
    data = sac.transitions(_sequences(4, length=3, done=done, truncated=truncated, valid=valid).steps)
    torch.testing.assert_close(data.terminal, torch.tensor([[False, True, False, False]] + [[False] * 4]))
    torch.testing.assert_close(data.trained, torch.tensor([[True, True, False, False], [True, True, True, True]]))
    torch.testing.assert_close(data.state_valid, torch.tensor([[True, True, True, False], [True] * 4]))
    steps = _sequences(4, length=3).steps
    data = sac.transitions(steps)
    torch.testing.assert_close(data.reward, steps["reward"][1:])  # a_t earns reward[t + 1]
    torch.testing.assert_close(data.next_observation, steps["observation"][1:])
    torch.testing.assert_close(data.action, steps["action"][:-1])


def test_agent_critic_loss_is_the_soft_target_of_its_own_networks(tmp_path):
    """The agent's critic loss on a tiny batch, rebuilt from its networks' outputs with the same noise: the target
    bootstraps from the target critics (not the online ones) at a fresh sample of the policy at s_{t+1}."""
    config = _config(tmp_path, discounting=0.9, sac_initial_alpha=0.3)
    agent = SACAgent(SPEC, config)
    with torch.no_grad():  # the online critics differ from the targets, so a mix-up shows
        for parameter in agent.network.critic.parameters():
            parameter.add_(0.5)
    unrolls = _sequences(3, done=torch.tensor([[False] * 3, [False, True, False]]))
    torch.manual_seed(7)
    out = agent.loss(TrainingBatch(unrolls))
    torch.manual_seed(7)
    obs, next_obs = unrolls.observation[0], unrolls.observation[1]
    next_action, next_log_prob = agent.network.actor.distribution(next_obs).rsample_with_log_prob()
    target_q1, target_q2 = agent.target_network(next_obs, next_action)
    y = unrolls.reward[1] + 0.9 * torch.tensor([1.0, 0.0, 1.0]) * (torch.minimum(target_q1, target_q2)
                                                                  - 0.3 * next_log_prob)
    q1, q2 = agent.network.critic(obs, unrolls.action[0])
    expected = ((q1 - y) ** 2).mean() + ((q2 - y) ** 2).mean()
    torch.testing.assert_close(out.loss, expected.detach(), rtol=1e-5, atol=1e-6)
    # Sequences of one transition: the priority is that transition's mean |TD error| over the twin critics.
    torch.testing.assert_close(out.priorities, (0.5 * ((q1 - y).abs() + (q2 - y).abs())).detach(), rtol=1e-5,
                               atol=1e-6)


def test_polyak_update_moves_the_target_by_tau():
    online, target = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    with torch.no_grad():
        for p in online.parameters():
            p.fill_(1.0)
        for p in target.parameters():
            p.fill_(0.0)
    sac.polyak_update(target, online, 0.005)
    assert all(torch.allclose(p, torch.full_like(p, 0.005)) for p in target.parameters())
    sac.polyak_update(target, online, 0.005)  # 1 - 0.995^2
    assert all(torch.allclose(p, torch.full_like(p, 0.009975)) for p in target.parameters())
    assert all(torch.equal(p, torch.ones_like(p)) for p in online.parameters())


def _set_log_std(agent, log_std):
    """Makes the actor's log-std head constant: log_std = -5 + 3.5 (tanh(bias) + 1)."""
    with torch.no_grad():
        agent.network.actor.log_std.weight.zero_()
        agent.network.actor.log_std.bias.fill_(math.atanh((log_std + 5.0) / 3.5 - 1.0) if log_std > -5 else -10.0)


@pytest.mark.parametrize("log_std, direction", [(0.0, -1), (-5.0, 1)])
def test_the_temperature_moves_towards_the_target_entropy(tmp_path, log_std, direction):
    """Entropy above the target -D = -1 (std 1: about 1.4 nats) lowers alpha; below it (std e^-5: about -2.9) raises
    it. Only the updates that train the actor (every second) move alpha; every update moves the target critics."""
    from seed.training.optimizers import make_optimizer

    agent = SACAgent(SPEC, _config(tmp_path))
    _set_log_std(agent, log_std)
    optimizer = make_optimizer(agent, agent.config)
    batch = TrainingBatch(_sequences(16))
    alphas, target_before = [], [p.clone() for p in agent.target_network.parameters()]
    for step in range(4):
        output = agent.update(batch, optimizer, contract.UpdateStep(step))
        alphas.append(output.values["alpha"])
        assert ("losses/actor" in output.values) == (step % 2 == 0)
    assert int(agent.network.updates) == 4
    assert all(np.sign(np.diff([1.0] + alphas))[[0, 2]] == direction), alphas
    assert alphas[0] == alphas[1] and alphas[2] == alphas[3]  # odd updates leave alpha alone
    assert all(not torch.equal(a, b) for a, b in zip(target_before, agent.target_network.parameters(), strict=True))


def test_optimizer_groups_train_each_part_at_its_own_rate(tmp_path):
    from seed.training.optimizers import make_optimizer

    agent = SACAgent(SPEC, _config(tmp_path, learning_rate=1e-3, sac_policy_learning_rate=3e-4))
    critic, actor, temperature = make_optimizer(agent, agent.config).param_groups
    assert (critic["lr"], actor["lr"], temperature["lr"]) == (1e-3, 3e-4, 1e-3)
    assert {id(p) for p in actor["params"]} == {id(p) for p in agent.network.actor.parameters()}
    assert temperature["params"] == [agent.network.log_alpha]
    assert sum(len(g["params"]) for g in (critic, actor, temperature)) == len(list(agent.network.parameters()))
    # One update that trains the policy: each step moves its own group only (Adam counts the steps per tensor): one
    # critic step, two actor steps (the actor's loss reaches the critics too, but they must not move) and two
    # temperature steps.
    optimizer = make_optimizer(agent, agent.config)
    agent.update(TrainingBatch(_sequences(8)), optimizer, contract.UpdateStep(0))
    steps = [[int(optimizer.state[p]["step"]) for p in group["params"]] for group in optimizer.param_groups]
    assert steps == [[1] * len(critic["params"]), [2] * len(actor["params"]), [2]]


def test_act_is_uniform_before_training_then_samples_and_eval_envs_take_the_mode(tmp_path):
    agent = SACAgent(SPEC, _config(tmp_path, envs_per_actor=4, num_eval_envs=1))
    network = agent.network
    _set_log_std(agent, -5.0)  # a near-deterministic policy, so its samples sit by its mode
    rows = 400
    batch = InferenceBatch(env_ids=torch.arange(rows) % 4, observation=torch.randn(rows, 3),
                           reward=torch.zeros(rows), done=torch.zeros(rows, dtype=torch.bool),
                           prev_action=torch.zeros(rows, 1))
    mode = network.actor.distribution(batch.observation).mode()
    is_eval = (batch.env_ids == 3).unsqueeze(-1)
    with torch.inference_mode():
        before = agent.act(network, batch, {}).action
    network.updates += 1
    with torch.inference_mode():
        after = agent.act(network, batch, {}).action
        evaluation = agent.evaluation_act(network, batch, {}).action
    assert before.shape == (rows, 1) and before.dtype == torch.float32
    train_before = before[~is_eval]
    assert train_before.min() >= -2 and train_before.max() <= 2 and train_before.std() > 0.9  # U(-2, 2): 1.15
    assert (after - mode)[~is_eval].abs().max() < 0.1 and not torch.equal(after[~is_eval], mode[~is_eval])
    assert torch.equal(before[is_eval], mode[is_eval]) and torch.equal(after[is_eval], mode[is_eval])
    assert torch.equal(evaluation, mode)


def test_a_discrete_env_is_refused_naming_its_action_space(tmp_path):
    cartpole = EnvSpec("gym:CartPole-v1", (4,), "float32", 2)
    with pytest.raises(contract.IncompatibleActionSpace) as refused:
        SACAgent(cartpole, _config(tmp_path))
    assert str(refused.value) == ("--env=gym:CartPole-v1: got a Discrete(2) action space; --agent=sac takes Box "
                                  "actions")


def test_defaults_are_cleanrl_s_and_sampling_is_uniform(tmp_path):
    config = resolve_config(dict(agent="sac", env="gym:Pendulum-v1", logdir=str(tmp_path)))
    assert (config.batch_size, config.unroll_length, config.discounting, config.learning_rate) == (256, 1, 0.99, 1e-3)
    assert (config.sac_policy_learning_rate, config.sac_tau, config.sac_policy_frequency) == (3e-4, 0.005, 2)
    assert (config.replay_capacity, config.replay_min_size, config.replay_ratio) == (1_000_000, 5000, 256.0)
    assert config.priority_exponent == 0.0 and config.burn_in == 0
    assert CLEANRL_DEFAULTS["adam_epsilon"] == 1e-8  # torch's default, which CleanRL's Adam uses


def test_pendulum_trains_through_the_real_learner_training_process_and_two_actors(processes, tmp_path):
    """seed-learner --agent=sac (the optimizer in the training process) and two seed-actor processes over the unix
    socket: updates happen at the replay ratio, the actor and temperature train, SIGTERM exits 0 and the
    checkpoint holds the target critics and the updates count."""
    logdir = str(tmp_path / "run")
    address = f"unix:{tmp_path}/learner.sock"
    common = ["--env=gym:Pendulum-v1", f"--server_address={address}", "--envs_per_actor=2"]
    learner = processes.learner([
        "--agent=sac", *common, f"--logdir={logdir}", "--num_actors=2", "--batch_size=32",
        "--sac_hidden_sizes=32,32", "--replay_capacity=10000", "--replay_min_size=64", "--replay_ratio=32",
        "--log_interval_s=0.5", "--torch_threads=1", "--checkpoint_interval_s=3600", "--training_process"])
    for i in range(2):
        processes.actor([*common, f"--actor_index={i}"], f"actor{i}")

    def trained():
        rows = read_metrics(logdir)
        return rows if rows and rows[-1]["train_steps"] >= 10 else None

    rows = wait_for(trained, 120, "10 SAC updates", on_timeout=lambda: processes.output(learner))
    trained_rows = [r for r in rows if "losses/actor" in r]
    assert trained_rows and all(math.isfinite(r["losses/critic"]) and r["alpha"] > 0 for r in trained_rows)
    learner.send_signal(signal.SIGTERM)
    assert learner.wait(timeout=60) == 0, processes.output(learner)
    found = checkpoint.latest(logdir)
    assert found is not None
    state = found[1]
    assert state["config"]["agent"] == "sac" and state["counters"]["train_steps"] >= 10
    assert int(state["agent"]["network"]["updates"]) == state["counters"]["train_steps"]
    assert set(state["agent"]["target_network"]) == {k[len("critic."):] for k in state["agent"]["network"]
                                                     if k.startswith("critic.")}


def test_sac_learns_the_toy_dial_through_the_real_learner_and_actor(processes, tmp_path, monkeypatch):
    """SAC's short learning test: on the toy family's `dial` (tests/toy_env/, a plug-in; reward 1 - |a - t| for an
    observed target t, 1/3 per step for a uniform random action) the learner (its training process) and one actor
    with an evaluation env (the policy's mode): the evaluation episodes' mean return passes 80% of the best, 8 of 10
    (random: 3.3), within a few hundred updates."""
    monkeypatch.setenv("SEED_RL_PLUGINS", "tests.toy_env")
    logdir = str(tmp_path / "run")
    address = f"unix:{tmp_path}/learner.sock"
    common = ["--env=toy:dial", "--toy_episode_length=10", f"--server_address={address}", "--envs_per_actor=4"]
    learner = processes.learner([
        "--agent=sac", *common, f"--logdir={logdir}", "--num_actors=1", "--num_eval_envs=1", "--seed=1",
        "--log_interval_s=1", "--torch_threads=1", "--checkpoint_interval_s=3600", "--training_process"])
    processes.actor([*common, "--actor_index=0"], "actor0")

    def learned():
        rows = [r for r in read_metrics(logdir) if r.get("eval_episode_return_mean") is not None]
        return rows if rows and rows[-1]["eval_episode_return_mean"] >= 8.0 else None

    rows = wait_for(learned, 240, "an evaluation return of 8 (random: 3.3)",
                    on_timeout=lambda: processes.output(learner)[-3000:] + "\n" + json.dumps(read_metrics(logdir)[-3:]))
    assert rows[-1]["train_steps"] > 0
    learner.send_signal(signal.SIGTERM)
    assert learner.wait(timeout=60) == 0, processes.output(learner)
