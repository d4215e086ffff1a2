"""The learner's builder: every part wired from a resolved LearnerConfig and the env's EnvSpec.

`build_learner` sets up this process (torch threads, allocator, determinism, seeds), then builds, in this order
(the random generators are seeded once, so the order is part of a run's reproducibility): the agent and its
optimizer (resumed from the newest checkpoint), the metrics, the experience (FIFO queue or replay), the sink
thread, the training process, the step slab and its notification channels, one CentralInference and
RequestBatcher per inference device, the priority refresher, the serving process, the inference threads, the
training loop and the supervision. `Learner` (seed/learner/learner.py) runs them.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import os
import threading
from typing import Any

import numpy as np
import torch

from seed import envs
from seed.config import LearnerConfig, burn_in_steps, torch_threads
from seed.contracts.agent import check_action_space
from seed.envs import make_spec
from seed.envs.base import EnvSpec
from seed.experience.priority_refresh import PriorityRefresher, make_priority_refresher
from seed.experience.replay import PrioritizedReplay, available_memory_bytes, check_fits_in_memory
from seed.experience.training_batches import FifoExperience, ReplayExperience, SinkThread
from seed.inference.central import CentralInference, InferenceModel, InferenceOutputs, UnrollLayout, serve_inference
from seed.inference.rollout_gate import RolloutGate
from seed.learner.checkpointing import LearnerCheckpointer, restore_rng_states, resume, seed_everything
from seed.learner.supervision import LearnerSupervision
from seed.learner.training_loop import TrainingLoop
from seed.metrics.episodes import EpisodeRecorder
from seed.metrics.recording import LearnerMetrics, MetricsWriter
from seed.metrics.sinks import SinkSettings
from seed.runtime.host_memory import keep_freed_memory
from seed.runtime.supervised_thread import SupervisedThread, sink_fault_from_environment
from seed.serving.process import ServingProcess
from seed.training.optimizers import HeldOptimizerState, learner_optimizer
from seed.training.process import TrainingProcess
from seed.transport import REDACTED, TransportSecurity, listen_addresses
from seed.transport.notify import RequestBatcher, new_reply_fd, new_request_channel, send_replies
from seed.transport.slab import StepSlab


@dataclasses.dataclass
class ServingChannels:
    """What the learner shares with the serving process (and with shm actors on this host).

    slab: the step slab, one slot of `envs_per_stream` rows per actor stream.
    request_pipes: (read fd, write fd) per inference device: "actor a's slot is ready" (a % devices == index).
    reply_fds: one eventfd per actor slot, "actor a's reply is ready"; whoever holds the slot waits on it (a gRPC
      stream of the serving process, or an actor on this host that writes the slab itself, seed/transport/shm/link.py).
    lifeline_read, lifeline_write: the serving process reads end of file on this pipe when the learner exits
      (however).
    """

    slab: StepSlab
    request_pipes: list[tuple[int, int]]
    reply_fds: list[int]
    lifeline_read: int
    lifeline_write: int

    @classmethod
    def create(cls, config: LearnerConfig, spec: EnvSpec, num_inference_devices: int) -> ServingChannels:
        slab = StepSlab.create(config.actor_streams, config.envs_per_stream, spec.observation_shape,
                               spec.observation_dtype, spec.action_shape, spec.action_dtype)
        request_pipes = [new_request_channel() for _ in range(num_inference_devices)]
        reply_fds = [new_reply_fd() for _ in range(config.actor_streams)]
        lifeline_read, lifeline_write = os.pipe()
        return cls(slab, request_pipes, reply_fds, lifeline_read, lifeline_write)

    def close(self) -> None:
        """Releases the slab's descriptor, the pipes and the eventfds (once the serving process has exited)."""
        for fd in (self.lifeline_read, self.lifeline_write, *(fd for pipe in self.request_pipes for fd in pipe),
                   *self.reply_fds):
            try:
                os.close(fd)
            except OSError:
                pass
        self.request_pipes, self.lifeline_read, self.lifeline_write, self.reply_fds = [], -1, -1, []
        self.slab.release()


