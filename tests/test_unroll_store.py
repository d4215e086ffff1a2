"""Unroll store: overlap semantics, crossing episode ends, restarts discard partial unrolls."""

import pytest
import torch

from seed.inference.unroll_store import UnrollStore


def _step(values, done=None):
    values = torch.as_tensor(values, dtype=torch.float32)
    done = torch.zeros(len(values), dtype=torch.bool) if done is None else torch.as_tensor(done)
    return {"reward": values, "done": done}


def _state(values):
    return {"h": torch.as_tensor(values, dtype=torch.float32)[:, None]}


def _single(batch):
    """The single unrolls of what `append` returned (a time-major batch, or None), in env order."""
    return [] if batch is None else batch.unbind()


def test_the_unrolls_one_append_completes_come_out_as_one_time_major_batch():
    store = UnrollStore(num_envs=4, unroll_length=2, burn_in=0)
    ids = torch.tensor([3, 1, 2])
    assert store.append(ids, _step([0, 10, 20]), _state([0, 1, 2])) is None
    assert store.append(ids, _step([1, 11, 21]), _state([0, 1, 2])) is None
    batch = store.append(ids, _step([2, 12, 22]), _state([0, 1, 2]))
    assert batch.batch_size == 3 and batch.env_id.tolist() == [3, 1, 2]  # the order of `env_ids`
    assert batch.reward.shape == (3, 3)  # [L, n]: time-major
    assert batch.reward.tolist() == [[0, 10, 20], [1, 11, 21], [2, 12, 22]]
    assert batch.initial_state["h"].shape == (3, 1)
    # The next batch starts from the bootstrap step; the emitted one is a copy, not a view of the store.
    after = store.append(ids, _step([3, 13, 23]), _state([0, 1, 2]))
    assert after is None and batch.reward[:, 0].tolist() == [0, 1, 2]


def test_vtrace_unrolls_overlap_by_the_bootstrap_step():
    store = UnrollStore(num_envs=1, unroll_length=3, burn_in=0)
    emitted = []
    for t in range(10, 17):
        emitted += _single(store.append(torch.tensor([0]), _step([t]), _state([t])))
    assert [u.reward.tolist() for u in emitted] == [[10, 11, 12, 13], [13, 14, 15, 16]]
    assert all(u.valid.all() for u in emitted)
    # The state stored with an unroll is the state fed into its first step.
    assert [u.initial_state["h"].item() for u in emitted] == [0.0, 13.0]


def test_burn_in_prefix_is_padding_first_then_real_overlap():
    # SEED's test_overlap_2: unroll 2, overlap 2 -> [0, 10, 11, 12] then [11, 12, 13, 14] here with burn_in=1.
    store = UnrollStore(num_envs=1, unroll_length=2, burn_in=1)
    emitted = []
    for t in range(10, 15):
        emitted += _single(store.append(torch.tensor([0]), _step([t]), _state([100 + t])))
    assert [u.reward.tolist() for u in emitted] == [[0, 10, 11, 12], [11, 12, 13, 14]]
    assert emitted[0].valid.tolist() == [False, True, True, True]
    assert emitted[1].valid.tolist() == [True, True, True, True]
    # First unroll: zero state (before the padding); second: the state fed into step 11, its first step.
    assert [u.initial_state["h"].item() for u in emitted] == [0.0, 111.0]


def test_paper_r2d2_geometry_120_steps_overlapping_by_41():
    store = UnrollStore(num_envs=2, unroll_length=80, burn_in=40)
    emitted = []
    for t in range(300):
        emitted += _single(store.append(torch.tensor([0, 1]), _step([t, t]), _state([t, t])))
    first, second = emitted[0], emitted[2]
    assert first.length == 121 and first.valid.sum() == 81
    assert torch.equal(second.reward[:41], first.reward[-41:])
    assert second.initial_state["h"].item() == second.reward[0].item()


def test_unrolls_cross_episode_ends():
    store = UnrollStore(num_envs=1, unroll_length=4)
    emitted = []
    for t in range(5):
        emitted += _single(store.append(torch.tensor([0]), _step([t], done=[t == 2]), _state([t])))
    assert len(emitted) == 1
    assert emitted[0].done.tolist() == [False, False, True, False, False]


