"""The R2D2 agent: a recurrent dueling Q-network, per-env epsilon-greedy at inference, burn-in, n-step
double-Q targets with value rescaling, prioritized sequence replay and a periodically copied target net.
"""

from __future__ import annotations

import copy
import threading
from typing import Any

import numpy as np
import torch
from torch import nn

from seed.agents.networks import ORTHOGONAL_INIT_NETWORKS, AgentBody, glorot_uniform_, orthogonal_init_, resolve_network
from seed.agents.options import check_network_options
from seed.agents.r2d2.config import R2D2Config
from seed.agents.r2d2.r2d2 import (
    annealed_epsilons,
    epsilon_schedule,
    inverse_value_rescale,
    n_step_targets,
    sequence_priorities,
    value_rescale,
)
from seed.config import LearnerConfig
from seed.contracts import ActOutput, InferenceBatch, State
from seed.contracts import agent as contract
from seed.contracts.training import LossOutput, TrainingBatch, Unroll
from seed.envs.base import EnvSpec


class DuelingQNetwork(nn.Module):
    """AgentBody (raw reward and one-hot previous action into the LSTM) + dueling heads of `--dueling_hidden` hidden
    units (512, the paper's), or with `--dueling_hidden=0` one linear layer to the Q-values (DQN's head).

    Init: Glorot uniform (the paper's), except the plain conv torsos (ORTHOGONAL_INIT_NETWORKS): orthogonal with
    gain sqrt(2), as the V-trace agent does.

    forward(...) -> Q-values [T, B, A] (in the value-rescaled space), new state.
    """

    def __init__(self, spec: EnvSpec, config: LearnerConfig):
        super().__init__()
        network = resolve_network(spec, config.network, "nature")
        sizes = tuple(int(s) for s in config.mlp_sizes.split(",") if s)
        self.body = AgentBody(spec, network, config.network_width, config.use_lstm, config.lstm_size, sizes,
                              clip_reward_input=False)
        hidden = config.dueling_hidden
        if network == "mlp" and hidden > 0:
            hidden = max(sizes[-1] if sizes else 64, 64)  # MLP bodies get heads of their own width
        self.dueling = hidden > 0
        if self.dueling:
            self.value = nn.Sequential(nn.Linear(self.body.output_size, hidden), nn.ReLU(), nn.Linear(hidden, 1))
            self.advantage = nn.Sequential(nn.Linear(self.body.output_size, hidden), nn.ReLU(),
                                           nn.Linear(hidden, spec.num_actions, bias=False))
        else:
            self.q_head = nn.Linear(self.body.output_size, spec.num_actions)
        glorot_uniform_(self)
        if network in ORTHOGONAL_INIT_NETWORKS:
            # Glorot (the paper's init) on these torsos gives near-constant Atari features (orthogonal_init_).
            orthogonal_init_(self.body.torso)

    def initial_state(self, batch_size: int) -> State:
        return self.body.initial_state(batch_size)

    def forward(self, observation, prev_action, reward, done, state):
        features, new_state = self.body(observation, prev_action, reward, done, state)
        if not self.dueling:
            return self.q_head(features), new_state
        advantage = self.advantage(features)
        q = self.value(features) + advantage - advantage.mean(-1, keepdim=True)
        return q, new_state


