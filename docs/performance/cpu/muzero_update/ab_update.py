"""The MuZero update against its reference, alternating in one process on one batch: the per-step loss on NCHW
weights kept in tests/test_muzero_update.py (`reference_loss`) and the current loss (agents/muzero/losses.py), each
with Adam on the same parameters, `--rounds` x `--per_round` updates each, medians in ms. Alternating in one
process keeps a shared machine's load the same for both.

    NUMBA_CACHE_DIR=/tmp/numba taskset -c 1 python docs/performance/cpu/muzero_update/ab_update.py \
        --preset=minatar_muzero --batch_size=8
"""

import copy
import os
import statistics
import sys
import time

import torch
from absl import flags

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))  # the repository, for tests.*

from seed.agents.muzero import networks  # noqa: E402
from seed.agents.muzero.losses import muzero_loss  # noqa: E402
from seed.bench.compute_cost import make_unrolls  # noqa: E402
from seed.config import explicit_flags  # noqa: E402
from seed.contracts import agent as contract  # noqa: E402
from seed.contracts.training import TrainingBatch  # noqa: E402
from seed.envs import make_spec  # noqa: E402
from seed.learner.configuration import define_learner_flags, learner_fields, resolve_config  # noqa: E402
from tests.test_muzero_update import reference_loss, reference_normalize_latent  # noqa: E402

define_learner_flags()
flags.DEFINE_integer("rounds", 5, "Rounds of (reference, current).")
flags.DEFINE_integer("per_round", 3, "Timed updates of each per round.")
FLAGS = flags.FLAGS


def main() -> None:
    FLAGS(sys.argv)
    values = explicit_flags(learner_fields(), FLAGS)
    values.setdefault("logdir", "/tmp/seed-ab-update")
    config = resolve_config(values)
    torch.set_num_threads(1)
    torch.manual_seed(config.seed)
    spec = make_spec(config.env, config.env_options())
    agent = type(config).agent_class(spec, config)
    batch = TrainingBatch(make_unrolls(agent, spec, config, torch.Generator().manual_seed(config.seed)),
                          importance_weights=torch.ones(config.batch_size))
    reference = copy.deepcopy(agent.network)
    if isinstance(reference, networks.ResNetMuZeroNetwork):  # the NCHW layout it ran in
        reference.memory_format = torch.contiguous_format
        reference.to(memory_format=torch.contiguous_format)
    reference_target = copy.deepcopy(reference).requires_grad_(False).eval()
    optimizers = {name: torch.optim.Adam(net.parameters(), lr=config.learning_rate)
                  for name, net in (("reference", reference), ("current", agent.network))}
    step = contract.UpdateStep(0, config.grad_clip_norm, None)

    def reference_update() -> None:
        original = networks.normalize_latent
        networks.normalize_latent = reference_normalize_latent
        try:
            contract.gradient_step(reference, lambda b: reference_loss(
                reference, reference_target, b, config, 0, agent.stacked_observations), batch,
                optimizers["reference"], step)
        finally:
            networks.normalize_latent = original

    def current_update() -> None:
        contract.gradient_step(agent.network, lambda b: muzero_loss(
            agent.network, agent.target_network, b, config, 0, agent.stacked_observations), batch,
            optimizers["current"], step)

    updates = {"reference": reference_update, "current": current_update}
    times: dict[str, list[float]] = {name: [] for name in updates}
    for update in updates.values():
        for _ in range(2):
            update()
    for _ in range(FLAGS.rounds):
        for name, update in updates.items():
            for _ in range(FLAGS.per_round):
                start = time.perf_counter()
                update()
                times[name].append((time.perf_counter() - start) * 1e3)
    medians = {name: statistics.median(t) for name, t in times.items()}
    print(f"batch {config.batch_size}: reference {medians['reference']:.1f} ms, current {medians['current']:.1f} ms, "
          f"ratio {medians['reference'] / medians['current']:.2f}, load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
