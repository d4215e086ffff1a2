"""Prioritized replay: sum tree sampling and updates, importance weights, the replay ratio, thread safety."""

import threading

import numpy as np
import pytest
import torch

from seed.contracts.training import Unroll
from seed.experience.replay import PrioritizedReplay, SumTree


def test_sum_tree_sampling_frequencies_match_priorities():
    tree = SumTree(6)
    priorities = np.array([1.0, 2.0, 0.0, 4.0, 8.0, 1.0])
    tree.set(np.arange(6), priorities)
    assert tree.total == pytest.approx(16.0)
    rng = np.random.default_rng(0)
    draws = np.concatenate([tree.sample(64, rng) for _ in range(2000)])
    frequencies = np.bincount(draws, minlength=6) / len(draws)
    np.testing.assert_allclose(frequencies, priorities / priorities.sum(), atol=0.005)
    assert frequencies[2] == 0.0


def test_sum_tree_updates_and_find():
    tree = SumTree(5)
    tree.set(np.arange(5), np.ones(5))
    tree.set(np.array([1, 3]), np.array([0.0, 6.0]))
    assert tree.total == pytest.approx(9.0)
    assert tree.get(np.arange(5)).tolist() == [1, 0, 1, 6, 1]
    # Cumulative ranges: [0,1) -> 0, [1,2) -> 2, [2,8) -> 3, [8,9) -> 4.
    assert tree.find(np.array([0.5, 1.5, 2.0, 7.99, 8.5])).tolist() == [0, 2, 3, 3, 4]
    with pytest.raises(ValueError, match="priorities"):
        tree.set(np.array([0]), np.array([-1.0]))


def _unroll(value, length=3):
    steps = {"reward": torch.full((length,), float(value)), "observation": torch.zeros(length, 2, dtype=torch.uint8)}
    return Unroll(steps, {"h": torch.full((4,), float(value))}, torch.tensor(value))


def test_importance_weights_follow_the_formula():
    replay = PrioritizedReplay(capacity=4, priority_exponent=0.5, importance_sampling_exponent=0.6, min_size=4,
                               replay_ratio=1.0, batch_size=4, seed=1)
    priorities = np.array([1.0, 4.0, 9.0, 16.0])
    replay.insert(Unroll.stack([_unroll(i) for i in range(4)]), priorities)
    sample = replay.sample(timeout_s=1)
    p_alpha = priorities ** 0.5
    probabilities = p_alpha / p_alpha.sum()
    raw = (4 * probabilities[sample.indices]) ** -0.6
    np.testing.assert_allclose(sample.importance_weights.numpy(), raw / raw.max(), rtol=1e-6)
    # Time-major batch; each sampled sequence is the one stored in its slot.
    assert sample.unrolls.reward.shape == (3, 4)
    assert sample.unrolls.reward[0].tolist() == sample.indices.astype(float).tolist()
    assert sample.unrolls.initial_state["h"][:, 0].tolist() == sample.indices.astype(float).tolist()


def test_priority_exponent_zero_samples_uniformly_with_unit_weights():
    """--priority_exponent=0 --importance_sampling_exponent=0 (minatar_r2d2's, DQN's uniform replay): every stored
    sequence equally likely whatever its priority, before and after updates (a zero priority too), weights all 1."""
    replay = PrioritizedReplay(capacity=4, priority_exponent=0.0, importance_sampling_exponent=0.0, min_size=1,
                               replay_ratio=1e9, batch_size=64, seed=3, max_insert_lead=100)
    replay.insert(Unroll.stack([_unroll(i) for i in range(4)]), np.array([0.0, 1e-6, 1.0, 100.0]))
    draws = []
    for round_ in range(400):
        sample = replay.sample(timeout_s=1)
        assert sample.importance_weights.tolist() == [1.0] * 64
        draws.append(sample.indices)
        if round_ == 200:
            replay.update_priorities(sample.indices, np.full(64, 50.0) * (sample.indices == 3), sample.generations)
    frequencies = np.bincount(np.concatenate(draws), minlength=4) / (400 * 64)
    np.testing.assert_allclose(frequencies, 0.25, atol=0.01)


def test_priority_update_changes_sampling():
    replay = PrioritizedReplay(capacity=3, priority_exponent=1.0, importance_sampling_exponent=0.0, min_size=1,
                               replay_ratio=1e9, batch_size=30, seed=2, max_insert_lead=100)
    replay.insert(Unroll.stack([_unroll(i) for i in range(3)]), np.ones(3))
    sample = replay.sample(timeout_s=1)
    first_two = np.isin(sample.indices, [0, 1])
    replay.update_priorities(sample.indices[first_two], np.zeros(first_two.sum()), sample.generations[first_two])
    assert set(replay.sample(timeout_s=1).indices.tolist()) == {2}


