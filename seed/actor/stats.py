"""Throughput and latency statistics written by an actor process, for benchmarks (`seed-bench`).

With `--stats_file=PATH` an actor appends one JSON object per line to PATH every `--stats_interval_s`
seconds and once more when it stops (`"final": true`). Counters are cumulative since the actor started, so
a reader takes the rate over any interval from two rows:

  time           float   wall clock (unix seconds) when the row was written
  elapsed_s      float   seconds since the actor started
  actor_index    int
  pid            int
  agent_steps    int     env steps summed over the actor's K envs
  env_frames     int     agent_steps x action repeat
  round_trips    int     step messages answered (one per K agent steps); for actor-side inference: forward passes
  cpu_s          float   CPU seconds (user + system, all threads) of this process (time.process_time)
  latency_ms     list    round-trip latency samples of this row's window (ms), at most `max_samples` of them
                         drawn uniformly when the window had more (see `latency_count`)
  latency_count  int     round trips in this row's window
  waited_s       float   seconds the actor sat blocked waiting for actions (cumulative); with one env group
                         every round trip is waited out whole, with --env_groups only what the other groups'
                         stepping did not hide (seed/actor/env_groups.py); env_only baseline: 0
  final          bool
"""

from __future__ import annotations

import json
import os
import random
import time


class ActorStats:
    """Accumulates an actor's counters and latency samples; appends a row to `path` every `interval_s`.

    Args:
      path: the JSON Lines file (its directory is created); "" disables everything (every call is cheap).
      interval_s: seconds between rows.
      action_repeat: env frames per agent step.
      max_samples: latency samples kept per row (reservoir sampling beyond that).
    """

    def __init__(self, path: str, interval_s: float, action_repeat: int, actor_index: int, max_samples: int = 5000):
        self.path = path
        self.interval_s = interval_s
        self.action_repeat = action_repeat
        self.actor_index = actor_index
        self.max_samples = max_samples
        self.start_time = time.time()
        self.agent_steps = 0
        self.round_trips = 0
        self.waited_s = 0.0
        self._window: list[float] = []
        self._window_count = 0
        self._next_write = time.monotonic() + interval_s
        self._random = random.Random(actor_index)
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)

    def record(self, agent_steps: int, latency_s: float, waited_s: float | None = None) -> None:
        """One round trip that moved `agent_steps` env steps and took `latency_s` seconds, of which the actor
        waited `waited_s` seconds with nothing to do (default: all of it)."""
        self.agent_steps += agent_steps
        self.round_trips += 1
        self.waited_s += latency_s if waited_s is None else waited_s
        self._window_count += 1
        if len(self._window) < self.max_samples:
            self._window.append(latency_s)
        else:  # reservoir sampling keeps a uniform sample of the window
            slot = self._random.randrange(self._window_count)
            if slot < self.max_samples:
                self._window[slot] = latency_s
        if self.path and time.monotonic() >= self._next_write:
            self.write()

    def write(self, final: bool = False) -> None:
        if not self.path:
            return
        now = time.time()
        row = {
            "time": now,
            "elapsed_s": round(now - self.start_time, 4),
            "actor_index": self.actor_index,
            "pid": os.getpid(),
            "agent_steps": self.agent_steps,
            "env_frames": self.agent_steps * self.action_repeat,
            "round_trips": self.round_trips,
            "cpu_s": round(time.process_time(), 4),
            "latency_ms": [round(s * 1e3, 4) for s in self._window],
            "latency_count": self._window_count,
            "waited_s": round(self.waited_s, 6),
            "final": final,
        }
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        self._window = []
        self._window_count = 0
        self._next_write = time.monotonic() + self.interval_s
