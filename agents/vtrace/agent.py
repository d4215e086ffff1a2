"""The V-trace (IMPALA) agent: an actor-critic network, sampling at inference, the V-trace loss.

Discrete actions: softmax logits over the AgentBody (agents/networks.py), the behaviour logits stored with the
unroll. Box actions: the tanh-squashed Gaussian of agents/gaussian_actor_critic.py, the behaviour policy's log
density of each action stored with the unroll (`action_log_prob`) for the importance weights.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from seed.agents.gaussian_actor_critic import GaussianActorCritic, box_act, box_log_probs
from seed.agents.networks import ORTHOGONAL_INIT_NETWORKS, AgentBody, orthogonal_init_, resolve_network
from seed.agents.normalization import (
    ObservationNormalizer,
    ReturnScaler,
    load_state_dict_with_scaler,
    loss_rewards,
    state_dict_with_scaler,
    update_observation_statistics,
    with_scaled_rewards,
)
from seed.agents.options import check_input_statistics_options, check_network_options
from seed.agents.vtrace.config import VTraceConfig
from seed.agents.vtrace.vtrace import from_importance_weights
from seed.config import LearnerConfig
from seed.contracts import ActOutput, InferenceBatch, State
from seed.contracts import agent as contract
from seed.contracts.training import LossOutput, TrainingBatch
from seed.envs.base import EnvSpec


def _sample(logits: torch.Tensor) -> torch.Tensor:
    """Actions [B] sampled from softmax(logits [B, A]) by the Gumbel-max trick: argmax(logits - log E),
    E ~ Exp(1). Unlike torch.multinomial it never synchronises with the host, so it can be captured in a CUDA
    graph."""
    noise = torch.empty_like(logits).exponential_()
    return (logits - noise.log()).argmax(-1)


class ActorCriticNetwork(nn.Module):
    """AgentBody + policy logits [T, B, A] and baseline [T, B] heads; with --normalize_observations the vector
    observations go through a running normaliser (buffers `normalizer.*`, agents/normalization.py) first.

    Init with the plain conv torsos (ORTHOGONAL_INIT_NETWORKS): the torso orthogonal with gain sqrt(2), the
    policy head with gain 0.01 (a near-uniform first policy) and the baseline head with gain 1, as CleanRL and
    Stable-Baselines do; otherwise PyTorch's default.
    """

    def __init__(self, spec: EnvSpec, config: LearnerConfig):
        super().__init__()
        network = resolve_network(spec, config.network, "impala_deep")
        sizes = tuple(int(s) for s in config.mlp_sizes.split(",") if s)
        self.normalizer = None
        if config.normalize_observations:
            if len(spec.observation_shape) != 1:
                raise ValueError(f"--normalize_observations: got True for {spec.name}'s observations of shape "
                                 f"{spec.observation_shape}, expected vector observations (O,)")
            self.normalizer = ObservationNormalizer(spec.observation_shape[0], config.observation_clip)
        self.body = AgentBody(spec, network, config.network_width, config.use_lstm, config.lstm_size, sizes,
                              clip_reward_input=True)
        self.policy = nn.Linear(self.body.output_size, spec.num_actions)
        self.baseline = nn.Linear(self.body.output_size, 1)
        if network in ORTHOGONAL_INIT_NETWORKS:
            orthogonal_init_(self.body.torso)
            orthogonal_init_(self.policy, 0.01)
            orthogonal_init_(self.baseline, 1.0)

    def initial_state(self, batch_size: int) -> State:
        return self.body.initial_state(batch_size)

    def forward(self, observation, prev_action, reward, done, state):
        features, new_state = self._features(observation, prev_action, reward, done, state)
        return self.policy(features), self.baseline(features).squeeze(-1), new_state

    def policy_logits(self, observation, prev_action, reward, done, state):
        """`forward` without the baseline head: (logits [T, B, A], state), what acting needs."""
        features, new_state = self._features(observation, prev_action, reward, done, state)
        return self.policy(features), new_state

    def _features(self, observation, prev_action, reward, done, state):
        if self.normalizer is not None:
            observation = self.normalizer(observation)
        return self.body(observation, prev_action, reward, done, state)


def actor_critic_network(spec: EnvSpec, config: Any) -> nn.Module:
    """The network of V-trace and PPO for `spec`: ActorCriticNetwork (Discrete actions) or GaussianActorCritic
    (Box actions; refused with an LSTM, which it does not have). Both: (observation, prev_action, reward, done,
    state) -> (logits [T, B, A] or Gaussian means [T, B, D], values [T, B], state), and `normalizer` (or None)."""
    if not spec.continuous:
        return ActorCriticNetwork(spec, config)
    if config.use_lstm:
        raise ValueError(f"--use_lstm: got True for {spec.name}'s {spec.action_space} actions, expected False (the "
                         "Box actor-critic is feed-forward)")
    sizes = tuple(int(s) for s in config.mlp_sizes.split(",") if s)
    return GaussianActorCritic(spec, sizes, config.normalize_observations, config.observation_clip,
                               config.policy_min_std, config.initial_log_std, config.box_policy)


def reward_scaler(config: Any) -> ReturnScaler | None:
    """The training side's reward scaler with --normalize_rewards (per env id, discounted by --discounting)."""
    if not config.normalize_rewards:
        return None
    return ReturnScaler(config.num_envs, config.discounting, config.reward_clip)


