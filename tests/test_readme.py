"""README.md stays a page a newcomer reads in five minutes and every command and link on it works; the measurements
live in docs/learning and docs/performance, one dated file per study, each folder with an index that reaches them.

Checked: README is at most 300 lines; every relative link of README.md and docs/**/*.md names a file that exists
(anchors are not checked); README's preset table lists exactly the presets of seed/presets.py, and every
`--preset=NAME` it shows exists; every result, time, FPS and cost figure of its learning, preset and performance
tables is in the study its row links; every `make TARGET`, `launch/` script, `python -m MODULE` and `seed-*` command
it shows exists; every study states its date, commit, machine and command at the top and is linked from its folder's
index, and every other page of those folders is reachable from the index."""

from __future__ import annotations

import glob
import importlib.util
import itertools
import os
import re

from seed.presets import PRESETS
from tests.conftest import REPO

README = os.path.join(REPO, "README.md")
MAX_LINES = 300
STUDY_FOLDERS = ("docs/learning", "docs/performance")
# Pages of the study folders that are not studies: the indexes, reference pages and tables written by seed-report.
NOT_STUDIES = {"docs/learning/README.md", "docs/learning/options.md", "docs/performance/README.md",
               "docs/performance/tools.md", "docs/performance/hot_path.md"}
GENERATED = re.compile(r"(^|/)(curves|report|sweep_[\w]+)\.md$")
HEADER_FIELDS = ("Date", "Commit", "Machine", "Command")
HEADER_LINES = 40

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
CODE_SPAN = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
MAKE = re.compile(r"(?:^|[\s;&|(])make\s+([a-z][\w-]*)")
MAKE_TARGET = re.compile(r"^([a-z][\w-]*)\s*:(?!=)", re.M)
LAUNCH_SCRIPT = re.compile(r"(?<![\w./-])(launch/[\w./-]+\.(?:sh|py))")
PYTHON_MODULE = re.compile(r"python3?\s+-m\s+(seed(?:\.\w+)*)")
PRESET_FLAG = re.compile(r"--preset=([a-z][a-z0-9_]*)")  # NAME and <name> are placeholders
CONSOLE_SCRIPT = re.compile(r"(?<![\w/-])(seed-[a-z]+)(?![\w./-])")
PRESET_ROW = re.compile(r"^\| `(\w+)` \|", re.M)
# A figure of a table cell: a number with its sign, thousands separators, decimals and unit letter (1.9x, 24M, -22%),
# or a range of two (3.5-5.6, 10-25M); digits inside a word (v5, Walker2d) are not figures.
FIGURE = re.compile(r"(?<![\w.,-])-?\d+(?:,\d{3})*(?:\.\d+)?(?:-\d+(?:,\d{3})*(?:\.\d+)?)?[KMx%]?(?![\w.,]\d)")
RANGE = re.compile(r"(-?[\d,.]+)-([\d,.]+)([KMx%]?)")
# README's tables whose rows each link their study: (section, the columns whose figures the study must hold).
FIGURE_TABLES = {"Learning results": ("result", "time on 2 cores"), "Presets": ("reaches", "time"),
                 "Performance": ("FPS", "simulator ceiling", "$ per 1B frames")}


def read(path: str) -> str:
    with open(os.path.join(REPO, path), encoding="utf-8") as f:
        return f.read()


def markdown_pages() -> list[str]:
    """README.md and every page under docs/, as paths relative to the repository."""
    pages = glob.glob(os.path.join(REPO, "docs", "**", "*.md"), recursive=True)
    return ["README.md"] + sorted(os.path.relpath(page, REPO) for page in pages)


def code_text(text: str) -> str:
    """What a page shows as commands: its fenced blocks and its inline code spans, one per line."""
    blocks = [match.group(0) for match in FENCE.finditer(text)]
    spans = CODE_SPAN.findall(FENCE.sub("", text))
    return "\n".join(blocks + spans)


def relative_links(text: str) -> list[str]:
    """The targets of the page's Markdown links and images that point into the repository, without their anchors;
    links inside fenced code are not links."""
    targets = []
    for match in LINK.finditer(FENCE.sub("", text)):
        target = match.group(1)
        if re.match(r"[a-zA-Z][\w+.-]*:", target) or target.startswith("#"):
            continue
        targets.append(target.split("#", 1)[0])
    return targets


