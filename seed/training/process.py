"""--training_process: the optimizer steps in a process of their own, so training never holds the GIL that the
learner's inference thread needs.

    learner process                                      training process (spawned)
      prefetcher: time-major batches  --feeder thread-->   batch slots (shared memory, `depth` of them)
                                      ("batch", slot) ->   train_on_batch on the slot's tensors, in place
      main thread: metrics, publish  <- ("step", slot,     parameters and their version (shared memory,
                   to inference          version, values)  under a record lock)
      checkpoint                      ("state",) ------>   agent and optimizer state dicts, pickled back

Parameters travel through one shared copy of the network's state dict (seed/training/shared_parameters.py): the training
process writes it and its version under a record lock after every update, the learner's main thread reads both
under the same lock into each inference device's staging (seed/inference/parameter_publisher.py) when an update's
message arrives,
so inference is told exactly the version of the weights it got. The kernel releases that lock when its holder
dies. Batch slots are allocated from the first batch (its fields and shapes are what every later batch must have)
and handed to the child once.

The child ends when its command pipe closes, and the kernel kills it when the learner dies (a parent-death
signal: a stuck child cannot act on anything else). The learner ends loudly when the child dies (`receive`
raises `TrainingProcessDied` with its exit code; the child's traceback is on stderr), dies halfway through
writing the parameters, or stops getting on (seed/training/liveness.py: past its own deadline, the child is
hung; its stacks are dumped to stderr, it is killed and `TrainingProcessHung` raised).
R2D2's replay stays in the learner process: the feeder samples it, sends each batch's importance weights with
its slot, and keeps the slot's replay indices and generations; the child returns the new priorities with the
update, and the learner's main thread writes them into the replay (`TrainingUpdate`).

--training_devices=d0,d1,...: data-parallel training (seed/training/data_parallel.py). The learner starts one training
process per device, all its children (rank 0 is the process above; ranks 1..N-1 are named seed-train-r<k> in ps),
which meet through a TCPStore the learner serves on 127.0.0.1 and form a torch.distributed group (gloo on the
CPU, NCCL on CUDA). Every rank gets the slots and each batch's command, reads the whole slot and trains on its
share of the columns; only rank 0 publishes, reports updates and hands over its state for checkpoints. The
learner checks ranks 1..N-1 whenever it checks rank 0: a dead one ends it (`TrainingProcessDied` naming the rank);
a hung one holds rank 0 in a collective past its deadline, and every rank is killed.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import io
import math
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.multiprocessing as mp

from seed.config import LearnerConfig, torch_threads
from seed.contracts.training import TrainingBatch, Unroll
from seed.envs.base import EnvSpec
from seed.inference.parameter_publisher import copy_tensors
from seed.runtime.supervised_thread import SupervisedThread
from seed.training import data_parallel, liveness
from seed.training.batch_workers import BatchWorkerDied, BatchWorkers
from seed.training.liveness import TrainingFault, TrainingProgress, die_with_parent, step_allowance_s
from seed.training.optimizers import HeldOptimizerState
from seed.training.shared_parameters import ParametersHalfWritten, SharedParameters
from seed.training.update import train_on_batch

_STATE_TIMEOUT_S = 120.0  # longest wait for the child's state dicts (a checkpoint)


@dataclasses.dataclass
class TrainingUpdate:
    """One update the training process reported.

    Attributes:
      version: the update's number (train steps made once it is applied).
      values: its metrics (losses, gradient_norm, publish_ms, ...).
      priorities: float64 [B] new replay priorities of the batch's sequences (R2D2), else None.
      replay_indices, replay_generations: the batch's replay slots and their generations when sampled (the
        priority update skips slots written since), else None.
    """

    version: int
    values: dict[str, float]
    priorities: np.ndarray | None = None
    replay_indices: object | None = None
    replay_generations: object | None = None


class TrainingProcessDied(RuntimeError):
    """The training process exited while the learner ran (its traceback, if it raised, is on stderr)."""


class TrainingProcessHung(TrainingProcessDied):
    """The training process missed its deadline (seed/training/liveness.py); the learner killed it."""


def _copy_parameters(targets: dict[str, torch.Tensor], network: torch.nn.Module) -> None:
    """The network's state dict (any device) into the shared host copy."""
    with torch.no_grad():
        state = network.state_dict()
        copy_tensors(list(targets.values()), [state[name] for name in targets])


