"""--training_process: the optimizer steps in a process of their own, so training never holds the GIL that the
learner's inference thread needs.

    learner process                                      training process (spawned)
      prefetcher: time-major batches  --feeder thread-->   batch slots (shared memory, `depth` of them)
                                      ("batch", slot) ->   train_on_batch on the slot's tensors, in place
      main thread: metrics, publish  <- ("step", slot,     parameters (shared memory, under `lock`)
                   to inference          version, values)
      checkpoint                      ("state",) ------>   agent and optimizer state dicts, pickled back

Parameters travel through one shared copy of the network's state dict: the training process writes it under
`lock` after every update, the learner's main thread reads it under the same lock into each inference device's
staging (seed/parameters.py) when the update's message arrives. Batch slots are allocated from the first batch
(its fields and shapes are what every later batch must have) and handed to the child once.

The child ends when its command pipe closes (the learner exited, however), and the learner ends loudly when the
child dies: `receive` raises `TrainingProcessDied` with its exit code, and the child's traceback is on stderr.
R2D2's replay stays in the learner process: the feeder samples it, sends each batch's importance weights with
its slot, and keeps the slot's replay indices and generations; the child returns the new priorities with the
update, and the learner's main thread writes them into the replay (`TrainingUpdate`).
"""

from __future__ import annotations

import dataclasses
import io
import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.multiprocessing as mp

from seed.config import LearnerConfig
from seed.envs.base import EnvSpec
from seed.parameters import copy_tensors
from seed.supervisor import SupervisedThread
from seed.training import make_optimizer, train_on_batch
from seed.unroll import TrainingBatch, Unroll

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


def _copy_parameters(targets: dict[str, torch.Tensor], network: torch.nn.Module) -> None:
    """The network's state dict (any device) into the shared host copy."""
    with torch.no_grad():
        state = network.state_dict()
        copy_tensors(list(targets.values()), [state[name] for name in targets])


def to_bytes(agent_state: dict, optimizer_state: dict) -> bytes:
    """Agent and optimizer state dicts by value: no tensor of the sender's is shared with the receiver (a
    pickled CPU tensor would be moved to shared memory and keep changing under a checkpoint being written)."""
    buffer = io.BytesIO()
    torch.save({"agent": agent_state, "optimizer": optimizer_state}, buffer)
    return buffer.getvalue()


def from_bytes(data: bytes) -> tuple[dict, dict]:
    """(agent state dict, optimizer state dict) from `to_bytes`, on the CPU."""
    state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    return state["agent"], state["optimizer"]


def _child_main(config: LearnerConfig, spec: EnvSpec, initial_state: bytes, train_steps: int,
                parameters: dict[str, torch.Tensor], lock, commands, results) -> None:
    """The training process: trains on each batch slot it is sent and publishes after every update."""
    from seed.agents import agent_module
    from seed.host_memory import keep_freed_memory

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the learner decides when to stop (Ctrl-C reaches the group)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    torch.set_num_threads(config.torch_threads or os.cpu_count() or 1)
    if config.keep_freed_memory:
        keep_freed_memory()
    torch.manual_seed(config.seed + 1)
    device = torch.device(config.training_device)
    agent_state, optimizer_state = from_bytes(initial_state)
    agent = agent_module(config.agent).Agent(spec, config)
    agent.load_state_dict(agent_state)
    agent.to(device)
    optimizer = make_optimizer(agent, config)
    optimizer.load_state_dict(optimizer_state)  # moves the moments to the parameters' device
    slots: list[Unroll] = []
    while True:
        try:
            command = commands.recv()
        except EOFError:  # the learner is gone
            return
        kind = command[0]
        if kind == "slots":
            slots = command[1]
        elif kind == "batch":
            _, slot, importance_weights = command
            start = time.perf_counter()
            weights = None if importance_weights is None else torch.from_numpy(importance_weights).to(device)
            result = train_on_batch(agent, optimizer, TrainingBatch(slots[slot].to(device), weights), config,
                                    train_steps)
            if not result.trained:
                results.send(("dropped", slot))
                continue
            step_ms = (time.perf_counter() - start) * 1e3
            train_steps += 1
            agent.after_update(train_steps)
            publish_start = time.perf_counter()
            with lock:
                _copy_parameters(parameters, agent.network)
            result.values["publish_ms"] = (time.perf_counter() - publish_start) * 1e3
            result.values["training_process/step_ms"] = step_ms
            priorities = (None if result.priorities is None
                          else result.priorities.detach().cpu().double().numpy())
            results.send(("step", slot, train_steps, result.values, priorities))
        elif kind == "state":
            results.send(("state", to_bytes(agent.state_dict(), optimizer.state_dict())))
        elif kind == "stop":
            return
        else:
            raise ValueError(f"training process command: got {kind!r}, expected slots, batch, state or stop")


