"""Clipped LARS (SpeedyZero, Mei et al. 2023, eq. 1 and appendix A.3): momentum SGD whose step per weight tensor
is scaled by LARS's trust ratio clipped to at most 1, so it only ever shrinks a step that would be too large for
the tensor's norm, never magnifies one (plain LARS's over-regularisation early in training, their Fig. 3c).

For a weight tensor w with gradient g, weight decay beta, base learning rate gamma and momentum mu:

    ratio = min(eta ||w|| / (||g|| + beta ||w||), 1)     (1 where ||w|| = 0 or the denominator is 0)
    v     <- mu v + ratio (g + beta w)
    w     <- w - gamma v

Momentum accumulates the already-scaled update, as in LARS (You et al. 2017, Algorithm 1) and NVIDIA's LARC with
clipping; the paper states only the momentum-free rule. Biases and normalisation parameters (every tensor of a
BatchNorm / LayerNorm / GroupNorm, and every tensor of at most one dimension) get plain momentum SGD: no weight
decay and ratio 1 (`lars_bn_bias_eta` > 0 instead gives them the clipped ratio with that eta, as the paper's
appendix does with 0.05, still without weight decay).

Warm start (appendix A.3): the first `warmup_steps` steps are plain momentum SGD with weight decay (ratio 1 for
every tensor); Clipped LARS applies from then on. A tensor whose norm is 0 (EfficientZero zero-initialises its
last layers) keeps ratio 1 until it has grown: the formula would freeze it at 0.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from seed.config import OPTIMIZERS, LearnerConfig
from seed.contracts.agent import Agent

_NORM_LAYERS = (nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm)


def split_lars_parameters(network: nn.Module) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """(weights, excluded): the trainable tensors that get Clipped LARS with weight decay, and the biases and
    normalisation parameters that do not (each tensor of a norm layer, a name starting with 'bias' such as an
    LSTM's bias_ih_l0, or any tensor of at most one dimension)."""
    norm_parameters = {id(p) for module in network.modules() if isinstance(module, _NORM_LAYERS)
                       for p in module.parameters(recurse=False)}
    weights, excluded = [], []
    for name, parameter in network.named_parameters():
        if not parameter.requires_grad:
            continue
        is_bias = name.rsplit(".", 1)[-1].startswith("bias")
        if id(parameter) in norm_parameters or is_bias or parameter.dim() <= 1:
            excluded.append(parameter)
        else:
            weights.append(parameter)
    return weights, excluded


class ClippedLARS(torch.optim.Optimizer):
    """Clipped LARS over parameter groups; a group's `lars` (bool) says whether it gets the trust ratio and
    `weight_decay` its beta (see the module docstring for the rule).

    Args:
      params: tensors or parameter groups (dicts with 'params' and optional per-group overrides).
      lr: base learning rate gamma.
      eta: trust coefficient of the `lars` groups.
      weight_decay: beta of the `lars` groups (other groups set their own, 0 from `clipped_lars`).
      momentum: mu.
      warmup_steps: steps of plain momentum SGD (ratio 1 everywhere) before the trust ratio applies.
    """

    def __init__(self, params: Iterable[Any], lr: float, eta: float = 1e-3, weight_decay: float = 0.0,
                 momentum: float = 0.9, warmup_steps: int = 0):
        for name, value in (("learning_rate", lr), ("lars_eta", eta), ("weight_decay", weight_decay)):
            if value < 0:
                raise ValueError(f"{name}: got {value}, expected >= 0")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum: got {momentum}, expected in [0, 1)")
        if warmup_steps < 0:
            raise ValueError(f"lars_warmup_steps: got {warmup_steps}, expected >= 0")
        defaults = dict(lr=lr, eta=eta, weight_decay=weight_decay, momentum=momentum, lars=True,
                        warmup_steps=warmup_steps)
        super().__init__(params, defaults)

    @property
    def steps(self) -> int:
        """Optimizer steps taken (the warm start counts these); kept under the state's 'steps' key, which
        `state_dict` carries as it is, so a resumed run continues the warm start where it stopped."""
        return int(self.state.get("steps", 0))

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        steps = self.steps
        for group in self.param_groups:
            warming_up = steps < group["warmup_steps"]
            use_ratio = not warming_up and group["lars"]
            beta, eta, mu = group["weight_decay"], group["eta"], group["momentum"]
            for w in group["params"]:
                if w.grad is None:
                    continue
                g = w.grad
                update = g.add(w, alpha=beta) if beta else g.clone()
                if use_ratio:
                    update.mul_(trust_ratio(w, g, eta, beta))
                state = self.state[w]
                if mu:
                    buffer = state.get("momentum_buffer")
                    if buffer is None:
                        buffer = state["momentum_buffer"] = update
                    else:
                        buffer.mul_(mu).add_(update)
                    update = buffer
                w.add_(update, alpha=-group["lr"])
        self.state["steps"] = steps + 1
        return loss


def trust_ratio(w: torch.Tensor, g: torch.Tensor, eta: float, beta: float) -> torch.Tensor:
    """min(eta ||w|| / (||g|| + beta ||w||), 1) as a 0-d tensor on w's device; 1 where ||w|| = 0 or the
    denominator is 0 (no host synchronisation)."""
    w_norm = torch.linalg.vector_norm(w)
    denominator = torch.linalg.vector_norm(g) + beta * w_norm
    ratio = eta * w_norm / denominator
    defined = (w_norm > 0) & (denominator > 0)
    return torch.where(defined, ratio.clamp(max=1.0), torch.ones_like(ratio))


def clipped_lars(network: nn.Module, lr: float, eta: float, weight_decay: float, momentum: float,
                 warmup_steps: int, bn_bias_eta: float = 0.0) -> ClippedLARS:
    """Clipped LARS over `network`'s trainable tensors: weights get the trust ratio and weight decay; biases and
    normalisation parameters get neither (plain momentum SGD), or the clipped ratio with `bn_bias_eta` when it
    is > 0."""
    weights, excluded = split_lars_parameters(network)
    groups = [{"params": weights}]
    if excluded:
        groups.append({"params": excluded, "weight_decay": 0.0, "lars": bn_bias_eta > 0,
                       "eta": bn_bias_eta})
    return ClippedLARS(groups, lr=lr, eta=eta, weight_decay=weight_decay, momentum=momentum,
                       warmup_steps=warmup_steps)


class HeldOptimizerState:
    """The optimizer's state dict, held by a learner whose training process owns the optimizer itself: what the
    child starts from and what a checkpoint writes after the child stopped. None until there is a state (a fresh
    start: the child builds a new optimizer).

    Building a torch optimizer imports torch._dynamo (2-2.5 s of a learner's start-up on a busy core), which
    the learner's own process never needs when it does not step the optimizer.
    """

    def __init__(self, state: dict[str, Any] | None = None):
        self.state = state

    def state_dict(self) -> dict[str, Any] | None:
        return self.state

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        self.state = state

    def build(self, agent: Agent, config: LearnerConfig) -> torch.optim.Optimizer:
        """The optimizer itself, from this state and `config`'s hyperparameters (the training process; a learner
        with --training_process stepped in its own process, as a library may: `Learner.train_step`)."""
        optimizer = make_optimizer(agent, config)
        load_optimizer_state(optimizer, self.state)
        return optimizer


def learner_optimizer(agent: Agent, config: LearnerConfig) -> torch.optim.Optimizer | HeldOptimizerState:
    """The learner process's optimizer: the real one when it trains itself; with --training_process only its
    state (the child builds the optimizer)."""
    return HeldOptimizerState() if config.training_process else make_optimizer(agent, config)


def load_optimizer_state(optimizer: torch.optim.Optimizer | HeldOptimizerState,
                         state: dict[str, Any] | None) -> None:
    """Loads a checkpoint's optimizer state into `optimizer`: its moments and step counts, with the
    hyperparameters `optimizer` was built with (`with_hyperparameters_of`). A checkpoint without optimizer state
    (None: written before a training process reported one, so before any update) leaves a real optimizer fresh;
    a HeldOptimizerState only holds the state (`build` applies the hyperparameters)."""
    if isinstance(optimizer, HeldOptimizerState):
        optimizer.load_state_dict(state)
    elif state is not None:
        optimizer.load_state_dict(with_hyperparameters_of(optimizer, state))


def with_hyperparameters_of(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> dict[str, Any]:
    """`state` (an optimizer state dict) with each parameter group's settings replaced by `optimizer`'s, which
    it was built with from this run's flags: a run resumed with another --learning_rate, --adam_epsilon,
    --lars_eta, ... steps with it, where torch's `load_state_dict` alone would restore the checkpoint's.

    A setting only the checkpoint's group has is dropped: PPO's `initial_lr`, so its annealing restarts from the
    configured rate and goes on from the update count. `state` itself is not changed; groups that differ in
    number are left for `load_state_dict` to refuse."""
    saved = state["param_groups"]
    if len(saved) != len(optimizer.param_groups):
        return state
    groups = [{**{key: value for key, value in now.items() if key != "params"}, "params": before["params"]}
              for before, now in zip(saved, optimizer.param_groups, strict=True)]
    return {**state, "param_groups": groups}


def make_optimizer(agent: Agent, config: LearnerConfig) -> torch.optim.Optimizer:
    """The learner's optimizer (the same in the learner process and the training process): --optimizer=adam
    (the default) or clipped_lars (seed/training/optimizers.py), over `agent.network`'s parameters (Adam: in the
    agent's `parameter_groups`, each at its own "lr" where it names one)."""
    if config.optimizer == "clipped_lars":
        return clipped_lars(agent.network, lr=config.learning_rate, eta=config.lars_eta,
                            weight_decay=config.weight_decay, momentum=config.momentum,
                            warmup_steps=config.lars_warmup_steps, bn_bias_eta=config.lars_bn_bias_eta)
    if config.optimizer != "adam":
        raise ValueError(f"--optimizer: got {config.optimizer!r}, expected {' or '.join(OPTIMIZERS)}")
    # fused: one kernel per step over all parameters where the device has one (CPU and CUDA): on the MuJoCo PPO
    # preset's 2 x 64 MLPs a step takes 4.5 ms against foreach's 5.3 (one thread, this VM); else foreach (one
    # multi-tensor update instead of a Python loop over parameters, which CPU defaults to).
    groups = agent.parameter_groups()
    devices = {p.device.type for group in groups for p in group["params"]}
    kernel = {"fused": True} if devices <= {"cpu", "cuda"} else {"foreach": True}
    return torch.optim.Adam(groups, lr=config.learning_rate, eps=config.adam_epsilon,
                            betas=(config.adam_beta1, 0.999), **kernel)
