"""Is the training process alive and getting on, and does it end with the learner.

A hung training process (an optimizer step that never returns, a lock never let go) stalls every actor: the
learner publishes nothing new, the HTS gate never opens, the replay ratio blocks the sink. Its main thread, the
one that would be stuck, declares in shared memory what it is doing and by when it will report again
(`TrainingProgress`):

  waiting for a command   it polls its command pipe and reports every second; it must within `timeout_s`;
  training update n       one deadline when the update starts: `step_allowance_s` (the update is not
                          interrupted to report, so a stuck step is seen as one);
  copying the parameters  once it holds the parameter lock: `timeout_s` (a copy takes milliseconds);
  writing its state       serialising the state dicts for a checkpoint: `timeout_s`;
  waiting for the learner taking the parameter lock or sending on the result pipe: no deadline (the learner is
                          the slow side then, and it judges its own waits).

The learner's main thread reads the deadline whenever it polls for updates; past it, the training process is hung.
A heartbeat thread would keep beating while the main thread is stuck, so there is none: the reports come from
the main thread between its steps.

`die_with_parent` makes the kernel kill the training process when the learner dies, however it dies.

Test-only faults: SEED_FAULT_TRAINING_PROCESS=<fault>@<update> (`TrainingFault`), read once by the learner and
by the training process; never set it in a real run.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import signal
import sys
import time

import torch

FIRST_UPDATE_FACTOR = 5.0  # the first update (and the start) may take this many times timeout_s
SLOWEST_UPDATE_FACTOR = 10.0  # a later update may take this many times the slowest one so far
REPORT_INTERVAL_S = 1.0  # the idle training process reports at least this often

_ACTIVITIES = ("starting", "waiting for a command", "training update", "copying the parameters of update",
               "waiting for the learner", "writing its state for a checkpoint")
STARTING, IDLE, TRAINING, COPYING, WAITING_FOR_LEARNER, WRITING_STATE = range(len(_ACTIVITIES))


def step_allowance_s(timeout_s: float, slowest_update_s: float) -> float:
    """Seconds one update may take before the training process counts as hung: `timeout_s`, or 10x the slowest
    update so far if that is longer; before any update finished, FIRST_UPDATE_FACTOR x `timeout_s` (CUDA and
    cuDNN initialise lazily on the first step, and nothing is measured yet)."""
    if slowest_update_s <= 0:
        return FIRST_UPDATE_FACTOR * timeout_s
    return max(timeout_s, SLOWEST_UPDATE_FACTOR * slowest_update_s)


class TrainingProgress:
    """What the training process's main thread does, since when, and by when it reports again.

    float64 [4] in shared memory: (deadline_s, since_s, activity, update); times are time.monotonic() seconds
    (CLOCK_MONOTONIC, one clock for every process of the host). The child writes the deadline last and the
    learner decides on the deadline alone (one aligned 8-byte value); the other fields only word the message.
    """

    def __init__(self, timeout_s: float):
        self.values = torch.zeros(4, dtype=torch.float64).share_memory_()
        self.report(STARTING, 0, FIRST_UPDATE_FACTOR * timeout_s)

    def report(self, activity: int, update: int, allowed_s: float) -> None:
        """Child (and the learner before the start): doing `activity` from now on, next report within
        `allowed_s` seconds (math.inf: no deadline)."""
        now = time.monotonic()
        values = self.values.numpy()
        values[1:] = (now, activity, update)
        values[0] = now + allowed_s

    def overdue(self, now: float | None = None) -> str | None:
        """Learner: None while the deadline holds, else what the training process has been doing too long."""
        now = time.monotonic() if now is None else now
        deadline, since, activity, update = self.values.tolist()
        if now <= deadline:
            return None
        what = _ACTIVITIES[int(activity)] + (f" {int(update)}" if int(activity) in (TRAINING, COPYING) else "")
        return (f"{what} for {now - since:.1f} s (allowed {deadline - since:.1f} s; "
                f"{'no report since' if int(activity) == IDLE else 'no progress'})")


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent_pid: int) -> None:
    """Training process, first thing: on Linux the kernel SIGKILLs this process when the thread that started it
    exits (the learner's run, however the learner ends: a SIGKILLed learner cannot stop it, and a stuck child
    could not act on a message). Then checks that the parent is still `parent_pid`: had it died before the
    prctl, the signal would never come."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"prctl(PR_SET_PDEATHSIG): {os.strerror(error)}")
    if os.getppid() != parent_pid:
        print(f"[training process] the learner (pid {parent_pid}) exited before the training process started: "
              "exiting", file=sys.stderr, flush=True)
        os._exit(1)


def exit_without_teardown() -> None:
    """A learner's child process (training process, batch worker) that has finished its work: flushes its output
    and exits with status 0 at once. Its state already went back to the learner and the learner owns every
    shared resource, so the interpreter's teardown (0.8 s of CPU with torch loaded, 1.4 s once an optimizer has
    imported torch._dynamo; measured on 2 cores) would only delay the learner's exit."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


FAULT_ENV = "SEED_FAULT_TRAINING_PROCESS"
_FAULTS = {
    "step_hangs": "the training process's update N sleeps forever in its main thread (a stuck optimizer step)",
    "child_dies_writing": "the training process's update N takes the parameter lock, marks the copy half-written, "
                          "reports the update and sleeps holding the lock (for a test to kill it there)",
    "learner_holds_lock": "the learner sleeps forever holding the parameter lock when it reads version N or "
                          "later (for a test to kill it there)",
}


@dataclasses.dataclass(frozen=True)
class TrainingFault:
    """The test-only fault of SEED_FAULT_TRAINING_PROCESS=<fault>@<update> (`_FAULTS` lists them)."""

    name: str = ""
    update: int = 0

    @classmethod
    def from_environment(cls, environ: dict[str, str] | None = None) -> TrainingFault:
        raw = (os.environ if environ is None else environ).get(FAULT_ENV, "")
        if not raw:
            return cls()
        name, _, update = raw.partition("@")
        if name not in _FAULTS or not update.isdigit() or int(update) < 1:
            raise ValueError(f"{FAULT_ENV}: got {raw!r}, expected <fault>@<update> with fault one of "
                             f"{sorted(_FAULTS)} and update >= 1")
        return cls(name, int(update))

    def due(self, name: str, update: int) -> bool:
        """Whether fault `name` is armed and update (or version) `update` reached it."""
        return self.name == name and update >= self.update

    def sleep_forever(self, where: str) -> None:
        print(f"[{where}] test fault {FAULT_ENV}={self.name}@{self.update}: {_FAULTS[self.name]}; sleeping now",
              file=sys.stderr, flush=True)
        while True:
            time.sleep(3600)