def to_bytes(agent_state: dict, optimizer_state: dict | None) -> bytes:
    """Agent and optimizer state dicts by value: no tensor of the sender's is shared with the receiver (a
    pickled CPU tensor would be moved to shared memory and keep changing under a checkpoint being written)."""
    buffer = io.BytesIO()
    torch.save({"agent": agent_state, "optimizer": optimizer_state}, buffer)
    return buffer.getvalue()


def from_bytes(data: bytes) -> tuple[dict, dict | None]:
    """(agent state dict, optimizer state dict or None) from `to_bytes`, on the CPU."""
    state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    return state["agent"], state["optimizer"]


def _name_process(name: str) -> None:
    """Linux: the process's name in ps, top and /proc/<pid>/comm (at most 15 bytes)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME


@dataclasses.dataclass(frozen=True)
class TrainingProcessSpec:
    """What one training process (one rank) starts from: plain values, pickled into the spawned child.

    Attributes:
      config, spec: the learner's.
      initial_state: the agent's and optimizer's state dicts (`to_bytes`; the optimizer's None for a fresh one),
        the child's starting point.
      train_steps: updates made so far (the child numbers its updates on from here).
      learner_pid: the learner's pid (the child dies with it).
      rank, world: this process's rank among the `world` training processes (--training_devices; 0 of 1
        without); it trains on the device of its rank.
      store_port: the learner's TCPStore port where the ranks meet (0 when `world` is 1).
    """

    config: LearnerConfig
    spec: EnvSpec
    initial_state: bytes
    train_steps: int
    learner_pid: int
    rank: int = 0
    world: int = 1
    store_port: int = 0


@dataclasses.dataclass(frozen=True)
class TrainingLinks:
    """What a training process shares with the learner (handles to pipes and shared memory, not copies).

    Attributes:
      commands: the receive end of the learner's command pipe ("slots", "batch", "state", "stop").
      results: rank 0: the send end of the pipe its updates, dropped batches and states go back through; ranks
        1..N-1: None (rank 0 reports for them all).
      parameters: rank 0: the shared parameters it publishes after every update; ranks 1..N-1: None.
      progress: rank 0: the progress record the learner watches (seed/training/liveness.py); ranks 1..N-1: None.
      preparation: rank 0 with batch workers: the shared copy of the agent's preparation network it writes when
        that network's version changes (seed/training/batch_workers.py); else None.
    """

    commands: Any
    results: Any = None
    parameters: SharedParameters | None = None
    progress: TrainingProgress | None = None
    preparation: SharedParameters | None = None


def _child_main(spec: TrainingProcessSpec, links: TrainingLinks) -> None:
    """The training process: trains on each batch slot it is sent and publishes after every update.

    With --training_devices (`world` > 1) every rank runs this; rank 0 publishes, reports updates and answers for
    the state, ranks 1..N-1 only train, on the device of their rank.
    """
    device, shard = _set_up_process(spec)
    progress = links.progress
    if progress is None:  # ranks 1..N-1: rank 0 reports for them all (it waits for them in every update)
        progress = TrainingProgress(spec.config.training_process_timeout_s)
    agent, optimizer = _build_agent(spec, device)
    trainer = _Trainer(spec, links, progress, agent, optimizer, device, shard)
    _command_loop(links.commands, trainer)
    liveness.exit_without_teardown()


def _set_up_process(spec: TrainingProcessSpec) -> tuple[torch.device, data_parallel.Shard | None]:
    """The child's process settings: dies with the learner, ignores the stop signals, dumps its stacks on SIGUSR2,
    its threads and allocator, its seed; with --training_devices, joins the ranks' group. Returns its device and
    its share of each batch (None without --training_devices)."""
    config, rank, world = spec.config, spec.rank, spec.world
    die_with_parent(spec.learner_pid)
    from seed.runtime.host_memory import keep_freed_memory

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the learner decides when to stop (Ctrl-C reaches the group)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    faulthandler.register(signal.SIGUSR2, all_threads=True)  # the learner asks for our stacks when we hang
    devices = data_parallel.parse_devices(config.training_devices) if world > 1 else [config.training_device]
    torch.set_num_threads(max(1, torch_threads(config.torch_threads) // world))
    if config.keep_freed_memory:
        keep_freed_memory()
    torch.manual_seed(config.seed + 1)
    device = torch.device(devices[rank])
    if world == 1:
        return device, None
    _name_process(f"seed-train-r{rank}")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    group_timeout_s = liveness.FIRST_UPDATE_FACTOR * config.training_process_timeout_s
    data_parallel.init_group(devices[rank], rank, world,
                             data_parallel.connect_store(spec.store_port, group_timeout_s), group_timeout_s)
    return device, data_parallel.Shard(rank, world)


def _build_agent(spec: TrainingProcessSpec, device: torch.device) -> tuple[Any, torch.optim.Optimizer]:
    """The learner's agent and optimizer, rebuilt from `spec.initial_state` on `device`."""

    agent_state, optimizer_state = from_bytes(spec.initial_state)
    agent = type(spec.config).agent_class(spec.spec, spec.config)
    agent.load_state_dict(agent_state)
    agent.to(device)
    # The learner's optimizer state (None: a fresh start); loading it moves the moments to the parameters' device.
    return agent, HeldOptimizerState(optimizer_state).build(agent, spec.config)


