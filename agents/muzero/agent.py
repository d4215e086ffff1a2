"""The MuZero agent in its EfficientZero form (Ye et al. 2021): a batched tree search on the inference device for
every env of the inference batch at once, sequences in the learner's prioritized replay, and the K-step model
loss of agents/muzero/losses.py.

Acting (`act`, on the inference device): initial inference of the whole batch, then one `search` over B trees
(agents/muzero/search) whose recurrent function runs dynamics + value-prefix LSTM + prediction on every tree's
leaf at once. The step stores the search's policy (`search_policy` [A]) and root value (`root_value`): the policy
target and the initial priority. Training envs sample from the search (pUCT: visit counts with Dirichlet noise on
the root prior; gumbel: the sequential-halving winner); evaluation envs play the most visited action (gumbel: the
improved policy's argmax) without noise.

Replay: each item is a sequence of burn_in + unroll_length + 1 steps. The unroll store makes consecutive
sequences of one env share their last burn_in + 1 steps, so with burn_in >= unroll_steps + td_steps - 1 every
position of an episode is one of the first `unroll_length` positions of exactly one sequence, and from there it
has the K = unroll_steps steps and the n = td_steps look-ahead its targets need. A sampled sequence trains every
one of its first unroll_length positions as the start of a K-step unroll (like R2D2 trains every step of its
sequences), so a batch of B sequences is B x unroll_length unrolls.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import torch
from torch import nn

from seed.agents.muzero.config import MuZeroConfig
from seed.agents.muzero.graphed_search import GraphedSearch
from seed.agents.muzero.losses import (
    muzero_loss,
    predicted_values,
    start_priorities,
    trained_starts,
    value_targets,
)
from seed.agents.muzero.networks import MLPMuZeroNetwork, MuZeroNetwork, ResNetMuZeroNetwork
from seed.agents.muzero.reanalysis import reanalyse_batch
from seed.agents.muzero.targets import support_to_scalar, unroll_masks
from seed.agents.torsos import stack_frames
from seed.config import LearnerConfig
from seed.contracts import ActOutput, InferenceBatch, State
from seed.contracts import agent as contract
from seed.contracts.storage import torch_dtype
from seed.contracts.training import LossOutput, TrainingBatch, Unroll
from seed.envs.base import EnvSpec


def make_network(spec: EnvSpec, config: LearnerConfig) -> MuZeroNetwork:
    """The MLP variant for vector observations, the ResNet variant for image frames (`--network=auto`);
    `--network=nature` is the ResNet variant with the Nature DQN's convolutions as its downsampling (for CPUs),
    `--network=minatar` the ResNet variant without downsampling on MinAtar's 10 x 10 x C states."""
    network = config.network
    if network == "auto":
        network = "mlp" if len(spec.observation_shape) == 1 else "resnet"
    if network == "mlp":
        hidden = tuple(int(s) for s in config.mlp_sizes.split(",") if s) or (64,)
        return MLPMuZeroNetwork(math.prod(spec.observation_shape) * spec.frame_stack, spec.num_actions, hidden,
                                config.latent_size, config.lstm_size, config.value_support_size,
                                config.reward_support_size)
    if network in ("resnet", "nature", "minatar"):
        expected = "[H, W, C] MinAtar states" if network == "minatar" else "[H, W] frames"
        if len(spec.observation_shape) != (3 if network == "minatar" else 2):
            raise ValueError(f"--network={network}: needs {expected}, got observation shape "
                             f"{spec.observation_shape}")
        return ResNetMuZeroNetwork(tuple(spec.observation_shape), spec.frame_stack, spec.num_actions,
                                   config.latent_channels, config.residual_blocks, config.lstm_size,
                                   config.value_support_size, config.reward_support_size,
                                   projection_size=config.projection_size,
                                   predictor_hidden=config.projection_size // 2, torso=network)
    raise ValueError(f"--network: got {config.network!r}, expected auto, mlp, resnet, nature or minatar with "
                     "--agent=muzero")


def check_config(config: LearnerConfig) -> None:
    """Refuses settings the agent cannot train with; each error names the flag, its value and what is expected."""
    look_ahead = config.unroll_steps + config.td_steps - 1
    checks = [
        ("search", config.search in ("puct", "gumbel"), "puct or gumbel"),
        ("num_simulations", config.num_simulations >= 1, ">= 1"),
        ("unroll_steps", config.unroll_steps >= 1, ">= 1"),
        ("td_steps", config.td_steps >= 1, ">= 1"),
        ("burn_in", config.burn_in >= look_ahead,
         f">= unroll_steps + td_steps - 1 = {look_ahead} with --agent=muzero (the look-ahead each sequence shares "
         "with the next, so that every position starts a K-step unroll with n-step value targets)"),
        ("residual_blocks", config.residual_blocks >= 0, ">= 0"),
        ("projection_size", config.projection_size >= 2, ">= 2 (the predictor's hidden layer is half of it)"),
        ("value_prefix_horizon", config.value_prefix_horizon >= 1, ">= 1"),
        ("value_support_size", config.value_support_size >= 1, ">= 1"),
        ("reward_support_size", config.reward_support_size >= 1, ">= 1"),
        ("td_age_updates", config.td_age_updates >= 0, ">= 0 (0 = no off-policy correction)"),
        ("visit_temperature", config.visit_temperature >= 0, ">= 0"),
        ("reanalyse_ratio", 0 <= config.reanalyse_ratio <= 1, ">= 0 and <= 1 (the fraction of a batch reanalysed)"),
        ("reanalyse_workers", config.reanalyse_workers >= 0, ">= 0 (0 = reanalyse inside each update)"),
    ]
    for name, ok, expected in checks:
        if not ok:
            raise ValueError(f"--{name}: got {getattr(config, name)!r}, expected {expected}")


class MuZeroAgent(contract.Agent):
    """EfficientZero / SpeedyZero: acts by a batched tree search over its learned model, trains from the central
    prioritized replay (reanalysing the batch first with --reanalyse_ratio)."""

    config_class = MuZeroConfig
    uses_replay = True

    @classmethod
    def check_config(cls, config: Any) -> None:
        check_config(config)

    @classmethod
    def describe_config(cls, config: Any) -> dict[str, Any]:
        return describe_config(config)

    @classmethod
    def batch_workers(cls, config: Any) -> int:
        """--reanalyse_workers: the processes that reanalyse batches beside the trainer (none without reanalysis)."""
        return config.reanalyse_workers if config.reanalyse_ratio > 0 else 0

    @classmethod
    def evaluation_policy(cls, config: Any) -> str:
        chosen_by = "most visited action" if config.search == "puct" else "argmax of the improved policy"
        return f"{config.search} search of {config.num_simulations} simulations without root noise, {chosen_by}"
    # `act` (the representation call and the whole search) may be captured as a CUDA graph (--cuda_graphs): while a
    # capture runs the search fixes its loop length and reads nothing back (search/__init__.py, DepthBound).
    cuda_graphs = True

    def __init__(self, spec: EnvSpec, config: LearnerConfig):
        check_config(config)
        from seed.agents.muzero.search import SearchConfig  # the search package is only needed to act

        self.spec = spec
        self.config = config
        self.network = make_network(spec, config)
        self.target_network = copy.deepcopy(self.network).requires_grad_(False).eval()
        self.history = spec.frame_stack - 1
        self.train_steps = 0  # updates made, kept by `after_update`: the age of a step for the off-policy correction
        self.search_config = SearchConfig(
            num_simulations=config.num_simulations, algorithm=config.search, dirichlet_alpha=config.dirichlet_alpha,
            dirichlet_fraction=0.0,  # the root noise is added here, per row: evaluation rows get none
            backend=config.search_backend)
        # reanalysis's searches on a GPU, as CUDA-graph replays with --cuda_graphs (the framework captures `act`)
        self._graphed_search = GraphedSearch(self._search)

    # --- acting -------------------------------------------------------------------------------------------------

    def initial_state(self, batch_size: int) -> State:
        """The frame stack (Atari) as the only per-env state: the search starts from the stacked observation."""
        if not self.history:
            return {}
        return {"frames": torch.zeros((batch_size, self.history, *self.spec.observation_shape),
                                      dtype=torch_dtype(self.spec.observation_dtype))}

    def _stacked(self, observation: torch.Tensor, done: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """Observations [T, B, *frame] -> stacked [T, B, S, *frame] and the new frame state."""
        if not self.history:
            return observation.unsqueeze(2), {}
        stacked, frames = stack_frames(state["frames"], observation, done)
        return stacked, {"frames": frames}

    def _root_prior(self, logits: torch.Tensor, noisy: torch.Tensor) -> torch.Tensor:
        """Root prior logits [B, A] with Dirichlet(alpha) noise mixed in (weight `exploration_fraction`) on the rows
        where `noisy` [B] is set (MuZero's root exploration noise), with --search=puct only: Gumbel MuZero explores
        with its Gumbel noise and builds the improved policy (the policy target) from the network's own logits
        (Danihelka et al. 2022; mctx's gumbel_muzero_policy adds no Dirichlet noise), so with --search=gumbel the
        logits come back unchanged (and no noise is drawn)."""
        fraction = self.config.exploration_fraction
        if fraction <= 0 or self.config.search == "gumbel":
            return logits
        concentration = torch.full_like(logits, self.config.dirichlet_alpha)
        noise = torch._standard_gamma(concentration)
        noise = noise / noise.sum(-1, keepdim=True).clamp(min=1e-12)
        mixed = (1 - fraction) * torch.softmax(logits, -1) + fraction * noise
        return torch.where(noisy.unsqueeze(-1), mixed.clamp(min=1e-12).log(), logits)

    def _recurrent_fn(self, network: MuZeroNetwork):
        """The search's recurrent function: dynamics + value-prefix LSTM + prediction for B leaves at once.

        The embedding of a node is {latent, h, c (the value-prefix LSTM), prefix (its predicted value prefix),
        depth}. The edge reward is the child's prefix minus the parent's; the LSTM (and so the prefix) restarts from
        zero below every node whose depth is a multiple of `value_prefix_horizon` (the root included), as in
        EfficientZero's search.
        """
        horizon = self.config.value_prefix_horizon
        discount = self.config.discounting

        def recurrent_fn(parent: dict[str, torch.Tensor], action: torch.Tensor):
            from seed.agents.muzero.search import RecurrentOutput

            latent, prefix_logits, (h, c), policy, value_logits = network.recurrent_inference(
                parent["latent"], action, (parent["h"], parent["c"]))
            prefix = support_to_scalar(prefix_logits)
            parent_reset = (parent["depth"] % horizon) == 0
            reward = prefix - torch.where(parent_reset, torch.zeros_like(prefix), parent["prefix"])
            depth = parent["depth"] + 1
            keep = ((depth % horizon) != 0).unsqueeze(-1).to(h.dtype)
            return RecurrentOutput(
                reward=reward, discount=torch.full_like(reward, discount), prior_logits=policy,
                value=support_to_scalar(value_logits),
                embedding={"latent": latent, "h": h * keep, "c": c * keep, "prefix": prefix, "depth": depth})

        return recurrent_fn

    def _search(self, network: MuZeroNetwork, stacked: torch.Tensor, evaluate: torch.Tensor) -> Any:
        """One search per row of stacked observations [B, S, *frame]; rows where `evaluate` [B] is set get no root
        noise and temperature 0. Returns the SearchOutput."""
        from seed.agents.muzero.search import RootInput, search

        latent, policy_logits, value_logits = network.initial_inference(stacked)
        rows = latent.shape[0]
        h, c = network.initial_state_lstm(rows, latent.device)
        embedding = {"latent": latent, "h": h, "c": c, "prefix": torch.zeros(rows, device=latent.device),
                     "depth": torch.zeros(rows, dtype=torch.int64, device=latent.device)}
        root = RootInput(prior_logits=self._root_prior(policy_logits, ~evaluate),
                         value=support_to_scalar(value_logits), embedding=embedding)
        temperature = torch.where(evaluate, 0.0, self.config.visit_temperature)
        return search(root, self._recurrent_fn(network), self.search_config, temperature=temperature)

    def _act(self, network: MuZeroNetwork, batch: InferenceBatch, state: State, evaluate: torch.Tensor
             ) -> ActOutput:
        stacked, new_state = self._stacked(batch.observation.unsqueeze(0), batch.done.unsqueeze(0), state)
        out = self._search(network, stacked[0], evaluate)
        greedy_by = out.visit_counts if self.config.search == "puct" else out.action_weights
        action = torch.where(evaluate, greedy_by.argmax(-1), out.action)
        return ActOutput(action=action, outputs={"search_policy": out.action_weights.float(),
                                                 "root_value": out.root_value.float()}, state=new_state)

    def act(self, network: nn.Module, batch: InferenceBatch, state: State) -> ActOutput:
        """One search for every row; the last `num_eval_envs` env ids (and padded rows) play greedily."""
        evaluate = batch.env_ids >= self.config.num_envs - self.config.num_eval_envs
        return self._act(network, batch, state, evaluate)

    def evaluation_act(self, network: nn.Module, batch: InferenceBatch, state: State) -> ActOutput:
        """The evaluation policy on every row: the search without root noise, its most visited action."""
        return self._act(network, batch, state, torch.ones_like(batch.done))

    # --- training -----------------------------------------------------------------------------------------------

    def to(self, device: torch.device) -> contract.Agent:
        self.network.to(device)
        self.target_network.to(device)
        return self

    def replay_sequence_bytes(self) -> int:
        return replay_sequence_bytes(self.spec, self.config)

    def stacked_observations(self, unrolls: Unroll) -> torch.Tensor:
        """[L, B, S, *frame]: every stored step's observation with the frames before it (from the stored state)."""
        stacked, _ = self._stacked(unrolls.observation, unrolls.done, unrolls.initial_state)
        return stacked

    @torch.no_grad()
    def initial_priorities(self, unrolls: Unroll) -> np.ndarray:
        """Priorities at insertion (a time-major batch) from the stored search values: |root value - n-step
        target| over the sequence's starts, the target bootstrapped with the stored root values too
        (EfficientZero's new-data priority uses the root value the actor saw)."""
        batch = unrolls
        root_value = batch.steps["root_value"].float()
        targets, mask = value_targets(batch, root_value, self.config, self.train_steps)
        starts = self.config.unroll_length
        priorities = start_priorities(root_value[:starts], targets[:starts], mask[:starts] & batch.valid[:starts],
                                      self.config.priority_eta)
        return priorities.double().numpy()

    @torch.no_grad()
    def priorities(self, unrolls: Unroll, network: MuZeroNetwork, target_network: MuZeroNetwork, version: int
                   ) -> torch.Tensor:
        """Priority Refresh (seed/experience/priority_refresh.py): the priorities float [B] that training on sequences
        [L, B]
        with these networks would give them: |v - z| over the sequence's starts (v: `network`'s value at a start,
        z: the n-step target bootstrapped with `target_network`), combined as the loss combines them. `version`:
        the networks' parameter version, the train_steps the loss ran with (--td_age_updates shortens each step's
        horizon by its age against it); not `self.train_steps`, which stays 0 in the learner's agent when the
        training process trains."""
        length, batch = unrolls.reward.shape
        starts = self.config.unroll_length
        stacked = self.stacked_observations(unrolls)
        bootstrap = predicted_values(target_network, stacked.flatten(0, 1), length, batch)
        targets, target_mask = value_targets(unrolls, bootstrap, self.config, version)
        start_value = predicted_values(network, stacked[:starts].flatten(0, 1), starts, batch)
        masks = unroll_masks(unrolls.done, unrolls.truncated, unrolls.valid, starts, self.config.unroll_steps)
        mask = masks["start"][0] & target_mask[:starts]
        return start_priorities(start_value, targets[:starts], mask, self.config.priority_eta)

    @property
    def target_version(self) -> int:
        """The update the target network was copied at (`after_update` copies it every target_update_interval):
        the reanalysing network's version for reanalysis/staleness_updates."""
        return self.train_steps - self.train_steps % self.config.target_update_interval

    def reanalyse_batch(self, batch: TrainingBatch, train_steps: int) -> tuple[TrainingBatch, dict[str, float]]:
        """--reanalyse_ratio: the batch with fresh policy targets for its first sequences, searched with the target
        network, and the pass's metrics (agents/muzero/reanalysis.py)."""
        return reanalyse_batch(batch, train_steps, config=self.config, stacked_observations=self.stacked_observations,
                               search=self._reanalysis_search(), network=self.target_network,
                               network_version=self.target_version)

    def _reanalysis_search(self) -> Any:
        """The search reanalysis runs: CUDA-graph replays on a GPU with --cuda_graphs (graphed_search.py), else
        eager."""
        return self._graphed_search if self.config.cuda_graphs else self._search

    def preparation_network(self) -> tuple[nn.Module, int]:
        """--reanalyse_workers: the workers reanalyse with the target network (its version: `target_version`)."""
        return self.target_network, self.target_version

    def prepare_batch(self, batch: TrainingBatch, train_steps: int, version: int
                      ) -> tuple[TrainingBatch, dict[str, float]]:
        """--reanalyse_workers, in a batch worker (seed/training/batch_workers.py): the reanalysis `reanalyse_batch`
        makes inline, with the worker's target network, which holds the parameters of update `version`."""
        return reanalyse_batch(batch, train_steps, config=self.config, stacked_observations=self.stacked_observations,
                               search=self._reanalysis_search(), network=self.target_network, network_version=version)

    def loss(self, batch: TrainingBatch) -> LossOutput:
        """EfficientZero's loss on every start of every sampled sequence (agents/muzero/losses.py)."""
        return muzero_loss(self.network, self.target_network, batch, self.config, self.train_steps,
                           self.stacked_observations)

    def update(self, batch: TrainingBatch, optimizer: torch.optim.Optimizer, step: contract.UpdateStep
               ) -> contract.UpdateOutput:
        """One optimizer step on the loss; with --reanalyse_ratio the batch's policy targets are searched again
        with the target network first (its metrics are logged beside the loss's).

        With a shard (--training_devices) each rank trains its columns, its loss scaled by world x its trained
        starts / the whole batch's (`data_parallel_share`): the loss is a mean over trained starts, not over
        columns, so the averaged gradient is the whole batch's whatever the padding. Each rank reanalyses its own
        columns."""
        share = None if step.shard is None else data_parallel_share(batch, step.shard, self.config.unroll_length)
        reanalysis: dict[str, float] = {}
        if self.config.reanalyse_ratio > 0 and not self.batch_workers(self.config):  # else reanalysed in a worker
            if share is not None:
                columns, reanalysis = self.reanalyse_batch(share[0], step.train_steps)
                share = (columns, share[1])
            else:
                batch, reanalysis = self.reanalyse_batch(batch, step.train_steps)
        return _with_values(contract.gradient_step(self.network, self.loss, batch, optimizer, step, share=share),
                            reanalysis)

    def after_update(self, train_steps: int) -> None:
        self.train_steps = train_steps
        if train_steps % self.config.target_update_interval == 0:
            self.target_network.load_state_dict(self.network.state_dict())

    def state_dict(self) -> dict[str, Any]:
        return {"network": self.network.state_dict(), "target_network": self.target_network.state_dict(),
                "train_steps": self.train_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.network.load_state_dict(state["network"])
        self.target_network.load_state_dict(state["target_network"])
        self.train_steps = int(state.get("train_steps", 0))


def replay_sequence_bytes(spec: EnvSpec, config: LearnerConfig) -> int:
    """Bytes one replay sequence takes: (burn_in + unroll_length + 1) steps of observation (one frame), reward,
    done, truncated, prev_action, action, valid, policy_version, search_policy [A] and root_value, plus the frame
    stack before the first step and the env id."""
    length = config.burn_in + config.unroll_length + 1
    frame = int(np.prod(spec.observation_shape)) * np.dtype(spec.observation_dtype).itemsize
    step_bytes = frame + 4 + 1 + 1 + 8 + 8 + 1 + 8 + 4 * spec.num_actions + 4
    return length * step_bytes + (spec.frame_stack - 1) * frame + 8


def data_parallel_share(batch: TrainingBatch, shard: contract.GradientShard, unroll_length: int
                        ) -> tuple[TrainingBatch, float]:
    """This rank's columns of `batch` and its loss scale world x (its trained starts) / (the batch's), so that the
    ranks' averaged gradient of their scaled losses (each a mean over its own trained starts) is the gradient of
    the whole batch's loss (a mean over all of them). 0 for a rank, or a batch, with no trained start."""
    columns, _ = shard.batch(batch)
    whole = trained_starts(batch.unrolls, unroll_length)
    return columns, shard.world * trained_starts(columns.unrolls, unroll_length) / max(1, whole)


def _with_values(output: contract.UpdateOutput, values: dict[str, float]) -> contract.UpdateOutput:
    output.values.update(values)
    return output


def describe_config(config: LearnerConfig) -> dict[str, Any]:
    """Derived values for --print_config: the replay's sequence length and expected memory."""
    from seed.envs import make_spec

    spec = make_spec(config.env, config.env_options())
    per_sequence = replay_sequence_bytes(spec, config)
    return {
        "replay_sequence_length": config.burn_in + config.unroll_length + 1,
        "trained_positions_per_batch": config.batch_size * config.unroll_length,
        "replay_bytes_per_sequence": per_sequence,
        "replay_expected_gib": round(per_sequence * config.replay_capacity / 2**30, 2),
    }
