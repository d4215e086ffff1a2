"""Clipped LARS (seed/training/optimizers.py) against the formula computed by hand in NumPy, and --optimizer for every
agent."""

from __future__ import annotations

import io
import threading

import numpy as np
import pytest
import torch
from torch import nn

from seed.training.optimizers import ClippedLARS, clipped_lars, split_lars_parameters

LR, ETA, BETA, MU = 0.1, 0.02, 0.01, 0.9


class _Net(nn.Module):
    """A weight matrix, its bias and a BatchNorm (weight and bias): one tensor of each kind."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 2)
        self.norm = nn.BatchNorm1d(2)

    def forward(self, x):
        return self.norm(self.linear(x))


def _net_with_gradients(seed: int = 0, grad_scale: float = 1.0) -> _Net:
    torch.manual_seed(seed)
    net = _Net()
    with torch.no_grad():
        net.norm.weight.uniform_(0.5, 1.5)
        net.norm.bias.uniform_(-0.5, 0.5)
    _set_gradients(net, seed, grad_scale)
    return net


def _set_gradients(net: nn.Module, seed: int, grad_scale: float = 1.0) -> None:
    generator = torch.Generator().manual_seed(seed + 100)
    for p in net.parameters():
        p.grad = grad_scale * torch.randn(p.shape, generator=generator)


def _expected_first_step(w: np.ndarray, g: np.ndarray, lars: bool) -> np.ndarray:
    """One step from a zero momentum buffer: w - lr * ratio * (g + beta w), by hand."""
    if not lars:  # bias / norm parameter: plain SGD (the first momentum step is the update itself)
        return w - LR * g
    ratio = min(ETA * np.linalg.norm(w) / (np.linalg.norm(g) + BETA * np.linalg.norm(w)), 1.0)
    return w - LR * ratio * (g + BETA * w)


def _numpy(net: nn.Module) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    return {name: (p.detach().double().numpy().copy(), p.grad.double().numpy().copy())
            for name, p in net.named_parameters()}


def test_biases_and_norm_parameters_are_excluded_from_the_trust_ratio_and_weight_decay():
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.LSTM(4, 4), nn.LayerNorm(4), nn.Linear(4, 2, bias=False))
    weights, excluded = split_lars_parameters(net)
    names = {id(p): name for name, p in net.named_parameters()}
    assert sorted(names[id(p)] for p in weights) == ["0.weight", "2.weight_hh_l0", "2.weight_ih_l0", "4.weight"]
    assert sorted(names[id(p)] for p in excluded) == ["0.bias", "1.bias", "1.weight", "2.bias_hh_l0",
                                                      "2.bias_ih_l0", "3.bias", "3.weight"]


def test_one_step_matches_the_formula_for_a_weight_a_bias_and_a_batchnorm_weight():
    net = _net_with_gradients()
    before = _numpy(net)
    optimizer = clipped_lars(net, lr=LR, eta=ETA, weight_decay=BETA, momentum=MU, warmup_steps=0)
    optimizer.step()
    w, g = before["linear.weight"]
    ratio = ETA * np.linalg.norm(w) / (np.linalg.norm(g) + BETA * np.linalg.norm(w))
    assert 0.0 < ratio < 1.0  # the weight's step is scaled down (a ratio below 1 is kept)
    for name, lars in (("linear.weight", True), ("linear.bias", False), ("norm.weight", False),
                       ("norm.bias", False)):
        after = dict(net.named_parameters())[name].detach().double().numpy()
        np.testing.assert_allclose(after, _expected_first_step(*before[name], lars), rtol=1e-5, atol=1e-7,
                                   err_msg=name)


def test_a_trust_ratio_above_one_is_clipped_to_one():
    w = torch.tensor([[3.0, 4.0]])  # ||w|| = 5
    g = torch.tensor([[0.0, 1e-3]])  # eta ||w|| / (||g|| + beta ||w||) = 0.1 / 0.051 ~ 1.96
    weight = nn.Parameter(w.clone())
    weight.grad = g.clone()
    assert ETA * 5.0 / (1e-3 + BETA * 5.0) > 1.0
    ClippedLARS([weight], lr=LR, eta=ETA, weight_decay=BETA, momentum=0.0).step()
    expected = w.double().numpy() - LR * 1.0 * (g.double().numpy() + BETA * w.double().numpy())
    np.testing.assert_allclose(weight.detach().double().numpy(), expected, rtol=1e-6)


def test_momentum_accumulates_the_scaled_update():
    net = _net_with_gradients()
    optimizer = clipped_lars(net, lr=LR, eta=ETA, weight_decay=BETA, momentum=MU, warmup_steps=0)
    w0, g0 = _numpy(net)["linear.weight"]
    optimizer.step()
    _set_gradients(net, seed=7)
    w1, g1 = _numpy(net)["linear.weight"]
    optimizer.step()
    ratio = lambda w, g: min(ETA * np.linalg.norm(w) / (np.linalg.norm(g) + BETA * np.linalg.norm(w)), 1.0)
    v1 = ratio(w0, g0) * (g0 + BETA * w0)
    v2 = MU * v1 + ratio(w1, g1) * (g1 + BETA * w1)
    np.testing.assert_allclose(net.linear.weight.detach().double().numpy(), w1 - LR * v2, rtol=1e-5, atol=1e-7)


def test_the_warm_start_is_plain_momentum_sgd_then_the_ratio_applies():
    net = _net_with_gradients()
    optimizer = clipped_lars(net, lr=LR, eta=ETA, weight_decay=BETA, momentum=0.0, warmup_steps=1)
    w0, g0 = _numpy(net)["linear.weight"]
    optimizer.step()  # step 0 of 1 warm-up step: ratio 1, weight decay kept
    np.testing.assert_allclose(net.linear.weight.detach().double().numpy(), w0 - LR * (g0 + BETA * w0), rtol=1e-5)
    w1, g1 = _numpy(net)["linear.weight"]
    optimizer.step()  # the warm start is over: Clipped LARS
    np.testing.assert_allclose(net.linear.weight.detach().double().numpy(), _expected_first_step(w1, g1, True),
                               rtol=1e-5, atol=1e-7)
    assert optimizer.steps == 2


def test_a_zero_weight_tensor_moves_with_ratio_one():
    """EfficientZero zero-initialises its last layers; the formula's ratio 0 would freeze them forever."""
    weight = nn.Parameter(torch.zeros(2, 2))
    weight.grad = torch.ones(2, 2)
    ClippedLARS([weight], lr=LR, eta=ETA, weight_decay=BETA, momentum=MU).step()
    torch.testing.assert_close(weight.detach(), torch.full((2, 2), -LR))


