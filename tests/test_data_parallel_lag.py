"""--training_devices with --max_policy_lag: every rank drops or trains each batch alike (seed/training/data_parallel.py
`Shard.agreed_lag`), even when the ranks saw different policy versions in their slot.

The race this closes: rank 0 dropped a batch before any collective and told the learner, which refilled the slot;
a rank still behind then read the slot's next batch. Here that is made to happen every time: two real gloo ranks
(spawned processes) each get their own copy of every batch, and on rank 1 every other batch is the "refilled"
one, fresh where rank 0's is too old. The ranks must agree on every drop and end with equal parameters."""

from __future__ import annotations

import traceback

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from seed.contracts.training import TrainingBatch, Unroll
from tests.test_data_parallel import _agent_and_config

MAX_LAG = 2
BATCHES = 6


def _batches(agent, spec, config) -> list[TrainingBatch]:
    """BATCHES fixed random V-trace batches [L, B, ...] (the same in every process; policy versions set later)."""
    rng = np.random.default_rng(7)
    length, b = config.unroll_length + 1, config.batch_size
    batches = []
    for _ in range(BATCHES):
        steps = {
            "observation": torch.from_numpy(rng.normal(size=(length, b, *spec.observation_shape)).astype(np.float32)),
            "reward": torch.from_numpy(rng.normal(size=(length, b)).astype(np.float32)),
            "done": torch.from_numpy(rng.random((length, b)) < 0.1),
            "truncated": torch.zeros(length, b, dtype=torch.bool),
            "prev_action": torch.from_numpy(rng.integers(0, spec.num_actions, (length, b))),
            "action": torch.from_numpy(rng.integers(0, spec.num_actions, (length, b))),
            "valid": torch.ones(length, b, dtype=torch.bool),
            "policy_logits": torch.from_numpy(rng.normal(size=(length, b, spec.num_actions)).astype(np.float32)),
        }
        state = {k: torch.from_numpy(rng.normal(size=v.shape).astype(np.float32)) if v.is_floating_point() else v
                 for k, v in agent.initial_state(b).items()}
        batches.append(TrainingBatch(Unroll(steps, state, torch.arange(b))))
    return batches


def _versions(batch, version: int) -> None:
    """Every step of `batch` acted by parameters `version` (its policy lag at update u: u - version)."""
    steps = batch.unrolls.steps
    steps["policy_version"] = torch.full(steps["reward"].shape, version, dtype=torch.int64)


def _rank(rank: int, world: int, store_path: str, out_path: str) -> None:
    import datetime

    from seed.training.data_parallel import Shard
    from seed.training.optimizers import make_optimizer
    from seed.training.update import train_on_batch

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=30))
    trained, error = [], None
    agent, spec, config = _agent_and_config("vtrace")
    config.max_policy_lag = MAX_LAG
    optimizer = make_optimizer(agent, config)
    train_steps = 0
    try:
        for index, batch in enumerate(_batches(agent, spec, config)):
            # Even batches: rank 0's slot was acted 5 updates ago (lag > MAX_LAG: drop); rank 1's copy is the next,
            # fresh batch (lag 0). Odd batches: fresh on both.
            stale = index % 2 == 0 and rank == 0
            _versions(batch, train_steps - 5 if stale else train_steps)
            result = train_on_batch(agent, optimizer, batch, config, train_steps, Shard(rank, world))
            trained.append(result.trained)
            if result.trained:
                train_steps += 1
                agent.after_update(train_steps)
    except Exception:  # noqa: BLE001 - reported to the test: a collective left waiting alone, a broken peer
        error = traceback.format_exc(limit=3)
    torch.save({"trained": trained, "error": error,
                "parameters": {k: v.detach().clone() for k, v in agent.network.state_dict().items()}},
               f"{out_path}.{rank}")
    dist.destroy_process_group()


def test_ranks_that_saw_different_lags_drop_the_same_batches_and_stay_equal(tmp_path):
    """Before (rank 0 deciding alone): rank 0 dropped batch 0, rank 1 trained it, and their updates paired up one
    batch apart until the last all_reduce waited alone for the gloo timeout."""
    out = str(tmp_path / "ranks")
    mp.start_processes(_rank, args=(2, str(tmp_path / "store"), out), nprocs=2, start_method="spawn")
    ranks = [torch.load(f"{out}.{rank}", weights_only=True) for rank in range(2)]
    assert [r["error"] for r in ranks] == [None, None], [r["error"] for r in ranks]
    # The largest lag wins: the even batches are dropped on both ranks, the odd ones trained on both.
    assert ranks[0]["trained"] == ranks[1]["trained"] == [False, True] * (BATCHES // 2), \
        [r["trained"] for r in ranks]
    for name, tensor in ranks[0]["parameters"].items():
        assert torch.equal(tensor, ranks[1]["parameters"][name]), name