def broken_links(page: str, repo: str) -> list[str]:
    """The relative links of `page` (a path relative to `repo`) that name no file or folder."""
    with open(os.path.join(repo, page), encoding="utf-8") as f:
        links = relative_links(f.read())
    folder = os.path.dirname(os.path.join(repo, page))
    return [link for link in links if not os.path.exists(os.path.normpath(os.path.join(folder, link)))]


def make_targets(makefile: str) -> set[str]:
    return set(MAKE_TARGET.findall(makefile))


def preset_table(readme: str) -> list[str]:
    """The preset names of the first column of README's table under "## Presets", in order."""
    section = readme.split("\n## Presets", 1)[1].split("\n## ", 1)[0]
    return PRESET_ROW.findall(section)


def header_fields(text: str, lines: int = HEADER_LINES) -> dict[str, int]:
    """How often each of the study header's fields ("- **Date**: ...") appears: in the page's first `lines` lines
    (key) and in the whole page (key + "_total")."""
    counts = {}
    top = "\n".join(text.splitlines()[:lines])
    for field in HEADER_FIELDS:
        pattern = re.compile(rf"^- \*\*{field}\*\*", re.M)
        counts[field] = len(pattern.findall(top))
        counts[field + "_total"] = len(pattern.findall(text))
    return counts


def linked_pages(page: str, repo: str) -> set[str]:
    """The Markdown pages (paths relative to `repo`) that `page` links to; a link to a folder counts as its
    README.md."""
    with open(os.path.join(repo, page), encoding="utf-8") as f:
        links = relative_links(f.read())
    pages = set()
    for link in links:
        path = os.path.normpath(os.path.join(os.path.dirname(page), link))
        if os.path.isdir(os.path.join(repo, path)):
            path = os.path.join(path, "README.md")
        if path.endswith(".md") and os.path.exists(os.path.join(repo, path)):
            pages.add(path)
    return pages


def reachable(index: str, repo: str) -> set[str]:
    """Every Markdown page reachable by links from `index` (itself included)."""
    seen, todo = {index}, [index]
    while todo:
        for page in linked_pages(todo.pop(), repo) - seen:
            seen.add(page)
            todo.append(page)
    return seen


def table_rows(readme: str, section: str) -> list[dict[str, str]]:
    """The rows of the first table under "## <section>" of README, as {column header: cell}."""
    text = readme.split(f"\n## {section}", 1)[1].split("\n## ", 1)[0]
    lines = text.strip().splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("|"))
    table = itertools.takewhile(lambda line: line.startswith("|"), lines[first:])
    cells = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in table]
    header, rows = cells[0], [row for row in cells[2:] if len(row) == len(cells[0])]
    return [dict(zip(header, row, strict=True)) for row in rows]


def figures(cell: str) -> list[str]:
    """The figures of a table cell's text (link targets left out)."""
    return FIGURE.findall(re.sub(r"\]\([^)]*\)", "]", cell))


def figure_appears(figure: str, text: str) -> bool:
    """Whether `text` holds `figure` as a figure of its own (not inside a longer number); a range also where its
    two ends appear (a study's "3.7 / 6.8 minutes" is README's 3.7-6.8)."""
    if re.search(rf"(?<![\w.,]){re.escape(figure)}(?![\w]|[.,]\d)", text):
        return True
    ends = RANGE.fullmatch(figure)
    return bool(ends) and all(figure_appears(end, text) for end in (ends[1], ends[2] + ends[3]))


def study_pages(folder: str) -> list[str]:
    pages = sorted(os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, folder, "**", "*.md"),
                                                                recursive=True))
    return [page for page in pages if page not in NOT_STUDIES and not GENERATED.search(page)]


# The helpers, on small inputs.

def test_code_text_keeps_fenced_blocks_and_inline_spans_only():
    text = "Run `make run` now.\n\n```bash\nmake test\nlaunch/local.sh\n```\nthen make lint in prose.\n"
    code = code_text(text)
    assert "make run" in code and "make test" in code and "launch/local.sh" in code
    assert "make lint" not in code


def test_relative_links_skip_urls_anchors_and_code():
    text = ("[a](docs/x.md) ![fig](img/p.png) [b](https://e.org/y) [c](#top) [d](z.md#part) [e](mailto:x@y)\n"
            "```\n[f](not/a/link.md)\n```\n")
    assert relative_links(text) == ["docs/x.md", "img/p.png", "z.md"]


