"""The MuZero update against the reference it replaced (docs/performance/cpu/muzero_update.md): the loss as
batched tensor code (one cross-entropy per term over every unroll step, no Python loop per step) and the ResNet
in channels-last memory must train exactly what the per-step loss on the NCHW network trained: the same losses,
metrics, priorities, gradients and batch-norm running statistics on fixed inputs, to float32 tolerance (the
sums run in another order). `reference_loss` is the per-step loss as it was (agents/muzero/losses.py at
b736832), kept here verbatim so the fast version is checked against the one a reader can follow step by step."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from seed.agents.muzero import networks
from seed.agents.muzero.agent import MuZeroAgent
from seed.agents.muzero.losses import (
    _cross_entropy,
    predicted_values,
    scale_gradient,
    start_priorities,
    trained_starts,
    unroll_targets,
)
from seed.agents.muzero.targets import gather_unroll, scalar_to_support, support_to_scalar
from seed.config import LearnerConfig
from seed.contracts.training import LossOutput, TrainingBatch, Unroll
from seed.envs import make_spec
from seed.learner.configuration import resolve_config


def reference_normalize_latent(latent: torch.Tensor) -> torch.Tensor:
    """normalize_latent as it was: through a flattened (NCHW-ordered) copy."""
    flat = latent.flatten(1)
    low = flat.min(1, keepdim=True).values
    high = flat.max(1, keepdim=True).values
    return ((flat - low) / (high - low).clamp(min=1e-5)).view_as(latent)


def reference_loss(network: nn.Module, target_network: nn.Module, batch: TrainingBatch, config: LearnerConfig,
                train_steps: int, stacked_observations: Callable[[Unroll], torch.Tensor]) -> LossOutput:
    """The loss of `network` on `batch` (see the module docstring), value targets bootstrapped with
    `target_network` at the horizons of parameter version `train_steps`; `stacked_observations` maps sequences
    [L, B] to the stacked observations [L, B, S, *frame] the networks read (the agent's frame stacking)."""
    c = config
    unrolls = batch.unrolls
    length, batch_size = unrolls.reward.shape
    starts, k_steps = c.unroll_length, c.unroll_steps
    if length < starts + k_steps + c.td_steps:
        raise ValueError(f"training batch: got sequences of {length} steps, expected >= unroll_length + unroll_steps"
                         f" + td_steps = {starts + k_steps + c.td_steps}")
    stacked = stacked_observations(unrolls).flatten(0, 1)  # [L * B, S, *frame]

    # Every stored position through the representation once: the starts' latents (with gradient) and the
    # consistency targets (their projections, detached).
    latent_all = network.represent(stacked)
    latent_shape = latent_all.shape[1:]
    with torch.no_grad():
        bootstrap = predicted_values(target_network, stacked, length, batch_size)
        targets = unroll_targets(unrolls, bootstrap, c, train_steps)
        z, z_mask, alive = targets["z"], targets["z_mask"], targets["alive"]
        value_target, value_mask = targets["value"], targets["value_mask"]
        prefix_target, policy_target = targets["prefix"], targets["policy"]
        projection_target = network.project(latent_all.detach(), with_predictor=False).detach()
        projection_target = gather_unroll(projection_target.view(length, batch_size, -1), starts, k_steps)
        actions = gather_unroll(unrolls.action, starts, k_steps)  # [K + 1, U, B]

    latent = latent_all.view(length, batch_size, *latent_shape)[:starts].flatten(0, 1)  # [U * B, ...]
    policy_logits, value_logits = network.predict(latent)
    start_value = support_to_scalar(value_logits.detach()).view(starts, batch_size)
    lstm = network.initial_state_lstm(latent.shape[0], latent.device)
    per_step = {name: [] for name in ("policy", "value", "reward", "consistency")}

    def add(name: str, k: int, values: torch.Tensor, mask: torch.Tensor) -> None:
        per_step[name].append((k, values.view(starts, batch_size) * mask[k].to(values.dtype)))

    def add_predictions(k: int, policy: torch.Tensor, value: torch.Tensor) -> None:
        add("policy", k, _cross_entropy(policy, policy_target[k].flatten(0, 1)), alive)
        add("value", k, _cross_entropy(value, scalar_to_support(value_target[k].flatten(0, 1),
                                                                c.value_support_size)), value_mask)

    add_predictions(0, policy_logits, value_logits)
    for k in range(1, k_steps + 1):
        latent = scale_gradient(latent, 0.5)
        latent, prefix_logits, lstm, policy_logits, value_logits = network.recurrent_inference(
            latent, actions[k - 1].flatten(), lstm)
        if k % c.value_prefix_horizon == 0:
            lstm = (torch.zeros_like(lstm[0]), torch.zeros_like(lstm[1]))
        add_predictions(k, policy_logits, value_logits)
        prefix_support = scalar_to_support(prefix_target[k].flatten(0, 1), c.reward_support_size)
        add("reward", k, _cross_entropy(prefix_logits, prefix_support), targets["reward_mask"])
        predicted = network.project(latent, with_predictor=True)
        similarity = F.cosine_similarity(predicted, projection_target[k].flatten(0, 1), dim=-1)
        add("consistency", k, -similarity, alive)

    costs = {"policy": c.policy_cost, "value": c.value_cost, "reward": c.reward_cost,
             "consistency": c.consistency_cost}
    weights = batch.importance_weights if batch.importance_weights is not None else torch.ones(batch_size)
    weights = weights.to(latent.device).float()
    positions = max(1, trained_starts(unrolls, starts))  # = targets["start"][0].sum()
    total = torch.zeros((), device=latent.device)
    metrics: dict[str, Any] = {}
    for name, terms in per_step.items():
        # k = 0 counts fully, each later unroll step 1 / K (MuZero).
        summed = sum(values * (1.0 if k == 0 else 1.0 / k_steps) for k, values in terms)
        term = (summed * weights).sum() / positions
        total = total + costs[name] * term
        metrics[f"losses/{name}"] = float(term.detach())
    metrics["losses/total"] = float(total.detach())

    start_mask = targets["start"][0] & z_mask[:starts]
    errors = start_value - z[:starts]
    priorities = start_priorities(start_value, z[:starts], start_mask, c.priority_eta)
    count = start_mask.sum().clamp(min=1)
    metrics.update({
        "value/start_mean": float((start_value * start_mask).sum() / count),
        "value/target_mean": float((z[:starts] * start_mask).sum() / count),
        "value/abs_error_mean": float((errors.abs() * start_mask).sum() / count),
        "search/root_value_mean": float((unrolls.root_value[:starts].float() * start_mask).sum() / count),
        "updated_priorities_mean": float(priorities.mean()),
    })
    return LossOutput(total, metrics, priorities.detach())


# --- fixed inputs ------------------------------------------------------------------------------------------------


def _config(tmp_path, env: str, **overrides) -> LearnerConfig:
    values = dict(agent="muzero", env=env, logdir=str(tmp_path), batch_size=3, torch_threads=1, latent_channels=8,
                  latent_size=16, projection_size=32, lstm_size=16, value_support_size=10, reward_support_size=4,
                  max_abs_reward=1.0, td_age_updates=3, value_prefix_horizon=3, target_update_interval=1000)
    values.update(overrides)
    return resolve_config(values)


def _batch(config: LearnerConfig, spec, seed: int = 0) -> TrainingBatch:
    """Sequences [L, 3] with everything the masks branch on: terminations inside the unrolls, a truncation, a
    column whose first steps are padding, rewards beyond the clip, old steps (a shorter value horizon) and
    unequal importance weights."""
    generator = torch.Generator().manual_seed(seed)
    length, columns = config.burn_in + config.unroll_length + 1, config.batch_size
    shape = (length, columns, *spec.observation_shape)
    if spec.observation_dtype == "bool":
        observation = torch.rand(shape, generator=generator) < 0.3
    else:
        observation = torch.randn(shape, generator=generator)
    done = torch.zeros(length, columns, dtype=torch.bool)
    done[4, 0] = done[13, 0] = done[7, 1] = done[11, 2] = True
    truncated = torch.zeros_like(done)
    truncated[11, 2] = True
    valid = torch.ones_like(done)
    valid[:3, 1] = False
    policy = torch.rand(length, columns, spec.num_actions, generator=generator)
    steps = dict(observation=observation, reward=3 * torch.randn(length, columns, generator=generator), done=done,
                 truncated=truncated, valid=valid, prev_action=torch.zeros(length, columns, dtype=torch.long),
                 action=torch.randint(0, spec.num_actions, (length, columns), generator=generator),
                 policy_version=torch.randint(0, 10, (length, columns), generator=generator),
                 search_policy=policy / policy.sum(-1, keepdim=True),
                 root_value=torch.randn(length, columns, generator=generator))
    weights = torch.rand(columns, generator=generator) + 0.5
    return TrainingBatch(Unroll(steps, {}, torch.arange(columns)), weights)


def _reference_network(network: nn.Module) -> nn.Module:
    """The same parameters in the layout the reference ran in: NCHW (contiguous) weights and inputs."""
    reference = copy.deepcopy(network)
    if isinstance(reference, networks.ResNetMuZeroNetwork):
        reference.memory_format = torch.contiguous_format
        reference.to(memory_format=torch.contiguous_format)
    return reference


def _update(network: nn.Module, target_network: nn.Module, loss_fn, batch, config, stacked, train_steps: int
            ) -> tuple[LossOutput, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """One SGD update with `loss_fn`: its loss output, the gradients, and the parameters and buffers after. SGD,
    not Adam: Adam's step on a gradient of float noise (the biases before a batch norm) is a full learning rate
    in a random direction."""
    optimizer = torch.optim.SGD(network.parameters(), lr=0.1)
    out = loss_fn(network, target_network, batch, config, train_steps, stacked)
    optimizer.zero_grad(set_to_none=True)
    out.loss.backward()
    gradients = {name: p.grad.clone() for name, p in network.named_parameters() if p.grad is not None}
    optimizer.step()
    return out, gradients, {k: v.clone() for k, v in network.state_dict().items()}


# --- the update against the reference ----------------------------------------------------------------------------


@pytest.mark.parametrize("env", ["minatar:breakout", "fake:vector"])
def test_the_update_trains_what_the_reference_trained(tmp_path, monkeypatch, env):
    """Two SGD updates on fixed sequences, each from the same parameters: every loss term, metric, priority and
    gradient, and the parameters and batch-norm statistics after, equal the reference's (the per-step loss on
    NCHW weights) to float32 tolerance. Seen failing with the 1 / K weight of the unroll steps applied at k = 0 too,
    and with the consistency term's k shifted by one."""
    from seed.agents.muzero.losses import muzero_loss

    torch.manual_seed(0)
    config = _config(tmp_path, env)
    spec = make_spec(env, config.env_options())
    agent = MuZeroAgent(spec, config)
    batch = _batch(config, spec)
    reference_network = _reference_network(agent.network)
    reference_target = _reference_network(agent.target_network)
    for train_steps in (10, 11):  # the second from the first's parameters and batch-norm statistics, copied
        fast = _update(agent.network, agent.target_network, muzero_loss, batch, config, agent.stacked_observations,
                       train_steps)
        with monkeypatch.context() as patch:
            patch.setattr(networks, "normalize_latent", reference_normalize_latent)
            slow = _update(reference_network, reference_target, reference_loss, batch, config,
                           agent.stacked_observations, train_steps)
        out, expected = fast[0], slow[0]
        assert out.metrics.keys() == expected.metrics.keys()
        for name, value in expected.metrics.items():
            assert out.metrics[name] == pytest.approx(value, rel=1e-5, abs=1e-6), (train_steps, name)
        torch.testing.assert_close(out.loss, expected.loss, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(out.priorities, expected.priorities, rtol=1e-5, atol=1e-6)
        assert fast[1].keys() == slow[1].keys()
        for name, gradient in slow[1].items():
            _assert_close_to_scale(fast[1][name], gradient, (train_steps, name))
        for name, value in slow[2].items():  # parameters, batch-norm running means, variances and counts
            _assert_close_to_scale(fast[2][name], value, (train_steps, name))
        reference_network.load_state_dict(agent.network.state_dict())


def _assert_close_to_scale(got: torch.Tensor, expected: torch.Tensor, what: Any) -> None:
    """Every element within 1e-3 of the tensor's largest magnitude (+ 1e-7 for the gradients of float noise that
    the biases before a batch norm get): a convolution's weight gradient sums thousands of products in an order
    that depends on the memory format, so its small elements carry the large ones' rounding (measured: at most
    1.5e-5 of the largest on the first update, 3.7e-4 on the second, where batch norm over nearly constant
    channels amplifies it). From parameters that differ by that much the next update's gradients differed by up
    to 3e-3, hence each update from the same parameters."""
    error = float((got.double() - expected.double()).abs().max())
    scale = float(expected.double().abs().max())
    assert error <= 1e-3 * scale + 1e-7, (what, error, scale)


def test_the_resnet_in_either_memory_format_computes_the_same_values():
    """channels_last=True (the default) against the NCHW layout on the same parameters: representation,
    dynamics, prediction, value prefix and projection."""
    torch.manual_seed(0)
    fast = networks.ResNetMuZeroNetwork((10, 10, 4), 1, 6, 8, 1, 16, 10, 4, projection_size=32,
                                        predictor_hidden=16, torso="minatar")
    slow = networks.ResNetMuZeroNetwork((10, 10, 4), 1, 6, 8, 1, 16, 10, 4, projection_size=32,
                                        predictor_hidden=16, torso="minatar", channels_last=False)
    slow.load_state_dict(fast.state_dict())
    assert fast.stem.weight.is_contiguous(memory_format=torch.channels_last)
    assert slow.stem.weight.is_contiguous()
    observation = torch.rand(12, 1, 10, 10, 4) < 0.3
    action = torch.randint(0, 6, (12,))
    results = []
    for network in (fast, slow):
        latent, policy, value = network.initial_inference(observation)
        lstm = network.initial_state_lstm(12, latent.device)
        recurrent = network.recurrent_inference(latent, action, lstm)
        results.append([latent, policy, value, recurrent[0], recurrent[1], *recurrent[2], recurrent[3],
                        recurrent[4], network.project(recurrent[0], with_predictor=True)])
    assert results[0][0].is_contiguous(memory_format=torch.channels_last)
    for got, expected in zip(*results, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