def test_bn_bias_eta_gives_the_excluded_tensors_the_clipped_ratio_without_weight_decay():
    net = _net_with_gradients(grad_scale=10.0)
    before = _numpy(net)
    clipped_lars(net, lr=LR, eta=ETA, weight_decay=BETA, momentum=0.0, warmup_steps=0, bn_bias_eta=0.05).step()
    w, g = before["norm.weight"]
    ratio = min(0.05 * np.linalg.norm(w) / np.linalg.norm(g), 1.0)
    assert ratio < 1.0
    np.testing.assert_allclose(net.norm.weight.detach().double().numpy(), w - LR * ratio * g, rtol=1e-5)


def test_a_resumed_optimizer_takes_the_identical_next_step():
    net = _net_with_gradients()
    optimizer = clipped_lars(net, lr=LR, eta=ETA, weight_decay=BETA, momentum=MU, warmup_steps=2)
    for step in range(2):  # through the warm start: the step count must travel with the state
        _set_gradients(net, seed=step)
        optimizer.step()
    buffer = io.BytesIO()
    torch.save({"net": net.state_dict(), "optimizer": optimizer.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    resumed_net = _Net()
    resumed_net.load_state_dict(saved["net"])
    resumed = clipped_lars(resumed_net, lr=LR, eta=ETA, weight_decay=BETA, momentum=MU, warmup_steps=2)
    resumed.load_state_dict(saved["optimizer"])
    assert resumed.steps == 2
    for each in (net, resumed_net):
        _set_gradients(each, seed=9)
    optimizer.step()
    resumed.step()
    for (name, a), b in zip(net.named_parameters(), resumed_net.parameters(), strict=True):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("agent", ["vtrace", "r2d2", "ppo"])
def test_make_optimizer_gives_every_agent_clipped_lars(tmp_path, agent):
    from seed.agents import agent_class
    from seed.envs import make_spec
    from seed.learner.configuration import resolve_config
    from seed.training.optimizers import make_optimizer

    extra = dict(sync="hts") if agent == "ppo" else {}
    config = resolve_config(dict(agent=agent, env="gym:CartPole-v1", logdir=str(tmp_path), optimizer="clipped_lars",
                                 learning_rate=0.05, lars_warmup_steps=3, **extra))
    instance = agent_class(agent)(make_spec(config.env, config.env_options()), config)
    optimizer = make_optimizer(instance, config)
    assert isinstance(optimizer, ClippedLARS)
    weights, excluded = optimizer.param_groups
    assert weights["lars"] and weights["weight_decay"] == config.weight_decay
    assert not excluded["lars"] and excluded["weight_decay"] == 0.0
    assert weights["warmup_steps"] == 3 and weights["lr"] == 0.05
    trained = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert trained == {id(p) for p in instance.network.parameters()}
    assert isinstance(make_optimizer(instance, resolve_config(dict(agent=agent, env="gym:CartPole-v1",
                                                                   logdir=str(tmp_path), **extra))),
                      torch.optim.Adam)


def test_an_unknown_optimizer_is_refused_naming_the_flag(tmp_path):
    """Refused when the configuration resolves (before anything is built), so --print_config refuses it too with
    the one-line error, and make_optimizer still refuses a configuration that skipped the checks."""
    import dataclasses
    import subprocess
    import sys

    from seed.learner.configuration import resolve_config
    from seed.training.optimizers import make_optimizer

    with pytest.raises(ValueError, match="--optimizer: got 'lamb', expected adam or clipped_lars"):
        resolve_config(dict(env="gym:CartPole-v1", logdir=str(tmp_path), optimizer="lamb"))
    cli = subprocess.run([sys.executable, "-m", "seed.learner.main", "--print_config", "--optimizer=no_such_optimizer",
                          f"--logdir={tmp_path}"], capture_output=True, text=True, timeout=120)
    assert cli.returncode == 2 and cli.stdout == ""
    assert cli.stderr.strip() == ("seed-learner: --optimizer: got 'no_such_optimizer', expected adam or "
                                  "clipped_lars"), cli.stderr
    config = dataclasses.replace(resolve_config(dict(env="gym:CartPole-v1", logdir=str(tmp_path))), optimizer="lamb")
    with pytest.raises(ValueError, match="--optimizer: got 'lamb', expected adam or clipped_lars"):
        make_optimizer(None, config)


def test_a_vtrace_learner_trains_with_clipped_lars_in_its_training_process(processes, tmp_path):
    """The real learner (optimizer steps in the training process) and one actor: updates happen, the weights
    move, and the checkpoint holds Clipped LARS's state (its step count == the updates)."""
    from seed.learner.configuration import resolve_config
    from seed.learner.learner import Learner
    from seed.runtime import checkpoint

    config = resolve_config(dict(env="fake:vector", logdir=str(tmp_path / "run"), server_address=f"unix:{tmp_path}/s",
                                 num_actors=1, envs_per_actor=4, batch_size=4, unroll_length=5, torch_threads=1,
                                 fake_episode_length=20, training_process=True, max_train_steps=8,
                                 optimizer="clipped_lars", learning_rate=0.05, lars_warmup_steps=4))
    learner = Learner(config)
    initial = {k: v.clone() for k, v in learner.parts.agent.network.state_dict().items()}
    raised: list[BaseException] = []
    runner = threading.Thread(target=lambda: _run(learner, raised))
    runner.start()
    processes.actor([f"--{k}={v}" for k, v in dict(env="fake:vector", server_address=f"unix:{tmp_path}/s",
                                                    actor_index=0, envs_per_actor=4,
                                                    fake_episode_length=20).items()], "actor0")
    runner.join(120)
    if runner.is_alive():
        learner.request_stop()
        runner.join(30)
        pytest.fail("the learner did not stop at --max_train_steps")
    assert not raised, raised
    assert learner.parts.metrics.train_steps == 8
    _, saved = checkpoint.latest(config.logdir)
    assert saved["optimizer"]["state"]["steps"] == 8
    assert any(not torch.equal(saved["agent"]["network"][k], v) for k, v in initial.items())


def _run(learner, raised: list[BaseException]) -> None:
    try:
        learner.run()
    except BaseException as error:  # noqa: BLE001 - inspected by the test
        raised.append(error)
