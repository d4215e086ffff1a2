"""Batch workers: processes that prepare each training batch beside the trainer (`Agent.batch_workers`).

An agent may ask for a pass over every batch before its update that reads a network other than the one being
trained (MuZero's reanalysis: a search of every position with the target network). Inline, that pass is on the
critical path of every update; here N worker processes run it while the training process trains the batch before,
as SpeedyZero does:

    learner: feeder thread                 batch workers (spawned, N)            training process
      batch -> free slot (shared memory)
      ("prepare", slot, train_steps) -->   agent.prepare_batch(slot's batch) ->
                                           the changed tensors into the slot
      collector thread  <-- ("prepared", slot, version, values)
      ("batch", slot, weights, values) ------------------------------------->   train_on_batch(slot)

The workers read the agent's preparation network (`Agent.preparation_network`: MuZero's target network) from one
shared copy (seed/training/shared_parameters.py, under its record lock): the training process writes it whenever
its version changes (MuZero: at every target update), and a worker loads it before a batch when the version it
holds is older. A batch is prepared with the newest parameters written when it starts; the update it trains reports
how many updates older they are (`batch_workers/staleness_updates`).

A slot is the batch's own until the update on it is reported, so the worker writes the prepared tensors into it in
place (only those the preparation replaced). Batches reach the trainer in the order they finish (the replay samples
them independently).

A worker that dies or takes longer than its allowance over one batch ends the learner naming it: the learner's
main thread raises `BatchWorkerDied` (a TrainingProcessDied) from its next poll of the training process. Workers die
with the learner (a parent-death signal) and ignore SIGINT / SIGTERM (the learner stops them).
"""

from __future__ import annotations

import dataclasses
import os
import queue
import signal
import sys
import threading
import time
from multiprocessing.connection import wait
from typing import Any

import torch

from seed.config import LearnerConfig
from seed.contracts.training import TrainingBatch, Unroll
from seed.envs.base import EnvSpec
from seed.training.liveness import FIRST_UPDATE_FACTOR, die_with_parent, exit_without_teardown
from seed.training.shared_parameters import SharedParameters


class BatchWorkerDied(RuntimeError):
    """A batch worker exited, or hung over one batch and was killed, while the learner ran."""


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
    """What one batch worker starts from: plain values, pickled into the spawned child.

    Attributes:
      config, spec: the learner's.
      index: the worker's number (0 .. N-1), in its process name `seed-prep-w<index>`.
      learner_pid: the learner's pid (the worker dies with it).
    """

    config: LearnerConfig
    spec: EnvSpec
    index: int
    learner_pid: int


def _worker_main(spec: WorkerSpec, commands: Any, results: Any, parameters: SharedParameters) -> None:
    """A batch worker: prepares each slot it is told of with the newest preparation parameters, until told to stop
    or the learner's end of the pipe closes."""
    _serve_preparations(spec, commands, results, parameters)
    exit_without_teardown()


def _serve_preparations(spec: WorkerSpec, commands: Any, results: Any, parameters: SharedParameters) -> None:
    """`_worker_main`'s work, returning when the worker should exit."""
    die_with_parent(spec.learner_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the learner stops us
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None).prctl(15, f"seed-prep-w{spec.index}".encode()[:15], 0, 0, 0)  # PR_SET_NAME
    torch.set_num_threads(1)
    torch.manual_seed(spec.config.seed + 1000 + spec.index)
    agent = type(spec.config).agent_class(spec.spec, spec.config)
    network = agent.preparation_network()[0]
    loaded = -1  # the version of the parameters in `network`
    slots: list[Unroll] = []
    while True:
        try:
            command = commands.recv()
        except EOFError:  # the learner is gone
            return
        kind = command[0]
        if kind == "slots":
            slots = command[1]
        elif kind == "prepare":
            _, slot, train_steps = command
            start = time.perf_counter()
            if parameters.version != loaded:
                with parameters.reading(lambda waited_s: None) as (tensors, version):
                    network.load_state_dict(tensors)
                    loaded = version
            prepared, values = agent.prepare_batch(TrainingBatch(slots[slot]), train_steps, loaded)
            write_prepared(slots[slot], prepared.unrolls)
            values["batch_workers/prepare_ms"] = (time.perf_counter() - start) * 1e3
            results.send(("prepared", slot, loaded, values))
        elif kind == "stop":
            return
        else:
            raise ValueError(f"batch worker command: got {kind!r}, expected slots, prepare or stop")


def write_prepared(slot: Unroll, prepared: Unroll) -> None:
    """Copies the tensors of `prepared` that are not the slot's own (those the preparation replaced) into the slot;
    a field or shape the slot lacks is refused, naming it."""
    for name, into, values in (("steps", slot.steps, prepared.steps),
                               ("initial_state", slot.initial_state, prepared.initial_state)):
        if set(into) != set(values):
            raise ValueError(f"prepared batch {name}: got fields {sorted(values)}, expected {sorted(into)} (the "
                             "slot's)")
        for key, value in values.items():
            if value is into[key]:
                continue
            if value.shape != into[key].shape:
                raise ValueError(f"prepared batch {name}.{key}: got shape {tuple(value.shape)}, expected "
                                 f"{tuple(into[key].shape)} (the slot's)")
            into[key].copy_(value)


