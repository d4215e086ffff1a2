"""The quick exit (seed/runtime/quick_exit.py) in real processes: `gc.freeze` runs at exit, after every other atexit
handler (they run with nothing frozen yet); the handlers' writes, buffered stdout and stderr and the exit status
come through as without it; and every entry point calls it before it registers anything else."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO

# Writes what it saw into the folder argv[1], then ends as argv[2] says. `last` is registered before the quick exit
# (so it runs after gc.freeze), `handler` after it (so it runs before); the metrics row and the buffered file are
# written and closed in `handler`, as a process's own exit handlers do.
FREEZING_PROCESS = """if True:
    import atexit, gc, json, os, sys, weakref

    out, ending = sys.argv[1], sys.argv[2]

    def note(name, value):
        with open(os.path.join(out, name), "w") as f:
            f.write(json.dumps(value))

    atexit.register(lambda: note("last.json", gc.get_freeze_count()))
    from seed.runtime.quick_exit import freeze_objects_at_exit
    freeze_objects_at_exit()
    from seed.metrics.recording import MetricsWriter
    from seed.metrics.sinks import JsonlSink

    metrics = MetricsWriter([JsonlSink(out)])
    log = open(os.path.join(out, "buffered.log"), "w")  # buffered: its text is in the file once it is closed
    log.write("a line the exit must not lose\\n")

    class Resource:
        pass

    resource = Resource()
    weakref.finalize(resource, note, "finalizer.json", "ran")  # an exit-time finalizer (atexit=True)

    def handler():
        note("handler.json", gc.get_freeze_count())
        metrics.write({"env_frames": 7, "train_steps": 1})
        metrics.close()
        log.close()

    atexit.register(handler)
    print("stdout, never flushed by the process")
    sys.stderr.write("stderr without a newline")
    if ending == "exit 3":
        sys.exit(3)
    if ending == "exception":
        raise RuntimeError("the process's own error")
"""


@pytest.mark.parametrize("ending, status", [("exit 3", 3), ("exception", 1), ("return", 0)])
def test_a_process_that_freezes_at_exit_runs_its_handlers_and_flushes_first(tmp_path, ending, status):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # stdout to a pipe: block-buffered
    done = subprocess.run([sys.executable, "-c", FREEZING_PROCESS, str(tmp_path), ending], capture_output=True,
                          text=True, cwd=REPO, env=dict(env, PYTHONPATH=REPO), timeout=120)
    assert done.returncode == status, done.stderr[-3000:]
    assert done.stdout == "stdout, never flushed by the process\n"
    assert done.stderr.startswith("stderr without a newline"), done.stderr[-3000:]
    if ending == "exception":
        assert "RuntimeError: the process's own error" in done.stderr, done.stderr[-3000:]
    read = lambda name: (tmp_path / name).read_text()  # noqa: E731
    assert read("handler.json") == "0"  # the handlers registered after the quick exit run before the freeze
    assert int(read("last.json")) > 1000  # the freeze ran at exit: the handler after it saw the objects frozen
    assert read("finalizer.json") == '"ran"'
    assert read("buffered.log") == "a line the exit must not lose\n"
    assert read("metrics.jsonl") == '{"env_frames": 7, "train_steps": 1}\n'


def _entry_points() -> list[tuple[str, str]]:
    """(command, "module:function") of every console script setup.py installs."""
    with open(os.path.join(REPO, "setup.py")) as f:
        return re.findall(r'"(seed-[\w-]+)=([\w.]+:\w+)"', f.read())


def test_every_entry_point_is_listed():
    assert {name for name, _ in _entry_points()} == {"seed-learner", "seed-actor", "seed-bench", "seed-report",
                                                      "seed-eval"}


# Runs an entry point's function with --help, a handler registered before it: that handler runs after the freeze
# only if the entry point registered the quick exit (as its first handler: before its own, e.g. absl's).
ENTRY_POINT = """if True:
    import atexit, gc, importlib, os, sys
    atexit.register(lambda: os.write(2, f"\\nfrozen at exit: {gc.get_freeze_count()}\\n".encode()))
    module, function = sys.argv[1].split(":")
    sys.argv = [sys.argv[2], "--help"]
    getattr(importlib.import_module(module), function)()
"""


@pytest.mark.parametrize("command, target", _entry_points())
def test_every_entry_point_freezes_at_exit(command, target):
    done = subprocess.run([sys.executable, "-c", ENTRY_POINT, target, command], capture_output=True, text=True,
                          cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO), timeout=120)
    assert f"USAGE: {command}" in done.stdout, (done.stdout[-2000:], done.stderr[-3000:])  # it ran, as the command
    assert done.returncode == 1, done.stderr[-3000:]  # absl's status after --help, through the quick exit
    frozen = re.findall(r"frozen at exit: (\d+)", done.stderr)
    assert frozen and int(frozen[-1]) > 1000, done.stderr[-3000:]