def test_broken_links_resolve_against_the_page_folder(tmp_path):
    (tmp_path / "docs" / "sub").mkdir(parents=True)
    (tmp_path / "docs" / "sub" / "b.md").write_text("")
    (tmp_path / "docs" / "a.md").write_text("[ok](sub/b.md) [ok too](sub/) [up](../README.md) [gone](c.md#x)")
    (tmp_path / "README.md").write_text("")
    assert broken_links("docs/a.md", str(tmp_path)) == ["c.md"]


def test_make_and_script_patterns_read_the_forms_readme_uses():
    code = 'make run    # x\nSKIP_FOOTBALL=1 make test\n(make gpu-check ARGS="--learn")\nmake install TORCH_SPEC="t"'
    assert MAKE.findall(code) == ["run", "test", "gpu-check", "install"]
    assert make_targets("install: .stamp\nrun: install\n\tx\nPYTHON ?= python3\nX := 1\n.PHONY: run\n") == {
        "install", "run"}
    assert LAUNCH_SCRIPT.findall("launch/local.sh --x; python launch/soak.py; see launch/README.md") == [
        "launch/local.sh", "launch/soak.py"]
    assert PYTHON_MODULE.findall("python -m seed.bench.network --x; python3 -m seed.bench search") == [
        "seed.bench.network", "seed.bench"]
    assert CONSOLE_SCRIPT.findall("seed-learner --x; seed-eval; logs/seed-run; seed-rl-torch") == [
        "seed-learner", "seed-eval"]


def test_preset_table_reads_the_first_column_of_the_presets_section():
    readme = ("# T\n\n## Presets\n\n| preset | agent |\n|---|---|\n| `a_b` | V-trace |\n| `c` | PPO |\n\n"
              "## Other\n\n| `d` | x |\n")
    assert preset_table(readme) == ["a_b", "c"]


def test_header_fields_count_the_top_and_the_whole_page():
    page = "# S\n\n- **Date**: 1\n- **Commit**: a\n- **Machine**: m\n" + "x\n" * 50 + "- **Command**: late\n"
    counts = header_fields(page)
    assert [counts[field] for field in HEADER_FIELDS] == [1, 1, 1, 0]
    assert counts["Command_total"] == 1


def test_reachable_follows_links_and_folders(tmp_path):
    (tmp_path / "d" / "s").mkdir(parents=True)
    (tmp_path / "d" / "README.md").write_text("[a](a.md) [s](s/)")
    (tmp_path / "d" / "a.md").write_text("[b](b.md) [img](x.png)")
    (tmp_path / "d" / "b.md").write_text("")
    (tmp_path / "d" / "s" / "README.md").write_text("[up](../README.md)")
    (tmp_path / "d" / "orphan.md").write_text("")
    assert reachable("d/README.md", str(tmp_path)) == {"d/README.md", "d/a.md", "d/b.md", "d/s/README.md"}


def test_figures_and_where_they_appear():
    assert figures("[training envs 18 at 24M frames, -20.64](x.md#a) 1.9x on v5, short (-22%); 3.5-5.6 / 2,598") == [
        "18", "24M", "-20.64", "1.9x", "-22%", "3.5-5.6", "2,598"]
    study = "Each run took 3.7 / 6.8 / 4.2 minutes; 1.9x it; 2.31M frames; 12,345 steps"
    assert figure_appears("3.7-6.8", study) and figure_appears("1.9x", study) and figure_appears("2.31M", study)
    assert not figure_appears("15.5-18.4", study) and not figure_appears("2.3M", study)
    assert not figure_appears("2,345", study) and not figure_appears("1.9", study)
    rows = table_rows("# R\n\n## T\n\n| a | b |\n|---|---|\n| 1 | [2](y.md) |\n\n| c |\n|---|\n| 3 |\n## U\n", "T")
    assert rows == [{"a": "1", "b": "[2](y.md)"}]


# The repository's pages.

def test_readme_is_short():
    lines = read("README.md").splitlines()
    assert len(lines) <= MAX_LINES, (
        f"README.md: got {len(lines)} lines, expected at most {MAX_LINES}: move measurements to a study in "
        "docs/learning or docs/performance and reference text to docs/usage.md or docs/agents.md")


def test_every_relative_link_resolves():
    broken = {page: links for page in markdown_pages() if (links := broken_links(page, REPO))}
    assert not broken, f"links that name no file: got {broken}, expected every relative link to resolve"