class BatchWorkers:
    """The learner's side of the N batch workers.

    Args:
      config, spec: the learner's.
      count: N, the worker processes.
      parameters: the shared copy of the agent's preparation network, written by the training process.
      context: the multiprocessing context the workers are spawned in.
      timeout_s: a worker may take this long over one batch (FIRST_UPDATE_FACTOR x this over its first, which
        compiles and warms up), or it counts as hung.
    """

    def __init__(self, config: LearnerConfig, spec: EnvSpec, count: int, parameters: SharedParameters, context: Any,
                 timeout_s: float):
        self.parameters = parameters
        self.timeout_s = timeout_s
        self.processes, self._commands, self._results, self._child_ends = [], [], [], []
        for index in range(count):
            child_commands, commands = context.Pipe(duplex=False)
            results, child_results = context.Pipe(duplex=False)
            self.processes.append(context.Process(
                target=_worker_main, name=f"seed-batch-worker-{index}",
                args=(WorkerSpec(config, spec, index, os.getpid()), child_commands, child_results, parameters),
                daemon=True))
            self._commands.append(commands)
            self._results.append(results)
            self._child_ends += [child_commands, child_results]
        self._idle: queue.Queue[int] = queue.Queue()
        self._busy: dict[int, tuple[int, float]] = {}  # worker -> (its slot, when it was handed over)
        self._prepared_by: list[int] = [0] * count  # batches each worker finished
        self._lock = threading.Lock()
        self._check_lock = threading.Lock()  # the collector thread and the learner's main thread both check
        self._failure: str | None = None  # the first verdict, given again to every later check

    def start(self) -> None:
        """Starts the workers; they die with the thread that calls this (their parent-death signal)."""
        for index, process in enumerate(self.processes):
            process.start()
            self._idle.put(index)
        for end in self._child_ends:  # a worker's exit reads as EOF here, the learner's there
            end.close()

    def send_slots(self, slots: list[Unroll]) -> None:
        for commands in self._commands:
            commands.send(("slots", slots))

    def submit(self, slot: int, train_steps: int, stop: threading.Event) -> bool:
        """Hands `slot` to the next idle worker (waiting for one until `stop`); `train_steps`: the trainer's
        updates made so far (the agent's metrics compare against it). False if stopped first."""
        while not stop.is_set():
            try:
                index = self._idle.get(timeout=0.1)
            except queue.Empty:
                continue
            with self._lock:
                self._busy[index] = (slot, time.monotonic())
            self._commands[index].send(("prepare", slot, train_steps))
            return True
        return False

    def next_prepared(self, timeout_s: float) -> tuple[int, int, dict[str, float]] | None:
        """(slot, the preparation parameters' version, the worker's metrics) of a batch a worker finished, waiting
        up to `timeout_s`; None if none did. Raises BatchWorkerDied (see `check`)."""
        ready = wait(self._results, timeout_s)
        for results in ready:
            index = self._results.index(results)
            try:
                _, slot, version, values = results.recv()
            except (EOFError, OSError):
                break  # its exit: `check` names it
            with self._lock:
                self._busy.pop(index)
            self._prepared_by[index] += 1
            self._idle.put(index)
            return slot, version, values
        self.check()
        return None

    def check(self) -> None:
        """Raises BatchWorkerDied naming the first worker that exited, or that has spent longer than its allowance
        on one batch (it is killed first); once raised, every later call raises the same."""
        with self._check_lock:
            if self._failure is None:
                self._failure = self._find_failure()
            if self._failure is not None:
                raise BatchWorkerDied(self._failure)

    def _find_failure(self) -> str | None:
        """The message naming the first worker that exited or hung (killing a hung one), None while all are well."""
        for index, process in enumerate(self.processes):
            if process.pid is not None and not process.is_alive():
                process.join(timeout=5)
                with self._lock:
                    slot = self._busy.get(index, (None,))[0]
                doing = "idle" if slot is None else f"preparing the batch in slot {slot}"
                return (f"batch worker {index} of {len(self.processes)} (pid {process.pid}) exited with code "
                        f"{process.exitcode} while {doing} (its traceback, if any, is above): the learner cannot get "
                        "prepared batches without it")
        now = time.monotonic()
        with self._lock:
            busy = dict(self._busy)
        for index, (slot, since) in busy.items():
            allowed = self.timeout_s * (FIRST_UPDATE_FACTOR if self._prepared_by[index] == 0 else 1.0)
            if now - since > allowed:
                process = self.processes[index]
                process.kill()
                process.join(timeout=5)
                return (f"batch worker {index} of {len(self.processes)} (pid {process.pid}) hung: {now - since:.1f} s "
                        f"on the batch in slot {slot}, allowed {allowed:g} s (from --training_process_timeout_s); "
                        "killed it")
        return None

    def stop(self) -> None:
        """Tells every worker to stop (each finishes the batch it is on), then kills any left after 10 s."""
        for process, commands in zip(self.processes, self._commands, strict=True):
            if process.is_alive():
                try:
                    commands.send(("stop",))
                except (BrokenPipeError, OSError):
                    pass
        for process in self.processes:
            if process.pid is None:
                continue
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
                process.join(timeout=5)
        for end in (*self._commands, *self._results):
            end.close()