def test_priority_update_of_a_recycled_slot_is_dropped():
    """A slot overwritten between `sample` and `update_priorities` keeps the new sequence's initial priority."""
    replay = PrioritizedReplay(capacity=2, priority_exponent=1.0, importance_sampling_exponent=0.0, min_size=2,
                               replay_ratio=1e9, batch_size=4, seed=0, max_insert_lead=100)
    replay.insert(Unroll.stack([_unroll(0), _unroll(1)]), np.array([1.0, 1.0]))
    sample = replay.sample(timeout_s=1)
    assert set(sample.indices.tolist()) == {0, 1}
    replay.insert(Unroll.stack([_unroll(2)]), np.array([7.0]))  # the ring recycles slot 0 while the batch trains
    replay.update_priorities(sample.indices, np.full(len(sample.indices), 100.0), sample.generations)
    assert replay.tree.get(np.array([0]))[0] == 7.0  # sequence 2's own priority, not sequence 0's TD error
    assert replay.tree.get(np.array([1]))[0] == 100.0  # slot 1 still holds what was sampled
    assert replay.stats()["replay_stale_priority_updates"] == int((sample.indices == 0).sum()) > 0


def _assert_consistent(saved, capacity):
    """Every filled slot's fields, priority and the counters belong to one and the same sequence."""
    for slot in range(saved["size"]):
        sequence = int(saved["steps"]["reward"][slot, 0])
        assert saved["state"]["h"][slot, 0].item() == sequence, (slot, saved["state"]["h"][slot])
        assert int(saved["env_ids"][slot]) == sequence
        assert saved["priorities"][slot] == sequence + 1, (slot, sequence, saved["priorities"][slot])
        assert saved["inserted"] - saved["size"] <= sequence < saved["inserted"], (slot, sequence, saved["inserted"])
        assert sequence % capacity == slot


def test_replay_checkpoint_is_not_torn_by_a_concurrent_insert(tmp_path, monkeypatch):
    """An insert that arrives while the replay is being written lands before or after the saved state, never
    half in it. The insert is started from inside torch.save (after the state was read, before it is written),
    so the interleaving that tore the old checkpoint happens every time unless the save holds the replay off."""
    from seed.experience.training_batches import ReplayExperience

    capacity = 4
    replay = PrioritizedReplay(capacity=capacity, priority_exponent=1.0, importance_sampling_exponent=0.0,
                               min_size=1, replay_ratio=1e9, batch_size=2, seed=0, max_insert_lead=100)
    replay.insert(Unroll.stack([_unroll(i) for i in range(capacity)]), np.arange(1.0, capacity + 1))
    experience = ReplayExperience(replay, lambda unrolls: np.ones(unrolls.batch_size), lambda ids: ids < 0,
                                  torch.device("cpu"), checkpoint=True)
    real_save = torch.save
    insert_done = threading.Event()

    def save_while_inserting(obj, path):
        # The next sequence (4) recycles slot 0 with priority 5.
        threading.Thread(target=lambda: (replay.insert(Unroll.stack([_unroll(capacity)]), np.array([capacity + 1.0])),
                                         insert_done.set())).start()
        insert_done.wait(1.0)  # returns at once if the insert is not held off
        real_save(obj, path)

    monkeypatch.setattr(torch, "save", save_while_inserting)
    experience.save(str(tmp_path))
    monkeypatch.setattr(torch, "save", real_save)
    assert insert_done.wait(5)
    saved = torch.load(tmp_path / ReplayExperience.REPLAY_FILE, weights_only=False)
    _assert_consistent(saved, capacity)
    # The copy `state_dict` returns is consistent too, and restores into a replay that samples the same content.
    _assert_consistent(replay.state_dict(), capacity)
    restored = PrioritizedReplay(capacity=capacity, priority_exponent=1.0, importance_sampling_exponent=0.0,
                                 min_size=1, replay_ratio=1e9, batch_size=2, seed=0)
    restored.load_state_dict(replay.state_dict())
    assert restored.inserted == capacity + 1
    assert int(restored.sample(timeout_s=1).unrolls.reward[0].min()) >= 1  # sequence 0 is gone


