"""`seed-bench --compare=REV`: the working tree against another commit, measured in one run.

This VM's speed moves 2-5x between days and 10-30% between two runs a minute apart, so a figure from another
day says nothing about a change. The A/B bench installs REV from `git archive` into a virtual environment of its
own (cached per commit under --compare_cache_dir), then runs the same named configuration for both sides
alternately, `--compare_rounds` rounds, the order flipped every round (A B, B A, A B, ...) so that a drift in the
machine's speed hits both alike. Each round gives one ratio, working tree over REV, from its two runs; the
comparison is the median of those ratios, with their spread (min, max).

    seed-bench --config=fake_mlp --compare=9e0b7a4 --baselines=transport --duration_s=25
    seed-bench --config=fake_mlp --compare=9e0b7a4 --compare_with=da2d4f7     # two commits, no working tree

Before every run the cores are sampled: when other processes hold more than --compare_max_other_load of them
(a share, 0.25 by default), it waits up to --compare_wait_s for them to go quiet and then refuses, unless
--compare_allow_load. The load measured during each run (`other_processes_cores`) is printed beside it; a round in
which either run saw more than that share is discarded and measured again (kept in the result's
`discarded_rounds`).

A side is a python interpreter that imports that side's `seed`: the running one for the working tree (which must
be an editable install of a git checkout), the cached environment's for a commit. The environment is a plain
virtual environment whose `.pth` file appends the running interpreter's site-packages (torch, grpc, ...) after its
own, so only the project itself is installed per commit (`pip install --no-deps`, a few seconds).
"""

from __future__ import annotations

import dataclasses
import datetime
import fcntl
import json
import os
import platform
import shutil
import site
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from seed.bench.measure import BenchError

SCHEMA = "seed-bench-compare/1"
WORKING_TREE = "working tree"
DEFAULT_CACHE_DIR = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "seed-rl", "ab")


@dataclasses.dataclass(frozen=True)
class Side:
    """One side of the comparison: a label (a commit, or the working tree) and the interpreter that runs it."""
    label: str
    python: str
    commit: str | None  # None for the working tree (its HEAD is in `label`)


# ------------------------------------------------------------------------------------------ pure logic


def round_order(round_index: int) -> tuple[int, int]:
    """Which side runs first in a round: (0, 1) in even rounds, (1, 0) in odd ones (ABBA ordering)."""
    return (0, 1) if round_index % 2 == 0 else (1, 0)


def load_problem(other_cores: float, cores: int, max_share: float) -> str | None:
    """Why the machine is too busy to measure on, or None. `other_cores`: CPU seconds per second that other
    processes used while sampling; refused above `max_share` of `cores`."""
    if other_cores <= max_share * cores:
        return None
    return (f"other processes hold {other_cores:.2f} of {cores} cores, expected at most {max_share:.2f} x {cores} = "
            f"{max_share * cores:.2f} (--compare_max_other_load); stop them or pass --compare_allow_load")


