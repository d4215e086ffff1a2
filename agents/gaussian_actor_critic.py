"""The actor-critic network of V-trace and PPO on Box action spaces: a tanh-squashed Gaussian policy
(agents/distributions.py) and a value, from vector observations.

    observation [T, B, O] -> (running normalisation, agents/normalization.py) -> policy MLP (tanh) -> mean [T, B, D]
                                                                            -> value MLP (tanh)  -> value [T, B]
    log_std [D]: one parameter per action dimension, the same in every state

As CleanRL's ppo_continuous_action and the one tuned configuration of SEED's mujoco/ (PPO on HalfCheetah):
separate policy and value MLPs (`--mlp_sizes`, 64,64) with tanh, orthogonal init (gain sqrt 2 hidden, 0.01 mean
head, 1 value head), a state-independent log std starting at 0 (`--initial_log_std`). The std is a parameter,
not SEED's state-dependent softplus head: the 1M-step targets are CleanRL's, whose policy has it, and a std that
does not depend on the state cannot collapse in the rarely visited states where a head would be least trained.
SEED's minimum std stays (`--policy_min_std`, 1e-3: std = max(exp(log_std), min_std)). No LSTM and no previous
action or reward input: MuJoCo states are fully observed.

The network is time-major like agents/networks.py's and keeps its call signature (observation, prev_action,
reward, done, state) -> (mean, value, state), so the agents run either network the same way.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from seed.agents.distributions import BOX_POLICIES, TanhNormal
from seed.agents.networks import orthogonal_init_
from seed.agents.normalization import ObservationNormalizer
from seed.agents.torsos import MLPTorso
from seed.contracts import ActOutput, InferenceBatch, State
from seed.contracts.training import Unroll
from seed.envs.base import EnvSpec

ACTION_LOG_PROB = "action_log_prob"  # the unroll column of the behaviour policy's log mu(a_t | x_t), float32 [B]


def check_box_spec(spec: EnvSpec) -> None:
    """Raises ValueError naming the field unless `spec` has vector observations and finite Box bounds with
    low < high (the tanh squash maps onto a bounded box)."""
    if len(spec.observation_shape) != 1:
        raise ValueError(f"{spec.name}: observation_shape: got {spec.observation_shape}, expected a vector (O,) for "
                         f"the Gaussian actor-critic on {spec.action_space}")
    bounds = list(zip(spec.action_low, spec.action_high, strict=True))
    if not all(math.isfinite(lo) and math.isfinite(hi) and lo < hi for lo, hi in bounds):
        raise ValueError(f"{spec.name}: action bounds: got low {spec.action_low}, high {spec.action_high}, expected "
                         "finite bounds with low < high in every dimension (the policy squashes into them)")


class GaussianActorCritic(nn.Module):
    """forward(observation [T, B, O], prev_action, reward, done, state) -> (mean [T, B, D], value [T, B], {}).

    Args:
      spec: a Box env spec (check_box_spec).
      mlp_sizes: hidden sizes of each MLP.
      normalize_observations, observation_clip: the running observation normaliser (buffers `normalizer.*`).
      min_std, initial_log_std: the policy's std floor and starting log std.
      box_policy: "tanh" (TanhNormal) or "clipped" (ClippedNormal: unsquashed, the env clips).
    """

    def __init__(self, spec: EnvSpec, mlp_sizes: tuple[int, ...], normalize_observations: bool,
                 observation_clip: float = 10.0, min_std: float = 1e-3, initial_log_std: float = 0.0,
                 box_policy: str = "tanh"):
        super().__init__()
        if box_policy not in BOX_POLICIES:
            raise ValueError(f"--box_policy: got {box_policy!r}, expected {' or '.join(BOX_POLICIES)}")
        self.distribution_class = BOX_POLICIES[box_policy]
        check_box_spec(spec)
        size, dims = spec.observation_shape[0], spec.action_shape[0]
        self.normalizer = ObservationNormalizer(size, observation_clip) if normalize_observations else None
        self.policy_torso = MLPTorso(size, mlp_sizes, nn.Tanh)
        self.mean = nn.Linear(self.policy_torso.output_size, dims)
        self.value_torso = MLPTorso(size, mlp_sizes, nn.Tanh)
        self.value = nn.Linear(self.value_torso.output_size, 1)
        self.log_std = nn.Parameter(torch.full((dims,), float(initial_log_std)))
        self.min_std = min_std
        # Constants of the env, rebuilt from the spec on every side: kept out of the state dict.
        self.register_buffer("action_low", torch.tensor(spec.action_low, dtype=torch.float32), persistent=False)
        self.register_buffer("action_high", torch.tensor(spec.action_high, dtype=torch.float32), persistent=False)
        orthogonal_init_(self.policy_torso)
        orthogonal_init_(self.value_torso)
        orthogonal_init_(self.mean, 0.01)
        orthogonal_init_(self.value, 1.0)

    def initial_state(self, batch_size: int) -> State:
        return {}

    def forward(self, observation: torch.Tensor, prev_action: torch.Tensor, reward: torch.Tensor,
                done: torch.Tensor, state: State) -> tuple[torch.Tensor, torch.Tensor, State]:
        time_steps, batch = done.shape
        x = observation.reshape(time_steps * batch, -1).float()
        if self.normalizer is not None:
            x = self.normalizer(x)
        mean = self.mean(self.policy_torso(x)).view(time_steps, batch, -1)
        value = self.value(self.value_torso(x)).view(time_steps, batch)
        return mean, value, {}

    def distribution(self, mean: torch.Tensor) -> TanhNormal:
        """The policy over actions [..., D] in the env's units given the Gaussian means [..., D]."""
        return self.distribution_class(mean, self.log_std, self.action_low, self.action_high, self.min_std)