def test_replay_that_does_not_fit_in_memory_is_refused():
    from seed.experience.replay import ReplayDoesNotFit, check_fits_in_memory

    check_fits_in_memory(1000, 1000, available_bytes=10**6)
    with pytest.raises(ReplayDoesNotFit) as info:
        check_fits_in_memory(100_000_000, 1742, available_bytes=20 * 2**30)
    message = str(info.value)
    assert message.startswith("--replay_capacity: got 100,000,000 sequences x 1,742 bytes = 174,200,000,000 bytes")
    assert f"expected at most {20 * 2**30 // 1742:,} sequences: {20 * 2**30:,} bytes" in message


def test_fifo_eviction_and_memory_accounting():
    replay = PrioritizedReplay(capacity=2, priority_exponent=1.0, importance_sampling_exponent=0.0, min_size=1,
                               replay_ratio=1e9, batch_size=8, seed=0, max_insert_lead=100)
    replay.insert(Unroll.stack([_unroll(i) for i in range(3)]), np.ones(3))
    assert replay.size == 2 and replay.inserted == 3
    assert set(replay.sample(timeout_s=1).unrolls.env_id.tolist()) == {1, 2}
    per_sequence = PrioritizedReplay.bytes_per_sequence(_unroll(0))
    assert per_sequence == 3 * 4 + 3 * 2 + 4 * 4 + 8
    assert replay.nbytes == 2 * per_sequence


def test_one_batch_wrapping_the_ring_is_stored_in_order_with_each_sequences_priority_and_generation():
    replay = PrioritizedReplay(capacity=4, priority_exponent=1.0, importance_sampling_exponent=0.0, min_size=1,
                               replay_ratio=1e9, batch_size=2, seed=0, max_insert_lead=100)
    replay.insert(Unroll.stack([_unroll(i) for i in range(6)]), np.arange(1.0, 7.0))  # sequences 4 and 5 recycle 0, 1
    state = replay.state_dict()
    assert state["steps"]["reward"][:, 0].tolist() == [4.0, 5.0, 2.0, 3.0]
    assert state["steps"]["observation"].shape == (4, 3, 2)  # [capacity, L, ...] from a [L, n, ...] batch
    assert replay._env_ids.tolist() == [4, 5, 2, 3] and replay._generations.tolist() == [4, 5, 2, 3]
    assert replay.tree.get(np.arange(4)).tolist() == [5.0, 6.0, 3.0, 4.0]
    assert (replay.size, replay.next_slot, replay.inserted) == (4, 2, 6)


def test_a_batch_is_inserted_as_far_as_the_ratio_allows_and_the_rest_waits():
    """min_size 4 and a lead of 2: 6 of a batch of 8 go in at once; each further sequence waits for sampling."""
    stop = threading.Event()
    replay = PrioritizedReplay(capacity=100, priority_exponent=1.0, importance_sampling_exponent=0.0, min_size=4,
                               replay_ratio=1.0, batch_size=1, seed=0, max_insert_lead=2, stop=stop)
    thread = threading.Thread(target=replay.insert, args=(Unroll.stack([_unroll(i) for i in range(8)]), np.ones(8)))
    thread.start()
    try:
        for expected in (6, 7):
            thread.join(0.3)
            assert thread.is_alive() and replay.inserted == expected
            assert replay.sample(timeout_s=1) is not None  # one sampled at ratio 1: room for one more
        thread.join(5)
        assert not thread.is_alive() and replay.inserted == 8
        assert replay._env_ids[:8].tolist() == list(range(8))  # in order, none lost or repeated
    finally:
        stop.set()


def test_replay_ratio_is_enforced_both_ways():
    stop = threading.Event()
    replay = PrioritizedReplay(capacity=100, priority_exponent=0.9, importance_sampling_exponent=0.6, min_size=4,
                               replay_ratio=2.0, batch_size=4, seed=0, max_insert_lead=6, stop=stop)
    replay.insert(Unroll.stack([_unroll(i) for i in range(4)]), np.ones(4))
    assert replay.sample(timeout_s=0.1) is not None  # at min size: the first batch
    assert replay.sample(timeout_s=0.1) is None  # 4 sampled need 2 more inserts at ratio 2
    replay.insert(Unroll.stack([_unroll(4), _unroll(5)]), np.ones(2))
    assert replay.sample(timeout_s=0.1) is not None
    # Inserts run ahead by at most max_insert_lead sequences, then block until sampling catches up.
    inserted = threading.Event()

    def producer():
        replay.insert(Unroll.stack([_unroll(i) for i in range(20)]), np.ones(20))
        inserted.set()

    thread = threading.Thread(target=producer)
    thread.start()
    assert not inserted.wait(0.5)
    assert replay.inserted - 4 - replay.sampled / 2 <= 6
    for _ in range(100):
        if inserted.is_set():
            break
        replay.sample(timeout_s=0.1)
    thread.join(timeout=5)
    assert inserted.is_set()
    stop.set()


