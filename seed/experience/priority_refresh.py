"""Priority Refresh (SpeedyZero, Mei et al. 2023, section 4.3): recompute the priority of *every* replay item with
the latest network, not only of the items just trained on, so that sampling follows the current TD errors.

A `PriorityRefresher` thread in the learner sweeps the whole replay in batches of `batch_size` slots:

    for slots [i, i + batch_size) of the filled replay:
        pull the newest published parameters (if newer) into its own copy of the network, on the training device
        read the slots' sequences and generations (a copy; not a sample: the replay ratio ignores it)
        priorities = agent.priorities(sequences, network, target_network, version)  # the agent's own function
        write them back; a slot rewritten since the read keeps its new sequence's priority (generation check)

A sweep starts at most every `interval_s` seconds (back to back if a sweep takes longer), and only once the
network has changed since the previous sweep began. Inference and training never wait for it: it reads the
parameters from the publisher that inference reads (under the publish lock, for the length of one copy), and the
replay's lock is held only to copy a batch of slots out and to write their priorities.

Its target network follows its online copy the way the agent's does: copied over whenever the pulled version
crosses a multiple of `target_update_interval` (so it can be up to the few updates between two pulls newer
than the trainer's target).

Metrics (through `on_values`, averaged over the learner's log window): replay/refresh_items_per_s (slots
refreshed per second of a batch's work: read, forward pass, write), replay/refresh_sweep_s (a whole sweep's
duration), replay/refresh_sweeps (sweeps finished) and replay/refresh_version_lag_updates (updates between
the network that refreshed and the newest published, at the end of a batch). The replay's own stats add
replay/oldest_priority_age_s and the counts of refreshed and skipped (stale) priorities.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from seed.config import LearnerConfig
from seed.contracts.training import PublishedParameters, Unroll
from seed.experience.replay import PrioritizedReplay
from seed.runtime.supervised_thread import SupervisedThread

# (sequences [L, B] on the device, online network, target network, the parameters' published version)
#   -> priorities float [B]
PriorityFunction = Callable[[Unroll, nn.Module, nn.Module], torch.Tensor]


class PriorityRefresher:
    """Args:
      replay: the prioritized replay to refresh.
      priorities: the agent's priority function (e.g. R2D2's `Agent.priorities`).
      network, target_network: the agent's networks as of `version`; the refresher works on copies of them.
      published: where the trained parameters are published (an inference device's `ParameterPublisher`, seen
        through the `PublishedParameters` contract): its `read` copies them in, its `published` says the newest
        version.
      version: the learner's train_steps when this starts (the version of `network`).
      target_update_interval: updates between copies of the online network to the target network.
      interval_s: seconds between the starts of two sweeps (> 0).
      batch_size: slots per forward pass (> 0).
      device: where the copies run (the training device).
      stop: the learner's stop event.
      on_values: receives the metrics (a dict of floats) after each batch and sweep.
    """

    def __init__(self, replay: PrioritizedReplay, priorities: PriorityFunction, network: nn.Module,
                 target_network: nn.Module, published: PublishedParameters, version: int,
                 target_update_interval: int, interval_s: float, batch_size: int, device: torch.device,
                 stop: threading.Event, on_values: Callable[[dict[str, float]], None] | None = None):
        if interval_s <= 0:
            raise ValueError(f"priority_refresh_interval_s: got {interval_s}, expected > 0 (0 turns it off)")
        if batch_size < 1:
            raise ValueError(f"priority_refresh_batch_size: got {batch_size}, expected >= 1")
        self.replay = replay
        self._priorities = priorities
        self.network = copy.deepcopy(network).to(device).requires_grad_(False)
        self.target_network = copy.deepcopy(target_network).to(device).requires_grad_(False)
        self._parameters = self.network.state_dict()  # the tensors of `network`, written in place
        self._published = published
        self.version = version
        self._target_update_interval = max(1, target_update_interval)
        self.interval_s = interval_s
        self.batch_size = batch_size
        self.device = torch.device(device)
        self._stop = stop
        self._on_values = on_values or (lambda values: None)
        self.sweeps = 0
        self._swept_version: int | None = None  # the version the last sweep started with
        self.thread = SupervisedThread(self._loop, "priority-refresh")

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        """Waits for the thread to end (the learner's stop event must be set: it ends within one batch)."""
        if self.thread.ident is not None:
            self.thread.join(timeout=30)

    def pull(self) -> int:
        """Copies the newest published parameters in (if newer), moving the target network on as the agent
        does; returns the version held."""
        newest = self._published.read(self._parameters, self.version)
        if newest // self._target_update_interval > self.version // self._target_update_interval:
            self.target_network.load_state_dict(self.network.state_dict())
        self.version = newest
        return newest

    def sweep(self) -> int:
        """Refreshes every filled slot once, in batches with the newest parameters of each moment; returns how
        many priorities were written (slots rewritten during the sweep are skipped)."""
        start = time.monotonic()
        size = self.replay.size
        written = 0
        self._swept_version = self.pull()
        for first in range(0, size, self.batch_size):
            if self._stop.is_set():
                return written
            batch_start = time.perf_counter()
            self.pull()
            indices = np.arange(first, min(first + self.batch_size, size))
            unrolls, generations = self.replay.read(indices)
            with torch.no_grad():
                priorities = self._priorities(unrolls.to(self.device), self.network, self.target_network,
                                              self.version)
            written += self.replay.refresh_priorities(indices, priorities.detach().double().cpu().numpy(),
                                                      generations)
            self._on_values({"replay/refresh_items_per_s": len(indices) / (time.perf_counter() - batch_start),
                             "replay/refresh_version_lag_updates": float(self._published.published - self.version)})
        self.sweeps += 1
        self._on_values({"replay/refresh_sweep_s": time.monotonic() - start,
                         "replay/refresh_sweeps": float(self.sweeps)})
        return written

    def _loop(self) -> None:
        while not self._stop.is_set():
            start = time.monotonic()
            if self.replay.size and self._published.published != self._swept_version:
                self.sweep()
            self._stop.wait(max(0.05, self.interval_s - (time.monotonic() - start)))


def make_priority_refresher(config: LearnerConfig, agent: Any, experience: Any, published: PublishedParameters,
                            version: int, stop: threading.Event, on_values: Callable[[dict[str, float]], None]
                            ) -> PriorityRefresher | None:
    """The learner's refresher for --priority_refresh_interval_s (None when 0, and for an agent without a replay,
    whose configuration has no such flag: seed-learner refuses it there, naming the agents that have it)."""
    if not agent.uses_replay or not config.priority_refresh_interval_s:  # only a replay agent has the flag
        return None
    return PriorityRefresher(experience.replay, agent.priorities, agent.network, agent.target_network, published,
                             version,
                             config.target_update_interval, config.priority_refresh_interval_s,
                             config.priority_refresh_batch_size or config.batch_size,
                             torch.device(config.training_device), stop, on_values)
