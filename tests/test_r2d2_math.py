"""R2D2 math: value rescaling, n-step double-Q targets, priorities, the epsilon schedule."""

import numpy as np
import pytest
import torch

from seed.agents.r2d2.r2d2 import (
    epsilon_schedule,
    inverse_value_rescale,
    n_step_targets,
    sequence_priorities,
    value_rescale,
)


@pytest.mark.parametrize("eps", [1e-3, 1e-2, 0.0])
def test_value_rescaling_round_trip(eps):
    x = torch.cat([-torch.logspace(-6, 6, 500, dtype=torch.float64), torch.zeros(1, dtype=torch.float64),
                   torch.logspace(-6, 6, 500, dtype=torch.float64)])
    back = inverse_value_rescale(value_rescale(x, eps), eps)
    relative = ((back - x).abs() / x.abs().clamp(min=1e-12))[x != 0]
    assert relative.max() < 1e-5
    assert back[x == 0].abs().max() < 1e-9
    # And the formula itself: h(3) = sqrt(4) - 1 + 3 eps.
    assert value_rescale(torch.tensor(3.0, dtype=torch.float64), eps).item() == pytest.approx(1 + 3 * eps)


def _column(values, dtype=torch.float32):
    return torch.tensor(values, dtype=dtype).unsqueeze(1)


def test_n_step_without_episode_end():
    # T = 4 transitions; rewards at steps 1..4; bootstrap values V(s_i) = 10 + i.
    rewards = _column([0, 1, 2, 3, 4])
    done = _column([False] * 5, torch.bool)
    boot = _column([10, 11, 12, 13, 14])
    targets, mask = n_step_targets(rewards, done, done.clone(), boot, n=2, discount=0.5)
    expected = [1 + 0.5 * 2 + 0.25 * 12, 2 + 0.5 * 3 + 0.25 * 13, 3 + 0.5 * 4 + 0.25 * 14,
                4 + 0.5 * 14]  # the last transition falls back to a 1-step horizon
    assert targets.squeeze(1).tolist() == pytest.approx(expected)
    assert mask.all()


def test_n_step_with_done_in_the_middle():
    # Episode ends after the action at step 1 (done[2]); step 2 starts a new episode.
    rewards = _column([0, 1, 2, 3, 4, 5])
    done = _column([False, False, True, False, False, False], torch.bool)
    boot = _column([10, 11, 12, 13, 14, 15])
    targets, mask = n_step_targets(rewards, done, torch.zeros_like(done), boot, n=3, discount=0.5)
    expected = [
        1 + 0.5 * 2,                       # t=0: r1, r2 (terminal), no bootstrap
        2,                                  # t=1: r2 terminal
        3 + 0.5 * 4 + 0.25 * 5 + 0.125 * 15,  # t=2: new episode, full 3-step horizon, bootstrap V(s5)
        4 + 0.5 * 5 + 0.25 * 15,            # t=3: r4, r5 then the unroll ends -> bootstrap V(s5)
        5 + 0.5 * 15,                       # t=4: 1-step
    ]
    assert targets.squeeze(1).tolist() == pytest.approx(expected)
    assert mask.all()


def test_n_step_with_done_near_the_end():
    rewards = _column([0, 1, 2, 3, 4])
    done = _column([False, False, False, False, True], torch.bool)  # terminal after the last action
    boot = _column([10, 11, 12, 13, 14])
    targets, _ = n_step_targets(rewards, done, torch.zeros_like(done), boot, n=5, discount=0.9)
    expected = [1 + 0.9 * 2 + 0.81 * 3 + 0.729 * 4, 2 + 0.9 * 3 + 0.81 * 4, 3 + 0.9 * 4, 4]
    assert targets.squeeze(1).tolist() == pytest.approx(expected)


def test_n_step_truncation_bootstraps_instead_of_terminating():
    rewards = _column([0, 1, 2, 3, 4, 5])
    done = _column([False, False, False, True, False, False], torch.bool)
    truncated = done.clone()  # time limit at step 3
    boot = _column([10, 11, 12, 13, 14, 15])
    targets, mask = n_step_targets(rewards, done, truncated, boot, n=3, discount=0.5)
    # t=0: r1, r2, then the horizon would take r3 (the truncated step) -> bootstrap from V(s2) instead.
    assert targets[0, 0].item() == pytest.approx(1 + 0.5 * 2 + 0.25 * 12)
    # t=1: r2 then bootstrap V(s2).
    assert targets[1, 0].item() == pytest.approx(2 + 0.5 * 12)
    # t=2: its own next step is truncated: no target.
    assert mask[:, 0].tolist() == [True, True, False, True, True]
    # As a terminal, t=0 would have been 1 + 0.5*2 + 0.25*3 with no bootstrap: truncation differs.
    terminal, _ = n_step_targets(rewards, done, torch.zeros_like(done), boot, n=3, discount=0.5)
    assert terminal[0, 0].item() == pytest.approx(1 + 0.5 * 2 + 0.25 * 3)


def test_sequence_priority_formula():
    td = torch.tensor([[1.0, -2.0], [-3.0, 0.5], [2.0, 0.5]])
    mask = torch.tensor([[True, True], [True, True], [True, False]])
    p = sequence_priorities(td, mask, eta=0.9)
    assert p.tolist() == pytest.approx([0.9 * 3 + 0.1 * 2, 0.9 * 2 + 0.1 * 1.25])


def test_epsilon_schedule_values():
    eps = epsilon_schedule(num_envs=10, num_eval_envs=2)
    assert eps[0] == pytest.approx(0.4)
    assert eps[7] == pytest.approx(0.4 ** 8)
    assert eps[3] == pytest.approx(0.4 ** (1 + 7 * 3 / 7))
    assert eps[8:].tolist() == [1e-3, 1e-3]
    assert np.all(np.diff(eps[:8]) < 0)
    with pytest.raises(ValueError, match="num_eval_envs: got 4"):
        epsilon_schedule(4, 4)


def test_sequence_priority_leaves_masked_steps_out_of_max_and_mean():
    # Column 0: the masked step has the largest |td|; column 1: nothing is valid (a sequence of padding).
    td = torch.tensor([[10.0, 4.0], [-1.0, 4.0], [3.0, 4.0]])
    mask = torch.tensor([[False, False], [True, False], [True, False]])
    p = sequence_priorities(td, mask, eta=0.9)
    assert p.tolist() == pytest.approx([0.9 * 3 + 0.1 * (1 + 3) / 2, 0.0])