def test_preset_table_lists_every_preset_once():
    names = preset_table(read("README.md"))
    assert len(names) == len(set(names)), f"README preset table: got duplicate rows in {names}"
    assert set(names) == set(PRESETS), (
        f"README preset table: got {sorted(set(names) - set(PRESETS))} not in seed/presets.py and is missing "
        f"{sorted(set(PRESETS) - set(names))}; expected one row per preset of seed/presets.py")


def test_every_preset_readme_names_exists():
    named = set(PRESET_FLAG.findall(read("README.md")))
    assert named, "README.md names no --preset=NAME; expected at least its examples"
    unknown = sorted(named - set(PRESETS))
    assert not unknown, f"README.md: --preset= got {unknown}, expected one of seed/presets.py's presets"


def test_every_make_target_readme_shows_exists():
    shown = set(MAKE.findall(code_text(read("README.md"))))
    targets = make_targets(read("Makefile"))
    assert {"run", "test"} <= shown, f"README.md: got make targets {sorted(shown)}, expected `make run` and `make test`"
    missing = sorted(shown - targets)
    assert not missing, (f"README.md shows make targets the Makefile lacks: got {missing}, expected one of "
                         f"{sorted(targets)}")


def test_every_launch_script_readme_names_exists():
    scripts = set(LAUNCH_SCRIPT.findall(read("README.md")))
    assert "launch/local.sh" in scripts and "launch/gpu_check.sh" in scripts, scripts
    missing = sorted(script for script in scripts if not os.path.isfile(os.path.join(REPO, script)))
    assert not missing, f"README.md names launch scripts that do not exist: got {missing}"


def test_every_python_module_readme_runs_exists():
    missing = []
    for module in set(PYTHON_MODULE.findall(read("README.md"))):
        spec = importlib.util.find_spec(module)
        if spec is not None and spec.submodule_search_locations is not None:  # a package runs its __main__
            spec = importlib.util.find_spec(module + ".__main__")
        if spec is None:
            missing.append(module)
    assert not missing, f"README.md runs `python -m` on modules that do not exist: got {sorted(missing)}"


def test_every_seed_command_readme_shows_is_installed():
    scripts = set(re.findall(r"\"(seed-[a-z]+)=", read("setup.py")))
    shown = set(CONSOLE_SCRIPT.findall(code_text(read("README.md"))))
    assert "seed-learner" in shown, shown
    missing = sorted(shown - scripts)
    assert not missing, f"README.md shows commands setup.py does not install: got {missing}, expected {sorted(scripts)}"


def test_every_study_states_date_commit_machine_and_command_once_at_the_top():
    wrong = {}
    for folder in STUDY_FOLDERS:
        for page in study_pages(folder):
            counts = header_fields(read(page))
            bad = [field for field in HEADER_FIELDS if counts[field] != 1 or counts[field + "_total"] != 1]
            if bad:
                wrong[page] = bad
    assert not wrong, (f"studies without their header: got {wrong} missing or repeated, expected each study to "
                       f"start with one '- **Field**: ...' line per field of {HEADER_FIELDS} in its first "
                       f"{HEADER_LINES} lines")


def test_each_folder_index_links_its_studies_and_reaches_every_page():
    for folder in STUDY_FOLDERS:
        index = f"{folder}/README.md"
        studies = study_pages(folder)
        assert len(studies) >= 8, f"{folder}: got {len(studies)} studies, expected one file per study"
        unlinked = sorted(set(studies) - linked_pages(index, REPO))
        assert not unlinked, f"{index}: got no line for {unlinked}, expected the index to link every study"
        pages = {os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, folder, "**", "*.md"), recursive=True)}
        orphans = sorted(pages - reachable(index, REPO))
        assert not orphans, f"{folder}: got pages no link reaches from {index}: {orphans}"


def test_each_figure_of_readmes_result_tables_is_in_the_study_it_links():
    """README's learning, preset and performance tables each link a study per row: every result, time, FPS and
    cost figure of the row is in that study (a figure the study changed since, or one never in it, is caught; the
    wording is not checked)."""
    readme = read("README.md")
    wrong = []
    for section, columns in FIGURE_TABLES.items():
        for row in table_rows(readme, section):
            links = [link for cell in row.values() for link in relative_links(cell)]
            if not links:  # "not measured yet"
                continue
            study = read(links[0])
            wrong += [f"{section}: {next(iter(row.values()))}: {figure!r} not in {links[0]}"
                      for column in columns for figure in figures(row[column]) if not figure_appears(figure, study)]
    assert not wrong, "README figures its studies do not hold:\n" + "\n".join(wrong)