def evaluation_policy(config: Any) -> str:
    """V-trace's and PPO's evaluation policy in words."""
    discrete = "greedy (argmax)" if config.eval_greedy else "sampled from the policy"
    return f"{discrete}; Box actions: the mode (the squashed Gaussian mean)"


class VTraceAgent(contract.Agent):
    """IMPALA's actor-critic: samples its policy when acting, trains the V-trace loss from the FIFO queue."""

    config_class = VTraceConfig
    action_spaces = ("discrete", "box")

    @classmethod
    def check_config(cls, config: Any) -> None:
        check_network_options(config)
        check_input_statistics_options(config)

    @classmethod
    def evaluation_policy(cls, config: Any) -> str:
        return evaluation_policy(config)

    def __init__(self, spec: EnvSpec, config: LearnerConfig):
        self.spec = spec
        self.config = config
        self.network = actor_critic_network(spec, config)
        self.reward_scaler = reward_scaler(config)

    def initial_state(self, batch_size: int) -> State:
        return self.network.initial_state(batch_size)

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
        """Samples from the policy; the evaluation envs (the last `num_eval_envs` env ids) use the evaluation
        policy: sampled too, or the greedy action with `--eval_greedy` (Box actions: the mode)."""
        if self.spec.continuous:
            return box_act(network, batch, state, self.config, evaluation=False)
        logits, new_state = self._logits(network, batch, state)
        action = _sample(logits)
        if self.config.eval_greedy and self.config.num_eval_envs > 0:
            is_eval = batch.env_ids >= self.config.num_envs - self.config.num_eval_envs
            action = torch.where(is_eval, logits.argmax(-1), action)
        return ActOutput(action=action, outputs={"policy_logits": logits}, state=new_state)

    def evaluation_act(self, network: nn.Module, batch: InferenceBatch, state: State) -> ActOutput:
        """The evaluation policy on every row: a sample from the policy, or its argmax with `--eval_greedy`
        (Box actions: the mode)."""
        if self.spec.continuous:
            return box_act(network, batch, state, self.config, evaluation=True)
        logits, new_state = self._logits(network, batch, state)
        action = logits.argmax(-1) if self.config.eval_greedy else _sample(logits)
        return ActOutput(action=action, outputs={"policy_logits": logits}, state=new_state)

    @staticmethod
    def _logits(network: nn.Module, batch: InferenceBatch, state: State) -> tuple[torch.Tensor, State]:
        logits, new_state = network.policy_logits(batch.observation.unsqueeze(0), batch.prev_action.unsqueeze(0),
                                                  batch.reward.unsqueeze(0), batch.done.unsqueeze(0), state)
        return logits[0], new_state

    def loss(self, batch: TrainingBatch) -> LossOutput:
        """IMPALA loss on a time-major batch of unrolls of T + 1 steps.

        The learner re-runs the network from the stored initial state over all T + 1 steps. Step t pairs
        action a_t with reward r_{t+1} and done_{t+1} (done at t + 1 ends the episode a_t was taken in).
        """
        c = self.config
        unrolls = batch.unrolls
        logits, baseline, _ = self.network(unrolls.observation, unrolls.prev_action, unrolls.reward,
                                           unrolls.done, unrolls.initial_state)
        actions = unrolls.action[:-1]
        rewards = loss_rewards(unrolls, c.max_abs_reward)
        # Truncation ends the episode like termination here: the final observation is not sent, so there is
        # no value to bootstrap from (SEED's V-trace learner did the same).
        discounts = (~unrolls.done[1:]).float() * c.discounting
        policy_metrics = {}
        if self.spec.continuous:
            target_action_log_probs, behaviour_action_log_probs, entropy, policy_metrics = box_log_probs(
                self.network, logits[:-1], unrolls, entropy_grad=c.entropy_cost != 0)
        else:
            target_log_probs = F.log_softmax(logits[:-1], -1)
            behaviour_log_probs = F.log_softmax(unrolls.policy_logits[:-1], -1)
            target_action_log_probs = target_log_probs.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
            behaviour_action_log_probs = behaviour_log_probs.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
            entropy = -(F.softmax(logits[:-1], -1) * target_log_probs).sum(-1).mean()
        log_rhos = target_action_log_probs.detach() - behaviour_action_log_probs
        returns = from_importance_weights(
            log_rhos=log_rhos,
            discounts=discounts, rewards=rewards, values=baseline[:-1].detach(), bootstrap_value=baseline[-1].detach(),
            clip_rho_threshold=c.clip_rho_threshold, clip_pg_rho_threshold=c.clip_pg_rho_threshold,
            lambda_=c.lambda_)
        policy_loss = -(target_action_log_probs * returns.pg_advantages).mean()
        baseline_loss = c.baseline_cost * 0.5 * (returns.vs - baseline[:-1]).pow(2).mean()
        rhos = log_rhos.exp()
        entropy_loss = -c.entropy_cost * entropy
        total = policy_loss + baseline_loss + entropy_loss
        metrics = {
            # SEED's summary names.
            "losses/policy": policy_loss.item(),
            "losses/V": baseline_loss.item(),
            "losses/entropy": entropy_loss.item(),
            "losses/total": total.item(),
            "policy/entropy": entropy.item(),
            "V/value function": baseline[:-1].mean().item(),
            # Off-policyness (how far the behaviour policy lags the trained one) and the learning signal.
            "vtrace/rho_mean": rhos.mean().item(),
            "vtrace/rho_clipped_fraction": (rhos > c.clip_rho_threshold).float().mean().item(),
            "vtrace/advantage_abs_mean": returns.pg_advantages.abs().mean().item(),
            **policy_metrics,
        }
        return LossOutput(total, metrics)

    def update(self, batch: TrainingBatch, optimizer: torch.optim.Optimizer, step: contract.UpdateStep
               ) -> contract.UpdateOutput:
        """One gradient step on the V-trace loss. With --normalize_rewards the loss trains on rewards scaled by the
        whole batch's returns (before a data-parallel rank takes its columns); with --normalize_observations the
        batch's observations join the statistics after the step, so the step saw the normalisation the behaviour
        policy acted with, give or take the policy lag."""
        batch = with_scaled_rewards(self.reward_scaler, batch)
        out = contract.gradient_step(self.network, self.loss, batch, optimizer, step)
        update_observation_statistics(self.network.normalizer, batch.unrolls)
        return out

