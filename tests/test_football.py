"""Google Research Football env family and its torso.

The SMM packing, option validation and torso tests always run; the tests that step real envs need gfootball
(`make football`) and are skipped without it.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from seed.agents.football_torsos import FootballTorso
from seed.envs.football import SMM_SIZES, pack_smm, smm_size, unpack_smm

SCENARIO = "academy_empty_goal_close"
SHOT, RIGHT = 12, 5  # indices in gfootball's default action set


@pytest.fixture(scope="module")
def gfootball():
    return pytest.importorskip("gfootball.env", reason="gfootball is not installed; run `make football` to build it")


def _random_planes(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return (rng.random(shape + (16,)) < 0.3).astype(np.uint8) * 255


def test_pack_unpack_round_trip():
    rng = np.random.default_rng(0)
    planes = _random_planes(rng, (3, 72, 96))
    packed = pack_smm(planes)
    assert packed.dtype == np.uint16 and packed.shape == (3, 72, 96)
    expected = torch.from_numpy((planes != 0).transpose(0, 3, 1, 2).astype(np.float32))
    for tensor in (torch.from_numpy(packed), torch.from_numpy(packed.astype(np.int32))):
        unpacked = unpack_smm(tensor)
        assert unpacked.dtype == torch.float32 and unpacked.shape == (3, 16, 72, 96)
        torch.testing.assert_close(unpacked, expected, rtol=0, atol=0)
    # Bit i is plane i.
    one = np.zeros((1, 1, 16), np.uint8)
    one[0, 0, 5] = 255
    assert pack_smm(one)[0, 0] == 1 << 5
    assert pack_smm(np.full((2, 2, 16), 255, np.uint8)).tolist() == [[0xFFFF] * 2] * 2
    with pytest.raises(ValueError, match="16"):
        pack_smm(np.zeros((4, 4, 12), np.uint8))


def test_smm_size_option():
    assert smm_size({}) == (96, 72)
    assert [smm_size({"smm_size": k}) for k in SMM_SIZES] == [(96, 72), (120, 90), (144, 108)]
    with pytest.raises(ValueError, match=r"smm_size.*'huge'.*default, medium, large"):
        smm_size({"smm_size": "huge"})


@pytest.mark.parametrize("size", list(SMM_SIZES))
def test_torso_output_shape(size):
    width, height = SMM_SIZES[size]
    torso = FootballTorso((height, width))
    assert torso.output_size == 256
    packed = torch.from_numpy(pack_smm(_random_planes(np.random.default_rng(1), (2, height, width))))
    out = torso(packed)
    assert out.shape == (2, 256) and out.dtype == torch.float32
    torch.testing.assert_close(torso(packed.to(torch.int32)), out)
    assert torso(packed.reshape(1, 2, height, width)).shape == (1, 2, 256)
    assert FootballTorso((height, width), width_multiplier=2)(packed).shape == (2, 256)


def test_missing_gfootball_says_how_to_install(monkeypatch):
    from seed.envs import make_spec

    monkeypatch.setitem(sys.modules, "gfootball", None)
    monkeypatch.setitem(sys.modules, "gfootball.env", None)
    with pytest.raises(ImportError, match="make football"):  # a package to install: its flags still resolve
        make_spec(f"football:{SCENARIO}")


@pytest.mark.parametrize("size", list(SMM_SIZES))
def test_env_steps_with_each_smm_size(gfootball, size):
    from seed.envs import make_batch, make_spec

    options = {"smm_size": size, "seed": 3}
    spec = make_spec(f"football:{SCENARIO}", options)
    width, height = SMM_SIZES[size]
    assert spec.observation_shape == (height, width)
    assert spec.observation_dtype == "uint16"
    assert spec.num_actions == 19 and spec.action_repeat == 1 and spec.frame_stack == 1
    batch = make_batch(f"football:{SCENARIO}", 2, 0, options)
    try:
        observation = batch.reset()
        assert observation.shape == (2, height, width) and observation.dtype == np.uint16
        rng = np.random.default_rng(0)
        for _ in range(5):
            step = batch.step(rng.integers(spec.num_actions, size=2))
            assert step.observation.shape == (2, height, width) and step.observation.dtype == np.uint16
            for k in range(2):
                spec.check_observation(step.observation[k])
        planes = unpack_smm(torch.from_numpy(step.observation))  # [2, 16, H, W]
        # Every frame shows the ball (layer 2 of each of the 4 stacked frames) and the active player (layer 3).
        counts = planes.sum(dim=(-1, -2))
        assert (counts[:, 2::4] >= 1).all() and (counts[:, 3::4] >= 1).all()
    finally:
        batch.close()


def test_raw_return_is_sum_of_score_reward(gfootball):
    from seed.envs import make_batch

    options = {"football_rewards": "scoring,checkpoints", "seed": 0}
    batch = make_batch(f"football:{SCENARIO}", 2, 0, options)
    scores = [[] for _ in range(batch.num_envs)]

    def recording(k, step):
        def wrapped(action):
            result = step(action)
            scores[k].append(result[3]["score_reward"])
            return result

        return wrapped

    for k, env in enumerate(batch.envs):
        env._env.step = recording(k, env._env.step)
    try:
        batch.reset()
        finished, returns = [], np.zeros(batch.num_envs)
        for t in range(300):
            actions = np.full(batch.num_envs, SHOT if t % 3 else RIGHT)
            step = batch.step(actions)
            returns += step.reward
            for stats in step.finished:
                k = stats.env_index
                assert stats.raw_return == pytest.approx(sum(scores[k]))
                assert stats.episode_return == pytest.approx(returns[k])
                assert stats.steps == len(scores[k]) and not stats.truncated
                finished.append(stats)
                scores[k].clear()
                returns[k] = 0
            if len(finished) >= 4:
                break
        assert len(finished) >= 4
        # This policy scores in the close empty-goal scenario; checkpoint shaping adds reward on top of the goal.
        goals = [s for s in finished if s.raw_return == 1]
        assert goals and all(s.episode_return > s.raw_return for s in goals)
    finally:
        batch.close()


def test_same_seed_repeats_episodes(gfootball):
    from seed.envs import make_batch

    def rollout(seed):
        batch = make_batch(f"football:{SCENARIO}", 1, 0, {"seed": seed})
        try:
            rng = np.random.default_rng(0)
            frames = [batch.reset()] + [batch.step(rng.integers(19, size=1)).observation for _ in range(30)]
        finally:
            batch.close()
        return np.stack(frames)

    np.testing.assert_array_equal(rollout(7), rollout(7))


def test_bad_options(gfootball):
    from seed.envs import make_spec

    with pytest.raises(ValueError, match="unknown scenario 'no_such_scenario'.*11_vs_11_stochastic"):
        make_spec("football:no_such_scenario")
    with pytest.raises(ValueError, match="football_rewards.*'goals'"):
        make_spec(f"football:{SCENARIO}", {"football_rewards": "goals"})
    with pytest.raises(ValueError, match="smm_size"):
        make_spec(f"football:{SCENARIO}", {"smm_size": (96, 72)})


def test_gfootball_episode_lines_are_dropped_but_its_warnings_pass():
    """gfootball logs one INFO line per finished episode through absl; the env filters those out."""
    import logging

    from seed.envs.football import _NoEpisodeLines

    def record(level, module):
        return logging.LogRecord("absl", level, f"/x/{module}.py", 1, "Episode reward: 1.00", None, None)

    drop = _NoEpisodeLines()
    assert not drop.filter(record(logging.INFO, "football_env_core"))
    assert drop.filter(record(logging.WARNING, "football_env_core"))
    assert drop.filter(record(logging.INFO, "actor_main"))
