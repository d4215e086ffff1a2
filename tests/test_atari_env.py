"""`--env=atari:<Game>` against the real ALE: Table 9 preprocessing, seeding, truncation, action sets."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from ale_py import Action, ALEInterface, roms

import seed.envs as envs
from seed.envs import atari
from seed.envs.base import SequentialEnvBatch


def make_env(game: str = "Pong", seed: int = 0, **kwargs) -> atari.AtariEnv:
    return atari.AtariEnv(game, seed, **kwargs)


# ----------------------------------------------------------------------------------------------- spec


def test_spec_defaults_match_table_9():
    spec = envs.make_spec("atari:Pong")
    assert spec.name == "atari:Pong"
    assert spec.observation_shape == (84, 84)
    assert spec.observation_dtype == "uint8"
    assert spec.num_actions == 18
    assert spec.action_repeat == 4
    assert spec.frame_stack == 4


def test_spec_options():
    assert envs.make_spec("atari:Pong", {"atari_minimal_action_set": True}).num_actions == 6
    assert envs.make_spec("atari:Breakout", {"atari_minimal_action_set": True}).num_actions == 4
    assert envs.make_spec("atari:Pong", {"action_repeat": 1}).action_repeat == 1
    with pytest.raises(ValueError, match=r"action_repeat: got 0, expected an integer >= 1"):
        envs.make_spec("atari:Pong", {"action_repeat": 0})
    with pytest.raises(ValueError, match=r"atari_minimal_action_set: got 'maybe', expected a boolean"):
        envs.make_spec("atari:Pong", {"atari_minimal_action_set": "maybe"})
    with pytest.raises(ValueError, match=r"atari_max_frames: got 0, expected an integer >= 1"):
        envs.make_batch("atari:Pong", 1, 0, {"atari_max_frames": 0})


def test_game_names_map_to_rom_ids():
    assert atari.rom_id("Pong") == "pong"
    assert atari.rom_id("MsPacman") == "ms_pacman"
    assert atari.rom_id("MontezumaRevenge") == "montezuma_revenge"
    assert atari.rom_id("UpNDown") == "up_n_down"
    assert "SpaceInvaders" in atari.valid_games()


def test_unknown_game_error():
    with pytest.raises(ValueError) as info:
        envs.make_spec("atari:NotAGame")
    message = str(info.value)
    assert "'NotAGame'" in message and "Valid names" in message and "Pong" in message
    assert "valid_games()" in message
    with pytest.raises(ValueError, match=r"unknown game 'ms_pacman'.*Did you mean 'MsPacman'\?"):
        envs.make_batch("atari:ms_pacman", 1, 0, {})


# ----------------------------------------------------------------------------------------------- observations


def test_observation_shape_dtype_and_range():
    env = make_env()
    spec = env.spec
    observations = [env.reset()]
    rng = np.random.default_rng(0)
    for _ in range(20):
        observations.append(env.step(int(rng.integers(18))).observation)
    for observation in observations:
        spec.check_observation(observation)
        assert observation.min() < observation.max()  # not a blank frame
    # A bilinear resize never leaves the range of the source frame.
    screen = env.ale.getScreenGrayscale()
    assert screen.min() <= observations[-1].min() and observations[-1].max() <= screen.max()


def _replay(game: str, noops: int, actions: list[int], repeat: int) -> list[np.ndarray]:
    """Independent Table 9 reference: raw ALE frames, max of the last two per repeat, bilinear 84 x 84."""
    ale = ALEInterface()
    ale.setFloat("repeat_action_probability", 0.0)
    ale.loadROM(str(roms.get_rom_path(atari.rom_id(game))))
    ale.reset_game()
    legal = ale.getLegalActionSet()
    frames = [ale.getScreenGrayscale()]
    for _ in range(noops):
        ale.act(Action.NOOP)
        frames.append(ale.getScreenGrayscale())
    pooled = np.maximum(frames[-1], frames[-2]) if noops else frames[-1]
    out = [cv2.resize(pooled, (84, 84), interpolation=cv2.INTER_LINEAR)]
    for action in actions:
        raw = []
        for _ in range(repeat):
            ale.act(legal[action])
            raw.append(ale.getScreenGrayscale())
        pooled = np.maximum(raw[-1], raw[-2]) if repeat > 1 else raw[-1]
        out.append(cv2.resize(pooled, (84, 84), interpolation=cv2.INTER_LINEAR))
    return out


@pytest.mark.parametrize("repeat", [4, 1])
def test_preprocessing_matches_independent_reference(repeat):
    env = make_env("Breakout", seed=3, action_repeat=repeat)
    actions = [1, 2, 2, 3, 1, 0, 3, 3, 2, 1] * 3
    got = [env.reset()] + [env.step(a).observation for a in actions]
    assert env.ale.getEpisodeFrameNumber() == env.last_noops + repeat * len(actions)
    expected = _replay("Breakout", env.last_noops, actions, repeat)
    for t, (a, b) in enumerate(zip(got, expected, strict=True)):
        np.testing.assert_array_equal(a, b, err_msg=f"agent step {t}")


@pytest.mark.parametrize("repeat", [4, 1])
def test_consecutive_observations_differ(repeat):
    # Freeway's cars move every frame: every agent step must show a fresh frame (the original SEED code
    # returned the reset frame for the whole episode when the action repeat was 1).
    env = make_env("Freeway", action_repeat=repeat)
    previous = first = env.reset()
    for _ in range(40):
        observation = env.step(1).observation
        assert not np.array_equal(observation, previous)
        previous = observation
    assert not np.array_equal(previous, first)
    # Pong with random actions: the paddles move, most steps change the picture.
    env = make_env("Pong", action_repeat=repeat)
    previous = env.reset()
    rng = np.random.default_rng(1)
    changed = 0
    for _ in range(60):
        observation = env.step(int(rng.integers(18))).observation
        changed += not np.array_equal(observation, previous)
        previous = observation
    assert changed > 30


def test_rewards_are_raw_and_summed_over_the_repeat():
    env = make_env("Pong", seed=0)
    env.reset()
    rewards = []
    for _ in range(300):  # the CPU scores against a NOOP player: -1 per point, unclipped, never 0.25 etc.
        result = env.step(0)
        assert result.raw_reward == result.reward
        rewards.append(result.reward)
    assert -1.0 in rewards and set(rewards) <= {-1.0, 0.0, 1.0}


# ----------------------------------------------------------------------------------------------- reset no-ops


def test_noop_counts_are_uniform_in_1_to_30():
    env = make_env("Pong", seed=7)
    counts = []
    for _ in range(900):
        env.reset()
        counts.append(env.last_noops)
        # The no-ops are single raw frames, played before any action repetition.
        assert env.ale.getEpisodeFrameNumber() == env.last_noops
    counts = np.array(counts)
    assert counts.min() == 1 and counts.max() == 30
    histogram = np.bincount(counts, minlength=31)[1:]
    assert histogram.min() >= 12 and histogram.max() <= 50  # expected 30 each
    assert abs(counts.mean() - 15.5) < 1.0
    # Seeded: the same seed draws the same counts.
    again = make_env("Pong", seed=7)
    assert [again.reset() is not None and again.last_noops for _ in range(20)] == list(counts[:20])


def test_noop_max_option():
    batch = envs.make_batch("atari:Pong", 1, 0, {"atari_noop_max": 3})
    env = batch.envs[0]
    seen = set()
    for _ in range(60):
        env.reset()
        seen.add(env.last_noops)
    assert seen == {1, 2, 3}
    env = envs.make_batch("atari:Pong", 1, 0, {"atari_noop_max": 0}).envs[0]
    env.reset()
    assert env.last_noops == 0 and env.ale.getEpisodeFrameNumber() == 0


# ----------------------------------------------------------------------------------------------- episode cap


def test_truncation_at_frame_cap():
    env = make_env("Pong", max_frames=400)
    env.reset()
    steps = 0
    while True:
        result = env.step(0)
        steps += 1
        if result.terminated or result.truncated:
            break
    assert result.truncated and not result.terminated
    assert env.ale.getEpisodeFrameNumber() == 400  # no-op frames count towards the cap
    assert steps == -(-(400 - env.last_noops) // 4)
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step(0)


def test_truncation_in_sequential_batch_reports_done_with_fresh_frame():
    batch = envs.make_batch("atari:Pong", 2, 0, {"atari_max_frames": 400, "seed": 5})
    assert isinstance(batch, SequentialEnvBatch)
    batch.reset()
    finished = []
    for _ in range(100):
        out = batch.step(np.zeros(2, np.int64))
        finished += out.finished
        for k in np.flatnonzero(out.done):
            assert out.truncated[k]
            env = batch.envs[k]
            # The observation is the first frame of the new episode, not the last frame of the old one.
            assert env.ale.getEpisodeFrameNumber() == env.last_noops
            np.testing.assert_array_equal(out.observation[k], env._pooled_observation())
        if len(finished) == 2:
            break
    assert sorted(s.env_index for s in finished) == [0, 1]
    for stats in finished:
        assert stats.truncated and stats.frames == stats.steps * 4 and stats.steps <= 100


# ----------------------------------------------------------------------------------------------- actions, seeds


def test_full_and_minimal_action_sets():
    full = make_env("Pong")
    assert len(full.actions) == 18 and full.actions == list(full.ale.getLegalActionSet())
    minimal = make_env("Pong", minimal_action_set=True)
    assert len(minimal.actions) == 6 and minimal.spec.num_actions == 6
    minimal.reset()
    with pytest.raises(ValueError, match=r"action: got 6, expected an integer in \[0, 6\)"):
        minimal.step(6)
    full.reset()
    full.step(17)
    with pytest.raises(ValueError, match=r"action: got 18, expected an integer in \[0, 18\)"):
        full.step(18)


def _first_frames(seed: int, first_env_id: int = 0, num_envs: int = 2, steps: int = 5) -> np.ndarray:
    batch = envs.make_batch("atari:Boxing", num_envs, first_env_id, {"seed": seed})
    frames = [batch.reset()]
    for t in range(steps):
        frames.append(batch.step(np.full(num_envs, t % 18)).observation)
    return np.stack(frames)


def test_same_seed_same_frames_different_seed_different_frames():
    a = _first_frames(0)
    np.testing.assert_array_equal(a, _first_frames(0))
    assert not np.array_equal(a, _first_frames(100))
    # Env i of the run uses seed + first_env_id + i: env 1 of (seed 0, id 0) == env 0 of (seed 0, id 1).
    np.testing.assert_array_equal(a[:, 1], _first_frames(0, first_env_id=1, num_envs=1)[:, 0])


def test_sticky_actions_option():
    default = envs.make_batch("atari:Pong", 1, 0, {}).envs[0]
    assert default.ale.getFloat("repeat_action_probability") == 0.0  # ALE's own default is 0.25
    sticky = envs.make_batch("atari:Pong", 1, 0, {"sticky_actions": True}).envs[0]
    assert sticky.ale.getFloat("repeat_action_probability") == pytest.approx(0.25)


def test_step_before_reset_is_an_error():
    with pytest.raises(RuntimeError, match="before reset"):
        make_env().step(0)


# ----------------------------------------------------------------------------------------------- vector env


@pytest.mark.parametrize("repeat", [4, 1])
def test_vector_env_batch(repeat):
    options = {"atari_vector_env": True, "action_repeat": repeat, "atari_max_frames": 200, "seed": 2}
    batch = envs.make_batch("atari:Freeway", 3, 0, options)
    assert isinstance(batch, atari.AleVectorEnvBatch)
    assert batch.spec == envs.make_spec("atari:Freeway", options)
    first = batch.reset()
    assert first.shape == (3, 84, 84) and first.dtype == np.uint8
    previous, finished, done_seen = first, [], False
    for _ in range(200 // repeat + 30):
        out = batch.step(np.ones(3, np.int64))
        assert out.observation.shape == (3, 84, 84) and out.reward.dtype == np.float32
        assert not np.array_equal(out.observation, previous)
        previous = out.observation
        finished += out.finished
        if out.done.any():
            done_seen = True
            assert out.truncated[out.done].all()
            break
    assert done_seen and all(s.truncated for s in finished)
    again = envs.make_batch("atari:Freeway", 3, 0, options)
    np.testing.assert_array_equal(again.reset(), first)
    with pytest.raises(ValueError, match=r"actions: got values in \[0, 18\], expected integers in \[0, 18\)"):
        again.step(np.array([0, 18, 1]))
    batch.close()
    again.close()
