"""The learner's training loop, on its main thread: batches -> updates -> parameters to inference.

Without --training_process each iteration trains on the next prefetched batch here (`train_on_batch`), publishes
the network's parameters to every inference device and hands the new priorities to the experience (R2D2's
replay). With it, the training process trains and each iteration records the updates it reported (metrics,
priorities into the replay) and copies its newest parameters to inference. Either way a checkpoint is written
every --checkpoint_interval_s seconds, and the loop ends at --total_environment_frames, --max_train_steps, a stop
request, or a helper thread's death (what `poll` returns).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from seed.config import LearnerConfig
from seed.experience.training_batches import FifoExperience, ReplayExperience
from seed.inference.central import CentralInference
from seed.learner.checkpointing import LearnerCheckpointer
from seed.metrics.recording import LearnerMetrics
from seed.runtime.supervised_thread import ThreadFailure
from seed.training.optimizers import HeldOptimizerState
from seed.training.process import TrainingProcess, TrainingUpdate
from seed.training.update import train_on_batch


class TrainingLoop:
    """Trains `agent` with `optimizer` (here, or in `training_process` when not None: `optimizer` then holds
    only the child's last reported state) on `experience`'s batches and publishes each update's parameters to
    `inferences`; `metrics.train_steps` counts the updates."""

    def __init__(self, config: LearnerConfig, agent: Any, optimizer: torch.optim.Optimizer | HeldOptimizerState,
                 experience: FifoExperience | ReplayExperience, inferences: list[CentralInference],
                 metrics: LearnerMetrics, training_process: TrainingProcess | None, checkpointer: LearnerCheckpointer,
                 stop: threading.Event):
        self.config = config
        self.agent = agent
        self.optimizer = optimizer
        self.experience = experience
        self.inferences = inferences
        self.metrics = metrics
        self.training_process = training_process
        self.checkpointer = checkpointer
        self.stop = stop
        self.dropped_lagging_batches = 0  # --max_policy_lag

    def finished(self) -> bool:
        """A stop was requested, or --total_environment_frames or --max_train_steps is reached."""
        return self.stop.is_set() or self.run_complete()

    def run_complete(self) -> bool:
        """--total_environment_frames or --max_train_steps is reached: the run is over (not merely stopped)."""
        config, metrics = self.config, self.metrics
        return (metrics.env_frames >= config.total_environment_frames
                or bool(config.max_train_steps and metrics.train_steps >= config.max_train_steps))

    def run(self, poll: Callable[[], ThreadFailure | None]) -> ThreadFailure | None:
        """Trains until `finished()`, calling `poll` after every iteration; returns the failure `poll` reported
        (which ended the loop), None if the loop ended otherwise. Checkpoints every --checkpoint_interval_s."""
        last_checkpoint = time.monotonic()
        while not self.finished():
            if self.training_process is None:
                self.train_step()
            else:
                self.collect_updates(0.2)
            failure = poll()
            if failure is not None:
                return failure
            if time.monotonic() - last_checkpoint >= self.config.checkpoint_interval_s:
                self.checkpoint()
                last_checkpoint = time.monotonic()
        return None

    def train_step(self) -> bool:
        """One optimizer step on the next prefetched batch; False if none arrived in time."""
        batch = self.experience.next_batch(0.2)
        if batch is None:
            return False
        if isinstance(self.optimizer, HeldOptimizerState):  # a learner used as a library, stepped here
            self.optimizer = self.optimizer.build(self.agent, self.config)
        result = train_on_batch(self.agent, self.optimizer, batch, self.config, self.metrics.train_steps)
        if not result.trained:  # --max_policy_lag
            self.dropped_lagging_batches += 1
            return True
        values = result.values
        publish_start = time.perf_counter()
        self.publish(self.agent.network.state_dict(), version=self.metrics.train_steps + 1)
        values["publish_ms"] = (time.perf_counter() - publish_start) * 1e3
        self.experience.after_step(batch, result.priorities)
        self.metrics.record_train_step(values)
        self.agent.after_update(self.metrics.train_steps)
        return True

    def collect_updates(self, timeout_s: float) -> bool:
        """--training_process: records the updates the training process reported (waiting up to `timeout_s`
        for one) and publishes the newest parameters to inference; whether there were any."""
        updates = self.training_process.receive(timeout_s)
        self.record_updates(updates)
        self.dropped_lagging_batches = self.training_process.dropped_batches
        return bool(updates)

    def record_updates(self, updates: list[TrainingUpdate]) -> None:
        """The training process's updates: their metrics, their priorities into the replay, then its newest
        parameters to every inference device."""
        if not updates:
            return
        for update in updates:
            self.metrics.record_train_step(update.values)
            if update.priorities is not None:
                self.experience.update_priorities(update.replay_indices, update.replay_generations,
                                                  update.priorities)
        version = updates[-1].version
        if version != self.metrics.train_steps:
            raise RuntimeError(f"training process update: got version {version}, expected {self.metrics.train_steps}"
                               " (the learner's count of updates)")
        start = time.perf_counter()
        # The label is the one written with the weights: the child may have written update version + 1 since.
        published = self.training_process.read_parameters(self.publish)
        if published < version:
            raise RuntimeError(f"training process parameters: got version {published}, expected >= {version} (an "
                               "update's parameters are written before it is reported)")
        self.metrics.record_value("training_process/publish_to_inference_ms", (time.perf_counter() - start) * 1e3)

    def publish(self, parameters: dict[str, torch.Tensor], version: int) -> None:
        """Hands `parameters` (a state dict on any device), labelled `version` (train_steps after the update), to
        every inference device."""
        for inference in self.inferences:
            inference.publish(parameters, version=version)

    def checkpoint(self, with_experience: bool = True) -> None:
        """Writes the next rotated checkpoint (seed/runtime/checkpoint.py) and, if `with_experience`, the replay."""
        if self.training_process is not None and self.training_process.needs_asking():
            # Its state as of the last update recorded here; kept in this process too, for a checkpoint after it
            # stopped (a learner used as a library).
            agent_state, optimizer_state = self.training_process.state(self.record_updates)
            self.agent.load_state_dict(agent_state)
            self.optimizer.load_state_dict(optimizer_state)
        else:
            agent_state, optimizer_state = self.agent.state_dict(), self.optimizer.state_dict()
        self.checkpointer.save(agent_state, optimizer_state, with_experience)
