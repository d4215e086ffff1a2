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
                        (seed/supervisor.py).
With --training_process the optimizer steps run in a spawned process instead (seed/training_process.py): a
feeder thread hands it the prefetched batches, and the main thread publishes the parameters and records the
metrics of each update it reports, checkpoints, and ends the learner if that process dies.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import logging
import os
import random
import signal
import sys
import threading
import time
from typing import Any

import numpy as np
import torch

from seed import checkpoint
from seed.agents import agent_module
from seed.config import LearnerConfig
from seed.contracts import FinishedEpisodes
from seed.envs import make_spec
from seed.envs.base import EnvSpec
from seed.experience import FifoExperience, ReplayExperience, SinkThread
from seed.host_memory import keep_freed_memory
from seed.inference import CentralInference
from seed.metrics import LearnerMetrics, MetricsWriter
from seed.priority_refresh import make_priority_refresher
from seed.replay import PrioritizedReplay, available_memory_bytes, check_fits_in_memory
from seed.serving.notify import RequestBatcher, new_reply_fd, new_request_channel, send_replies
from seed.serving.process import ServingProcess
from seed.serving.slab import StepSlab
from seed.supervisor import SupervisedThread, ThreadDied, Watchdog, sink_fault_from_environment
from seed.sync_gate import RolloutGate
from seed.training import make_optimizer, train_on_batch
from seed.training_process import TrainingProcess, TrainingUpdate
from seed.transport import TransportSecurity, listen_addresses

log = logging.getLogger(__name__)