def summarise(rounds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The comparison of measured rounds. Each round is {"a": run, "b": run} with each run holding at least
    "env_frames_per_sec" (None when it measured nothing) and optionally "over_transport"; side a is the one being
    judged, b the reference. Returns the per-round ratios a / b, their median, min and max, and each side's
    median frames/s and ceiling ratio. A round with a missing rate gives no ratio."""
    if not rounds:
        raise BenchError("--compare_rounds: got 0 measured rounds, expected at least 1")
    ratios = [r["a"]["env_frames_per_sec"] / r["b"]["env_frames_per_sec"] for r in rounds
              if r["a"].get("env_frames_per_sec") and r["b"].get("env_frames_per_sec")]

    def median_of(side: str, key: str) -> float | None:
        values = [r[side][key] for r in rounds if r[side].get(key) is not None]
        return statistics.median(values) if values else None

    return {
        "rounds": len(rounds), "ratios": ratios,
        "median_ratio": statistics.median(ratios) if ratios else None,
        "min_ratio": min(ratios) if ratios else None, "max_ratio": max(ratios) if ratios else None,
        "a_env_frames_per_sec": median_of("a", "env_frames_per_sec"),
        "b_env_frames_per_sec": median_of("b", "env_frames_per_sec"),
        "a_over_transport": median_of("a", "over_transport"), "b_over_transport": median_of("b", "over_transport"),
    }


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def report_markdown(result: dict[str, Any]) -> str:
    """The rounds as a table, the verdict line, and the one-line row for a docs/performance study."""
    a, b = result["sides"]
    s = result["summary"]
    machine = result["machine"]
    lines = [f"### {result['config']}: {a['label']} (a) against {b['label']} (b), {s['rounds']} rounds x "
             f"{result['duration_s']:g} s, {machine['cpu_cores']} CPU cores ({machine['cpu_model']})",
             "", "| round | order | a frames/s | a other load | b frames/s | b other load | a / b | a / ceiling | "
             "b / ceiling |", "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for index, r in enumerate(result["rounds"]):
        ratio = (r["a"]["env_frames_per_sec"] / r["b"]["env_frames_per_sec"]
                 if r["a"].get("env_frames_per_sec") and r["b"].get("env_frames_per_sec") else None)
        lines.append(f"| {index + 1} | {r['order']} | {_fmt(r['a'].get('env_frames_per_sec'), ',.0f')} | "
                     f"{_fmt(r['a'].get('other_processes_cores'), '.2f')} | "
                     f"{_fmt(r['b'].get('env_frames_per_sec'), ',.0f')} | "
                     f"{_fmt(r['b'].get('other_processes_cores'), '.2f')} | {_fmt(ratio, '.3f')} | "
                     f"{_fmt(r['a'].get('over_transport'), '.3f')} | {_fmt(r['b'].get('over_transport'), '.3f')} |")
    lines += ["", f"a / b: median {_fmt(s['median_ratio'], '.3f')} (min {_fmt(s['min_ratio'], '.3f')}, "
                  f"max {_fmt(s['max_ratio'], '.3f')}); median frames/s a {_fmt(s['a_env_frames_per_sec'], ',.0f')}, "
                  f"b {_fmt(s['b_env_frames_per_sec'], ',.0f')}",
              "", "Row for docs/performance:", "", result["docs_row"]]
    return "\n".join(lines)


def docs_row(result: dict[str, Any]) -> str:
    a, b = result["sides"]
    s = result["summary"]
    ceiling = ""
    if s["a_over_transport"] is not None:
        ceiling = f"; over the gRPC ceiling a {s['a_over_transport']:.2f}, b {_fmt(s['b_over_transport'], '.2f')}"
    return (f"| {result['created_utc'][:10]} | {result['config']} | {a['label']} / {b['label']} | "
            f"{_fmt(s['median_ratio'], '.3f')}x ({_fmt(s['min_ratio'], '.3f')}-{_fmt(s['max_ratio'], '.3f')}) | "
            f"{s['rounds']} rounds x {result['duration_s']:g} s; {_fmt(s['a_env_frames_per_sec'], ',.0f')} / "
            f"{_fmt(s['b_env_frames_per_sec'], ',.0f')} frames/s{ceiling} | {result['machine']['cpu_cores']} cores, "
            f"{result['machine']['cpu_model']}, other load {result['max_other_load']:.2f} cores at most |")


# ------------------------------------------------------------------------------------------ the machine


def busy_cores(seconds: float = 2.0) -> float:
    """CPU seconds per second used by every process on the machine over `seconds` (from /proc/stat)."""
    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
        idle = fields[3] + fields[4]  # idle + iowait
        return sum(fields[:8]) - idle, sum(fields[:8])

    busy0, total0 = sample()
    time.sleep(seconds)
    busy1, total1 = sample()
    cores = os.cpu_count() or 1
    return cores * (busy1 - busy0) / max(1, total1 - total0)


def wait_for_quiet(max_share: float, wait_s: float, allow_load: bool,
                   sample: Callable[[], float] = busy_cores) -> float:
    """Samples the machine until it is quiet enough, for up to `wait_s`; returns the last load (cores). Raises
    BenchError when it stays busy, unless `allow_load`."""
    cores = os.cpu_count() or 1
    deadline = time.monotonic() + wait_s
    while True:
        load = sample()
        problem = load_problem(load, cores, max_share)
        if problem is None or allow_load:
            return load
        if time.monotonic() >= deadline:
            raise BenchError(problem)
        print(f"[compare] waiting for quiet cores: {problem}", file=sys.stderr, flush=True)
        time.sleep(5.0)


# ------------------------------------------------------------------------------------------ sides


def _git(repo: str, *args: str) -> str:
    completed = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=60)
    if completed.returncode != 0:
        raise BenchError(f"git {' '.join(args)}: {completed.stderr.strip() or completed.stdout.strip()}")
    return completed.stdout.strip()


def source_checkout() -> str:
    """The root of the git checkout the running `seed` package is imported from (an editable install)."""
    import seed

    package_dir = os.path.dirname(os.path.abspath(seed.__file__))
    completed = subprocess.run(["git", "ls-files", "--error-unmatch", "__init__.py"], cwd=package_dir,
                               capture_output=True, text=True)
    if completed.returncode != 0:
        raise BenchError(f"--compare: needs the project as an editable install of a git checkout; seed is imported "
                         f"from {package_dir}, which no git repository tracks")
    return _git(package_dir, "rev-parse", "--show-toplevel")


def resolve_commit(repo: str, rev: str) -> str:
    try:
        return _git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except BenchError:
        raise BenchError(f"--compare: got {rev!r}, expected a commit of {repo} (git rev-parse found none)") from None


def install_commit(repo: str, commit: str, cache_dir: str, log: Callable[[str], None]) -> str:
    """The python of a virtual environment with `commit` installed (built once per commit and cached)."""
    root = os.path.join(cache_dir, commit)
    python = os.path.join(root, "venv", "bin", "python")
    marker = os.path.join(root, "installed.json")
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, ".lock"), "w") as lock:
        fcntl.lockf(lock, fcntl.LOCK_EX)  # two comparisons installing one commit at once wait for each other
        if os.path.exists(marker):
            return python
        log(f"installing {commit[:10]} into {root}")
        for part in ("src", "venv"):
            shutil.rmtree(os.path.join(root, part), ignore_errors=True)
        src = os.path.join(root, "src")
        os.makedirs(src)
        archive = subprocess.run(["git", "archive", "--format=tar", commit], cwd=repo, capture_output=True,
                                 check=True)
        subprocess.run(["tar", "-x", "-C", src], input=archive.stdout, check=True)
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", os.path.join(root, "venv")], check=True)
        # The running interpreter's packages, after the environment's own: torch, grpc, numpy... without their
        # .pth files, so the working tree's editable finder never shadows the commit's copy.
        purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        with open(os.path.join(purelib, "_seed_ab_dependencies.pth"), "w") as f:
            f.write("\n".join(site.getsitepackages() + [site.getusersitepackages()]) + "\n")
        pip = subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-deps",
                              "--no-build-isolation", src], capture_output=True, text=True)
        if pip.returncode != 0:
            raise BenchError(f"--compare: installing {commit[:10]} failed: {pip.stderr[-2000:]}")
        where = subprocess.run([python, "-c", "import seed, seed.agents; print(seed.__file__)"],
                               capture_output=True, text=True, cwd=root)
        if where.returncode != 0 or not where.stdout.strip().startswith(os.path.join(root, "venv")):
            raise BenchError(f"--compare: {commit[:10]}'s environment imports seed from {where.stdout.strip()!r} "
                             f"{where.stderr[-500:]}, expected its own copy under {root}/venv")
        with open(marker, "w") as f:
            json.dump({"commit": commit, "installed_utc": datetime.datetime.now(datetime.timezone.utc).isoformat()}, f)
        return python


def working_tree_side(repo: str) -> Side:
    head = _git(repo, "rev-parse", "HEAD")
    dirty = _git(repo, "status", "--porcelain", "--untracked-files=no")
    return Side(f"{head[:10]}{'+dirty' if dirty else ''}", sys.executable, None)


# ------------------------------------------------------------------------------------------ running


def run_side(side: Side, bench_args: Sequence[str], out: str, runs_dir: str, log_path: str, cwd: str) -> dict[str, Any]:
    """One seed-bench run of one side; returns the figures a round needs. `cwd` holds no `seed` folder, so the
    side's own installed `seed` is imported (`python -m` puts the directory first on sys.path)."""
    command = [side.python, "-m", "seed.bench.cli", *bench_args, f"--out={out}", f"--runs_dir={runs_dir}",
               "--noprogress"]
    with open(log_path, "w") as log:
        completed = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, cwd=cwd)
    if completed.returncode != 0:
        with open(log_path, errors="replace") as f:
            raise BenchError(f"--compare: the run of {side.label} failed (exit {completed.returncode}); "
                             f"{log_path}:\n{f.read()[-3000:]}")
    with open(out) as f:
        result = json.load(f)
    transport = (result.get("baselines") or {}).get("transport")
    return {"env_frames_per_sec": result.get("env_frames_per_sec"),
            "over_transport": (result.get("ratios") or {}).get("framework_over_transport"),
            "transport_env_frames_per_sec": transport and transport.get("env_frames_per_sec"),
            "other_processes_cores": result["framework"].get("other_processes_cores"),
            "result_file": out, "git_commit": result["configuration"].get("git_commit")}


