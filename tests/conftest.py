"""Shared helpers: real learner and actor processes, addresses, metrics files."""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

# The tests compile the MuZero search with a Numba cache of their own, made fresh for each session, so an edit is
# always what runs. Numba's on-disk cache (__pycache__ beside the modules, which runs outside the tests keep using)
# checks only the source file of the function it loads: an edit to compiled_tree.py, whose functions
# compiled_puct.py and compiled_gumbel.py call, would leave their cached machine code running the old tree code.
# Numba reads the variable when it is imported, so this comes before any import that may import it; the learners
# and actors the tests start inherit it. pytest-xdist workers inherit the controller's directory (one compile per
# session, not per worker); only the process that made it removes it.
_NUMBA_CACHE_OWNER = "SEED_TESTS_NUMBA_CACHE_DIR"
if os.environ.get("PYTEST_XDIST_WORKER") and os.environ.get(_NUMBA_CACHE_OWNER):
    os.environ["NUMBA_CACHE_DIR"] = os.environ[_NUMBA_CACHE_OWNER]
else:
    os.environ["NUMBA_CACHE_DIR"] = os.environ[_NUMBA_CACHE_OWNER] = tempfile.mkdtemp(prefix="seed-tests-numba-")
    atexit.register(shutil.rmtree, os.environ["NUMBA_CACHE_DIR"], ignore_errors=True)

import pytest  # noqa: E402
import torch  # noqa: E402

from seed.config import torch_threads  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The test process takes the learner processes' automatic thread count (one on a machine of at most 4 cores): the
# tests' learners and actors keep the other core busy, and two OpenMP threads then wait on each other for it.
torch.set_num_threads(torch_threads(0))


def free_tcp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Processes:
    """Starts seed processes with output in files; kills whatever is left at teardown."""

    def __init__(self, directory: str):
        self.directory = directory
        self.started: list[tuple[subprocess.Popen, str]] = []

    def start(self, module: str, args: list[str], name: str) -> subprocess.Popen:
        log_path = os.path.join(self.directory, f"{name}.log")
        log = open(log_path, "ab")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        process = subprocess.Popen([sys.executable, "-m", module, *args], stdout=log, stderr=subprocess.STDOUT,
                                   cwd=REPO, env=env)
        process.log_path = log_path  # type: ignore[attr-defined]
        self.started.append((process, log_path))
        return process

    def learner(self, args: list[str], name: str = "learner") -> subprocess.Popen:
        return self.start("seed.learner.main", args, name)

    def actor(self, args: list[str], name: str) -> subprocess.Popen:
        return self.start("seed.actor.main", args, name)

    def output(self, process: subprocess.Popen) -> str:
        with open(process.log_path, errors="replace") as f:  # type: ignore[attr-defined]
            return f.read()

    def stop_all(self) -> None:
        for process, _ in self.started:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process, _ in self.started:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _registries() -> tuple[dict, dict]:
    """Copies of the env-family and agent registries (envs.FAMILIES, agents.registry.AGENTS)."""
    from seed import envs
    from seed.agents import registry  # the module plug-ins register in (`agents.registry` would be a second copy)

    return dict(envs.FAMILIES), dict(registry.AGENTS)


@pytest.fixture(autouse=True)
def registries_unchanged():
    """A test that leaves an env family or an agent registered would change every configuration the later tests
    resolve (a family's flags join every config class; spawned training processes, without SEED_RL_PLUGINS, refuse
    them): such a test fails here, at its own name."""
    before = _registries()
    yield
    after = _registries()
    assert after == before, f"the test left the registries changed: families {sorted(after[0])} (before "\
        f"{sorted(before[0])}), agents {sorted(after[1])} (before {sorted(before[1])})"


@pytest.fixture
def plugin_in_this_process():
    """`load(module)` registers a plug-in module's agents or env families in the test session's process (importing
    it, or re-running it when an earlier test imported it); both registries are restored after the test."""
    import importlib

    from seed import envs
    from seed.agents import registry

    families, agents = _registries()

    def load(module: str) -> None:
        if module in sys.modules:
            importlib.reload(sys.modules[module])
        else:
            importlib.import_module(module)

    yield load
    envs.FAMILIES.clear()
    envs.FAMILIES.update(families)
    registry.AGENTS.clear()
    registry.AGENTS.update(agents)


@pytest.fixture
def processes(tmp_path):
    procs = Processes(str(tmp_path))
    yield procs
    procs.stop_all()