def _command_loop(commands: Any, trainer: _Trainer) -> None:
    """Hands the learner's commands to `trainer` one at a time, reporting idle while none comes, until the
    learner says stop or is gone (its end of the pipe closed)."""
    while True:
        trainer.report_idle()
        try:
            if not commands.poll(liveness.REPORT_INTERVAL_S):
                continue
            command = commands.recv()
        except EOFError:  # the learner is gone
            return
        if not trainer.handle(command):
            return


class _Trainer:
    """The child's agent and optimizer and its handling of one command at a time.

    Keeps the update count (`train_steps`), the batch slots, and the slowest update so far (it sets the next
    update's deadline, seed/training/liveness.py).
    """

    def __init__(self, spec: TrainingProcessSpec, links: TrainingLinks, progress: TrainingProgress, agent: Any,
                 optimizer: torch.optim.Optimizer, device: torch.device, shard: data_parallel.Shard | None):
        self.config = spec.config
        self.learner_pid = spec.learner_pid
        self.results, self.parameters, self.progress = links.results, links.parameters, progress
        self.agent, self.optimizer, self.device, self.shard = agent, optimizer, device, shard
        self.train_steps = spec.train_steps
        self.timeout_s = spec.config.training_process_timeout_s
        self.fault = TrainingFault.from_environment()
        self.slowest_update_s = 0.0
        self.lock_wait_reported = -1  # the update whose long wait for the lock was reported
        self.slots: list[Unroll] = []
        self.preparation = links.preparation
        self.preparation_version = agent.preparation_network()[1] if self.preparation is not None else -1
        self.idle_since: float | None = None  # when the last command was done (None before the first update)

    def report_idle(self) -> None:
        self.progress.report(liveness.IDLE, self.train_steps, self.timeout_s)

    def handle(self, command: tuple) -> bool:
        """Carries out one command; False once told to stop."""
        kind = command[0]
        if kind == "slots":
            self.slots = command[1]
        elif kind == "batch":  # (batch, slot, weights[, (the preparation's version, its metrics)])
            _, slot, importance_weights, *prepared = command
            self._train(slot, importance_weights, *prepared)
        elif kind == "state":
            self._send_state()
        elif kind == "stop":
            return False
        else:
            raise ValueError(f"training process command: got {kind!r}, expected slots, batch, state or stop")
        if kind == "batch":
            self.idle_since = time.perf_counter()
        return True

    def _train(self, slot: int, importance_weights: np.ndarray | None,
               prepared: tuple[int, dict[str, float]] | None = None) -> None:
        """One update on the batch in `slot`; rank 0 then publishes it (ranks 1..N-1 only train). `prepared`: the
        version of the parameters a batch worker prepared it with and the worker's metrics (None without workers).

        Logs training_process/batch_wait_ms (from the previous update's end to this one's start: the trainer's
        wait for a batch) and, with batch workers, batch_workers/staleness_updates (updates between the
        preparation's parameters and the parameters this update trains)."""
        waited_ms = None if self.idle_since is None else (time.perf_counter() - self.idle_since) * 1e3
        progress, fault = self.progress, self.fault
        progress.report(liveness.TRAINING, self.train_steps + 1, step_allowance_s(self.timeout_s,
                                                                                   self.slowest_update_s))
        if fault.due("step_hangs", self.train_steps + 1):
            fault.sleep_forever("training process")
        start = time.perf_counter()
        weights = None if importance_weights is None else torch.from_numpy(importance_weights).to(self.device)
        # Ranks: the last collective of the update (gradients, priorities) follows every rank's last read of the
        # slot, so rank 0's answer frees it for them all.
        result = train_on_batch(self.agent, self.optimizer,
                                TrainingBatch(self.slots[slot].to(self.device), weights), self.config,
                                self.train_steps, self.shard)
        step_ms = (time.perf_counter() - start) * 1e3
        if not result.trained:
            progress.report(liveness.WAITING_FOR_LEARNER, self.train_steps, math.inf)
            if self.results is not None:
                self.results.send(("dropped", slot))
            return
        self.train_steps += 1
        self.agent.after_update(self.train_steps)
        if self.shard is not None and self.train_steps % data_parallel.SYNC_CHECK_EVERY == 0:
            self.shard.check_in_sync(self.agent.network, self.train_steps)
        if self.results is None:  # ranks 1..N-1: rank 0 publishes
            return
        self.slowest_update_s = max(self.slowest_update_s, time.perf_counter() - start)
        result.values["training_process/step_ms"] = step_ms
        if waited_ms is not None:
            result.values["training_process/batch_wait_ms"] = waited_ms
        if prepared is not None:
            version, values = prepared
            result.values.update(values)
            result.values["batch_workers/staleness_updates"] = float(self.train_steps - 1 - version)
        if self.preparation is not None:
            self._write_preparation()
        priorities = None if result.priorities is None else result.priorities.detach().cpu().double().numpy()
        self._publish(slot, result.values, priorities)

    def _publish(self, slot: int, values: dict[str, float], priorities: np.ndarray | None) -> None:
        """Rank 0: the new parameters into the shared copy, then the update's report to the learner."""
        progress, fault, train_steps = self.progress, self.fault, self.train_steps
        progress.report(liveness.WAITING_FOR_LEARNER, train_steps, math.inf)
        publish_start = time.perf_counter()
        with self.parameters.writing(train_steps, self._wait_for_learner) as shared:
            progress.report(liveness.COPYING, train_steps, self.timeout_s)
            _copy_parameters(shared, self.agent.network)
            if fault.due("child_dies_writing", train_steps):
                self.results.send(("step", slot, train_steps, values, priorities))
                fault.sleep_forever("training process")
        values["publish_ms"] = (time.perf_counter() - publish_start) * 1e3
        progress.report(liveness.WAITING_FOR_LEARNER, train_steps, math.inf)
        self.results.send(("step", slot, train_steps, values, priorities))

    def _write_preparation(self) -> None:
        """Rank 0 with batch workers: the preparation network into its shared copy when its version changed."""
        network, version = self.agent.preparation_network()
        if version == self.preparation_version:
            return
        self.progress.report(liveness.COPYING, self.train_steps, self.timeout_s)  # a worker holds it for a copy
        with self.preparation.writing(version, lambda waited_s: None) as shared:
            _copy_parameters(shared, network)
        self.preparation_version = version

    def _wait_for_learner(self, waited_s: float) -> None:
        """While the learner holds the parameter lock: it is alive (else the kernel would have released the lock
        and killed us), so wait; say so once after `timeout_s`."""
        learner_pid = self.learner_pid
        if os.getppid() != learner_pid:  # no parent-death signal on this platform
            print(f"[training process] the learner (pid {learner_pid}) is gone: exiting", file=sys.stderr,
                  flush=True)
            os._exit(1)
        if waited_s >= self.timeout_s and self.lock_wait_reported != self.train_steps:
            self.lock_wait_reported = self.train_steps
            print(f"[training process] update {self.train_steps}: waiting {waited_s:.0f} s for the parameter lock, "
                  f"held by the learner (pid {learner_pid})", file=sys.stderr, flush=True)

    def _send_state(self) -> None:
        """The agent's and optimizer's state dicts, by value, to the learner (a checkpoint)."""
        self.progress.report(liveness.WRITING_STATE, self.train_steps, self.timeout_s)
        state = to_bytes(self.agent.state_dict(), self.optimizer.state_dict())
        self.progress.report(liveness.WAITING_FOR_LEARNER, self.train_steps, math.inf)
        self.results.send(("state", state))


