"""The agent contract: every member the framework calls on an agent, each with its documented default.

An agent is a folder under agents/ holding a subclass of `Agent` (and its configuration dataclass, networks and
loss); agents/registry.py is the one place that names it. The framework reaches an agent only through this class:
it builds one with `Agent(spec, config)` and calls the members below, never a private one, never by name, never
by probing with hasattr.

Class-level members (read before an agent exists, e.g. while the configuration resolves):

    config_class            the dataclass of the agent's own flags (agents/<name>/config.py)
    default_config(family)  the agent's own values over the dataclass defaults (SAC's CleanRL settings); the env
                            family's table for the agent (envs/<family>.py: AGENT_DEFAULTS) goes over them
    check_config(config)    refusals of the resolved configuration (ValueError naming field, value, expected)
    derive_config(config, explicit)  values computed from others once flags are known (PPO's minibatches)
    describe_config(config) extra keys for --print_config (R2D2: the replay's expected memory)
    evaluation_policy(config)  how the evaluation envs and seed-eval pick actions, in words
    uses_replay             experience through the central prioritized replay (else the FIFO queue)
    supports_sync           the agent trains with --sync=hts
    cuda_graphs             `act` may be captured as CUDA graphs (False when its loop length comes from the host)
    action_spaces           the action spaces it acts on: ("discrete",) by default, "box" for action vectors;
                            `check_action_space` refuses any other env at start (learner, seed-eval)

Instance members (the learner, the training process, inference and seed-eval):

    network                 the trained nn.Module (inference runs a copy of it)
    initial_state(n)        per-env state rows [n, ...]
    to(device)              moves the trained networks
    act / evaluation_act    one inference step, under inference_mode
    loss(batch)             the loss of one batch
    update(batch, optimizer, step)  one learner update (default: loss, backward, clip, optimizer step)
    parameter_groups()      the trained parameters as Adam's groups (default: one of `network`'s; SAC: three rates)
    after_update(train_steps)       after each update (R2D2: the target copy)
    state_dict / load_state_dict    everything to checkpoint besides the optimizer
  with a replay (uses_replay):
    replay_sequence_bytes() the host bytes of one stored sequence (the replay's memory check)
    initial_priorities(unrolls)     priorities of sequences entering the replay
    priorities(unrolls, network, target_network, version)  Priority Refresh's priorities of stored sequences
    target_network          the network priorities bootstrap from, None if none
  with batch workers (optional; seed/training/batch_workers.py):
    batch_workers(config)   class-level: processes that prepare each batch beside the trainer (default 0: none)
    preparation_network()   the network prepare_batch reads and its version, synced to the workers
    prepare_batch(batch, train_steps, version)  the batch the update trains, made in a worker
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np
import torch
from torch import nn

from seed.contracts.inference import ActOutput, InferenceBatch, State
from seed.contracts.training import LossOutput, TrainingBatch, Unroll

if TYPE_CHECKING:
    from seed.envs.base import EnvSpec


class GradientShard(Protocol):
    """One rank's part of a data-parallel update (seed/training/data_parallel.py's Shard): what `Agent.update` uses."""

    world: int

    def batch(self, batch: TrainingBatch) -> tuple[TrainingBatch, float]:
        """This rank's columns of `batch` and the factor that makes the averaged gradient the whole batch's."""

    def columns(self, count: int) -> torch.Tensor:
        """This rank's columns of a batch of `count` columns."""

    def loss_scale(self, share: int, count: int) -> float:
        """The factor of a loss averaged over `share` of `count` columns."""

    def all_reduce_gradients(self, parameters: list[nn.Parameter]) -> None:
        """Averages the gradients over the ranks."""

    def gather_columns(self, values: torch.Tensor, count: int) -> torch.Tensor:
        """Every rank's per-column values [count], in batch order."""


@dataclasses.dataclass
class UpdateStep:
    """What one learner update is given besides the batch and the optimizer.

    Attributes:
      train_steps: updates made before this one (the parameter version being trained).
      grad_clip_norm: the global gradient-norm clip, 0 = off.
      shard: this rank's part with --training_devices, None for one trainer.
    """

    train_steps: int
    grad_clip_norm: float = 0.0
    shard: GradientShard | None = None


@dataclasses.dataclass
class UpdateOutput:
    """What one learner update did: metrics to log and the new replay priorities [B] (replay agents), or None."""

    values: dict[str, float]
    priorities: torch.Tensor | None = None


@dataclasses.dataclass
class AgentConfig:
    """Base of every agent's configuration dataclass: fields here are the agent's flags. The learner's resolved
    configuration is one dataclass made of the framework's LearnerConfig and the chosen agent's class
    (seed/config.py's `learner_config_class`), so an agent reads framework fields (batch_size, num_eval_envs)
    and its own from the same object."""


class IncompatibleActionSpace(ValueError):
    """The env's action space is not one the agent acts on (`Agent.action_spaces`)."""


