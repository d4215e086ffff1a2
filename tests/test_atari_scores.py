"""Human-normalised Atari scores from the packaged Atari-57 reference table."""

from __future__ import annotations

import filecmp
import os

import numpy as np
import pytest

from seed.envs import atari, atari_scores

# A copy of the Atari-57 reference table (human and random scores as published), kept apart from the packaged
# table so an edit of the packaged file shows up here.
REFERENCE_CSV = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "atari57_scores_reference.csv")


def test_packaged_table_has_57_games_named_like_env_ids():
    scores = atari_scores.load_scores()
    assert len(scores) == 57
    assert scores["Pong"].human == 14.6 and scores["Pong"].random == -20.7
    assert scores["MsPacman"].human == 6951.6 and scores["MsPacman"].random == 307.3
    assert scores["Asteroids"].random is None
    # Every game of the table is a valid --env=atari:<Game> name.
    assert set(scores) <= set(atari.valid_games())


def test_packaged_table_is_the_reference_copy():
    assert filecmp.cmp(atari_scores.DEFAULT_SCORES_PATH, REFERENCE_CSV, shallow=False)


def test_formula_against_hand_computed_values():
    # Pong: human 14.6, random -20.7 -> (21 + 20.7) / 35.3
    assert atari_scores.human_normalized_score("Pong", 21.0) == pytest.approx(41.7 / 35.3)
    assert atari_scores.human_normalized_score("Pong", -20.7) == pytest.approx(0.0)
    assert atari_scores.human_normalized_score("Pong", 14.6) == pytest.approx(1.0)
    # Breakout: human 30.5, random 1.7 -> (837.7 - 1.7) / 28.8 = 29.02777...
    assert atari_scores.human_normalized_score("atari:Breakout", 837.7) == pytest.approx(836.0 / 28.8)
    values = atari_scores.human_normalized_score("Boxing", np.array([0.1, 12.1, 100.0]))
    np.testing.assert_allclose(values, [0.0, 1.0, 99.9 / 12.0])
    assert atari_scores.normalize(5.0, human=10.0, random=0.0) == 0.5
    both = atari_scores.human_normalized_scores({"Pong": 14.6, "Breakout": 1.7})
    assert both == pytest.approx({"Pong": 1.0, "Breakout": 0.0})
    assert atari_scores.median_human_normalized({"Pong": 14.6, "Breakout": 1.7, "Boxing": 24.1}) == pytest.approx(1.0)


def test_missing_random_score_error_names_game_and_fix():
    with pytest.raises(ValueError) as info:
        atari_scores.human_normalized_score("Asteroids", 1000.0)
    message = str(info.value)
    assert "'Asteroids'" in message and "random" in message
    assert "extra_scores_path" in message and "game,human,random" in message


def test_unknown_game_error():
    with pytest.raises(ValueError, match=r"game: got 'NotAGame', expected one of the games"):
        atari_scores.human_normalized_score("NotAGame", 1.0)


def test_extra_scores_file(tmp_path):
    extra = tmp_path / "random_scores.csv"
    extra.write_text("game,human,random\nAsteroids,,719.1\nPong,20.0,\nNewGame,100,10\n")
    # Asteroids: packaged human 47388.7 with the supplied random 719.1.
    value = atari_scores.human_normalized_score("Asteroids", 10000.0, extra_scores_path=extra)
    assert value == pytest.approx((10000.0 - 719.1) / (47388.7 - 719.1))
    # Pong: the file overrides human only; random stays -20.7.
    assert atari_scores.human_normalized_score("Pong", 20.0, extra_scores_path=str(extra)) == pytest.approx(1.0)
    assert atari_scores.human_normalized_score("NewGame", 55.0, extra_scores_path=extra) == pytest.approx(0.5)


def test_bad_extra_files(tmp_path):
    missing_column = tmp_path / "a.csv"
    missing_column.write_text("game,human\nPong,1\n")
    with pytest.raises(ValueError, match=r"missing \['random'\]"):
        atari_scores.load_scores(missing_column)
    bad_number = tmp_path / "b.csv"
    bad_number.write_text("game,human,random\nPong,1,abc\n")
    with pytest.raises(ValueError, match=r"line 2, column 'random': got 'abc', expected a number"):
        atari_scores.load_scores(bad_number)
    with pytest.raises(FileNotFoundError, match="nope.csv"):
        atari_scores.load_scores(tmp_path / "nope.csv")
    equal = tmp_path / "c.csv"
    equal.write_text("game,human,random\nPong,3,3\n")
    with pytest.raises(ValueError, match="human score equals random score"):
        atari_scores.human_normalized_score("Pong", 1.0, extra_scores_path=equal)


def test_learner_logs_human_normalised_returns(tmp_path):
    import numpy as np

    from seed.learner.configuration import resolve_config
    from seed.learner.learner import Learner

    config = resolve_config(dict(env="atari:Pong", logdir=str(tmp_path), server_address=f"unix:{tmp_path}/s",
                                 num_actors=1, num_eval_envs=1))
    learner = Learner(config)
    learner.parts.metrics.record_episodes(np.array([-20.0, -10.0]), np.array([800, 900]))
    learner.parts.metrics.record_eval_episodes(np.array([14.6]), np.array([900]))
    row = learner.log_row(1.0, 1.0)
    human, random = 14.6, -20.7  # Pong in the shared reference table
    assert row["episode_human_normalized"] == pytest.approx((-15.0 - random) / (human - random))
    assert row["eval_episode_human_normalized"] == pytest.approx(1.0)