@dataclasses.dataclass
class LearnerParts:
    """Every part of a learner, built and wired; nothing started yet."""

    config: LearnerConfig
    spec: EnvSpec
    training_device: torch.device
    inference_devices: list[torch.device]
    stop_event: threading.Event
    agent: Any  # the agent module's Agent (networks + loss), on the training device
    optimizer: torch.optim.Optimizer | HeldOptimizerState  # only its state with --training_process
    metrics: LearnerMetrics
    episodes: EpisodeRecorder
    experience: FifoExperience | ReplayExperience
    sink: SinkThread
    training_process: TrainingProcess | None
    channels: ServingChannels
    inferences: list[CentralInference]  # one per inference device; actor a is served by device a % n
    batchers: list[RequestBatcher]
    priority_refresher: PriorityRefresher | None
    serving: ServingProcess
    inference_threads: list[SupervisedThread]
    writer: MetricsWriter
    reference_scores: tuple[float, float] | None
    training_loop: TrainingLoop
    supervision: LearnerSupervision


def setup_process(config: LearnerConfig) -> None:
    """This process's settings before anything is built: the logdir, torch's threads, the allocator, the
    deterministic algorithms, the seeds."""
    os.makedirs(config.logdir, exist_ok=True)
    torch.set_num_threads(torch_threads(config.torch_threads))
    if config.keep_freed_memory:
        keep_freed_memory()
    if config.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # what deterministic cuBLAS needs
        torch.use_deterministic_algorithms(True)
    seed_everything(config.seed)