def test_insert_reports_the_seconds_it_waited_for_the_replay_ratio():
    """`insert` returns how long the replay ratio held it (the sink's back-pressure, experience/ratio_wait_ms):
    nothing while inserts may run ahead, about the time sampling took to catch up once they may not."""
    replay = PrioritizedReplay(capacity=100, priority_exponent=0.9, importance_sampling_exponent=0.6, min_size=4,
                               replay_ratio=4.0, batch_size=4, seed=0, max_insert_lead=1)
    assert replay.insert(Unroll.stack([_unroll(i) for i in range(5)]), np.ones(5)) == 0.0  # min_size, then one ahead
    waited = []
    thread = threading.Thread(target=lambda: waited.append(replay.insert(Unroll.stack([_unroll(5)]), np.ones(1))))
    thread.start()
    thread.join(0.3)
    assert thread.is_alive()  # held by the ratio until a batch is sampled
    assert replay.sample(timeout_s=1) is not None
    thread.join(5)
    assert not thread.is_alive() and waited[0] >= 0.25


BAD_PRIORITIES = [(np.nan, "nan"), (np.inf, "inf"), (-1.0, "-1")]


@pytest.mark.parametrize("alpha", [0.0, 0.6])
@pytest.mark.parametrize("bad, shown", BAD_PRIORITIES)
def test_a_priority_that_is_not_finite_and_non_negative_is_refused_on_insert_naming_it(alpha, bad, shown):
    """The raw priorities are checked, not p ** alpha: at alpha 0 (uniform replay) a diverged loss's NaN would be
    stored as 1.0 and -1 at alpha 0.6 as about 6e-17 (or NaN). The whole batch is refused, nothing stored."""
    replay = PrioritizedReplay(capacity=8, priority_exponent=alpha, importance_sampling_exponent=0.4, min_size=1,
                               replay_ratio=1.0, batch_size=2, max_insert_lead=100)
    replay.insert(Unroll.stack([_unroll(0)]), np.array([1.0]))
    with pytest.raises(ValueError, match=rf"replay insert: priorities got {shown} at row 2 of 3, expected finite "
                                         r"values >= 0"):
        replay.insert(Unroll.stack([_unroll(i) for i in range(3)]), np.array([0.0, 2.0, bad]))
    assert replay.inserted == 1 and replay.tree.total == pytest.approx(1.0)


@pytest.mark.parametrize("alpha", [0.0, 0.6])
@pytest.mark.parametrize("bad, shown", BAD_PRIORITIES)
@pytest.mark.parametrize("method", ["update_priorities", "refresh_priorities"])
def test_a_priority_that_is_not_finite_and_non_negative_is_refused_on_update_and_refresh(alpha, bad, shown, method):
    """Training's updates and Priority Refresh's writes are checked the same way, stale slots' values too (a NaN
    is a diverged loss wherever it lands); nothing of the batch is written."""
    replay = PrioritizedReplay(capacity=4, priority_exponent=alpha, importance_sampling_exponent=0.4, min_size=1,
                               replay_ratio=1e9, batch_size=2, max_insert_lead=100)
    replay.insert(Unroll.stack([_unroll(i) for i in range(4)]), np.ones(4))
    before = replay.tree.get(np.arange(4)).copy()
    field = "update" if method == "update_priorities" else "refresh"
    with pytest.raises(ValueError, match=rf"replay {field}: priorities got {shown} at row 0 of 2, expected finite "
                                         r"values >= 0"):
        getattr(replay, method)(np.array([2, 3]), np.array([bad, 5.0]), replay._generations[[2, 3]])
    np.testing.assert_array_equal(replay.tree.get(np.arange(4)), before)


def test_a_negative_priority_exponent_is_refused():
    with pytest.raises(ValueError, match=r"priority_exponent: got -0.5, expected >= 0"):
        PrioritizedReplay(capacity=4, priority_exponent=-0.5, importance_sampling_exponent=0.4, min_size=1,
                          replay_ratio=1.0, batch_size=2)


@pytest.mark.parametrize("agent", ["r2d2", "muzero", "sac"])
def test_the_learner_refuses_a_negative_priority_exponent_naming_the_flag(tmp_path, agent):
    from seed.learner.configuration import resolve_config

    with pytest.raises(ValueError, match=r"--priority_exponent: got -0.5, expected >= 0 \(0: uniform replay\)"):
        resolve_config(dict(agent=agent, env="gym:Pendulum-v1" if agent == "sac" else "fake:vector",
                            logdir=str(tmp_path), priority_exponent=-0.5))