def test_restart_discards_partial_unroll_and_pads_again():
    store = UnrollStore(num_envs=2, unroll_length=3, burn_in=1)
    for t in range(3):
        store.append(torch.tensor([0, 1]), _step([t, t]), _state([t, t]))
    store.reset(torch.tensor([0]))
    emitted = []
    for t in range(50, 53):
        emitted += _single(store.append(torch.tensor([0, 1]), _step([t, t]), _state([t, t])))
    by_env = {int(u.env_id): u for u in emitted}
    assert set(by_env) == {1}
    assert by_env[1].reward.tolist() == [0, 0, 1, 2, 50]
    # Env 0 lost its steps 0..2: its first unroll after the restart is padding + new steps only.
    store_emitted = []
    for t in range(53, 55):
        store_emitted += _single(store.append(torch.tensor([0]), _step([t]), _state([t])))
    assert [u.reward.tolist() for u in store_emitted] == [[0, 50, 51, 52, 53]]
    assert store_emitted[0].valid.tolist() == [False, True, True, True, True]


def test_envs_in_any_order_and_subsets():
    store = UnrollStore(num_envs=3, unroll_length=1)
    out = _single(store.append(torch.tensor([2, 0]), _step([20, 0]), _state([0, 0])))
    out += _single(store.append(torch.tensor([0]), _step([1]), _state([0])))
    out += _single(store.append(torch.tensor([1, 2]), _step([10, 21]), _state([0, 0])))
    assert sorted((int(u.env_id), u.reward.tolist()) for u in out) == [(0, [0, 1]), (2, [20, 21])]


def test_burn_in_must_be_shorter_than_unroll():
    with pytest.raises(ValueError, match="burn_in: got 5, expected"):
        UnrollStore(num_envs=1, unroll_length=5, burn_in=5)


def test_a_step_written_in_two_parts_completes_the_unroll_then_gets_its_action():
    """--sync_lag=0's sync point: the boundary step is stored without an action (zeros), which emits the unroll;
    `complete_last` then writes the action into that step, now the first of the next unroll."""
    store = UnrollStore(num_envs=2, unroll_length=2)
    ids = torch.tensor([0, 1])
    for t in (10, 11):
        assert _single(store.append(ids, {**_step([t, t]), "action": torch.tensor([t, -t])}, _state([t, t]))) == []
    emitted = _single(store.append(ids, _step([12, 12]), _state([12, 12]), complete=False))
    assert [u.reward.tolist() for u in emitted] == [[10, 11, 12]] * 2
    assert [u.action.tolist() for u in emitted] == [[10, 11, 0], [-10, -11, 0]]  # the bootstrap step: no action yet
    store.complete_last(torch.tensor([1, 0]), {"action": torch.tensor([-12, 12])})
    store.append(ids, {**_step([13, 13]), "action": torch.tensor([13, -13])}, _state([13, 13]))
    emitted = _single(store.append(ids, {**_step([14, 14]), "action": torch.tensor([14, -14])}, _state([14, 14])))
    assert [u.action.tolist() for u in emitted] == [[12, 13, 14], [-12, -13, -14]]
    assert [u.initial_state["h"].item() for u in emitted] == [12.0, 12.0]  # the state fed into the split step


def test_partial_steps_and_completions_are_refused_when_they_cannot_fit():
    store = UnrollStore(num_envs=2, unroll_length=2)
    with pytest.raises(ValueError, match="complete=False before any complete step"):
        store.append(torch.tensor([0]), _step([1]), _state([1]), complete=False)
    store.append(torch.tensor([0]), {**_step([1]), "action": torch.tensor([1])}, _state([1]))
    with pytest.raises(ValueError, match=r"fields: got unknown \['logits'\]"):
        store.complete_last(torch.tensor([0]), {"logits": torch.zeros(1)})
    with pytest.raises(ValueError, match=r"env_ids: got \[1\] with no step written"):
        store.complete_last(torch.tensor([1]), {"action": torch.tensor([2])})
    burn_in = UnrollStore(num_envs=1, unroll_length=2, burn_in=1)  # a fresh env writes after its padding
    burn_in.append(torch.tensor([0]), {**_step([1]), "action": torch.tensor([1])}, _state([1]))
    burn_in.reset(torch.tensor([0]))
    with pytest.raises(ValueError, match=r"env_ids: got \[0\] with no step written"):
        burn_in.complete_last(torch.tensor([0]), {"action": torch.tensor([2])})