def compare(config: str, bench_args: Sequence[str], rev: str, against: str, rounds: int, duration_s: float,
            out: str, cache_dir: str, max_share: float, wait_s: float, allow_load: bool) -> dict[str, Any]:
    """Measures the working tree (or `against`) as side a and `rev` as side b; writes and returns the result."""
    if rounds < 1:
        raise BenchError(f"--compare_rounds: got {rounds}, expected at least 1")
    if not 0 < max_share <= 1:
        raise BenchError(f"--compare_max_other_load: got {max_share}, expected a share of the cores in (0, 1]")
    log = lambda message: print(f"[compare] {message}", file=sys.stderr, flush=True)
    repo = source_checkout()
    cache_dir = os.path.abspath(cache_dir)
    reference = resolve_commit(repo, rev)
    side_b = Side(reference[:10], install_commit(repo, reference, cache_dir, log), reference)
    if against:
        judged = resolve_commit(repo, against)
        side_a = Side(judged[:10], install_commit(repo, judged, cache_dir, log), judged)
    else:
        side_a = working_tree_side(repo)
    sides = (side_a, side_b)
    stem = out[:-5] if out.endswith(".json") else out
    work = tempfile.mkdtemp(prefix=os.path.basename(stem) + "-", dir=os.path.dirname(out))
    runs_dir = os.path.join(work, "runs")
    measured: list[dict[str, Any]] = []
    discarded: list[dict[str, Any]] = []
    max_other = 0.0
    cores = os.cpu_count() or 1
    while len(measured) < rounds:
        index = len(measured)
        order = round_order(index)
        pair: dict[str, Any] = {"order": " then ".join("ab"[i] for i in order)}
        for i in order:
            wait_for_quiet(max_share, wait_s, allow_load)
            name = f"round{index + 1}-{'ab'[i]}-{len(discarded)}"
            log(f"round {index + 1}/{rounds}: {sides[i].label} ({'ab'[i]})")
            run = run_side(sides[i], bench_args, os.path.join(work, f"{name}.json"), runs_dir,
                           os.path.join(work, f"{name}.log"), work)
            pair["ab"[i]] = run
            log(f"  {run['env_frames_per_sec'] or 0:,.0f} frames/s, other load {run['other_processes_cores'] or 0:.2f}")
        # A neighbour that started during a run makes that round's ratio meaningless: measure the round again.
        busy = [load_problem(pair[side]["other_processes_cores"] or 0.0, cores, max_share) for side in "ab"]
        if any(busy) and not allow_load:
            discarded.append(pair)
            if len(discarded) > 2 * rounds:
                raise BenchError(f"--compare: {len(discarded)} rounds discarded for load; last: "
                                 f"{next(p for p in busy if p)}")
            log(f"round {index + 1} discarded, measured again: {next(p for p in busy if p)}")
            continue
        max_other = max([max_other] + [pair[side]["other_processes_cores"] or 0.0 for side in "ab"])
        measured.append(pair)
    from seed.bench.results import cpu_model

    result: dict[str, Any] = {
        "schema": SCHEMA, "config": config, "bench_args": list(bench_args), "duration_s": duration_s,
        "created_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "sides": [dataclasses.asdict(side) for side in sides], "rounds": measured, "summary": summarise(measured),
        "discarded_rounds": discarded,
        "machine": {"cpu_cores": os.cpu_count(), "cpu_model": cpu_model(), "platform": platform.platform()},
        "max_other_load": max_other, "allow_load": allow_load, "work_dir": work,
    }
    result["docs_row"] = docs_row(result)
    with open(out, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    return result
