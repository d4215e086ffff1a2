"""The learner's supervision: starting its threads and processes, checking from the main thread that they live,
stopping them in order, and SIGTERM / SIGINT as a clean stop.

A helper thread that dies (seed/runtime/supervised_thread.py records its exception) ends the learner loudly instead of
freezing
it (the serving process's event reader too: it may end with its process, but not raise); a dead serving process is
restarted (again every 5 s while a restart fails); the training process's death surfaces from its own calls
(seed/training/process.py).
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from seed.experience.priority_refresh import PriorityRefresher
from seed.experience.training_batches import FifoExperience, ReplayExperience, SinkThread
from seed.runtime.supervised_thread import ThreadFailure, Watchdog
from seed.serving.process import ServingProcess
from seed.training.process import TrainingProcess


class LearnerSupervision:
    """Starts, watches and stops the learner's helper threads, its serving process and its training process.

    `release` frees what the learner shares with the serving process (the slab, pipes and eventfds); it runs once
    the serving process has exited, or after a failed start.
    """

    def __init__(self, stop: threading.Event, serving: ServingProcess, inference_threads: Sequence[threading.Thread],
                 sink: SinkThread, experience: FifoExperience | ReplayExperience,
                 priority_refresher: PriorityRefresher | None, training_process: TrainingProcess | None,
                 release: Callable[[], None]):
        self.stop_event = stop
        self.serving = serving
        self.inference_threads = list(inference_threads)
        self.sink = sink
        self.experience = experience
        self.priority_refresher = priority_refresher
        self.training_process = training_process
        self.release = release
        # A helper thread that dies ends the learner (the training loop polls this) instead of freezing it.
        self.watchdog = Watchdog(stop)
        self.watchdog.watch(*self.inference_threads, sink.thread, *experience.threads())
        if training_process is not None:
            self.watchdog.watch(*training_process.threads())
        if priority_refresher is not None:
            self.watchdog.watch(priority_refresher.thread)
        self.watchdog.watch_latest(lambda: serving.events_thread)
        self._retry_at = 0.0  # when a failed serving-process restart is tried again (time.monotonic())

    def start(self) -> list[str]:
        """Starts the threads, the training process and the serving process; the addresses it listens on. If the
        serving process fails to start, stops the rest, releases the shared resources and raises."""
        for thread in self.inference_threads:
            thread.start()
        self.sink.start()
        self.experience.start()
        if self.priority_refresher is not None:
            self.priority_refresher.start()
        if self.training_process is not None:
            self.training_process.start()
        try:
            return self.serving.start()
        except RuntimeError:
            self.stop_event.set()
            if self.training_process is not None:
                self.training_process.stop()
            self.release()
            raise

    def watch(self, thread: threading.Thread) -> None:
        """Adds a thread started later (the metrics logger) to those whose death ends the learner."""
        self.watchdog.watch(thread)

    def poll(self) -> ThreadFailure | None:
        """The main thread's check between training iterations: a helper thread that died (reported on stderr),
        else None after restarting the serving process if it is dead."""
        failure = self.watchdog.check()
        if failure is not None:
            print(f"[learner] {failure.describe()}\n[learner] stopping: a helper thread died", file=sys.stderr,
                  flush=True)
            return failure
        if not self.serving.alive() and not self.stop_event.is_set() and time.monotonic() > self._retry_at:
            self._retry_at = time.monotonic() + (0.0 if self.serving.restart() else 5.0)
        return None

    def stop(self, final_checkpoint: Callable[[bool], None] | None, failure: ThreadFailure | None,
             then: Sequence[Callable[[], None]] = ()) -> None:
        """Stops everything in order: the serving process, inference, the priority refresher; then
        `final_checkpoint(with_experience)` (None: the training loop raised, and a step that raised may have
        half-updated the network); then, even if that failed, the training process, the shared resources and
        `then` in turn. The experience is left out of the checkpoint if the sink thread died (`failure`): the
        replay may hold a half-written slot."""
        self.stop_event.set()  # also unblocks threads waiting on a dead one (inference in the sink's put)
        try:
            self.serving.stop()
            for thread in self.inference_threads:
                thread.join(timeout=10)
            if self.priority_refresher is not None:
                self.priority_refresher.stop()
            if final_checkpoint is not None:
                # The network and optimizer are whole (this thread's, or the training process's, which finishes
                # its update first).
                final_checkpoint(failure is None or failure.thread != self.sink.thread.name)
        finally:
            if self.training_process is not None:  # even if the checkpoint failed: it ignores SIGTERM
                self.training_process.stop()
            self.release()
            for step in then:
                step()


def install_signal_handlers(request_stop: Callable[..., Any]) -> None:
    """SIGTERM and SIGINT call `request_stop(signum, frame)`: the learner stops as at the end of its run (final
    checkpoint included) instead of dying mid-step. Call from the main thread."""
    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