class TrainingProcess:
    """The learner's side of the training process.

    Args:
      config, spec: the learner's.
      agent, optimizer: the learner's (resumed) agent and optimizer (or only its state: HeldOptimizerState, None
        for a fresh one); the child starts from their state.
      train_steps: updates made so far (the child numbers its updates on from here).
      next_batch: timeout_s -> TrainingBatch or None on the CPU (the FIFO experience's prefetched batches, or
        batches sampled from the replay).
      stop: the learner's stop event.
      depth: batch slots: batches the feeder can hand over before the child returns one (plus one per batch
        worker, each preparing one of them).

    With batch workers (`Agent.batch_workers(config)` > 0, seed/training/batch_workers.py) the feeder hands each
    batch to a worker, and a collector thread hands the prepared batch to the child.
    """

    def __init__(self, config: LearnerConfig, spec: EnvSpec, agent: Any,
                 optimizer: torch.optim.Optimizer | HeldOptimizerState,
                 train_steps: int, next_batch: Callable[[float], TrainingBatch | None], stop: threading.Event,
                 depth: int = 2):
        self._context = mp.get_context("spawn")
        self.parameters = SharedParameters(agent.network.state_dict(), train_steps)
        self.timeout_s = config.training_process_timeout_s
        self.progress = TrainingProgress(self.timeout_s)
        self._fault = TrainingFault.from_environment()
        child_commands, self._commands = self._context.Pipe(duplex=False)  # (receive end, send end)
        self._results, child_results = self._context.Pipe(duplex=False)
        self._child_ends = (child_commands, child_results)
        initial_state = to_bytes(agent.state_dict(), optimizer.state_dict())
        workers = type(config).agent_class.batch_workers(config)
        self.preparation = SharedParameters(agent.preparation_network()[0].state_dict(),
                                            agent.preparation_network()[1]) if workers else None
        self.workers = (BatchWorkers(config, spec, workers, self.preparation, self._context, self.timeout_s)
                        if workers else None)
        self._prepared_weights: dict[int, np.ndarray | None] = {}  # slot -> its batch's importance weights
        # --training_devices: ranks 1..N-1 are the learner's children too (they die with it); they meet rank 0
        # through a store served here.
        self.devices = data_parallel.parse_devices(config.training_devices) or [config.training_device]
        world = len(self.devices)
        self._store = data_parallel.serve_store(liveness.FIRST_UPDATE_FACTOR * self.timeout_s) if world > 1 else None
        port = 0 if self._store is None else self._store.port
        rank_zero = TrainingProcessSpec(config, spec, initial_state, train_steps, os.getpid(), 0, world, port)
        self.process = self._context.Process(
            target=_child_main, name="seed-training",
            args=(rank_zero, TrainingLinks(child_commands, child_results, self.parameters, self.progress,
                                           self.preparation)),
            daemon=True)
        self.ranks = [self.process]
        self._rank_commands = [self._commands]
        for rank in range(1, world):
            rank_commands, commands = self._context.Pipe(duplex=False)
            self._child_ends += (rank_commands,)
            self._rank_commands.append(commands)
            self.ranks.append(self._context.Process(
                target=_child_main, name=f"seed-training-rank{rank}",
                args=(dataclasses.replace(rank_zero, rank=rank), TrainingLinks(rank_commands)),
                daemon=True))
        self._next_batch = next_batch
        self._stop = stop
        self._depth = depth + workers
        self._slots: list[Unroll] = []
        self._free: queue.Queue[int] = queue.Queue()
        self._replay_keys: dict[int, tuple[object, object]] = {}  # slot -> its batch's (replay indices, generations)
        self._send_lock = threading.Lock()  # the feeder and the main thread both send commands
        self._states: list[tuple[dict, dict]] = []
        self.dropped_batches = 0
        self._stopped = False
        # --max_train_steps: the feeder hands over no more batches than updates are left, so the last
        # checkpoint is exactly that update's parameters (a batch dropped for its lag frees its place).
        self._batches_left = config.max_train_steps - train_steps if config.max_train_steps else None
        self._batches_sent = 0
        self.feeder = SupervisedThread(self._feed, "training-feeder")
        self.collector = SupervisedThread(self._collect, "batch-collector") if workers else None

    def threads(self) -> list[threading.Thread]:
        """The threads `start` starts, for the learner's watchdog."""
        return [self.feeder] if self.collector is None else [self.feeder, self.collector]

    def start(self) -> None:
        """Starts the child and the feeder. The child dies with the thread that calls this (its parent-death
        signal): call it from the thread that outlives the child (the learner's run)."""
        self.progress.report(liveness.STARTING, 0, liveness.FIRST_UPDATE_FACTOR * self.timeout_s)
        for process in self.ranks:
            process.start()
        # Our copies of the child's pipe ends: closed, so that the child's exit reads as EOF here and ours there.
        for end in self._child_ends:
            end.close()
        if self.workers is not None:
            self.workers.start()
            self.collector.start()
        self.feeder.start()

    def alive(self) -> bool:
        """Whether any training process (any rank) still runs."""
        return any(process.is_alive() for process in self.ranks)

    def needs_asking(self) -> bool:
        """Whether the current agent and optimizer state are the child's: True while it runs; False before it
        started and after `stop` (the learner's own copies are current then). Raises TrainingProcessDied if it
        ended any other way."""
        if self.process.pid is None or self._stopped:
            return False
        self._raise_if_a_rank_died()
        if not self.process.is_alive():
            raise TrainingProcessDied(f"training process exited with code {self.process.exitcode}: its state since "
                                      "the last checkpoint is lost")
        return True

    def _send(self, message: tuple) -> None:
        with self._send_lock:
            self._commands.send(message)

    def _send_all(self, message: tuple) -> None:
        """To every rank (rank 0 alone without --training_devices)."""
        with self._send_lock:
            for commands in self._rank_commands:
                commands.send(message)

    def _raise_if_a_rank_died(self) -> None:
        """--training_devices: raises TrainingProcessDied naming the first of ranks 1..N-1 that is gone (rank 0 then
        fails in its next collective, or waits in it)."""
        for rank, process in enumerate(self.ranks[1:], start=1):
            if process.pid is not None and not process.is_alive():
                process.join(timeout=5)
                raise TrainingProcessDied(
                    f"training rank {rank} of {len(self.ranks)} (pid {process.pid}, device {self.devices[rank]} of "
                    f"--training_devices) exited with code {process.exitcode} while the learner ran (its traceback, "
                    "if any, is above): data-parallel training cannot go on without it")

    def _feed(self) -> None:
        """Feeder thread: copies each prefetched batch into a free slot and tells the child."""
        while not self._stop.is_set():
            batch = self._next_batch(0.2)
            if batch is None:
                continue
            if not self._slots:
                self._slots = [batch.unrolls.map(lambda t: torch.empty_like(t, device="cpu").share_memory_())
                               for _ in range(self._depth)]
                self._send_all(("slots", self._slots))
                if self.workers is not None:
                    self.workers.send_slots(self._slots)
                for slot in range(self._depth):
                    self._free.put(slot)
            while not self._may_send() and not self._stop.is_set():
                time.sleep(0.05)
            slot = self._take_free_slot()
            if slot is None:
                return
            _copy_into(self._slots[slot], batch.unrolls)
            self._replay_keys[slot] = (batch.replay_indices, batch.replay_generations)
            weights = None if batch.importance_weights is None else batch.importance_weights.cpu().numpy()
            if self.workers is None:
                self._send_all(("batch", slot, weights))
            else:  # the collector sends it once prepared
                self._prepared_weights[slot] = weights
                if not self.workers.submit(slot, self.parameters.version, self._stop):
                    return
            self._batches_sent += 1

    def _collect(self) -> None:
        """Collector thread (batch workers): hands each prepared batch to the child, with the version of the
        parameters it was prepared with and the worker's metrics."""
        while not self._stop.is_set():
            prepared = self.workers.next_prepared(0.2)
            if prepared is None:
                continue
            slot, version, values = prepared
            self._send_all(("batch", slot, self._prepared_weights.pop(slot), (version, values)))

    def _may_send(self) -> bool:
        return self._batches_left is None or self._batches_sent - self.dropped_batches < self._batches_left

    def _take_free_slot(self) -> int | None:
        while not self._stop.is_set():
            try:
                return self._free.get(timeout=0.1)
            except queue.Empty:
                continue
        return None

    def receive(self, timeout_s: float) -> list[TrainingUpdate]:
        """Main thread: each update the child finished, waiting up to `timeout_s` for the first; frees their
        slots. Raises TrainingProcessDied if the child is gone."""
        updates = []
        wait = timeout_s
        while True:
            try:
                if not self._results.poll(wait):
                    break
                message = self._results.recv()
            except (EOFError, OSError):
                self.process.join(timeout=5)
                self._raise_if_a_rank_died()
                raise TrainingProcessDied(f"training process exited with code {self.process.exitcode} while the "
                                          f"learner ran (its traceback, if any, is above)") from None
            wait = 0.0
            kind = message[0]
            if kind == "step":
                _, slot, version, values, priorities = message
                indices, generations = self._replay_keys.pop(slot)  # before the slot is free for the feeder
                self._free.put(slot)
                updates.append(TrainingUpdate(version, values, priorities, indices, generations))
            elif kind == "dropped":
                self._replay_keys.pop(message[1])
                self._free.put(message[1])
                self.dropped_batches += 1
            elif kind == "state":
                # Stop here: updates the child made after this state stay in the pipe, so a checkpoint's counters
                # (the updates recorded so far) are exactly its state's.
                self._states.append(from_bytes(message[1]))
                break
        self._check_progress()
        return updates

    def read_parameters(self, publish: Callable[[dict[str, torch.Tensor], int], None]) -> int:
        """Main thread: calls `publish(parameters, version)` with the newest parameters the child wrote and their
        version, under the parameter lock (the child waits for it to write its next update); returns the version.
        Raises TrainingProcessDied if the child died halfway through writing them, TrainingProcessHung if it holds
        the lock past its deadline."""
        try:
            with self.parameters.reading(self._waiting_for_lock) as (parameters, version):
                if self._fault.due("learner_holds_lock", version):
                    self._fault.sleep_forever("learner")
                publish(parameters, version)
        except ParametersHalfWritten as error:
            self.process.join(timeout=5)
            raise TrainingProcessDied(
                f"training process (pid {self.process.pid}) died while writing the parameters of update "
                f"{error.version + 1} (exit code {self.process.exitcode}): the shared copy is half-written, nothing "
                "of it was published") from None
        return version

    def _waiting_for_lock(self, waited_s: float) -> None:
        self._check_progress()
        if waited_s > self.timeout_s:  # a copy takes milliseconds; the child's own deadline should have come first
            self._end_hung(f"holding the parameter lock for {waited_s:.1f} s")

    def _check_progress(self) -> None:
        """Raises TrainingProcessHung (after killing the child) if the child is past its deadline."""
        if self.process.pid is None or self._stopped:
            return
        self._raise_if_a_rank_died()
        if self.workers is not None:
            try:
                self.workers.check()
            except BatchWorkerDied as error:
                raise TrainingProcessDied(str(error)) from None
        reason = self.progress.overdue()
        if reason is not None:
            if not self.process.is_alive():
                self.process.join(timeout=5)
                raise TrainingProcessDied(f"training process exited with code {self.process.exitcode} while the "
                                          f"learner ran (its traceback, if any, is above)")
            self._end_hung(reason)

    def _end_hung(self, reason: str) -> None:
        pid = self.process.pid
        print(f"[learner] the training process (pid {pid}) is hung: {reason}. Its threads' stacks follow, then it is "
              "killed.", file=sys.stderr, flush=True)
        try:
            os.kill(pid, signal.SIGUSR2)  # faulthandler in the child: every thread's stack to stderr
            time.sleep(1.0)
        except ProcessLookupError:
            pass
        for process in self.ranks:  # ranks 1..N-1 (rank 0 waited on them, or they on it) go with it
            process.kill()
            process.join(timeout=5)
        raise TrainingProcessHung(f"training process (pid {pid}) hung: {reason}; limit from "
                                  f"--training_process_timeout_s={self.timeout_s:g}; killed it (exit code "
                                  f"{self.process.exitcode})")

    def state(self, on_updates: Callable[[list[TrainingUpdate]], None]) -> tuple[dict, dict]:
        """(agent state dict, optimizer state dict) of the child as of now; updates that arrive meanwhile go to
        `on_updates`, as from `receive`."""
        self._send(("state",))
        deadline = time.monotonic() + _STATE_TIMEOUT_S
        while not self._states:
            if time.monotonic() > deadline:
                raise TrainingProcessDied(f"training process sent no state within {_STATE_TIMEOUT_S:.0f} s")
            updates = self.receive(0.2)
            if updates:
                on_updates(updates)
        return self._states.pop(0)

    def stop(self) -> None:
        """Ends the feeder (the learner's stop event is set) and the child (it finishes the update it is in)."""
        self._stopped = True
        if self.feeder.ident is not None:
            self.feeder.join(timeout=10)
        if self.workers is not None:
            if self.collector.ident is not None:
                self.collector.join(timeout=10)
            self.workers.stop()
        for process, commands in zip(self.ranks, self._rank_commands, strict=True):
            if process.is_alive():
                try:
                    commands.send(("stop",))
                except (BrokenPipeError, OSError):
                    pass
        for process in self.ranks:
            if process.pid is None:
                continue
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
                process.join(timeout=5)
        for end in (*self._rank_commands, self._results):
            end.close()
        if not self.process.is_alive():
            self.parameters.close()
            if self.preparation is not None:
                self.preparation.close()


def _copy_into(target: Unroll, source: Unroll) -> None:
    """Copies a batch into a slot of the same fields and shapes; a mismatch names the field."""
    for name, tensors in (("steps", (target.steps, source.steps)), ("initial_state",
                                                                   (target.initial_state, source.initial_state))):
        into, values = tensors
        if set(into) != set(values):
            raise ValueError(f"training batch {name}: got fields {sorted(values)}, expected {sorted(into)} "
                             "(the first batch's)")
        for key, value in values.items():
            if into[key].shape != value.shape:
                raise ValueError(f"training batch {name}.{key}: got shape {tuple(value.shape)}, expected "
                                 f"{tuple(into[key].shape)} (the first batch's)")
            into[key].copy_(value)
    target.env_id.copy_(source.env_id)