ACTION_SPACES = {"discrete": "Discrete", "box": "Box"}  # Agent.action_spaces values -> their names in messages


def check_action_space(agent_class: type[Agent], spec: EnvSpec, agent_name: str) -> None:
    """Raises IncompatibleActionSpace unless `agent_class` acts on `spec`'s action space, e.g. "--env=gym:Hopper-v5:
    got a Box(3,) action space; --agent=r2d2 takes Discrete actions". The framework calls it once, before the
    agent is built, whatever the agent."""
    unknown = [kind for kind in agent_class.action_spaces if kind not in ACTION_SPACES]
    if unknown or not agent_class.action_spaces:
        raise ValueError(f"{agent_class.__name__}.action_spaces: got {agent_class.action_spaces!r}, expected a "
                         f"non-empty tuple of {', '.join(map(repr, ACTION_SPACES))}")
    if ("box" if spec.continuous else "discrete") not in agent_class.action_spaces:
        takes = " or ".join(ACTION_SPACES[kind] for kind in agent_class.action_spaces)
        raise IncompatibleActionSpace(f"--env={spec.name}: got a {spec.action_space} action space; "
                                      f"--agent={agent_name} takes {takes} actions")


class Agent(abc.ABC):
    """The typed contract between the framework and an agent (see the module docstring for the members)."""

    config_class: ClassVar[type[AgentConfig]] = AgentConfig
    uses_replay: ClassVar[bool] = False
    supports_sync: ClassVar[bool] = False
    cuda_graphs: ClassVar[bool] = True
    # "discrete": int64 [B] action indices (EnvSpec.num_actions); "box": float32 [B, D] action vectors in the env's
    # units (EnvSpec.action_shape, action_low, action_high). See ActOutput.
    action_spaces: ClassVar[tuple[str, ...]] = ("discrete",)

    network: nn.Module

    # ---- configuration (class-level: no agent exists yet) ----

    @classmethod
    def default_config(cls, env_family: str) -> dict[str, Any]:
        """The agent's own values over the dataclass defaults (of the framework's fields or the agent's own), for
        any env family; the family's defaults for this agent (envs/<family>.py: AGENT_DEFAULTS, by agent name)
        override them, a preset and the typed flags override both. Default: none."""
        return {}

    @classmethod
    def check_config(cls, config: Any) -> None:
        """Raises ValueError naming the field, the value received and the value expected for a configuration
        this agent refuses. Runs when the configuration resolves (also for --print_config). Default: accepts."""
        return None

    @classmethod
    def derive_config(cls, config: Any, explicit: dict[str, Any]) -> None:
        """Sets values derived from others once every layer is applied; `explicit`: the flags the user typed
        (a derived value never overrides one). Default: nothing."""
        return None

    @classmethod
    def describe_config(cls, config: Any) -> dict[str, Any]:
        """Extra keys --print_config shows beside the configuration. Default: none."""
        return {}

    @classmethod
    def evaluation_policy(cls, config: Any) -> str:
        """How the evaluation envs and seed-eval pick actions, in words (seed-eval's report). Default: the
        policy's argmax."""
        return "greedy (argmax)"

    # ---- acting ----

    @abc.abstractmethod
    def __init__(self, spec: EnvSpec, config: Any):
        """Builds the networks for `spec` from the resolved configuration."""

    @abc.abstractmethod
    def initial_state(self, batch_size: int) -> State:
        """Zero per-env state rows [batch_size, ...] (recurrent state, frame stack; {} for none)."""

    def to(self, device: torch.device) -> Agent:
        """Moves the trained networks to the training device. Default: `network`."""
        self.network.to(device)
        return self

    @abc.abstractmethod
    def act(self, network: nn.Module, batch: InferenceBatch, state: State) -> ActOutput:
        """One inference step of the training envs (and of the evaluation envs, by env id), under inference_mode,
        with `network` (inference's copy of `self.network`)."""

    def evaluation_act(self, network: nn.Module, batch: InferenceBatch, state: State) -> ActOutput:
        """The evaluation policy on every row (seed-eval). Default: `act`."""
        return self.act(network, batch, state)

    def resume_acting(self, agent_steps: int) -> None:
        """Before the first `act` of a resumed learner: the agent steps all envs (training and evaluation) had
        taken when its checkpoint was written, for schedules that `act` follows (R2D2's epsilon annealing).
        Default: nothing."""
        return None

    # ---- training ----

    @abc.abstractmethod
    def loss(self, batch: TrainingBatch) -> LossOutput:
        """The loss of one batch on the training device, its metrics and (replay agents) new priorities [B]."""

    def update(self, batch: TrainingBatch, optimizer: torch.optim.Optimizer, step: UpdateStep) -> UpdateOutput:
        """One learner update on `batch`. Default: one optimizer step on `loss` (with a shard: this rank's
        columns, gradients averaged over the ranks before the clip; priorities gathered in batch order).
        PPO overrides it with its epochs of minibatches, MuZero to reanalyse the batch first."""
        return gradient_step(self.network, self.loss, batch, optimizer, step)

    def parameter_groups(self) -> list[dict[str, Any]]:
        """The trained parameters as the Adam optimizer's groups (seed/training/optimizers.py): dicts with
        "params" and, where a group trains at its own rate, "lr" (the others use --learning_rate). Default: one
        group of `network`'s parameters. SAC: critics, actor and temperature, the actor at its own rate."""
        return [{"params": list(self.network.parameters())}]

    def after_update(self, train_steps: int) -> None:
        """After each update, with the number of updates made (R2D2 and MuZero copy their target networks).
        Default: nothing."""
        return None

    def state_dict(self) -> dict[str, Any]:
        """Everything to checkpoint besides the optimizer. Default: the network's state dict."""
        return {"network": self.network.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores `state_dict()`'s result."""
        self.network.load_state_dict(state["network"])

    # ---- replay agents ----

    target_network: nn.Module | None = None

    def replay_sequence_bytes(self) -> int:
        """Host bytes of one stored sequence (the replay's memory check). Needed when `uses_replay`."""
        raise NotImplementedError(f"{type(self).__name__} uses a replay but does not say a sequence's size")

    def initial_priorities(self, unrolls: Unroll) -> np.ndarray:
        """Priorities float64 [n] of the n sequences entering the replay, a time-major batch ([L, n, ...]).
        Default: 1 each (uniform until trained)."""
        return np.ones(unrolls.batch_size, np.float64)

    def priorities(self, unrolls: Unroll, network: nn.Module, target_network: nn.Module | None, version: int
                   ) -> torch.Tensor:
        """Priority Refresh: priorities [B] of stored sequences under `network` (and the target network it
        bootstraps from), as the loss of update `version` + 1 would give them: `version` is the parameters'
        published version (updates made when they were published), the `train_steps` their loss ran with; the
        agent's own step count is not it (with the training process the learner's agent never trains). Needed
        when `uses_replay`."""
        raise NotImplementedError(f"{type(self).__name__} uses a replay but has no priority function")

    # ---- batch workers (optional) ----

    @classmethod
    def batch_workers(cls, config: Any) -> int:
        """Worker processes that run `prepare_batch` on every training batch beside the trainer, so that batch
        k + 1 is prepared while batch k trains (seed/training/batch_workers.py; needs --training_process). An agent
        that prepares its batches there must not prepare them again in `update`. Default: 0, none."""
        return 0

    def preparation_network(self) -> tuple[nn.Module, int]:
        """The network `prepare_batch` reads (MuZero: its target network) and its version: updates made when its
        parameters were taken. The training process copies it to the workers whenever the version changes.
        Needed when `batch_workers` > 0."""
        raise NotImplementedError(f"{type(self).__name__} asks for batch workers but names no network for them")

    def prepare_batch(self, batch: TrainingBatch, train_steps: int, version: int
                      ) -> tuple[TrainingBatch, dict[str, float]]:
        """In a batch worker: the batch the update will train (tensors of `batch` it replaces are new ones, the
        others `batch`'s own; `batch` is not written) and metrics to log with that update. `train_steps`: the
        trainer's updates made when the batch was handed over; `version`: that of the parameters in
        `preparation_network()` now. Needed when `batch_workers` > 0."""
        raise NotImplementedError(f"{type(self).__name__} asks for batch workers but has no prepare_batch")


def gradient_step(network: nn.Module, loss_fn: Callable[[TrainingBatch], LossOutput], batch: TrainingBatch,
                  optimizer: torch.optim.Optimizer, step: UpdateStep,
                  share: tuple[TrainingBatch, float] | None = None) -> UpdateOutput:
    """One optimizer step of `network` on `loss_fn(batch)` (the default `Agent.update`): zero the gradients,
    backward, average them over the ranks with a shard, clip (`gradient_norm` is logged), step. `share`: this
    rank's (batch, loss scale) when the caller has taken it already (default: `step.shard.batch(batch)`)."""
    shard = step.shard
    if share is None:
        share = (batch, 1.0) if shard is None else shard.batch(batch)
    share, loss_scale = share
    out = loss_fn(share)
    optimizer.zero_grad(set_to_none=True)
    (out.loss if shard is None else out.loss * loss_scale).backward()
    if shard is not None:
        shard.all_reduce_gradients(list(network.parameters()))
    values = dict(out.metrics)
    if step.grad_clip_norm > 0:
        values["gradient_norm"] = float(torch.nn.utils.clip_grad_norm_(network.parameters(), step.grad_clip_norm))
    optimizer.step()
    priorities = out.priorities
    if shard is not None and priorities is not None:
        priorities = shard.gather_columns(priorities, int(batch.unrolls.env_id.shape[0]))
    return UpdateOutput(values, priorities)