def read_metrics(logdir: str) -> list[dict]:
    path = os.path.join(logdir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


RESUMED = re.compile(r"resumed from (\S+): env_frames=([\d,]+) train_steps=([\d,]+)")


def assert_resumed(output: str, logdir: str, saved: tuple[str, dict], rows_before: int) -> None:
    """The learner whose `output` this is resumed from `saved` (checkpoint.latest before it started): its resume
    line names that file and its counters, and its first metrics row (row `rows_before` of metrics.jsonl)
    continues from them instead of from zero."""
    path, state = saved
    counters = state["counters"]
    assert counters["train_steps"] > 0 and counters["env_frames"] > 0, counters
    match = RESUMED.search(output)
    assert match, output
    assert match.group(1) == path, (match.group(0), path)
    assert [int(match.group(i).replace(",", "")) for i in (2, 3)] == [counters["env_frames"], counters["train_steps"]]
    first_row = read_metrics(logdir)[rows_before]
    assert first_row["train_steps"] >= counters["train_steps"], (first_row, counters)
    assert first_row["env_frames"] >= counters["env_frames"], (first_row, counters)


def assert_optimizer_continued(logdir: str) -> None:
    """In the newest checkpoint, Adam's step count equals the learner's train steps: true across a resume only
    if the optimizer's state (step count and moments) was restored rather than started afresh."""
    from seed.runtime import checkpoint

    path, state = checkpoint.latest(logdir)
    steps = {int(moments["step"]) for moments in state["optimizer"]["state"].values()}
    assert steps == {state["counters"]["train_steps"]}, (path, steps, state["counters"])


def wait_for(predicate, timeout_s: float, what: str, interval_s: float = 0.25, on_timeout=None):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    details = on_timeout() if on_timeout else ""
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}\n{details}")


def serve_steps(inference, steps):
    """Runs `steps` through `inference` as one batch, writing each into the step slab the way the serving
    process does. steps: (actor, run_id, observation [K, ...], reward [K], done [K], truncated [K]) tuples.
    Returns {actor: (reply status, actions int32 [K])}."""
    import numpy as np

    slab = inference.slab
    actors, seqs = [], []
    for actor, run_id, observation, reward, done, truncated in steps:
        actors.append(actor)
        seqs.append(slab.write_request(actor, run_id, observation, reward, done, truncated))
    inference.run_batch(np.array(actors, np.int64), np.array(seqs, np.int64))
    return {a: (int(slab.reply_status[a]), slab.action[slab.rows(a)].copy()) for a in actors}


def serving_pid(learner_pid: int) -> int | None:
    """The learner's serving process (its child running seed.serving.process), or None."""
    for task in os.listdir(f"/proc/{learner_pid}/task"):
        with open(f"/proc/{learner_pid}/task/{task}/children") as f:
            for child in f.read().split():
                try:
                    with open(f"/proc/{child}/cmdline", "rb") as cmd:
                        if b"seed.serving.process" in cmd.read():
                            return int(child)
                except OSError:  # it just exited
                    pass
    return None


def pytest_unconfigure(config):
    """No hang at exit. A test that failed may leave a spawned child (a training process, a batch worker) that
    multiprocessing would join at interpreter exit, or a thread running a learner that never stops: pytest would
    print its summary and then wait forever (a CI run was cut at its time limit that way). The children are
    killed; a non-daemon thread still alive 60 s later is named and the process exits non-zero."""
    import multiprocessing
    import threading

    for child in multiprocessing.active_children():
        print(f"[conftest] killing {child.name} (pid {child.pid}), left running by a test", file=sys.stderr)
        child.kill()
        child.join(5)
    stuck = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon and t.is_alive()]
    if not stuck:
        return

    def watchdog():
        time.sleep(60)
        alive = [t.name for t in stuck if t.is_alive()]
        if alive:
            print(f"[conftest] threads left running by the tests kept the process from exiting for 60 s: {alive}",
                  file=sys.stderr, flush=True)
            os._exit(3)

    threading.Thread(target=watchdog, name="exit-watchdog", daemon=True).start()


def pytest_collection_modifyitems(session, config, items):
    """The test files in the order of their measured durations, longest first (tests/data/file_durations.json,
    written by launch/test_durations.py; a file not in it counts as 30 s): pytest-xdist's workers take whole files
    in this order (`--dist loadfile --no-loadscope-reorder`; xdist's own order is by the number of tests, which
    left the 85-s fuzzer and the netns soak, one test each, for last), so the suite does not end with one worker
    running a long file while the other waits."""
    path = os.path.join(REPO, "tests", "data", "file_durations.json")
    try:
        with open(path) as f:
            durations = json.load(f)
    except (OSError, ValueError):
        return
    def key(item):  # the sort is stable: a file's tests keep their order
        relative = os.path.relpath(str(item.path), REPO)
        return -durations.get(relative, 30.0), relative

    items.sort(key=key)
