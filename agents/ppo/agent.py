"""The PPO agent (HTS-RL's learner): the V-trace agent's actor-critic network, sampling at inference, and a
training step of `ppo_epochs` x `ppo_minibatches` clipped-surrogate updates over each rollout.

Box actions: the tanh-squashed Gaussian of agents/gaussian_actor_critic.py; the ratios use the behaviour policy's
log density of each action, stored with the unroll (`action_log_prob`)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from seed.agents.counter_rng import counter_uniforms, gumbel_max_sample
from seed.agents.gaussian_actor_critic import ACTION_LOG_PROB, box_act, box_log_probs
from seed.agents.normalization import (
    load_state_dict_with_scaler,
    loss_rewards,
    state_dict_with_scaler,
    update_observation_statistics,
    with_scaled_rewards,
)
from seed.agents.options import check_input_statistics_options, check_network_options
from seed.agents.ppo.config import PPOConfig
from seed.agents.ppo.ppo import clipped_surrogate_loss, gae, normalize
from seed.agents.vtrace.agent import _sample, actor_critic_network, evaluation_policy, reward_scaler
from seed.config import LearnerConfig
from seed.contracts import ActOutput, InferenceBatch, State
from seed.contracts import agent as contract
from seed.contracts.training import LossOutput, TrainingBatch, Unroll
from seed.envs.base import EnvSpec

SAMPLE_STEP = "sample_step"  # --deterministic: int64 per-env step counter keying the env's random stream
START_VALUE = "start_value"  # --ppo_value_clip: V(x_t) at the update's start, [T + 1, B]
PROXIMAL_LOG_PROB = "proximal_log_prob"  # --ppo_decoupled: log pi_prox(a_t|x_t) at the update's start, [T + 1, B]

def _minibatch_limit(config: Any) -> tuple[int, str]:
    """(the most minibatches a rollout splits into, that limit as the refusal states it): B env columns, or with
    --ppo_shuffle_steps its B x T single steps."""
    if config.ppo_shuffle_steps:
        most = config.batch_size * config.unroll_length
        return most, f"<= batch_size x unroll_length ({most}): a minibatch holds single steps (--ppo_shuffle_steps)"
    return config.batch_size, f"<= batch_size ({config.batch_size}): a minibatch holds whole env columns"


class PPOAgent(contract.Agent):
    """HTS-RL's PPO: samples its policy when acting; each update is epochs of minibatches over one rollout."""

    config_class = PPOConfig
    supports_sync = True  # the learner may hold actors at rollout boundaries (--sync=hts)
    action_spaces = ("discrete", "box")

    @classmethod
    def derive_config(cls, config: Any, explicit: dict[str, Any]) -> None:
        """A --ppo_minibatches that was not typed (a default or a preset's) and exceeds what a rollout can split
        into is lowered to that: whole env columns (batch_size) or, with --ppo_shuffle_steps, single steps
        (batch_size x unroll_length). With single steps a preset's 32 minibatches stay 32 with fewer envs: capping
        them at the env count made `hopper_ppo --envs_per_actor=1` train 2 minibatches of 1,024 steps, 16 times
        fewer gradient steps than CleanRL's layout it was meant to reproduce."""
        most, _ = _minibatch_limit(config)
        if config.ppo_minibatches > most and "ppo_minibatches" not in explicit:
            config.ppo_minibatches = most

    @classmethod
    def check_config(cls, config: Any) -> None:
        check_network_options(config)
        check_input_statistics_options(config)
        most, minibatch_limit = _minibatch_limit(config)
        checks = [
            ("ppo_clip", config.ppo_clip > 0, "> 0"),
            ("ppo_epochs", config.ppo_epochs >= 1, ">= 1"),
            ("ppo_value_clip", config.ppo_value_clip >= 0, ">= 0 (0: no clipping)"),
            ("ppo_decoupled_weight_clip", config.ppo_decoupled_weight_clip >= 0, ">= 0 (0: no truncation)"),
            ("ppo_minibatches", 1 <= config.ppo_minibatches <= most, f">= 1 and {minibatch_limit}"),
            ("ppo_shuffle_steps", not (config.ppo_shuffle_steps and config.use_lstm),
             "False with --use_lstm: an LSTM's steps depend on the steps before them"),
        ]
        for name, ok, expected in checks:
            if not ok:
                raise ValueError(f"--{name}: got {getattr(config, name)!r}, expected {expected}")

    @classmethod
    def evaluation_policy(cls, config: Any) -> str:
        return evaluation_policy(config)

    def __init__(self, spec: EnvSpec, config: LearnerConfig):
        self.spec = spec
        self.config = config
        if config.ppo_shuffle_steps and spec.frame_stack > 1:
            raise ValueError(f"--ppo_shuffle_steps: got True, expected False for {spec.name}: the network stacks its "
                             f"{spec.frame_stack} frames from the steps before each one")
        self.network = actor_critic_network(spec, config)
        self.reward_scaler = reward_scaler(config)

    def initial_state(self, batch_size: int) -> State:
        state = self.network.initial_state(batch_size)
        if self.config.deterministic:
            state[SAMPLE_STEP] = torch.zeros(batch_size, dtype=torch.int64)
        return state

    def to(self, device: torch.device) -> contract.Agent:
        """Moves the trained network (and the reward scaler's statistics) to the training device."""
        self.network.to(device)
        if self.reward_scaler is not None:
            self.reward_scaler.to(device)
        return self

    def state_dict(self) -> dict[str, Any]:
        return state_dict_with_scaler(self.network, self.reward_scaler)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        load_state_dict_with_scaler(self.network, self.reward_scaler, state)

    def act(self, network: nn.Module, batch: InferenceBatch, state: State) -> ActOutput:
        """Samples a_t ~ pi(.|x_t); stores the logits and the value V(x_t) (outputs `policy_logits` [B, A] and
        `baseline` [B]). With `--deterministic` the sample is Gumbel-max on the env's counter-based uniforms
        (agents/counter_rng.py) keyed by (seed, env id, the env's step count), so it does not depend on the
        batch. Evaluation envs play the evaluation policy (greedy with `--eval_greedy`).

        Box actions: `box_act` (agents/gaussian_actor_critic.py): float32 actions [B, D], outputs `action_log_prob`
        [B] and `baseline` [B]; with `--deterministic` the Gaussian draws are the inverse normal CDF of the
        env's counter-based uniforms. Evaluation envs play the mode."""
        if self.spec.continuous:
            return self._box_act(network, batch, state, evaluation=False)
        logits, baseline, new_state = self._forward(network, batch, state)
        if SAMPLE_STEP in state:
            steps = state[SAMPLE_STEP]
            action = gumbel_max_sample(logits, counter_uniforms(self.config.seed, batch.env_ids, steps,
                                                                logits.shape[-1]))
            new_state[SAMPLE_STEP] = steps + 1
        else:
            action = _sample(logits)
        if self.config.eval_greedy and self.config.num_eval_envs > 0:
            is_eval = batch.env_ids >= self.config.num_envs - self.config.num_eval_envs
            action = torch.where(is_eval, logits.argmax(-1), action)
        return ActOutput(action=action, outputs={"policy_logits": logits, "baseline": baseline}, state=new_state)

    def evaluation_act(self, network: nn.Module, batch: InferenceBatch, state: State) -> ActOutput:
        """The evaluation policy on every row: a sample from the policy, or its argmax with `--eval_greedy`
        (Box actions: the mode)."""
        if self.spec.continuous:
            return self._box_act(network, batch, state, evaluation=True)
        logits, _, new_state = self._forward(network, batch, state)
        if SAMPLE_STEP in state:
            new_state[SAMPLE_STEP] = state[SAMPLE_STEP] + 1
        action = logits.argmax(-1) if self.config.eval_greedy else _sample(logits)
        return ActOutput(action=action, outputs={"policy_logits": logits}, state=new_state)

    def _box_act(self, network: nn.Module, batch: InferenceBatch, state: State, evaluation: bool) -> ActOutput:
        core_state = {k: v for k, v in state.items() if k != SAMPLE_STEP}
        noise = None
        if SAMPLE_STEP in state:
            uniforms = counter_uniforms(self.config.seed, batch.env_ids, state[SAMPLE_STEP], self.spec.action_shape[0])
            noise = torch.special.ndtri(uniforms).float()
        out = box_act(network, batch, core_state, self.config, evaluation, noise)
        if SAMPLE_STEP in state:
            out.state[SAMPLE_STEP] = state[SAMPLE_STEP] + 1
        return out

    @staticmethod
    def _forward(network: nn.Module, batch: InferenceBatch, state: State
                 ) -> tuple[torch.Tensor, torch.Tensor, State]:
        core_state = {k: v for k, v in state.items() if k != SAMPLE_STEP}
        logits, baseline, new_state = network(batch.observation.unsqueeze(0), batch.prev_action.unsqueeze(0),
                                              batch.reward.unsqueeze(0), batch.done.unsqueeze(0), core_state)
        return logits[0], baseline[0], new_state

    # -- training ----------------------------------------------------------------------------------------------
    def _run(self, unrolls: Unroll) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits [T + 1, B, A], values [T + 1, B]) of the trained network over the unrolls."""
        state = {k: v for k, v in unrolls.initial_state.items() if k != SAMPLE_STEP}
        logits, values, _ = self.network(unrolls.observation, unrolls.prev_action, unrolls.reward, unrolls.done,
                                         state)
        return logits, values

    def targets(self, unrolls: Unroll) -> tuple[torch.Tensor, torch.Tensor]:
        """(advantages [T, B], returns [T, B]) by GAE from the values of the network as it is before this
        rollout's updates (computed once per rollout). Step t pairs action a_t with reward r_{t+1} and
        done_{t+1}; truncation ends the episode like termination (no final observation to bootstrap from)."""
        with torch.no_grad():
            _, values = self._run(unrolls)
        return self._gae(unrolls, values)

    def _gae(self, unrolls: Unroll, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`targets` from given values [T + 1, B]."""
        c = self.config
        rewards = loss_rewards(unrolls, c.max_abs_reward)
        discounts = (~unrolls.done[1:]).float() * c.discounting
        return gae(rewards, values[:-1], values[-1], discounts, c.lambda_)

    def minibatch_loss(self, unrolls: Unroll, advantages: torch.Tensor, returns: torch.Tensor,
                       advantages_normalized: bool = False) -> LossOutput:
        """Clipped surrogate + baseline_cost x 0.5 (R - V)^2 - entropy_cost x entropy on one minibatch of env
        columns (unrolls [T + 1, b, ...], advantages and returns [T, b]); advantages normalised over it unless
        `advantages_normalized` (a data-parallel rank's share, normalised over the whole minibatch already)."""
        c = self.config
        # The bootstrap row's outputs are not used (the targets are given), and the network is causal: run it on
        # steps 0..T-1 only. With --ppo_shuffle_steps that halves the rows of every forward and backward.
        logits, values = self._run(Unroll({k: v[:-1] for k, v in unrolls.steps.items()}, unrolls.initial_state,
                                          unrolls.env_id))
        action_log_probs, behaviour_log_probs, entropy, policy_metrics = self._log_probs(
            logits, unrolls, entropy_grad=c.entropy_cost != 0)
        advantages = advantages if advantages_normalized else normalize(advantages)
        if PROXIMAL_LOG_PROB in unrolls.steps:  # --ppo_decoupled: clip against the update's starting policy
            proximal_log_probs = unrolls.steps[PROXIMAL_LOG_PROB][:-1]
            weights = (proximal_log_probs - behaviour_log_probs).exp()
            if c.ppo_decoupled_weight_clip > 0:  # V-trace's truncation: a stale tail sample cannot dominate
                weights = weights.clamp(max=c.ppo_decoupled_weight_clip)
            surrogate = clipped_surrogate_loss(action_log_probs, proximal_log_probs, advantages, c.ppo_clip,
                                               weights=weights)
        else:
            surrogate = clipped_surrogate_loss(action_log_probs, behaviour_log_probs, advantages, c.ppo_clip)
        squared_error = (returns - values).pow(2)
        if START_VALUE in unrolls.steps:  # --ppo_value_clip: the larger error of the clipped and unclipped value
            start = unrolls.steps[START_VALUE][:-1]
            clipped = start + (values - start).clamp(-c.ppo_value_clip, c.ppo_value_clip)
            squared_error = torch.max(squared_error, (returns - clipped).pow(2))
        baseline_loss = c.baseline_cost * 0.5 * squared_error.mean()
        total = surrogate.loss + baseline_loss - c.entropy_cost * entropy
        metrics = {
            "losses/policy": surrogate.loss.item(),
            "losses/V": baseline_loss.item(),
            "losses/entropy": -c.entropy_cost * entropy.item(),
            "losses/total": total.item(),
            "policy/entropy": entropy.item(),
            "policy/clip_fraction": surrogate.clip_fraction.item(),
            "policy/approx_kl": surrogate.approx_kl.item(),
            "V/value function": values.mean().item(),
            **policy_metrics,
        }
        return LossOutput(total, metrics)

    def _log_probs(self, logits: torch.Tensor, unrolls: Unroll, entropy_grad: bool = True
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, float]]:
        """(log pi(a_t|x_t) [T, B], log mu(a_t|x_t) [T, B] as acted, the entropy (scalar), metrics) from the
        network's outputs `logits` over steps 0..T-1 of `unrolls` ([T + 1, B, ...]): Box actions' Gaussian means
        [T, B, D] or Discrete logits [T, B, A]."""
        if self.spec.continuous:
            return box_log_probs(self.network, logits, unrolls, entropy_grad=entropy_grad)
        actions = unrolls.action[:-1].unsqueeze(-1)
        log_probs = F.log_softmax(logits, -1)
        action_log_probs = log_probs.gather(-1, actions).squeeze(-1)
        behaviour_log_probs = F.log_softmax(unrolls.policy_logits[:-1], -1).gather(-1, actions).squeeze(-1)
        entropy = -(log_probs.exp() * log_probs).sum(-1).mean()
        return action_log_probs, behaviour_log_probs, entropy, {}

    def loss(self, batch: TrainingBatch) -> LossOutput:
        """The PPO loss of the whole batch as one minibatch (the learner uses `train_rollout` instead)."""
        advantages, returns = self.targets(batch.unrolls)
        return self.minibatch_loss(batch.unrolls, advantages, returns)

    def update(self, batch: TrainingBatch, optimizer: torch.optim.Optimizer, step: contract.UpdateStep
               ) -> contract.UpdateOutput:
        """One learner update: `train_rollout`'s epochs of minibatches (PPO has no replay priorities). With
        --normalize_rewards the rollout's rewards are scaled first (every env's, before a rank takes its share);
        with --normalize_observations its observations join the statistics after the last minibatch, so every
        minibatch saw the normalisation the rollout was acted with (HTS: the ratios start at exactly 1) and the
        next rollout acts with the new statistics."""
        batch = with_scaled_rewards(self.reward_scaler, batch)
        if self.config.anneal_learning_rate:
            self.anneal_learning_rate(optimizer, step.train_steps)
        values = self.train_rollout(batch, optimizer, step.grad_clip_norm, step.train_steps, step.shard)
        if self.config.anneal_learning_rate:
            values["learning_rate"] = optimizer.param_groups[0]["lr"]
        update_observation_statistics(self.network.normalizer, batch.unrolls)
        return contract.UpdateOutput(values)

    def anneal_learning_rate(self, optimizer: torch.optim.Optimizer, update: int) -> None:
        """CleanRL's anneal_lr: update k of N trains at lr x (1 - k / N), N = --total_environment_frames / (env
        frames per rollout: every env's --sync_every steps x action repeat), never below 0. Each group's rate is
        scaled from its first one (kept as `initial_lr`, which the optimizer's checkpoint holds)."""
        c = self.config
        updates = c.total_environment_frames / (c.num_envs * c.unroll_length * self.spec.action_repeat)
        fraction = max(1.0 - update / updates, 0.0)
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])
            group["lr"] = group["initial_lr"] * fraction

    def train_rollout(self, batch: TrainingBatch, optimizer: torch.optim.Optimizer, grad_clip_norm: float,
                      update: int, shard: contract.GradientShard | None = None) -> dict[str, float]:
        """One learner update on one rollout storage: `ppo_epochs` passes, each over `ppo_minibatches`
        minibatches of env columns (all T steps of b ~ B / ppo_minibatches envs, so recurrent state and frame
        stacks stay whole), one optimizer step each. Advantages come from the values before the first step.
        The minibatch shuffles come from a generator seeded with (seed, update): the same in every run.

        Args:
          batch: unrolls [T + 1, B, ...] of one rollout, on the training device.
          update: the number of updates done before this one (the learner's train_steps).
          shard: with data-parallel training (seed/training/data_parallel.py's Shard), this rank's part: each
          minibatch's
            columns are split over the ranks, its advantages normalised over the whole minibatch first, the
            gradients averaged before the clip. Logged losses are then this rank's share's.
        Returns the metrics averaged over the minibatch steps (plus `gradient_norm` with a clip).
        """
        c = self.config
        unrolls = batch.unrolls
        with torch.no_grad():
            logits, values = self._run(unrolls)
            advantages, returns = self._gae(unrolls, values)
            proximal_log_probs, behaviour_log_probs, _, _ = self._log_probs(logits[:-1], unrolls, entropy_grad=False)
            # How far the acting parameters were behind this update's (HTS acts one update behind): the estimate
            # mean (w - 1) - log w of KL(mu || pi_prox), w = pi_prox / mu.
            log_weights = proximal_log_probs - behaviour_log_probs
            lag_metrics = {"policy/behaviour_lag_kl": float((log_weights.exp() - 1.0 - log_weights).mean())}
        # The minibatches carry only what `minibatch_loss` reads: the network's inputs and the behaviour policy
        # (with --ppo_decoupled the proximal policy, with --ppo_value_clip the values; their bootstrap rows are never
        # read).
        behaviour = ACTION_LOG_PROB if self.spec.continuous else "policy_logits"
        steps = {k: unrolls.steps[k] for k in ("observation", "prev_action", "reward", "done", "action", behaviour)}
        if c.ppo_value_clip > 0:
            steps[START_VALUE] = values
        if c.ppo_decoupled:
            steps[PROXIMAL_LOG_PROB] = torch.cat([proximal_log_probs, torch.zeros_like(proximal_log_probs[:1])])
        unrolls = Unroll(steps, unrolls.initial_state, unrolls.env_id)
        parameters = list(self.network.parameters())
        if c.ppo_shuffle_steps:  # every step its own column: the minibatches below then draw single steps
            unrolls, advantages, returns = single_step_columns(unrolls, advantages, returns)
        columns = unrolls.reward.shape[1]
        generator = torch.Generator().manual_seed(c.seed * 1_000_003 + update)
        sums: dict[str, float] = {}
        count = 0
        for _ in range(c.ppo_epochs):
            order = torch.randperm(columns, generator=generator)
            for part in torch.tensor_split(order, min(c.ppo_minibatches, columns)):
                index = part.to(advantages.device)
                minibatch_advantages, mine, loss_scale = advantages.index_select(1, index), index, 1.0
                if shard is not None:
                    if len(part) < shard.world:
                        raise ValueError(f"PPO minibatch: got {len(part)} columns (--batch_size / --ppo_minibatches), "
                                         f"expected at least {shard.world} (one per training device)")
                    share = shard.columns(len(index)).to(advantages.device)
                    mine = index.index_select(0, share)
                    minibatch_advantages = normalize(minibatch_advantages).index_select(1, share)
                    loss_scale = shard.loss_scale(len(share), len(index))
                minibatch = Unroll({k: v.index_select(1, mine) for k, v in unrolls.steps.items()},
                                   {k: v.index_select(0, mine) for k, v in unrolls.initial_state.items()},
                                   unrolls.env_id.index_select(0, mine))
                out = self.minibatch_loss(minibatch, minibatch_advantages, returns.index_select(1, mine),
                                          advantages_normalized=shard is not None)
                optimizer.zero_grad(set_to_none=True)
                if shard is None:
                    out.loss.backward()
                else:
                    (out.loss * loss_scale).backward()
                    shard.all_reduce_gradients(parameters)
                values = dict(out.metrics)
                if grad_clip_norm > 0:
                    values["gradient_norm"] = float(torch.nn.utils.clip_grad_norm_(parameters, grad_clip_norm))
                optimizer.step()
                for key, value in values.items():
                    sums[key] = sums.get(key, 0.0) + value
                count += 1
        return {**{key: value / count for key, value in sums.items()}, **lag_metrics}



def single_step_columns(unrolls: Unroll, advantages: torch.Tensor, returns: torch.Tensor
                        ) -> tuple[Unroll, torch.Tensor, torch.Tensor]:
    """The rollout's T x B steps as T x B columns of length 2 (step t of env b, then step t + 1, which a loss over
    [T + 1] unrolls reads only as the bootstrap row), with advantages and returns [1, T x B]; column j is step
    t = j // B of env b = j % B. For networks without memory only (--ppo_shuffle_steps): each step's outputs
    depend on that step's inputs alone."""
    time_steps, envs = advantages.shape
    steps = {key: torch.stack([value[:-1].flatten(0, 1), value[1:].flatten(0, 1)])
             for key, value in unrolls.steps.items()}
    state = {key: value.repeat(time_steps, *([1] * (value.dim() - 1)))
             for key, value in unrolls.initial_state.items()}
    columns = Unroll(steps, state, unrolls.env_id.repeat(time_steps))
    return columns, advantages.reshape(1, time_steps * envs), returns.reshape(1, time_steps * envs)