class R2D2Agent(contract.Agent):
    """R2D2: epsilon-greedy on a recurrent dueling Q-network, trained from the central prioritized replay."""

    config_class = R2D2Config
    uses_replay = True

    @classmethod
    def check_config(cls, config: Any) -> None:
        check_network_options(config)
        if config.dueling_hidden < 0:
            raise ValueError(f"--dueling_hidden: got {config.dueling_hidden}, expected >= 0 (0: a linear Q head)")
        if config.epsilon_anneal_steps < 0:
            raise ValueError(f"--epsilon_anneal_steps: got {config.epsilon_anneal_steps}, expected >= 0 (0: R2D2's "
                             "fixed epsilons)")

    @classmethod
    def describe_config(cls, config: Any) -> dict[str, Any]:
        return describe_config(config)

    @classmethod
    def evaluation_policy(cls, config: Any) -> str:
        return f"epsilon-greedy, eps={config.eval_epsilon}"

    def __init__(self, spec: EnvSpec, config: LearnerConfig):
        if config.burn_in >= config.unroll_length:
            raise ValueError(f"burn_in: got {config.burn_in}, expected < unroll_length ({config.unroll_length})")
        self.spec = spec
        self.config = config
        self.network = DuelingQNetwork(spec, config)
        self.target_network = copy.deepcopy(self.network).requires_grad_(False)
        # Per env id, on the host; `epsilons_on` keeps one copy per inference device.
        self.epsilons = torch.from_numpy(epsilon_schedule(
            config.num_envs, config.num_eval_envs, config.epsilon_base, config.epsilon_alpha,
            config.eval_epsilon)).float()
        self.num_training_envs = config.num_envs - config.num_eval_envs
        self._device_epsilons: dict[torch.device, torch.Tensor] = {}
        self._device_acted: dict[torch.device, torch.Tensor] = {}  # --epsilon_anneal_steps: each env's steps
        self._acted_before = 0  # each env's steps before a resumed learner's start (resume_acting)
        self._device_tensors_lock = threading.Lock()  # guards both per-device stores

    def initial_state(self, batch_size: int) -> State:
        return self.network.initial_state(batch_size)

    def replay_sequence_bytes(self) -> int:
        """Bytes one replay sequence of this agent takes (see `replay_sequence_bytes`)."""
        return replay_sequence_bytes(self.spec, self.config, self.network)

    def to(self, device: torch.device) -> contract.Agent:
        """Moves the trained networks (online and target) to the training device."""
        self.network.to(device)
        self.target_network.to(device)
        return self

    def _on_device(self, store: dict[torch.device, torch.Tensor], device: torch.device, make) -> torch.Tensor:
        """`store`'s tensor for `device`, made by `make(device)` at the first call for it and never rebound."""
        device = torch.device(device)
        tensor = store.get(device)
        if tensor is None:
            with self._device_tensors_lock:
                tensor = store.get(device)
                if tensor is None:
                    tensor = store[device] = make(device)
        return tensor

    def epsilons_on(self, device: torch.device) -> torch.Tensor:
        """The per-env epsilons float32 [num_envs] on `device`, copied from `self.epsilons` at the first call
        for that device and never moved or freed afterwards.

        Each inference device's thread (and the CUDA graphs it captures) reads its own copy, so no device
        ever reads a tensor that another device's thread replaced.
        """
        return self._on_device(self._device_epsilons, device, lambda d: self.epsilons.to(d, copy=True))

    def acted_on(self, device: torch.device) -> torch.Tensor:
        """int64 [num_envs] on `device`: per env id, the agent steps of that training env which that device's
        `act` has seen (evaluation envs' steps are not counted), from the steps before a restart
        (`resume_acting`). Each env acts on one inference device only, so its count is its whole count however
        many devices there are. Updated in place, so a captured CUDA graph counts too."""
        return self._on_device(self._device_acted, device, lambda d: torch.full(
            (self.config.num_envs,), self._acted_before, dtype=torch.int64, device=d))

    def resume_acting(self, agent_steps: int) -> None:
        """A resumed learner's annealing goes on from where it was: each env counts as having taken its share
        (1 / num_envs) of the checkpoint's `agent_steps`."""
        self._acted_before = agent_steps // self.config.num_envs
        for acted in self._device_acted.values():
            acted.fill_(self._acted_before)

    def _row_epsilons(self, env_ids: torch.Tensor, device: torch.device) -> torch.Tensor:
        """Each row's epsilon [B] for `act`, annealed with --epsilon_anneal_steps (and the step count advanced)."""
        epsilons = self.epsilons_on(device)
        # Padded rows of a fixed-size batch carry an env id past the last one: give them the last epsilon.
        rows = env_ids.clamp(max=len(epsilons) - 1)
        row_epsilons = epsilons[rows]
        if self.config.epsilon_anneal_steps <= 0:
            return row_epsilons
        acted = self.acted_on(device)
        training = env_ids < self.num_training_envs
        # All training envs' steps together: the row's env's own steps times their number (envs step at one rate).
        row_epsilons = annealed_epsilons(row_epsilons, training, acted[rows] * self.num_training_envs,
                                         self.config.epsilon_anneal_steps)
        acted.index_add_(0, rows, training.long())
        return row_epsilons

    def act(self, network: nn.Module, batch: InferenceBatch, state: State) -> ActOutput:
        q, new_state = network(batch.observation.unsqueeze(0), batch.prev_action.unsqueeze(0),
                               batch.reward.unsqueeze(0), batch.done.unsqueeze(0), state)
        q = q[0]
        explore = torch.rand(q.shape[0], device=q.device) < self._row_epsilons(batch.env_ids, q.device)
        random_action = torch.randint(0, q.shape[-1], (q.shape[0],), device=q.device)
        action = torch.where(explore, random_action, q.argmax(-1))
        return ActOutput(action=action, outputs={"q_values": q}, state=new_state)

    def evaluation_act(self, network: nn.Module, batch: InferenceBatch, state: State) -> ActOutput:
        """The evaluation policy on every row: epsilon-greedy with `eval_epsilon` (paper: 0.001)."""
        q, new_state = network(batch.observation.unsqueeze(0), batch.prev_action.unsqueeze(0),
                               batch.reward.unsqueeze(0), batch.done.unsqueeze(0), state)
        q = q[0]
        explore = torch.rand(q.shape[0], device=q.device) < self.config.eval_epsilon
        random_action = torch.randint(0, q.shape[-1], (q.shape[0],), device=q.device)
        return ActOutput(action=torch.where(explore, random_action, q.argmax(-1)), outputs={"q_values": q},
                         state=new_state)

    def _targets(self, q_online: torch.Tensor, q_target: torch.Tensor, segment: dict[str, torch.Tensor]
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """n-step double-Q targets [T, B] (rescaled by h with --value_rescaling) and their mask for a segment of
        T + 1 steps."""
        eps = self.config.value_rescaling_epsilon
        best = q_online.argmax(-1, keepdim=True)
        bootstrap = q_target.gather(-1, best).squeeze(-1)
        if self.config.value_rescaling:
            bootstrap = inverse_value_rescale(bootstrap, eps)
        targets, mask = n_step_targets(segment["reward"], segment["done"], segment["truncated"], bootstrap,
                                       self.config.n_steps, self.config.discounting)
        if self.config.value_rescaling:
            targets = value_rescale(targets, eps)
        return targets, mask & segment["valid"][:-1]

    @torch.no_grad()
    def initial_priorities(self, unrolls: Unroll) -> np.ndarray:
        """Priorities at insertion (a time-major batch) from the Q-values stored at inference: they serve as both
        the online and the target values, and the bootstrap action is their argmax (greedy), not the
        epsilon-greedy action."""
        segment = {k: v[self.config.burn_in:] for k, v in unrolls.steps.items()}
        q = segment["q_values"].float()
        targets, mask = self._targets(q, q, segment)
        taken = q[:-1].gather(-1, segment["action"][:-1].unsqueeze(-1)).squeeze(-1)
        return sequence_priorities(targets - taken, mask, self.config.priority_eta).double().numpy()

    def burn_in(self, unrolls: Unroll, network: nn.Module | None = None, target_network: nn.Module | None = None
                ) -> tuple[State, State]:
        """Runs the burn-in prefix through the online and target networks (default: the agent's) from the stored
        state, no gradient."""
        network = network or self.network
        target_network = target_network or self.target_network
        b = self.config.burn_in
        state = unrolls.initial_state
        if b == 0:
            return state, state
        prefix = [unrolls.observation[:b], unrolls.prev_action[:b], unrolls.reward[:b], unrolls.done[:b]]
        with torch.no_grad():
            _, online_state = network(*prefix, state)
            _, target_state = target_network(*prefix, state)
        # A fresh env's prefix is all padding: keep its stored (zero) state instead of the padding's effect.
        real = unrolls.valid[b - 1]
        keep = lambda burned: {k: torch.where(real.view(-1, *[1] * (v.dim() - 1)), v, state[k])
                               for k, v in burned.items()}
        return keep(online_state), keep(target_state)

    def td_errors(self, unrolls: Unroll, network: nn.Module, target_network: nn.Module
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(td [T, B], mask [T, B], online Q-values [T + 1, B, A]) of sequences [L, B] under `network` and
        `target_network`: delta_t = h(n-step double-Q target) - Q(s_t, a_t), with gradient through Q(s_t, a_t).

        Burn-in steps [0, burn_in) only warm up the recurrent state; the T + 1 steps after them form the
        training segment (T transitions plus the bootstrap step).
        """
        online_state, target_state = self.burn_in(unrolls, network, target_network)
        segment = {k: v[self.config.burn_in:] for k, v in unrolls.steps.items()}
        inputs = [segment["observation"], segment["prev_action"], segment["reward"], segment["done"]]
        q_online, _ = network(*inputs, online_state)
        with torch.no_grad():
            q_target, _ = target_network(*inputs, target_state)
            targets, mask = self._targets(q_online.detach(), q_target, segment)
        taken = q_online[:-1].gather(-1, segment["action"][:-1].unsqueeze(-1)).squeeze(-1)
        return targets - taken, mask, q_online

    @torch.no_grad()
    def priorities(self, unrolls: Unroll, network: nn.Module, target_network: nn.Module, version: int
                   ) -> torch.Tensor:
        """Priority Refresh (seed/experience/priority_refresh.py): the priorities float [B] that training on sequences
        [L, B]
        with these networks would give them (eta max|delta| + (1 - eta) mean|delta|, as `loss` returns). R2D2's
        do not depend on the parameters' `version`."""
        td, mask, _ = self.td_errors(unrolls, network, target_network)
        return sequence_priorities(td, mask, self.config.priority_eta)

    def loss(self, batch: TrainingBatch) -> LossOutput:
        """Importance-weighted 0.5 sum_t delta_t^2 per sequence (`td_errors`), averaged over the batch."""
        c = self.config
        td, mask, q_online = self.td_errors(batch.unrolls, self.network, self.target_network)
        per_sequence = 0.5 * (td.pow(2) * mask).sum(0)
        weights = batch.importance_weights if batch.importance_weights is not None else torch.ones_like(per_sequence)
        loss = (weights * per_sequence).mean()
        priorities = sequence_priorities(td.detach(), mask, c.priority_eta)
        metrics = {
            "losses/total": loss.item(),
            "q/mean": q_online.detach().mean().item(),
            "td/abs_mean": (td.detach().abs() * mask).sum().item() / max(mask.sum().item(), 1),
            "updated_priorities_mean": priorities.mean().item(),
        }
        return LossOutput(loss, metrics, priorities)

    def after_update(self, train_steps: int) -> None:
        if train_steps % self.config.target_update_interval == 0:
            self.target_network.load_state_dict(self.network.state_dict())

    def state_dict(self) -> dict[str, Any]:
        return {"network": self.network.state_dict(), "target_network": self.target_network.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.network.load_state_dict(state["network"])
        self.target_network.load_state_dict(state["target_network"])


def replay_sequence_bytes(spec: EnvSpec, config: LearnerConfig, network: nn.Module) -> int:
    """Bytes one replay sequence takes: (burn_in + unroll_length + 1) steps of observation (one frame),
    reward, done, truncated, prev_action, action, valid, policy_version and q_values [A], plus the agent state and
    the env id."""
    length = config.burn_in + config.unroll_length + 1
    # obs, reward, done, truncated, prev_action and action, valid, policy_version, q
    step_bytes = (int(np.prod(spec.observation_shape)) * np.dtype(spec.observation_dtype).itemsize
                  + 4 + 1 + 1 + 8 + 8 + 1 + 8 + 4 * spec.num_actions)
    state_bytes = sum(t.numel() * t.element_size() for t in network.initial_state(1).values())
    return length * step_bytes + state_bytes + 8


def describe_config(config: LearnerConfig) -> dict[str, Any]:
    """Derived values for --print_config: the replay's expected memory for this env and network."""
    from seed.envs import make_spec

    spec = make_spec(config.env, config.env_options())
    length = config.burn_in + config.unroll_length + 1
    per_sequence = replay_sequence_bytes(spec, config, DuelingQNetwork(spec, config))
    return {
        "replay_sequence_length": length,
        "replay_bytes_per_sequence": per_sequence,
        "replay_expected_bytes": per_sequence * config.replay_capacity,
        "replay_expected_gib": round(per_sequence * config.replay_capacity / 2**30, 2),
    }
