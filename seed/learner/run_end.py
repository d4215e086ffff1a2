"""The end of a run, told to the actors: so they exit 0 instead of waiting for a learner that will not come back.

A run is over when the learner reaches --total_environment_frames or --max_train_steps, and also when a learner
starts on a logdir whose newest checkpoint is already there. Only then does the learner say so: it writes the
end into the step slab (`StepSlab.mark_finished`, seed/transport/slab.py), and every writer of the slab tells its
actor at its next handshake or step (gRPC: OUT_OF_RANGE, `wire.RUN_FINISHED`; shm: the actor reads the slab
itself). A learner that stops for any other reason (SIGTERM, a crash, a lost host) says nothing, and its actors
reconnect and wait for the next one: that is how an actor tells a finished run from a restarting learner.

The learner then lingers, still serving, until every actor slot that was in use heard it (`told_finished`), at
most --finished_linger_s. An actor that was reconnecting when the run ended (in its backoff, at most the actors'
--reconnect_max_backoff_s) dials again within the linger and hears it at its handshake; one that misses it (the
learner killed first) hears it from the next learner started on the logdir, which finds the run over, tells
every actor that dials in for the same linger, and exits.
"""

from __future__ import annotations

import threading
import time

from seed.transport.slab import StepSlab

POLL_S = 0.1


class RunEnd:
    """Tells the actors of `slab` that the run is over. `stop`: a stop request (SIGTERM) cuts the linger short."""

    def __init__(self, slab: StepSlab, linger_s: float, stop: threading.Event):
        if linger_s < 0:
            raise ValueError(f"--finished_linger_s: got {linger_s}, expected >= 0")
        self.slab, self.linger_s, self.stop = slab, linger_s, stop
        self._listeners: list[int] | None = None  # the slots waited for, fixed when the end is marked

    def mark(self, env_frames: int) -> None:
        """Writes the end into the slab: from now on no actor's step is served. Waits, in `linger`, for the slots
        that had an actor run (all of them if none had: a learner restarted on a finished logdir)."""
        if self._listeners is not None:
            return
        used = [slot for slot in range(len(self.slab.live_run)) if int(self.slab.live_run[slot]) != 0]
        self._listeners = used or list(range(len(self.slab.live_run)))
        self.slab.mark_finished(env_frames)

    def linger(self, env_frames: int) -> int:
        """Marks the end (if not yet) and waits until every listening slot was told, at most `linger_s` or until a
        stop request; returns how many of them were told."""
        self.mark(env_frames)
        listeners = self._listeners
        print(f"[learner] run finished at env_frames={env_frames:,}: telling the actors (up to "
              f"{self.linger_s:g}s, {len(listeners)} actor slots)", flush=True)
        deadline = time.monotonic() + self.linger_s
        told = self.told(listeners)
        while told < len(listeners) and time.monotonic() < deadline and not self.stop.wait(POLL_S):
            told = self.told(listeners)
        left = "" if told == len(listeners) else (
            "; the others hear it from a learner restarted on this logdir" if not self.stop.is_set() else
            "; stopped early")
        print(f"[learner] {told}/{len(listeners)} actor slots told the run is finished{left}", flush=True)
        return told

    def told(self, slots: list[int]) -> int:
        return int(sum(int(self.slab.told_finished[slot]) for slot in slots))
