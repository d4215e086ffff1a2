"""Human-normalised Atari scores: `normalized = (score - random) / (human - random)`.

Reference scores ship with the package in `atari57_scores.csv` (columns game, human, random, r2d2_paper,
seed_8tpu_paper; one row per Atari-57 game, games named as in `--env=atari:<Game>`, e.g. "Pong", "MsPacman").
Scores are undiscounted episode returns in game points (raw, unclipped rewards). The packaged random column
is empty for some games; for those pass `extra_scores_path`, a CSV file with columns game,human,random whose
rows override (or fill in) the packaged ones. An empty cell in that file keeps the packaged value.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np

DEFAULT_SCORES_PATH = Path(__file__).with_name("atari57_scores.csv")
REQUIRED_COLUMNS = ("game", "human", "random")


@dataclasses.dataclass(frozen=True)
class ReferenceScores:
    """Reference returns of one game, in game points. `random` is None where the table has no value."""

    game: str
    human: float | None
    random: float | None
    source: str  # the file the values came from (both files' names when merged)


def _parse(value: str | None, path: os.PathLike | str, line: int, column: str) -> float | None:
    if value is None or not value.strip():
        return None
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"{path}, line {line}, column {column!r}: got {value!r}, expected a number or empty") from None
    if not math.isfinite(number):
        raise ValueError(f"{path}, line {line}, column {column!r}: got {value!r}, expected a finite number")
    return number


def read_scores_csv(path: os.PathLike | str) -> dict[str, ReferenceScores]:
    """Reads a CSV with at least the columns game,human,random (other columns are ignored)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"scores file: got {str(path)!r}, expected an existing CSV file (game,human,random)")
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        columns = [c.strip() for c in (reader.fieldnames or [])]
        missing = [c for c in REQUIRED_COLUMNS if c not in columns]
        if missing:
            raise ValueError(f"{path}: header has columns {columns}, expected at least {list(REQUIRED_COLUMNS)} "
                             f"(missing {missing})")
        scores = {}
        for line, row in enumerate(reader, start=2):
            row = {(k or "").strip(): v for k, v in row.items()}
            game = (row.get("game") or "").strip()
            if not game:
                raise ValueError(f"{path}, line {line}, column 'game': got an empty name, expected a game like 'Pong'")
            scores[game] = ReferenceScores(
                game=game,
                human=_parse(row.get("human"), path, line, "human"),
                random=_parse(row.get("random"), path, line, "random"),
                source=str(path),
            )
    return scores


def load_scores(extra_scores_path: os.PathLike | str | None = None) -> dict[str, ReferenceScores]:
    """The packaged reference scores, overridden row by row (non-empty cells only) by `extra_scores_path`."""
    scores = read_scores_csv(DEFAULT_SCORES_PATH)
    if extra_scores_path is None:
        return scores
    for game, extra in read_scores_csv(extra_scores_path).items():
        base = scores.get(game)
        if base is None:
            scores[game] = extra
            continue
        scores[game] = ReferenceScores(
            game=game,
            human=extra.human if extra.human is not None else base.human,
            random=extra.random if extra.random is not None else base.random,
            source=f"{extra.source} over {base.source}",
        )
    return scores


def _game_name(game: str) -> str:
    # Accept the full --env value too ("atari:Pong").
    return game.split(":", 1)[1] if game.startswith("atari:") else game


def reference_scores(game: str, extra_scores_path: os.PathLike | str | None = None) -> tuple[float, float]:
    """(human, random) returns of `game`, with errors that say which value is missing and how to supply it."""
    name = _game_name(game)
    scores = load_scores(extra_scores_path)
    if name not in scores:
        raise ValueError(f"game: got {game!r}, expected one of the games in the scores table: "
                         f"{', '.join(sorted(scores))} (or add a row with extra_scores_path=<CSV game,human,random>)")
    row = scores[name]
    for column in ("human", "random"):
        if getattr(row, column) is None:
            raise ValueError(
                f"game {name!r}: no {column} score in {row.source}; supply {column} scores with a CSV file "
                f"(columns game,human,random) via extra_scores_path=<path>"
            )
    assert row.human is not None and row.random is not None
    if row.human == row.random:
        raise ValueError(f"game {name!r}: human score equals random score ({row.human}); cannot normalise")
    return row.human, row.random


def normalize(score: float | np.ndarray, human: float, random: float) -> float | np.ndarray:
    """`(score - random) / (human - random)`: 0 plays like random, 1 like the human reference."""
    if human == random:
        raise ValueError(f"human: got {human}, expected a value different from random ({random})")
    result = (np.asarray(score, np.float64) - random) / (human - random)
    return float(result) if result.ndim == 0 else result


def human_normalized_score(
    game: str, score: float | np.ndarray, extra_scores_path: os.PathLike | str | None = None
) -> float | np.ndarray:
    """Human-normalised score(s) of raw episode return(s) `score` (scalar or array) in `game` ("Pong")."""
    human, random = reference_scores(game, extra_scores_path)
    return normalize(score, human, random)


def human_normalized_scores(
    returns: Mapping[str, float], extra_scores_path: os.PathLike | str | None = None
) -> dict[str, float]:
    """{game: raw return} -> {game: human-normalised score}; errors name the first game that lacks a score."""
    return {game: float(human_normalized_score(game, value, extra_scores_path)) for game, value in returns.items()}


def median_human_normalized(returns: Mapping[str, float], extra_scores_path: os.PathLike | str | None = None) -> float:
    """Median human-normalised score over games (the usual Atari-57 summary)."""
    if not returns:
        raise ValueError("returns: got no games, expected at least one {game: return} entry")
    return float(np.median(list(human_normalized_scores(returns, extra_scores_path).values())))
