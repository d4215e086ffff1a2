"""The records of the batched search: what the caller passes in (the root, the recurrent function, the
configuration) and what it gets back. The contract is docs in agents/muzero/search/__init__.py.

B trees are searched at once, A actions, N = num_simulations + 1 nodes per tree. Tensors live on one device
(the inference device); floating tensors share one dtype (the dtype of `RootInput.value`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import Tensor

ALGORITHMS = ("puct", "gumbel")
BACKENDS = ("auto", "numpy", "numba")


@dataclass(frozen=True)
class RootInput:
    """The root of every tree, from the prediction network."""

    prior_logits: Tensor  # [B, A] float, policy logits of the root
    value: Tensor  # [B] float, scalar value of the root (already transformed back from the support)
    embedding: Any  # a pytree (tensor, or tuple/list/dict of tensors), each [B, ...]: the root's latent state


@dataclass(frozen=True)
class RecurrentOutput:
    """One step of the model from B parents, one action each."""

    reward: Tensor  # [B] float, reward of the edge (parent, action) -> child (scalar, not a support)
    discount: Tensor  # [B] float, discount applied to the child's value (gamma, or 0 after a terminal)
    prior_logits: Tensor  # [B, A] float, the child's policy logits
    value: Tensor  # [B] float, the child's scalar value
    embedding: Any  # pytree of [B, ...], the child's latent state


# (parent embeddings, a pytree of [B, ...]; actions [B] int64) -> the children.
RecurrentFn = Callable[[Any, Tensor], RecurrentOutput]


@dataclass(frozen=True)
class SearchConfig:
    """How to search. pUCT follows MuZero (Schrittwieser et al. 2020, pseudocode); gumbel follows Gumbel MuZero
    (Danihelka et al. 2022: sequential halving at the root, the deterministic improved-policy selection inside)."""

    num_simulations: int = 50
    algorithm: str = "puct"  # "puct" (MuZero) or "gumbel" (Gumbel MuZero, sequential halving)
    pb_c_base: float = 19652.0
    pb_c_init: float = 1.25
    dirichlet_alpha: float = 0.3
    dirichlet_fraction: float = 0.25  # root exploration noise weight (0 at evaluation)
    max_num_considered_actions: int = 16  # gumbel
    gumbel_scale: float = 1.0  # gumbel (0 at evaluation)
    value_scale: float = 0.1  # gumbel sigma: c_scale, c_visit = maxvisit_init
    maxvisit_init: float = 50.0
    # "numba": the compiled simulation loop (compiled.py; CPU tensors only); "numpy": the loop of numpy calls on the
    # CPU, torch calls elsewhere (puct.py, gumbel.py: the reference, and the path of other devices); "auto": numba on
    # the CPU, numpy elsewhere.
    backend: str = "auto"

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"SearchConfig.algorithm: got {self.algorithm!r}, expected one of {ALGORITHMS}")
        if self.backend not in BACKENDS:
            raise ValueError(f"SearchConfig.backend: got {self.backend!r}, expected one of {BACKENDS}")
        if self.num_simulations < 1:
            raise ValueError(f"SearchConfig.num_simulations: got {self.num_simulations}, expected >= 1")
        if self.max_num_considered_actions < 1:
            raise ValueError(f"SearchConfig.max_num_considered_actions: got {self.max_num_considered_actions}, "
                             "expected >= 1")
        if not 0.0 <= self.dirichlet_fraction <= 1.0:
            raise ValueError(f"SearchConfig.dirichlet_fraction: got {self.dirichlet_fraction}, expected in [0, 1]")
        if self.dirichlet_fraction > 0 and self.dirichlet_alpha <= 0:
            raise ValueError(f"SearchConfig.dirichlet_alpha: got {self.dirichlet_alpha}, expected > 0")
        if self.pb_c_base <= 0:
            raise ValueError(f"SearchConfig.pb_c_base: got {self.pb_c_base}, expected > 0")


@dataclass(frozen=True)
class SearchOutput:
    """The result of one search of B trees."""

    action: Tensor  # [B] int64: the action to play (puct: sampled from the visit counts with the temperature, or
    #   their argmax, lowest index first, at temperature 0; gumbel: the sequential-halving winner)
    action_weights: Tensor  # [B, A] float: the policy target (puct: normalised visit counts; gumbel: the improved
    #   policy softmax(logits + sigma(completed Q)))
    root_value: Tensor  # [B] float: the search value of the root (mean of the values backed up into it, its own
    #   network value included)
    visit_counts: Tensor  # [B, A] float: the root children's visit counts
    tree: Any  # tree.Tree, the final tree, for tests and statistics (this module imports nothing of the search)
