"""Supervision of the learner's helper threads: a dead thread ends the learner instead of freezing it.

Before this, a helper thread that raised (the experience sink, the prefetcher) just ended: inference then
blocked forever handing it unrolls, no actor got an answer, and the metrics said 0 FPS until someone killed
the run. Now:

- `SupervisedThread` runs its target like `threading.Thread` and records the exception that ended it
  (`failure`: the thread's name and formatted traceback) instead of only printing it.
- `Watchdog` holds the threads the learner started; the training loop polls `check()` between steps and gets
  the first failure: a thread that raised, or one that returned while the learner was not stopping. A thread
  that a part starts anew with each process it serves (the serving process's event reader, `watch_latest`) may
  end with that process; only its exception is a failure.

What the learner does with a failure (log it, stop, checkpoint where that is safe, exit non-zero) stays in the
learner's run loop; this module only builds and watches threads.

Fault injection for tests: `sink_fault_from_environment` reads SEED_FAULT_SINK_RAISE_AFTER_S once when the
learner starts; when it is set, the experience sink raises `InjectedFault` on its first call at least that many
seconds after the learner process started (counted from the process start, so a slow start on a loaded machine
does not move the fault). It exists for the soak test (seed/bench/soak.py) and tests/; never set it in a real
run. Likewise SEED_FAULT_SERVING_EVENTS_RAISE=1 makes the learner's serving-events thread raise `InjectedFault`
when the first finished episodes reach it (`episodes_fault_from_environment`; tests only).
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
import traceback
from collections.abc import Callable
from typing import TypeVar

SINK_FAULT_ENV = "SEED_FAULT_SINK_RAISE_AFTER_S"
EVENTS_FAULT_ENV = "SEED_FAULT_SERVING_EVENTS_RAISE"


@dataclasses.dataclass(frozen=True)
class ThreadFailure:
    """Why a supervised thread is gone: its name and the formatted traceback ('' if it returned)."""

    thread: str
    traceback: str

    def describe(self) -> str:
        if self.traceback:
            return f"thread {self.thread!r} died:\n{self.traceback.rstrip()}"
        return f"thread {self.thread!r} returned while the learner was running (expected it to run until stop)"


class ThreadDied(RuntimeError):
    """Raised by the learner's run loop after shutting down because a supervised thread died."""

    def __init__(self, failure: ThreadFailure):
        last_line = failure.traceback.strip().rsplit("\n", 1)[-1] if failure.traceback else "returned"
        super().__init__(f"thread {failure.thread!r} died ({last_line}); its traceback was logged when it died")
        self.failure = failure


class SupervisedThread(threading.Thread):
    """A daemon thread that keeps the exception that ended it in `failure` (None while fine or after a return)."""

    def __init__(self, target: Callable[[], object], name: str):
        super().__init__(target=target, name=name, daemon=True)
        self.failure: ThreadFailure | None = None

    def run(self) -> None:
        try:
            super().run()
        except BaseException:  # noqa: BLE001 - recorded for the watchdog, which ends the learner
            self.failure = ThreadFailure(self.name, traceback.format_exc())


class Watchdog:
    """The learner's helper threads, checked from the training loop.

    Args:
      stop: the learner's stop event; a thread that returns after it is set ended normally.
    """

    def __init__(self, stop: threading.Event):
        self._stop = stop
        self._threads: list[threading.Thread] = []
        self._latest: list[Callable[[], SupervisedThread | None]] = []

    def watch(self, *threads: threading.Thread) -> None:
        self._threads.extend(threads)

    def watch_latest(self, latest: Callable[[], SupervisedThread | None]) -> None:
        """A thread its owner replaces with each process it serves (`latest()`: the current one, None before
        the first): it ends with that process, so only its exception is a failure. Its owner replaces it only
        after a `check` (the learner restarts the serving process after polling), so no failure goes unseen."""
        self._latest.append(latest)

    @property
    def threads(self) -> list[threading.Thread]:
        return list(self._threads)

    def check(self) -> ThreadFailure | None:
        """The first watched thread that raised, or that ended (after starting) while `stop` is not set."""
        for thread in self._threads:
            failure = getattr(thread, "failure", None)
            if failure is not None:
                return failure
            if thread.ident is not None and not thread.is_alive() and not self._stop.is_set():
                return ThreadFailure(thread.name, "")
        for latest in self._latest:
            thread = latest()
            if thread is not None and thread.failure is not None:
                return thread.failure
        return None


class InjectedFault(RuntimeError):
    """The test-only fault of SEED_FAULT_SINK_RAISE_AFTER_S."""


T = TypeVar("T")
R = TypeVar("R")


def sink_fault_from_environment(sink: Callable[[T], R], environ: dict[str, str] | None = None
                                ) -> Callable[[T], R]:
    """`sink`, or, when SEED_FAULT_SINK_RAISE_AFTER_S=<seconds> is set, `sink` wrapped to raise `InjectedFault`
    on its first call at least that many seconds after this process started (test-only; see the module
    docstring)."""
    raw = (os.environ if environ is None else environ).get(SINK_FAULT_ENV, "")
    if not raw:
        return sink
    try:
        after_s = float(raw)
    except ValueError:
        raise ValueError(f"{SINK_FAULT_ENV}: got {raw!r}, expected seconds (a number)") from None
    import psutil

    due = psutil.Process().create_time() + after_s  # wall clock: what create_time is measured in
    print(f"[learner] test fault: the experience sink raises {after_s:g}s after the process started "
          f"({SINK_FAULT_ENV})", flush=True)

    def faulty_sink(item: T) -> R:
        if time.time() >= due:
            raise InjectedFault(f"{SINK_FAULT_ENV}={raw}: injected experience-sink failure")
        return sink(item)

    return faulty_sink


def episodes_fault_from_environment(on_episodes: Callable[[T], None], environ: dict[str, str] | None = None
                                    ) -> Callable[[T], None]:
    """`on_episodes`, or, when SEED_FAULT_SERVING_EVENTS_RAISE=1 is set, a function that raises `InjectedFault`
    instead (test-only: the serving-events thread that calls it dies; see the module docstring)."""
    raw = (os.environ if environ is None else environ).get(EVENTS_FAULT_ENV, "")
    if not raw:
        return on_episodes
    if raw != "1":
        raise ValueError(f"{EVENTS_FAULT_ENV}: got {raw!r}, expected 1 or unset")
    print(f"[learner] test fault: the serving-events thread raises at the first finished episodes "
          f"({EVENTS_FAULT_ENV})", flush=True)

    def faulty_on_episodes(episodes: T) -> None:
        raise InjectedFault(f"{EVENTS_FAULT_ENV}={raw}: injected serving-events failure")

    return faulty_on_episodes
