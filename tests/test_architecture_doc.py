"""docs/ARCHITECTURE.md stays a design page that is true of the tree: at most 250 lines, and every path it names
under seed/, agents/, envs/, tests/ and docs/ exists, so a moved or deleted module fails here instead of leaving
the page wrong."""

from __future__ import annotations

import glob
import os
import re

from tests.conftest import REPO

PAGE = os.path.join(REPO, "docs", "ARCHITECTURE.md")
MAX_LINES = 250
# A path starts at a top-level folder that is not itself inside a longer path (not after "/", ".", a letter).
PATH = re.compile(r"(?<![\w./-])((?:seed|agents|envs|tests|docs)/[\w./*<>-]*)")
# In the rooms table a row's first cell is the room (`seed/actor/`) and its second names modules relative to it.
ROOM_ROW = re.compile(r"^\| `((?:seed|agents|envs)/[\w/]*)`[^|]*\|([^|]*)\|")
MODULE = re.compile(r"`([\w/]+(?:\.py|/))`")


def named_paths(text: str) -> list[str]:
    """The repository paths `text` names, in order, without a sentence's final dot or comma; placeholders such as
    `agents/<name>/` are left out (they name a pattern, not a file)."""
    paths = []
    for match in PATH.finditer(text):
        path = match.group(1).rstrip(".,")
        if "<" in path or ">" in path:
            continue
        paths.append(path)
    return paths


def room_modules(text: str) -> list[str]:
    """The paths the rooms table names: each module of a row's second cell joined to the row's room."""
    paths = []
    for line in text.splitlines():
        row = ROOM_ROW.match(line)
        if row:
            room, cell = row.groups()
            paths += [room.rstrip("/") + "/" + name for name in MODULE.findall(cell)]
    return paths


def missing(paths: list[str], repo: str) -> list[str]:
    """The paths (globs allowed: `seed/bench/*.yaml`) that match nothing under `repo`."""
    return [path for path in paths if not glob.glob(os.path.join(repo, path))]


def test_named_paths_reads_the_forms_the_page_uses():
    text = ("`seed/inference/central.py`: ... (`seed/serving/`), seed/bench/*.yaml, envs/<family>.py, "
            "docs/performance/README.md. `agents/registry.py: AGENTS`, tests/toy_agent/, "
            "and seed.agents or foo/seed/x.py or docs/learning/x.md, ")
    assert named_paths(text) == ["seed/inference/central.py", "seed/serving/", "seed/bench/*.yaml",
                                 "docs/performance/README.md", "agents/registry.py", "tests/toy_agent/",
                                 "docs/learning/x.md"]


def test_room_modules_joins_each_module_to_its_room():
    text = ("| room | modules | imports |\n|---|---|---|\n"
            "| `seed/actor/` | `loop.py` (the loop), `main.py` (`seed-actor`) | envs, `seed/config.py` |\n"
            "| `seed/` (top) | `config.py` (flags) | - |\n"
            "| `agents/` | `registry.py`, `muzero/search/`, `AGENTS` | contracts |\n"
            "not a row: `seed/x/` | `y.py` |\n")
    assert room_modules(text) == ["seed/actor/loop.py", "seed/actor/main.py", "seed/config.py",
                                  "agents/registry.py", "agents/muzero/search/"]


def test_missing_finds_a_path_that_is_not_there(tmp_path):
    (tmp_path / "seed").mkdir()
    (tmp_path / "seed" / "a.py").write_text("")
    assert missing(["seed/a.py", "seed/", "seed/*.py", "seed/b.py", "seed/*.yaml"], str(tmp_path)) == [
        "seed/b.py", "seed/*.yaml"]


def test_page_is_short():
    with open(PAGE, encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert len(lines) <= MAX_LINES, (
        f"docs/ARCHITECTURE.md: got {len(lines)} lines, expected at most {MAX_LINES}: move measurements and "
        "history to docs/performance, docs/learning or docs/reliability")


def test_every_named_path_exists():
    with open(PAGE, encoding="utf-8") as f:
        paths = named_paths(f.read())
    assert len(paths) > 50, f"docs/ARCHITECTURE.md: got {len(paths)} paths, expected the page to name its modules"
    gone = missing(sorted(set(paths)), REPO)
    assert not gone, f"docs/ARCHITECTURE.md names paths that do not exist: got {gone}, expected every one to exist"


def test_every_module_of_the_rooms_table_exists():
    with open(PAGE, encoding="utf-8") as f:
        paths = room_modules(f.read())
    assert len(paths) > 40, f"docs/ARCHITECTURE.md: got {len(paths)} modules in the rooms table, expected every room's"
    gone = missing(paths, REPO)
    assert not gone, (f"docs/ARCHITECTURE.md's rooms table names modules that do not exist: got {gone}, expected "
                      "every one to exist in its room")