class Learner:
    """Builds every part from a resolved LearnerConfig; `run()` trains until done or stopped.

    `security` (TLS, token) is what the serving process listens with; None builds it from `config`'s flags.
    """

    def __init__(self, config: LearnerConfig, spec: EnvSpec | None = None, security: TransportSecurity | None = None):
        self.config = config
        os.makedirs(config.logdir, exist_ok=True)
        threads = config.torch_threads or os.cpu_count() or 1
        torch.set_num_threads(threads)
        if config.keep_freed_memory:
            keep_freed_memory()
        if config.deterministic:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # what deterministic cuBLAS needs
            torch.use_deterministic_algorithms(True)
        seed_everything(config.seed)
        self.spec = spec or make_spec(config.env, config.env_options())
        self.training_device = torch.device(config.training_device)
        devices = config.inference_devices or config.inference_device
        self.inference_devices = [torch.device(d.strip()) for d in devices.split(",") if d.strip()]
        self.stop_event = threading.Event()

        self.agent = agent_module(config.agent).Agent(self.spec, config)
        self.agent.to(self.training_device)
        self.optimizer = make_optimizer(self.agent, config)
        with open(os.path.join(config.logdir, "config.json"), "w") as f:  # what seed-report --curves groups by
            json.dump(dataclasses.asdict(config), f, indent=1, sort_keys=True)
        found = checkpoint.latest(config.logdir)
        restored = found[1] if found else None
        counters = restored["counters"] if restored else {}
        if restored:
            self.agent.load_state_dict(restored["agent"])
            self.optimizer.load_state_dict(restored["optimizer"])
            print(f"[learner] resumed from {found[0]}: "
                  f"env_frames={counters['env_frames']:,} train_steps={counters['train_steps']:,}", flush=True)
        self.metrics = LearnerMetrics(self.spec.action_repeat, **counters)
        if restored:
            restore_rng_states(restored.get("rng"))

        self.experience = self._make_experience()
        if restored:
            self.experience.restore(config.logdir)
        # Evaluation envs are never trained on: the FIFO queue and the replay both drop their unrolls.
        self.sink = SinkThread(sink_fault_from_environment(self.experience.sink), self.stop_event)
        self.training_process = (
            TrainingProcess(config, self.spec, self.agent, self.optimizer, self.metrics.train_steps,
                            self.experience.next_batch, self.stop_event)
            if config.training_process else None)
        # The step slab is shared with the serving process; one request pipe per inference device carries
        # "actor a's slot is ready", one reply eventfd per actor index "actor a's reply is ready".
        # One slot per actor stream (--env_groups: one per group of each actor) of envs_per_stream rows.
        self.slab = StepSlab.create(config.actor_streams, config.envs_per_stream, self.spec.observation_shape,
                                    self.spec.observation_dtype)
        self._request_pipes = [new_request_channel() for _ in self.inference_devices]
        # Whoever holds actor a's slot waits on its eventfd: a gRPC stream of the serving process, or an actor on
        # this host that writes the slab itself (--shm_actors, seed/shm_actor_link.py).
        self._reply_fds = [new_reply_fd() for _ in range(config.actor_streams)]
        # The serving process reads end of file on this pipe when the learner exits (however).
        self._lifeline_read, self._lifeline_write = os.pipe()
        reply = functools.partial(send_replies, self._reply_fds)
        # One inference network, state table, unroll store and batcher per inference device; actor a is
        # served by device a % n, so each env's rows live on exactly one device.
        self.inferences = [
            CentralInference(
                agent=self.agent, network=copy.deepcopy(self.agent.network).to(device).eval(), device=device,
                slab=self.slab, unroll_length=config.unroll_length, burn_in=config.burn_in, reply=reply,
                sink=self.sink.put, on_episodes=self._on_episodes, on_batch=self.metrics.record_batch,
                on_timing=self.metrics.record_values, cuda_graphs=config.cuda_graphs,
                policy_version=self.metrics.train_steps, rollout_gate=self._rollout_gate(i),
                row_by_row=config.deterministic)
            for i, device in enumerate(self.inference_devices)
        ]
        self.dropped_lagging_batches = 0  # --max_policy_lag
        self.batchers = [RequestBatcher(read_fd, self.slab, config.inference_batch_size,
                                        config.batch_timeout_ms / 1000.0, i, len(self._request_pipes))
                         for i, (read_fd, _) in enumerate(self._request_pipes)]
        self.inference = self.inferences[0]
        self.priority_refresher = make_priority_refresher(  # --priority_refresh_interval_s; None when off
            config, self.agent, self.experience, self.inference.parameters, self.metrics.train_steps,
            self.stop_event, self.metrics.record_values)
        self.serving = ServingProcess(self.slab.layout, self.spec, listen_addresses(config.server_address),
                                      2 * config.actor_streams + 8, [w for _, w in self._request_pipes],
                                      self._reply_fds, self._lifeline_read, self._on_actor_episodes,
                                      security=security or TransportSecurity.from_config(config),
                                      max_message_bytes=self._max_message_bytes(),
                                      shm_actors=config.shm_actors)
        self._inference_threads = [
            SupervisedThread(functools.partial(self._serve_inference, inference, batcher), f"inference-{i}")
            for i, (inference, batcher) in enumerate(zip(self.inferences, self.batchers, strict=True))
        ]
        # A helper thread that dies ends the learner (run's loop polls this) instead of freezing it.
        self.watchdog = Watchdog(self.stop_event)
        self.watchdog.watch(*self._inference_threads, self.sink.thread, *self.experience.threads())
        if self.training_process is not None:
            self.watchdog.watch(self.training_process.feeder)
        if self.priority_refresher is not None:
            self.watchdog.watch(self.priority_refresher.thread)
        # Football's shaped rewards differ from its score (goals): show both.
        self.writer = MetricsWriter(config.logdir, show_raw_return=self.spec.name.startswith("football:"))
        self.reference_scores = self._atari_reference_scores()
        self.bound_addresses: list[str] = []

    def _rollout_gate(self, device_index: int) -> RolloutGate | None:
        """--sync=hts: the sync point of inference device `device_index` (it serves actors a % n == index)."""
        if self.config.sync != "hts":
            return None
        streams = self.config.actor_streams  # the gate's "actors" are the slab's slots: one per actor stream
        actors = np.arange(device_index, streams, len(self.inference_devices))
        per_batch = max(1, self.config.inference_batch_size // self.config.envs_per_stream)
        return RolloutGate(actors, streams, self.config.sync_every, self.metrics.train_steps, per_batch)

    def _make_experience(self) -> FifoExperience | ReplayExperience:
        config = self.config
        if not getattr(self.agent, "uses_replay", False):
            # HTS: a batch is every env's unroll of one rollout, arriving at once; ordered by env id it is the
            # same batch whatever the arrival order (--deterministic needs that).
            # A training process takes its batches from shared memory on the host and moves them itself.
            device = torch.device("cpu") if config.training_process else self.training_device
            return FifoExperience(config.queue_capacity or config.batch_size, config.batch_size,
                                  device, self.stop_event, self.is_eval_env,
                                  sort_by_env=config.sync == "hts")
        # Refuse at start what the first insert would fail to allocate.
        check_fits_in_memory(config.replay_capacity, self.agent.replay_sequence_bytes(), available_memory_bytes())
        replay = PrioritizedReplay(config.replay_capacity, config.priority_exponent,
                                   config.importance_sampling_exponent, config.replay_min_size, config.replay_ratio,
                                   config.batch_size, seed=config.seed, stop=self.stop_event)
        device = torch.device("cpu") if config.training_process else self.training_device
        return ReplayExperience(replay, self.agent.initial_priorities, self.is_eval_env, device,
                                config.checkpoint_replay)

    def _atari_reference_scores(self) -> tuple[float, float] | None:
        """(human, random) scores of the Atari game, for human-normalised scores in the metrics."""
        if not self.spec.name.startswith("atari:"):
            return None
        from seed.envs.atari_scores import reference_scores

        try:
            return reference_scores(self.spec.name, self.config.atari_scores_file or None)
        except (ValueError, KeyError) as error:
            print(f"[learner] no human-normalised scores: {error}", flush=True)
            return None

    def _max_message_bytes(self) -> int:
        """The serving process's receive limit: twice a full step message of this env, plus 1 MiB."""
        spec, k = self.spec, self.config.envs_per_stream
        observation = int(np.prod(spec.observation_shape)) * np.dtype(spec.observation_dtype).itemsize
        step = k * (observation + 4 + 1 + 1 + 64)  # frames, reward, done, truncated, a finished episode each
        return 2 * step + (1 << 20)

    def _serve_inference(self, inference: CentralInference, batcher: RequestBatcher) -> None:
        """One inference device's loop: batches of ready slots until the learner stops."""
        # With a sync point the loop also polls it: the learner's publish is what opens it.
        wait_s = 0.1 if inference.gate is None else 0.005
        while not self.stop_event.is_set():
            if inference.gate is not None:
                inference.release_held()
            start = time.perf_counter()
            batch = batcher.next_batch(wait_s)
            if batch is None:
                continue
            self.metrics.record_value("inference/wait_ms", (time.perf_counter() - start) * 1e3)
            try:
                inference.run_batch(*batch)
            except Exception:  # one bad batch must not stop inference for everyone (its actors got FAILED)
                log.exception("inference batch failed")

    def is_eval_env(self, env_ids: torch.Tensor) -> torch.Tensor:
        """The last `num_eval_envs` env ids only evaluate."""
        return env_ids >= self.config.num_envs - self.config.num_eval_envs

    def _on_episodes(self, episodes: FinishedEpisodes) -> None:
        is_eval = self.is_eval_env(torch.from_numpy(episodes.env_ids)).numpy()
        self.metrics.record_episodes(episodes.returns[~is_eval], episodes.lengths[~is_eval])
        if is_eval.any():
            self.metrics.record_eval_episodes(episodes.returns[is_eval], episodes.lengths[is_eval])

    def _on_actor_episodes(self, episodes: list[tuple[int, float]]) -> None:
        """(env id, raw return) of episodes the actors reported finished (from the serving process)."""
        env_ids = torch.tensor([int(env_id) for env_id, _ in episodes], dtype=torch.int64)
        raw = np.array([float(score) for _, score in episodes], np.float64)
        is_eval = self.is_eval_env(env_ids).numpy()
        self.metrics.record_actor_episodes(raw[~is_eval].tolist())
        if is_eval.any():
            self.metrics.record_eval_scores(raw[is_eval].tolist())

    def request_stop(self, *_: Any) -> None:
        self.stop_event.set()

    def checkpoint(self, with_experience: bool = True) -> None:
        """Writes the next rotated checkpoint (seed/checkpoint.py) and, if `with_experience`, the replay."""
        if self.training_process is not None and self.training_process.needs_asking():
            # Its state as of the last update recorded here; kept in this process too, for a checkpoint after it
            # stopped (a learner used as a library).
            agent_state, optimizer_state = self.training_process.state(self._record_updates)
            self.agent.load_state_dict(agent_state)
            self.optimizer.load_state_dict(optimizer_state)
        else:
            agent_state, optimizer_state = self.agent.state_dict(), self.optimizer.state_dict()
        state = {
            "agent": agent_state,
            "optimizer": optimizer_state,
            "counters": {"env_frames": self.metrics.env_frames, "train_steps": self.metrics.train_steps,
                         "episodes": self.metrics.episodes, "eval_returns": list(self.metrics.eval_returns),
                         "eval_episodes": self.metrics.eval_episodes,
                         "eval_scores": list(self.metrics.eval_scores)},
            "seed": self.config.seed,
            "rng": rng_states(),
            "config": vars(self.config).copy(),
        }
        checkpoint.save(self.config.logdir, state, keep=self.config.keep_checkpoints)
        if with_experience:
            self.experience.save(self.config.logdir)

    def train_step(self) -> bool:
        """One optimizer step on the next prefetched batch; False if none arrived in time."""
        batch = self.experience.next_batch(0.2)
        if batch is None:
            return False
        result = train_on_batch(self.agent, self.optimizer, batch, self.config, self.metrics.train_steps)
        if not result.trained:  # --max_policy_lag
            self.dropped_lagging_batches += 1
            return True
        values = result.values
        publish_start = time.perf_counter()
        parameters = self.agent.network.state_dict()
        for inference in self.inferences:
            inference.publish(parameters, version=self.metrics.train_steps + 1)
        values["publish_ms"] = (time.perf_counter() - publish_start) * 1e3
        self.experience.after_step(batch, result.priorities)
        self.metrics.record_train_step(values)
        self.agent.after_update(self.metrics.train_steps)
        return True

    def collect_updates(self, timeout_s: float) -> bool:
        """--training_process: records the updates the training process reported (waiting up to `timeout_s`
        for one) and publishes the newest parameters to inference; whether there were any."""
        updates = self.training_process.receive(timeout_s)
        self._record_updates(updates)
        self.dropped_lagging_batches = self.training_process.dropped_batches
        return bool(updates)

    def _record_updates(self, updates: list[TrainingUpdate]) -> None:
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
        published = self.training_process.read_parameters(self._publish_to_inference)
        if published < version:
            raise RuntimeError(f"training process parameters: got version {published}, expected >= {version} (an "
                               "update's parameters are written before it is reported)")
        self.metrics.record_value("training_process/publish_to_inference_ms", (time.perf_counter() - start) * 1e3)

    def _publish_to_inference(self, parameters: dict[str, torch.Tensor], version: int) -> None:
        for inference in self.inferences:
            inference.publish(parameters, version=version)

    def run(self) -> dict[str, Any]:
        """Serves actors and trains until `total_environment_frames` or a stop request; returns a summary."""
        config = self.config
        for thread in self._inference_threads:
            thread.start()
        self.sink.start()
        self.experience.start()
        if self.priority_refresher is not None:
            self.priority_refresher.start()
        if self.training_process is not None:
            self.training_process.start()
        try:
            self.bound_addresses = self.serving.start()
        except RuntimeError:
            self.stop_event.set()
            if self.training_process is not None:
                self.training_process.stop()
            self._close()
            raise
        print(f"[learner] agent={config.agent} env={config.env} listening on {', '.join(self.bound_addresses)} "
              f"num_envs={config.num_envs} logdir={config.logdir}", flush=True)

        start = time.monotonic()
        start_frames = self.metrics.env_frames
        logger = _PeriodicLogger(self, start)
        logger.start()
        self.watchdog.watch(logger.thread)
        last_checkpoint = start
        retry_at = 0.0  # when a failed serving-process restart is tried again
        failure = None  # a helper thread that died
        training_failed = True  # until the loop ends normally: a step that raised may have half-updated the network
        try:
            while (not self.stop_event.is_set() and self.metrics.env_frames < config.total_environment_frames
                   and not (config.max_train_steps and self.metrics.train_steps >= config.max_train_steps)):
                if self.training_process is None:
                    self.train_step()
                else:
                    self.collect_updates(0.2)
                failure = self.watchdog.check()
                if failure is not None:
                    print(f"[learner] {failure.describe()}\n[learner] stopping: a helper thread died", file=sys.stderr,
                          flush=True)
                    break
                if not self.serving.alive() and not self.stop_event.is_set() and time.monotonic() > retry_at:
                    retry_at = time.monotonic() + (0.0 if self.serving.restart() else 5.0)
                if time.monotonic() - last_checkpoint >= config.checkpoint_interval_s:
                    self.checkpoint()
                    last_checkpoint = time.monotonic()
            training_failed = False
        finally:
            self.stop_event.set()  # also unblocks threads waiting on a dead one (inference in the sink's put)
            try:
                self.serving.stop()
                for thread in self._inference_threads:
                    thread.join(timeout=10)
                if self.priority_refresher is not None:
                    self.priority_refresher.stop()
                if not training_failed:
                    # The network and optimizer are whole (this thread's, or the training process's, which
                    # finishes its update first); the replay may hold a half-written slot if the sink died inside
                    # an insert.
                    self.checkpoint(with_experience=failure is None or failure.thread != self.sink.thread.name)
            finally:
                if self.training_process is not None:  # even if the checkpoint failed: it ignores SIGTERM
                    self.training_process.stop()
                self._close()
                logger.finish()
                self.writer.close()
        if failure is not None:
            raise ThreadDied(failure)
        wall = time.monotonic() - start
        summary = {
            "env_frames": self.metrics.env_frames,
            "train_steps": self.metrics.train_steps,
            "wall_time_s": round(wall, 1),
            "mean_env_frames_per_sec": round((self.metrics.env_frames - start_frames) / max(wall, 1e-9), 1),
            "last_episode_return_mean": logger.last_return_mean,
            "eval_return_running_mean_100": (float(np.mean(self.metrics.eval_returns))
                                             if self.metrics.eval_returns else None),
            "eval_episodes": self.metrics.eval_episodes,
            "eval_score_running_mean_100": (float(np.mean(self.metrics.eval_scores))
                                            if self.metrics.eval_scores else None),
            "seed": config.seed,
        }
        with open(os.path.join(config.logdir, "summary.json"), "w") as f:
            json.dump(summary, f)
        print(f"[learner] done: frames={summary['env_frames']:,} wall={summary['wall_time_s']}s "
              f"mean_fps={summary['mean_env_frames_per_sec']:,.0f} "
              f"last_return_mean={summary['last_episode_return_mean']}", flush=True)
        return summary

    def _close(self) -> None:
        """Releases the slab's descriptor, the pipes and the eventfds (the serving process has exited)."""
        for fd in (self._lifeline_read, self._lifeline_write, *(fd for pipe in self._request_pipes for fd in pipe),
                   *self._reply_fds):
            try:
                os.close(fd)
            except OSError:
                pass
        self._request_pipes, self._lifeline_read, self._lifeline_write, self._reply_fds = [], -1, -1, []
        self.slab.release()

    def log_row(self, elapsed_s: float, window_s: float) -> dict[str, Any]:
        """Extra values for the metrics row (agents with replay add theirs through `agent.metrics()`)."""
        extra = {"window_s": window_s, **self.experience.stats()}
        if self.config.max_policy_lag:
            extra["policy_lag_dropped_batches"] = self.dropped_lagging_batches
        row = self.metrics.snapshot(elapsed_s, extra)
        if self.reference_scores is not None:
            human, random = self.reference_scores
            for key, name in (("episode_return_mean", "episode_human_normalized"),
                              ("eval_episode_return_mean", "eval_episode_human_normalized"),
                              ("eval/return_running_mean_100", "eval/human_normalized_running_mean_100")):
                if row[key] is not None:
                    row[name] = (row[key] - random) / (human - random)
        return row


class _PeriodicLogger:
    """Writes one metrics row every `log_interval_s` from its own thread, however long a train step takes."""

    def __init__(self, learner: Learner, start: float):
        self.learner = learner
        self.start_time = start
        self.last_time = start
        self.last_train_steps = learner.metrics.train_steps
        self.last_return_mean: float | None = None
        self._done = threading.Event()
        self._lock = threading.Lock()
        self.thread = SupervisedThread(self._loop, "metrics-logger")

    def start(self) -> None:
        self.thread.start()

    def _loop(self) -> None:
        while not self._done.wait(self.learner.config.log_interval_s):
            self.write()

    def write(self) -> None:
        with self._lock:
            now = time.monotonic()
            window = now - self.last_time
            row = self.learner.log_row(now - self.start_time, window)
            row["train_steps_per_sec"] = (row["train_steps"] - self.last_train_steps) / max(window, 1e-9)
            self.learner.writer.write(row)
            self.last_time, self.last_train_steps = now, row["train_steps"]
            if row["episode_return_mean"] is not None:
                self.last_return_mean = row["episode_return_mean"]

    def finish(self) -> None:
        self._done.set()
        self.thread.join(timeout=10)
        # The last row carries whatever the window holds: a short run (--max_train_steps) can train all its steps
        # within half a second of the previous row, and those steps' values must not be dropped.
        unlogged = self.learner.metrics.train_steps != self.last_train_steps
        if self.thread.failure is None and (unlogged or time.monotonic() - self.last_time > 0.5):
            self.write()


def seed_everything(seed: int) -> None:
    """Seeds torch, NumPy's global generator and Python's `random` in this process (envs are seeded per env id
    from the same `--seed` by their actors)."""
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)


def rng_states() -> dict[str, Any]:
    """The random generators' states of this process, for the checkpoint."""
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def restore_rng_states(states: dict[str, Any] | None) -> None:
    if not states:
        return
    torch.set_rng_state(states["torch"])
    np.random.set_state(states["numpy"])
    random.setstate(states["python"])


def install_signal_handlers(learner: Learner) -> None:
    signal.signal(signal.SIGTERM, learner.request_stop)
    signal.signal(signal.SIGINT, learner.request_stop)