class TrainingProcess:
    """The learner's side of the training process.

    Args:
      config, spec: the learner's.
      agent, optimizer: the learner's (resumed) agent and optimizer; the child starts from their state.
      train_steps: updates made so far (the child numbers its updates on from here).
      next_batch: timeout_s -> TrainingBatch or None on the CPU (the FIFO experience's prefetched batches, or
        batches sampled from the replay).
      stop: the learner's stop event.
      depth: batch slots: batches the feeder can hand over before the child returns one.
    """

    def __init__(self, config: LearnerConfig, spec: EnvSpec, agent: Any, optimizer: torch.optim.Optimizer,
                 train_steps: int, next_batch: Callable[[float], TrainingBatch | None], stop: threading.Event,
                 depth: int = 2):
        self._context = mp.get_context("spawn")
        self.parameters = {name: tensor.detach().to("cpu", copy=True).share_memory_()
                           for name, tensor in agent.network.state_dict().items()}
        self.lock = self._context.Lock()
        child_commands, self._commands = self._context.Pipe(duplex=False)  # (receive end, send end)
        self._results, child_results = self._context.Pipe(duplex=False)
        self._child_ends = (child_commands, child_results)
        self.process = self._context.Process(
            target=_child_main, name="seed-training",
            args=(config, spec, to_bytes(agent.state_dict(), optimizer.state_dict()), train_steps, self.parameters,
                  self.lock, child_commands, child_results),
            daemon=True)
        self._next_batch = next_batch
        self._stop = stop
        self._depth = depth
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

    def start(self) -> None:
        self.process.start()
        # Our copies of the child's pipe ends: closed, so that the child's exit reads as EOF here and ours there.
        for end in self._child_ends:
            end.close()
        self.feeder.start()

    def alive(self) -> bool:
        return self.process.is_alive()

    def needs_asking(self) -> bool:
        """Whether the current agent and optimizer state are the child's: True while it runs; False before it
        started and after `stop` (the learner's own copies are current then). Raises TrainingProcessDied if it
        ended any other way."""
        if self.process.pid is None or self._stopped:
            return False
        if not self.process.is_alive():
            raise TrainingProcessDied(f"training process exited with code {self.process.exitcode}: its state since "
                                      "the last checkpoint is lost")
        return True

    def _send(self, message: tuple) -> None:
        with self._send_lock:
            self._commands.send(message)

    def _feed(self) -> None:
        """Feeder thread: copies each prefetched batch into a free slot and tells the child."""
        while not self._stop.is_set():
            batch = self._next_batch(0.2)
            if batch is None:
                continue
            if not self._slots:
                self._slots = [batch.unrolls.map(lambda t: torch.empty_like(t, device="cpu").share_memory_())
                               for _ in range(self._depth)]
                self._send(("slots", self._slots))
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
            self._send(("batch", slot, weights))
            self._batches_sent += 1

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
        return updates

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
        if self.process.is_alive():
            try:
                self._send(("stop",))
            except (BrokenPipeError, OSError):
                pass
            self.process.join(timeout=30)
            if self.process.is_alive():
                self.process.kill()
                self.process.join(timeout=5)
        for end in (self._commands, self._results):
            end.close()


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
