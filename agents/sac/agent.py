"""The SAC agent (Haarnoja et al. 2018, "Soft Actor-Critic Algorithms and Applications") on the central replay:
a tanh-normal actor, twin Q critics with Polyak-averaged targets, the automatic entropy temperature, 1-step
clipped double-Q soft targets at every position of the stored sequences, uniform sampling by default (priority
exponent 0), prioritized by the critics' TD errors optional. Box action spaces only.

One update (`update`, CleanRL's sac_continuous_action order): a critic step; on every --sac_policy_frequency-th
update that many actor steps, each followed by a temperature step; then the Polyak step of the target critics.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import torch
from torch import nn

from seed.agents.sac import sac
from seed.agents.sac.config import SACConfig
from seed.agents.sac.networks import SACNetworks, TwinQ
from seed.config import LearnerConfig
from seed.contracts import ActOutput, InferenceBatch, State
from seed.contracts import agent as contract
from seed.contracts.training import LossOutput, TrainingBatch, Unroll
from seed.envs.base import EnvSpec

# CleanRL's sac_continuous_action defaults (cleanrl/sac_continuous_action.py, Args): batch 256, gamma 0.99, q lr 1e-3
# (also the temperature's), policy lr 3e-4 (SACConfig), tau 0.005 and policy frequency 2 (SACConfig), learning
# starts at 5e3 steps, a buffer of 1e6 transitions; torch's Adam eps 1e-8. Here a sequence holds one transition
# (unroll_length 1: 2 stored steps), so 256 sequences are CleanRL's 256 transitions, and a replay ratio of 256
# sequences sampled per sequence inserted is CleanRL's one update of 256 per env step.
CLEANRL_DEFAULTS = dict(
    batch_size=256, unroll_length=1, burn_in=0, discounting=0.99, learning_rate=1e-3, adam_epsilon=1e-8,
    replay_capacity=1_000_000, replay_min_size=5000, replay_ratio=256.0, priority_exponent=0.0, grad_clip_norm=0.0,
)  # priority exponent 0: uniform sampling (importance weights all 1); --priority_exponent > 0 samples by TD error


def hidden_sizes(config: Any) -> tuple[int, ...]:
    """--sac_hidden_sizes as a tuple of ints, refused (ValueError naming the flag) unless one or more sizes >= 1."""
    try:
        sizes = tuple(int(s) for s in config.sac_hidden_sizes.split(","))
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise ValueError(f"--sac_hidden_sizes: got {config.sac_hidden_sizes!r}, expected comma-separated sizes "
                         ">= 1, e.g. 256,256")
    return sizes


class SACAgent(contract.Agent):
    """SAC: acts by sampling the tanh-normal policy (uniformly at random before the first update), trains from
    the central replay."""

    config_class = SACConfig
    uses_replay = True
    action_spaces = ("box",)

    @classmethod
    def default_config(cls, env_family: str) -> dict[str, Any]:
        return dict(CLEANRL_DEFAULTS)

    @classmethod
    def check_config(cls, config: Any) -> None:
        hidden_sizes(config)
        if config.burn_in != 0:
            raise ValueError(f"--burn_in: got {config.burn_in}, expected 0 with --agent=sac (its networks have no "
                             "state to warm up)")
        if not 0.0 < config.sac_tau <= 1.0:
            raise ValueError(f"--sac_tau: got {config.sac_tau}, expected 0 < tau <= 1")
        if config.sac_policy_frequency < 1:
            raise ValueError(f"--sac_policy_frequency: got {config.sac_policy_frequency}, expected >= 1")
        if not config.sac_initial_alpha > 0:
            raise ValueError(f"--sac_initial_alpha: got {config.sac_initial_alpha}, expected > 0")
        if config.optimizer != "adam":
            raise ValueError(f"--optimizer: got {config.optimizer!r}, expected adam with --agent=sac (its actor, "
                             "critics and temperature are Adam groups with their own learning rates)")
        if config.priority_refresh_interval_s:
            raise ValueError(f"--priority_refresh_interval_s: got {config.priority_refresh_interval_s}, expected 0 "
                             "with --agent=sac (the refresher copies target networks; SAC's move by Polyak "
                             "averaging)")
        devices = [d for d in config.training_devices.split(",") if d.strip()]
        if len(devices) > 1:
            raise ValueError(f"--training_devices: got {config.training_devices!r}, expected one device with "
                             "--agent=sac (its update makes several optimizer steps, not one averaged gradient)")

    @classmethod
    def describe_config(cls, config: Any) -> dict[str, Any]:
        return describe_config(config)

    @classmethod
    def evaluation_policy(cls, config: Any) -> str:
        return "the policy's mode: low + (high - low) (tanh(mean) + 1) / 2"

    def __init__(self, spec: EnvSpec, config: LearnerConfig):
        contract.check_action_space(type(self), spec, "sac")  # the framework checked already; a direct build too
        bounds = np.array([spec.action_low, spec.action_high], np.float64)
        if not np.isfinite(bounds).all() or not (bounds[0] < bounds[1]).all():
            raise ValueError(f"{spec.name}: action bounds: got low {spec.action_low}, high {spec.action_high}, "
                             "expected finite bounds with low < high (SAC squashes its actions into them)")
        self.spec = spec
        self.config = config
        self.target_entropy = -float(spec.action_shape[0])
        self.network = SACNetworks(spec, hidden_sizes(config), config.sac_initial_alpha)
        self.target_network: TwinQ = copy.deepcopy(self.network.critic).requires_grad_(False)

    def initial_state(self, batch_size: int) -> State:
        return {}

    def to(self, device: torch.device) -> contract.Agent:
        """Moves the trained networks (actor, critics, temperature and the target critics) to `device`."""
        self.network.to(device)
        self.target_network.to(device)
        return self

    def parameter_groups(self) -> list[dict[str, Any]]:
        """Three Adam groups: the critics and the temperature at --learning_rate (CleanRL's q_lr for both), the
        actor at --sac_policy_learning_rate. Each step of `update` gives gradients to one group only."""
        network = self.network
        return [{"params": list(network.critic.parameters())},
                {"params": list(network.actor.parameters()), "lr": self.config.sac_policy_learning_rate},
                {"params": [network.log_alpha]}]

    # ---- acting ----

    def act(self, network: nn.Module, batch: InferenceBatch, state: State) -> ActOutput:
        """A sample of the policy per row (uniform over the Box until the network has been updated once, as
        CleanRL's random actions before learning starts); the evaluation envs (the last `num_eval_envs` env
        ids) take the policy's mode."""
        policy = network.actor.distribution(batch.observation.float())
        action, _ = policy.rsample_with_log_prob()
        low, high = network.actor.action_low, network.actor.action_high
        uniform = low + (high - low) * torch.rand_like(action)
        action = torch.where(network.updates > 0, action, uniform)
        if self.config.num_eval_envs > 0:
            is_eval = batch.env_ids >= self.config.num_envs - self.config.num_eval_envs
            action = torch.where(is_eval.unsqueeze(-1), policy.mode(), action)
        return ActOutput(action=action, outputs={}, state={})

    def evaluation_act(self, network: nn.Module, batch: InferenceBatch, state: State) -> ActOutput:
        """The policy's mode on every row (tanh of the Gaussian's mean, in the env's units)."""
        return ActOutput(action=network.actor.distribution(batch.observation.float()).mode(), outputs={}, state={})

    # ---- training ----

    def _critic_loss(self, unrolls: Unroll, network: SACNetworks, target_network: TwinQ,
                     weights: torch.Tensor | None) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
        """(loss, parts, priorities [B]) of the twin critics on sequences [T + 1, B]; parts hold q1, q2,
        targets, td1, td2 [T, B] and the transitions' masks."""
        data = sac.transitions(unrolls.steps)
        observation, next_observation = data.observation.float(), data.next_observation.float()
        with torch.no_grad():
            next_action, next_log_prob = network.actor.distribution(next_observation).rsample_with_log_prob()
            next_q1, next_q2 = target_network(next_observation, next_action)
            targets = sac.soft_targets(data.reward, data.terminal, next_q1, next_q2, next_log_prob,
                                       network.log_alpha.exp(), self.config.discounting)
        q1, q2 = network.critic(observation, data.action)
        loss, q1_loss, q2_loss = sac.critic_loss(q1, q2, targets, data.trained, weights)
        priorities = sac.sequence_priorities((q1 - targets).detach(), (q2 - targets).detach(), data.trained,
                                             self.config.priority_eta)
        parts = dict(q1=q1, q2=q2, targets=targets, q1_loss=q1_loss, q2_loss=q2_loss, trained=data.trained,
                     state_valid=data.state_valid, observation=observation)
        return loss, parts, priorities

    def loss(self, batch: TrainingBatch) -> LossOutput:
        """The twin critics' loss (importance-weighted with prioritized replay) and the new priorities: the
        critic step of `update`, which adds the actor's and the temperature's."""
        loss, parts, priorities = self._critic_loss(batch.unrolls, self.network, self.target_network,
                                                    batch.importance_weights)
        metrics = self._critic_metrics(loss, parts, priorities)
        return LossOutput(loss, metrics, priorities)

    def _policy_step(self, observation: torch.Tensor, state_valid: torch.Tensor,
                     optimizer: torch.optim.Optimizer, grad_clip_norm: float) -> dict[str, float]:
        """One actor step, then one temperature step on a fresh sample of the stepped actor (CleanRL's)."""
        network = self.network
        alpha = network.log_alpha.exp().detach()
        action, log_prob = network.actor.distribution(observation).rsample_with_log_prob()
        network.critic.requires_grad_(False)  # the actor's loss trains the actor only: no critic weight gradients
        try:
            q1, q2 = network.critic(observation, action)
        finally:
            network.critic.requires_grad_(True)
        actor_loss = sac.actor_loss(log_prob, q1, q2, alpha, state_valid)
        optimizer.zero_grad(set_to_none=True)
        actor_loss.backward()
        if grad_clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(network.actor.parameters(), grad_clip_norm)
        optimizer.step()
        with torch.no_grad():
            _, log_prob = network.actor.distribution(observation).rsample_with_log_prob()
        alpha_loss = sac.temperature_loss(network.log_alpha, log_prob, self.target_entropy, state_valid)
        optimizer.zero_grad(set_to_none=True)
        alpha_loss.backward()
        optimizer.step()
        return {"losses/actor": actor_loss.item(), "losses/alpha": alpha_loss.item(),
                "policy/entropy": -sac.masked_mean(log_prob, state_valid).item()}

    def update(self, batch: TrainingBatch, optimizer: torch.optim.Optimizer, step: contract.UpdateStep
               ) -> contract.UpdateOutput:
        """One SAC update: the critic step (`loss`), on every --sac_policy_frequency-th update (train_steps a
        multiple of it) that many actor and temperature steps on the same batch, then the Polyak step."""
        c = self.config
        if step.shard is not None:
            raise ValueError("--training_devices: got several devices, expected one with --agent=sac")
        loss, parts, priorities = self._critic_loss(batch.unrolls, self.network, self.target_network,
                                                    batch.importance_weights)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        values = self._critic_metrics(loss, parts, priorities)
        if step.grad_clip_norm > 0:
            values["gradient_norm"] = float(torch.nn.utils.clip_grad_norm_(self.network.critic.parameters(),
                                                                           step.grad_clip_norm))
        optimizer.step()
        if step.train_steps % c.sac_policy_frequency == 0:
            observation, state_valid = parts["observation"], parts["state_valid"]
            for _ in range(c.sac_policy_frequency):
                values.update(self._policy_step(observation, state_valid, optimizer, step.grad_clip_norm))
        sac.polyak_update(self.target_network, self.network.critic, c.sac_tau)
        self.network.updates += 1
        values["alpha"] = float(self.network.log_alpha.detach().exp())
        return contract.UpdateOutput(values, priorities)

    @staticmethod
    def _critic_metrics(loss: torch.Tensor, parts: dict[str, torch.Tensor], priorities: torch.Tensor
                        ) -> dict[str, float]:
        trained = parts["trained"]
        td = 0.5 * ((parts["q1"] - parts["targets"]).abs() + (parts["q2"] - parts["targets"]).abs()).detach()
        return {
            "losses/critic": loss.item(),
            "losses/q1": parts["q1_loss"].item(),
            "losses/q2": parts["q2_loss"].item(),
            "q/mean": sac.masked_mean(parts["q1"].detach(), trained).item(),
            "td/abs_mean": sac.masked_mean(td, trained).item(),
            "updated_priorities_mean": priorities.mean().item(),
        }

    # ---- replay ----

    def replay_sequence_bytes(self) -> int:
        """Bytes one replay sequence of this agent takes (see `replay_sequence_bytes`)."""
        return replay_sequence_bytes(self.spec, self.config)

    @torch.no_grad()
    def priorities(self, unrolls: Unroll, network: nn.Module, target_network: nn.Module | None, version: int
                   ) -> torch.Tensor:
        """The priorities [B] the critic step would give sequences [T + 1, B] under these networks (its next
        action is sampled, so two calls differ). SAC refuses Priority Refresh (check_config); this is the same
        function the loss uses."""
        return self._critic_loss(unrolls, network, target_network, None)[2]

    def state_dict(self) -> dict[str, Any]:
        return {"network": self.network.state_dict(), "target_network": self.target_network.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.network.load_state_dict(state["network"])
        self.target_network.load_state_dict(state["target_network"])


def replay_sequence_bytes(spec: EnvSpec, config: LearnerConfig) -> int:
    """Bytes one replay sequence takes: (unroll_length + 1) steps of observation, reward, done, truncated,
    prev_action and action (float32 [D] each), valid and policy_version, plus the env id (SAC stores no agent
    outputs and no state)."""
    length = config.burn_in + config.unroll_length + 1
    action_bytes = 4 * math.prod(spec.action_shape)
    step_bytes = (math.prod(spec.observation_shape) * np.dtype(spec.observation_dtype).itemsize
                  + 4 + 1 + 1 + 2 * action_bytes + 1 + 8)
    return length * step_bytes + 8


def describe_config(config: LearnerConfig) -> dict[str, Any]:
    """Derived values for --print_config: the replay's sequence length and expected memory for this env."""
    from seed.envs import make_spec

    spec = make_spec(config.env, config.env_options())
    per_sequence = replay_sequence_bytes(spec, config) if spec.continuous else None
    described: dict[str, Any] = {"replay_sequence_length": config.burn_in + config.unroll_length + 1}
    if per_sequence is not None:
        described.update(replay_bytes_per_sequence=per_sequence,
                         replay_expected_bytes=per_sequence * config.replay_capacity,
                         replay_expected_gib=round(per_sequence * config.replay_capacity / 2**30, 2))
    return described
