"""Frame stacking on the learner (agents/networks.py `stack_frames`, the `frames` state of AgentBody): the stack
of S = 4 frames, oldest first, zeroed where a frame belongs to an earlier episode, carried across calls.

Frames here are tiny ([2] values; frame k holds k and 10 k) so every stack can be written out by hand."""

import numpy as np
import torch

from seed.agents.networks import AgentBody
from seed.agents.torsos import stack_frames
from seed.envs.base import EnvSpec


def _frames(values):
    """[len(values), 2]: frame v is (v, 10 v); 0 is the zero frame."""
    return torch.tensor([[v, 10 * v] for v in values], dtype=torch.float32)


def _sequence(values):
    """Observations [T, B = 1, 2] from frame numbers."""
    return _frames(values).unsqueeze(1)


def _stacks(stacked):
    """[T, 1, S, 2] -> per step the frame numbers of its stack, oldest first."""
    return stacked[:, 0, :, 0].tolist()


def test_stack_is_oldest_first_and_carries_the_last_three_frames():
    previous = _frames([1, 2, 3]).unsqueeze(0)  # [B = 1, S - 1 = 3, 2], oldest first
    stacked, carried = stack_frames(previous, _sequence([4, 5]), torch.zeros(2, 1, dtype=torch.bool))
    assert stacked.shape == (2, 1, 4, 2)
    assert _stacks(stacked) == [[1, 2, 3, 4], [2, 3, 4, 5]]
    assert stacked[1, 0, :, 1].tolist() == [20, 30, 40, 50]  # whole frames move together
    assert carried[0, :, 0].tolist() == [3, 4, 5]


def test_frames_of_an_earlier_episode_are_zeroed():
    previous = _frames([1, 2, 3]).unsqueeze(0)
    # done[2]: frame 6 is the first of a new episode; done[5]: so is frame 9.
    done = torch.tensor([False, False, True, False, False, True, False]).unsqueeze(1)
    stacked, carried = stack_frames(previous, _sequence([4, 5, 6, 7, 8, 9, 10]), done)
    assert _stacks(stacked) == [
        [1, 2, 3, 4],
        [2, 3, 4, 5],
        [0, 0, 0, 6],  # the first frame of an episode stands alone
        [0, 0, 6, 7],
        [0, 6, 7, 8],
        [0, 0, 0, 9],
        [0, 0, 9, 10],
    ]
    assert carried[0, :, 0].tolist() == [0, 9, 10]  # the zeros carry over to the next call


def test_done_on_the_first_step_drops_the_carried_frames():
    previous = _frames([1, 2, 3]).unsqueeze(0)
    stacked, carried = stack_frames(previous, _sequence([4, 5]), torch.tensor([[True], [False]]))
    assert _stacks(stacked) == [[0, 0, 0, 4], [0, 0, 4, 5]]
    assert carried[0, :, 0].tolist() == [0, 4, 5]


def _random_case(rng, steps, batch):
    observation = torch.from_numpy(rng.integers(1, 255, (steps, batch, 3, 2), dtype=np.uint8))
    done = torch.from_numpy(rng.random((steps, batch)) < 0.25)
    previous = torch.from_numpy(rng.integers(1, 255, (batch, 3, 3, 2), dtype=np.uint8))
    return previous, observation, done


def test_two_calls_equal_one_call_over_the_concatenated_sequence():
    rng = np.random.default_rng(0)
    for split in (1, 2, 3, 5, 8):
        previous, observation, done = _random_case(rng, 9, 3)
        whole, whole_carried = stack_frames(previous, observation, done)
        first, carried = stack_frames(previous, observation[:split], done[:split])
        second, second_carried = stack_frames(carried, observation[split:], done[split:])
        assert torch.equal(torch.cat([first, second]), whole), split
        assert torch.equal(second_carried, whole_carried), split


def test_inference_step_by_step_equals_training_on_the_whole_sequence():
    """What inference computes one step at a time (T = 1, frames in the state table) is what the learner
    recomputes over an unroll (one T-step call from the stored state), network outputs included."""
    spec = EnvSpec("test:frames", (3, 2), "uint8", num_actions=2, action_repeat=1, frame_stack=4)
    torch.manual_seed(0)
    body = AgentBody(spec, "mlp", use_lstm=True, lstm_size=8, mlp_sizes=(16,))
    rng = np.random.default_rng(1)
    steps, batch = 12, 3
    _, observation, done = _random_case(rng, steps, batch)
    prev_action = torch.from_numpy(rng.integers(0, 2, (steps, batch)))
    reward = torch.from_numpy(rng.normal(size=(steps, batch)).astype(np.float32))
    state = body.initial_state(batch)
    state["frames"] = torch.from_numpy(rng.integers(1, 255, (batch, 3, 3, 2), dtype=np.uint8))
    with torch.no_grad():
        whole, whole_state = body(observation, prev_action, reward, done, state)
        step_state, outputs = state, []
        for t in range(steps):
            output, step_state = body(observation[t:t + 1], prev_action[t:t + 1], reward[t:t + 1],
                                      done[t:t + 1], step_state)
            outputs.append(output)
    torch.testing.assert_close(torch.cat(outputs), whole)
    for key in whole_state:
        torch.testing.assert_close(step_state[key], whole_state[key])
    # The stack reached the network: the same observations with other carried frames give other outputs.
    other = dict(state, frames=state["frames"] // 2)
    with torch.no_grad():
        changed, _ = body(observation[:1], prev_action[:1], reward[:1], torch.zeros(1, batch, dtype=torch.bool),
                          other)
        unchanged, _ = body(observation[:1], prev_action[:1], reward[:1], torch.zeros(1, batch, dtype=torch.bool),
                            state)
    assert not torch.allclose(changed, unchanged)
