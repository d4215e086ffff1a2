"""The learner: a serving process for gRPC, and in this process inference, experience and training.

Processes and threads:
  serving process       gRPC server threads, one per actor stream: decode, validate, write the step into the
                        shared step slab, notify inference, wait for the reply in the slab (seed/serving/).
  inference-N threads   one per inference device: group notifications into batches, run
                        CentralInference.run_batch (slab rows -> device -> policy -> actions -> replies).
  experience-sink       completed unrolls into the FIFO queue or the replay (may block: back-pressure).
  prefetcher            stacks unrolls into time-major batches and moves them to the training device.
  main thread           training loop: loss, optimizer step, publish parameters, metrics, checkpoints;
                        restarts the serving process if it dies; ends the learner if a helper thread dies
                        (seed/runtime/supervised_thread.py).
With --training_process the optimizer steps run in a spawned process instead (seed/training/process.py): a
feeder thread hands it the prefetched batches, and the main thread publishes the parameters and records the
metrics of each update it reports, checkpoints, and ends the learner if that process dies.

`Learner` is the facade over three parts with one job each: seed/learner/builder.py builds and wires every part
from the configuration, seed/learner/training_loop.py trains (the main thread's loop), and seed/learner/supervision.py
starts, watches and stops the threads and processes. seed/learner/checkpointing.py writes and resumes checkpoints,
seed/metrics/episodes.py records episodes and writes the periodic metrics row.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import torch

from seed.config import LearnerConfig
from seed.envs.base import EnvSpec
from seed.learner.builder import build_learner
from seed.learner.run_end import RunEnd
from seed.metrics.episodes import PeriodicLogger, metrics_row, run_summary
from seed.runtime.supervised_thread import ThreadDied
from seed.transport import TransportSecurity


class Learner:
    """Builds every part from a resolved LearnerConfig (seed/learner/builder.py); `run()` trains until done or
    stopped.

    `security` (TLS, token) is what the serving process listens with; None builds it from `config`'s flags.
    The parts are handed out, not mirrored: `parts` (seed/learner/builder.py's `LearnerParts`: `agent`,
    `optimizer`, `metrics`, `experience`, `sink`, `channels.slab`, `inferences`, `batchers`, `training_process`,
    `serving`, `writer`, `training_loop` and `supervision`, ...) for tests and library use.
    """

    def __init__(self, config: LearnerConfig, spec: EnvSpec | None = None, security: TransportSecurity | None = None):
        self.parts = build_learner(config, spec, security)
        self.config = config
        self.bound_addresses: list[str] = []

    @property
    def dropped_lagging_batches(self) -> int:
        """Batches --max_policy_lag dropped (counted here, or by the training process)."""
        return self.parts.training_loop.dropped_lagging_batches

    def is_eval_env(self, env_ids: torch.Tensor) -> torch.Tensor:
        """The last `num_eval_envs` env ids only evaluate."""
        return self.parts.episodes.is_eval_env(env_ids)

    def _on_actor_episodes(self, episodes: list[tuple[int, float]]) -> None:
        """(env id, raw return) of episodes the actors reported finished (from the serving process)."""
        self.parts.episodes.on_actor_episodes(episodes)

    def request_stop(self, *_: Any) -> None:
        self.parts.stop_event.set()

    def checkpoint(self, with_experience: bool = True) -> None:
        """Writes the next rotated checkpoint (seed/runtime/checkpoint.py) and, if `with_experience`, the replay."""
        self.parts.training_loop.checkpoint(with_experience)

    def train_step(self) -> bool:
        """One optimizer step on the next prefetched batch; False if none arrived in time."""
        return self.parts.training_loop.train_step()

    def collect_updates(self, timeout_s: float) -> bool:
        """--training_process: records the updates the training process reported (waiting up to `timeout_s`
        for one) and publishes the newest parameters to inference; whether there were any."""
        return self.parts.training_loop.collect_updates(timeout_s)

    def run(self) -> dict[str, Any]:
        """Serves actors and trains until `total_environment_frames` or a stop request; returns a summary. A run
        that reached its end tells its actors so before it stops serving (seed/learner/run_end.py)."""
        config, parts = self.config, self.parts
        run_end = RunEnd(parts.channels.slab, config.finished_linger_s, parts.stop_event)
        if parts.training_loop.run_complete():  # resumed a finished run: every actor that dials in hears so
            run_end.mark(parts.metrics.env_frames)
        self.bound_addresses = parts.supervision.start()
        print(f"[learner] agent={config.agent} env={config.env} listening on {', '.join(self.bound_addresses)} "
              f"num_envs={config.num_envs} logdir={config.logdir}", flush=True)

        start = time.monotonic()
        start_frames = parts.metrics.env_frames
        logger = PeriodicLogger(self.log_row, parts.writer, parts.metrics, config.log_interval_s, start)
        logger.start()
        parts.supervision.watch(logger.thread)
        failure = None  # a helper thread that died
        finished = False  # until the loop ends normally: a step that raised may have half-updated the network
        try:
            failure = parts.training_loop.run(parts.supervision.poll)
            finished = True
            if failure is None and not parts.stop_event.is_set() and parts.training_loop.run_complete():
                run_end.linger(parts.metrics.env_frames)  # still serving: the actors exit 0 (seed/learner/run_end.py)
        finally:
            parts.supervision.stop(self.checkpoint if finished else None, failure,
                                   then=(logger.finish, parts.writer.close))
        if failure is not None:
            raise ThreadDied(failure)
        summary = run_summary(parts.metrics, time.monotonic() - start, start_frames, logger.last_return_mean,
                              config.seed)
        with open(os.path.join(config.logdir, "summary.json"), "w") as f:
            json.dump(summary, f)
        print(f"[learner] done: frames={summary['env_frames']:,} wall={summary['wall_time_s']}s "
              f"mean_fps={summary['mean_env_frames_per_sec']:,.0f} "
              f"last_return_mean={summary['last_episode_return_mean']}", flush=True)
        return summary

    def _close(self) -> None:
        """Releases the slab's descriptor, the pipes and the eventfds (the serving process has exited)."""
        self.parts.channels.close()

    def log_row(self, elapsed_s: float, window_s: float) -> dict[str, Any]:
        """Extra values for the metrics row (agents with replay add theirs through `agent.metrics()`)."""
        dropped = self.dropped_lagging_batches if self.config.max_policy_lag else None
        parts = self.parts
        return metrics_row(parts.metrics, parts.experience, elapsed_s, window_s, dropped, parts.reference_scores)