def box_act(network: GaussianActorCritic, batch: InferenceBatch, state: State, config: Any, evaluation: bool,
            noise: torch.Tensor | None = None) -> ActOutput:
    """One inference step on Box actions: float32 actions [B, D] in the env's units, outputs `action_log_prob`
    [B] (log mu(a | x) of the action as sent, recomputed from it as the loss will) and `baseline` [B].

    Training envs sample the policy (`noise`: standard normal draws [B, D] to use, e.g. counter-based ones);
    the evaluation envs (the last `num_eval_envs` env ids) and every row with `evaluation` play the mode.
    """
    mean, value, new_state = network(batch.observation.unsqueeze(0), batch.prev_action.unsqueeze(0),
                                     batch.reward.unsqueeze(0), batch.done.unsqueeze(0), state)
    dist = network.distribution(mean[0])
    if evaluation:
        action = dist.mode()
    else:
        action, _ = dist.rsample_with_log_prob(noise)
        if config.num_eval_envs > 0:
            is_eval = batch.env_ids >= config.num_envs - config.num_eval_envs
            action = torch.where(is_eval.unsqueeze(-1), dist.mode(), action)
    # The stored log-probability is log_prob(action), not the sample's own: the loss can only recompute it from
    # the action, and the two differ where tanh saturates (|u| > 7.25), so the on-policy ratio stays exactly 1.
    return ActOutput(action=action, outputs={ACTION_LOG_PROB: dist.log_prob(action), "baseline": value[0]},
                     state=new_state)


def box_log_probs(network: GaussianActorCritic, mean: torch.Tensor, unrolls: Unroll, entropy_grad: bool = True
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, float]]:
    """(log pi(a_t | x_t) [T, B] with gradients, log mu(a_t | x_t) [T, B] as stored, an entropy estimate (scalar,
    with gradients unless `entropy_grad` is False: no entropy bonus, so only logged), metrics) for the actions of
    `unrolls` ([T + 1, B, D]; the last step only bootstraps) given the trained network's Gaussian means [T, B, D]."""
    dist = network.distribution(mean)
    log_probs = dist.log_prob(unrolls.action[:-1])
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        entropy = dist.entropy_estimate().mean()
    metrics = {"policy/std": dist.std.mean().item(),
               "policy/max_action_abs(before_tanh)": mean.detach().abs().max().item()}
    return log_probs, unrolls.steps[ACTION_LOG_PROB][:-1], entropy, metrics