def build_learner(config: LearnerConfig, spec: EnvSpec | None = None,
                  security: TransportSecurity | None = None) -> LearnerParts:
    """Builds every part (`spec`: None makes it from --env; `security`: what the serving process listens with,
    None builds it from `config`'s flags)."""
    setup_process(config)
    spec = spec or make_spec(config.env, config.env_options())
    training_device = torch.device(config.training_device)
    devices = config.inference_devices or config.inference_device
    inference_devices = [torch.device(d.strip()) for d in devices.split(",") if d.strip()]
    stop = threading.Event()

    check_action_space(type(config).agent_class, spec, config.agent)  # before the agent builds its networks
    agent = type(config).agent_class(spec, config)
    agent.to(training_device)
    optimizer = learner_optimizer(agent, config)
    restored = resume(config, agent, optimizer)
    # What seed-report --curves groups by; written once the checkpoint is known to fit (a refused resume leaves
    # the run's own in place).
    with open(os.path.join(config.logdir, "config.json"), "w") as f:
        json.dump(dataclasses.asdict(config), f, indent=1, sort_keys=True)
    metrics = LearnerMetrics(spec.action_repeat, **(restored["counters"] if restored else {}))
    if restored:
        restore_rng_states(restored.get("rng"))
        agent.resume_acting(metrics.env_frames // spec.action_repeat)
    episodes = EpisodeRecorder(metrics, config.num_envs, config.num_eval_envs)

    experience = make_experience(config, agent, training_device, stop, episodes)
    if restored:
        experience.restore(config.logdir)
    # Evaluation envs are never trained on: the FIFO queue and the replay both drop their unrolls.
    sink = SinkThread(sink_fault_from_environment(experience.sink), stop, record=metrics.record_values)
    training_process = (TrainingProcess(config, spec, agent, optimizer, metrics.train_steps, experience.next_batch,
                                        stop)
                        if config.training_process else None)
    # One slot per actor stream (--env_groups: one per group of each actor) of envs_per_stream rows.
    channels = ServingChannels.create(config, spec, len(inference_devices))
    outputs = InferenceOutputs(reply=functools.partial(send_replies, channels.reply_fds), sink=sink.put,
                               on_episodes=episodes.on_episodes, on_batch=metrics.record_batch,
                               on_timing=metrics.record_values)
    # One inference network, state table, unroll store and batcher per inference device; actor a is served by
    # device a % n, so each env's rows live on exactly one device.
    inferences = [
        CentralInference(
            InferenceModel(agent=agent, network=copy.deepcopy(agent.network).to(device).eval(), device=device,
                           policy_version=metrics.train_steps,
                           cuda_graphs=config.cuda_graphs and agent.cuda_graphs,
                           row_by_row=config.deterministic),
            channels.slab, UnrollLayout(config.unroll_length, burn_in_steps(config)), outputs,
            rollout_gate=rollout_gate(config, i, len(inference_devices), metrics.train_steps))
        for i, device in enumerate(inference_devices)
    ]
    batchers = [RequestBatcher(read_fd, channels.slab, config.inference_batch_size, config.batch_timeout_ms / 1000.0,
                               i, len(channels.request_pipes))
                for i, (read_fd, _) in enumerate(channels.request_pipes)]
    priority_refresher = make_priority_refresher(  # --priority_refresh_interval_s; None when off
        config, agent, experience, inferences[0].parameters, metrics.train_steps, stop, metrics.record_values)
    serving = ServingProcess(channels.slab.layout, spec, listen_addresses(config.server_address),
                             2 * config.actor_streams + 8, [w for _, w in channels.request_pipes],
                             channels.reply_fds, channels.lifeline_read, episodes.on_actor_episodes,
                             security=security or TransportSecurity.from_config(config),
                             max_message_bytes=max_message_bytes(spec, config.envs_per_stream),
                             shm_actors=config.shm_actors)
    inference_threads = [
        SupervisedThread(functools.partial(serve_inference, inference, batcher, stop, metrics.record_value),
                         f"inference-{i}")
        for i, (inference, batcher) in enumerate(zip(inferences, batchers, strict=True))
    ]
    supervision = LearnerSupervision(stop, serving, inference_threads, sink, experience, priority_refresher,
                                     training_process, channels.close)
    # A family whose shaped rewards differ from its score (Football's goals) shows both.
    config_values = {**dataclasses.asdict(config), "auth_token": REDACTED if config.auth_token else ""}
    writer = MetricsWriter.open(SinkSettings(config.logdir, config_values,
                                             show_raw_return=envs.shows_raw_return(spec.name)))
    writer.write_config(config_values)
    checkpointer = LearnerCheckpointer(config, metrics, experience)
    training_loop = TrainingLoop(config, agent, optimizer, experience, inferences, metrics, training_process,
                                 checkpointer, stop)
    return LearnerParts(
        config=config, spec=spec, training_device=training_device, inference_devices=inference_devices,
        stop_event=stop, agent=agent, optimizer=optimizer, metrics=metrics, episodes=episodes, experience=experience,
        sink=sink, training_process=training_process, channels=channels, inferences=inferences, batchers=batchers,
        priority_refresher=priority_refresher, serving=serving, inference_threads=inference_threads, writer=writer,
        reference_scores=family_reference_scores(spec, config),
        training_loop=training_loop, supervision=supervision)


def rollout_gate(config: LearnerConfig, device_index: int, num_devices: int, train_steps: int) -> RolloutGate | None:
    """--sync=hts: the sync point of inference device `device_index` (it serves actors a % n == index)."""
    if config.sync != "hts":
        return None
    streams = config.actor_streams  # the gate's "actors" are the slab's slots: one per actor stream
    actors = np.arange(device_index, streams, num_devices)
    per_batch = max(1, config.inference_batch_size // config.envs_per_stream)
    return RolloutGate(actors, streams, config.sync_every, train_steps, per_batch, lag=config.sync_lag)


def make_experience(config: LearnerConfig, agent: Any, training_device: torch.device,
                    stop: threading.Event, episodes: EpisodeRecorder) -> FifoExperience | ReplayExperience:
    """The FIFO queue and prefetcher (agents without replay) or the prioritized replay (`agent.uses_replay`)."""
    # A training process takes its batches from shared memory on the host and moves them itself.
    device = torch.device("cpu") if config.training_process else training_device
    if not agent.uses_replay:
        # HTS: a batch is every env's unroll of one rollout, arriving at once; ordered by env id it is the
        # same batch whatever the arrival order (--deterministic needs that).
        return FifoExperience(config.queue_capacity or config.batch_size, config.batch_size, device, stop,
                              episodes.is_eval_env, sort_by_env=config.sync == "hts")
    # Refuse at start what the first insert would fail to allocate.
    check_fits_in_memory(config.replay_capacity, agent.replay_sequence_bytes(), available_memory_bytes())
    replay = PrioritizedReplay(config.replay_capacity, config.priority_exponent, config.importance_sampling_exponent,
                               config.replay_min_size, config.replay_ratio, config.batch_size, seed=config.seed,
                               stop=stop)
    return ReplayExperience(replay, agent.initial_priorities, episodes.is_eval_env, device, config.checkpoint_replay)


def family_reference_scores(spec: EnvSpec, config: LearnerConfig) -> tuple[float, float] | None:
    """(human, random) reference returns of the env, for human-normalised scores in the metrics; None for a family
    without them or an env without scores (said on stdout)."""
    try:
        return envs.reference_scores(spec.name, dataclasses.asdict(config))
    except (ValueError, KeyError, OSError) as error:
        print(f"[learner] no human-normalised scores: {error}", flush=True)
        return None


def max_message_bytes(spec: EnvSpec, envs_per_stream: int) -> int:
    """The serving process's receive limit: twice a full step message of this env, plus 1 MiB."""
    observation = int(np.prod(spec.observation_shape)) * np.dtype(spec.observation_dtype).itemsize
    step = envs_per_stream * (observation + 4 + 1 + 1 + 64)  # frames, reward, done, truncated, an episode each
    return 2 * step + (1 << 20)
