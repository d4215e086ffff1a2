"""Central inference for one device: slab rows in, actions out, steps into the unroll store.

`CentralInference.run_batch(actors, seqs)` is the learner's hot path. Per batch it does a fixed number of
vectorised operations, whatever the number of actors or envs: drop outdated requests and answer stale ones,
gather the ready rows of the step slab into a (pinned) staging buffer and check that no slot changed meanwhile,
reset the rows of new actor runs, copy the rows to the device once, run the policy (the agent's `act` between a
state gather and scatter; replayed as a CUDA graph on GPUs), copy actions and outputs back once, answer the
actors, and only then append the step to the unroll store and hand completed unrolls to the experience thread.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from seed.contracts import FinishedEpisodes, InferenceBatch
from seed.contracts.storage import to_torch
from seed.contracts.training import Unroll
from seed.inference.forward_pass import EagerPolicy, GraphedPolicy
from seed.inference.parameter_publisher import ParameterPublisher
from seed.inference.rollout_gate import RolloutGate
from seed.inference.state_table import StateTable
from seed.inference.unroll_store import UnrollStore
from seed.transport.notify import RequestBatcher
from seed.transport.slab import REPLY_FAILED, REPLY_INVALID, REPLY_OK, REPLY_STALE, StepSlab
from seed.transport.wire import (
    WireError,
    check_observation_values,
    check_step_values,
    invalid_observations,
    invalid_step_values,
)

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class InferenceModel:
    """What acts on one device and how its forward pass runs.

    agent: has `act(network, batch: InferenceBatch, state) -> ActOutput` and `initial_state(n)`.
    network: the inference copy of the agent's network, on `device`.
    policy_version: the version of `network`'s parameters (the learner's train_steps); every step records the
      version it was acted with (step field `policy_version`).
    cuda_graphs: replay the policy as CUDA graphs (GPU only).
    row_by_row: run the policy one env row at a time (`--deterministic`, see seed/inference/forward_pass.py).
    """

    agent: Any
    network: torch.nn.Module
    device: torch.device
    policy_version: int = 0
    cuda_graphs: bool = False
    row_by_row: bool = False


@dataclasses.dataclass(frozen=True)
class UnrollLayout:
    """The unrolls the per-env unroll store cuts: `burn_in + unroll_length + 1` steps each
    (seed/inference/unroll_store.py)."""

    unroll_length: int
    burn_in: int = 0


@dataclasses.dataclass(frozen=True)
class InferenceOutputs:
    """Where a batch's results go besides the slab's action rows.

    reply: actors int64 [n] -> None; tells whoever holds those slots (a serving-process stream or an shm actor)
      that they hold a reply.
    sink: receives the unrolls each batch completes, as one time-major batch; may block (queue back-pressure).
    on_episodes: receives the episodes finished in each batch.
    on_batch: (rows, learner-side latencies in seconds) of each batch.
    on_timing: {stage: milliseconds} of each batch (see `CentralInference._serve`).
    """

    reply: Callable[[np.ndarray], None]
    sink: Callable[[Unroll], None]
    on_episodes: Callable[[FinishedEpisodes], None]
    on_batch: Callable[[int, list[float]], None]
    on_timing: Callable[[dict[str, float]], None] = lambda timing: None


@dataclasses.dataclass
class _Requests:
    """The live requests of one batch and the values copied out of their slab rows (observations are in the
    staging buffer's first `len(env_ids)` rows).

    actors, seqs, runs: int64 [n], in arrival order. arrivals: float64 [n], monotonic seconds. env_ids: int64
    [n * K], the actors' rows actor by actor. reward: float32 [n * K]; done, truncated: bool [n * K].
    prev_action: int64 [n * K] (Box: float32 [n * K, D]), each row's previous action (set once new runs are reset).
    """

    actors: np.ndarray
    seqs: np.ndarray
    runs: np.ndarray
    arrivals: np.ndarray
    env_ids: np.ndarray
    reward: np.ndarray
    done: np.ndarray
    truncated: np.ndarray
    prev_action: np.ndarray | None = None
    observation: np.ndarray | None = None  # `--sync_lag=0`'s staged requests only: their own copy [n * K, ...]


class _GateBookkeeping:
    """Every call a batch makes on the `--sync=hts` rollout gate (seed/inference/rollout_gate.py), and what happens
    instead
    without one (`gate` None): which requests are served, which parameters a batch acts with, which rollout a
    served step completes, and the rollouts played again when their steps were lost. (Opening the sync point is
    `CentralInference.release_held`.)"""

    def __init__(self, gate: RolloutGate | None, parameters: ParameterPublisher):
        self.gate = gate
        self.parameters = parameters

    def admit(self, actors: np.ndarray, seqs: np.ndarray, runs: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The requests to serve now; the gate holds those at its sync point."""
        if self.gate is None:
            return actors, seqs, runs
        return self.gate.admit(actors, seqs, runs)

    def policy_version(self) -> int:
        """The version the next batch acts with. Without a gate, the newest published one is applied first;
        with a gate, parameters change only at sync points (`release_held`)."""
        if self.gate is None:
            self.parameters.refresh()
        return self.parameters.applied

    def stepped(self, actors: np.ndarray) -> object | None:
        """After the actors got their actions: the rollout their steps completed, if any (gate only)."""
        return None if self.gate is None else self.gate.stepped(actors)

    def start_over(self, actors: np.ndarray, completed_rollout: object | None) -> None:
        """The actors' steps were lost: with a gate, their lost unrolls are played again, or a batch would lack
        them."""
        if self.gate is not None:
            self.gate.start_over(actors, completed_rollout)


class CentralInference:
    """Owns the state table, unroll store and inference network of one device.

    Args:
      model: the agent and the inference network on its device (`InferenceModel`).
      slab: the step slab the serving process writes (num_actors x envs_per_actor rows).
      unrolls: the unroll length and burn-in of the unroll store.
      outputs: replies, completed unrolls, finished episodes and timings (`InferenceOutputs`); kept as the
        attributes `reply`, `sink`, `on_episodes`, `on_batch`, `on_timing`.
      rollout_gate: `--sync=hts`: holds actors at rollout boundaries and applies new parameters only there
        (seed/inference/rollout_gate.py); None applies every published version before the next batch.
    """

    def __init__(self, model: InferenceModel, slab: StepSlab, unrolls: UnrollLayout, outputs: InferenceOutputs,
                 rollout_gate: RolloutGate | None = None):
        agent, network, device = model.agent, model.network, model.device
        self.agent = agent
        self.network = network
        self.device = device
        self.slab = slab
        self.k = slab.envs_per_actor
        num_envs = slab.layout.num_envs
        self.state_table = StateTable(agent.initial_state, num_envs, device)
        self.unroll_store = UnrollStore(num_envs, unrolls.unroll_length, unrolls.burn_in)
        self.reply = outputs.reply
        self.sink = outputs.sink
        self.on_episodes = outputs.on_episodes
        self.on_batch = outputs.on_batch
        self.on_timing = outputs.on_timing
        self.actor_run = np.zeros(slab.layout.num_actors, np.int64)  # run whose rows the tables hold; 0 = none
        # Actions on the learner (EnvSpec.batch_action_dtype): int64 [B] indices, or float32 [B, D] for a Box.
        self.action_shape = slab.layout.action_shape
        action_dtype = np.float32 if self.action_shape else np.int64
        self.prev_action = np.zeros((num_envs, *self.action_shape), action_dtype)
        self.parameters = ParameterPublisher(network, device, model.policy_version)
        self.gate = rollout_gate
        self._staged: dict[int, _Requests] = {}  # --sync_lag=0: actor -> its stored, unanswered boundary step
        self._gating = _GateBookkeeping(rollout_gate, self.parameters)
        # A high-priority stream: inference kernels are scheduled ahead of the training step's waiting blocks.
        self.stream = torch.cuda.Stream(device, priority=-1) if device.type == "cuda" else None
        # The slab's observations as a tensor (unsigned types reinterpreted) and a staging buffer the ready
        # rows are gathered into: pinned on GPUs, so the copy to the device is one asynchronous DMA.
        self._observations = to_torch(slab.observation)
        pin = device.type == "cuda"
        self._staging = torch.empty_like(self._observations, pin_memory=pin)
        self._observations_np, self._staging_np = self._observations.numpy(), self._staging.numpy()
        self._inputs_host = {name: torch.zeros((num_envs, *shape), dtype=dtype, pin_memory=pin)
                             for name, dtype, shape in (("env_ids", torch.int64, ()),
                                                        ("prev_action", torch.from_numpy(self.prev_action).dtype,
                                                         self.action_shape),
                                                        ("reward", torch.float32, ()), ("done", torch.bool, ()))}
        self._inputs_np = {name: tensor.numpy() for name, tensor in self._inputs_host.items()}
        policy_args = (agent, network, self.state_table, device)
        if model.cuda_graphs and pin:
            self.policy = GraphedPolicy(*policy_args, self.k)
        else:
            self.policy = EagerPolicy(*policy_args, row_by_row=model.row_by_row)

    def publish(self, parameters: dict[str, torch.Tensor], version: int | None = None) -> None:
        """Hands new parameters (a state dict on any device) to this device's network, without stalling it;
        `version` is the learner's train_steps after the update (default: one more than the last)."""
        self.parameters.publish(parameters, version)

    def run_batch(self, actors: np.ndarray, seqs: np.ndarray) -> None:
        """Serves the requests (actor slot, sequence number) that the batcher grouped; replies to each."""
        if self.stream is not None:
            with torch.cuda.stream(self.stream):
                self._run_batch(actors, seqs)
        else:
            self._run_batch(actors, seqs)

    def release_held(self) -> bool:
        """`--sync=hts`: opens the sync point if every actor waits at it and the next rollout's parameters are
        published; applies exactly those and serves the held requests. Whether it opened."""
        if self.gate is None:
            return False
        # A held request of a superseded run does not count; it is answered stale, which frees its slot for the
        # new run's first step (the gate then waits for that run to play the rollout).
        superseded = self.gate.drop_superseded(self.slab.live_run)
        if len(superseded[0]):
            self._requests(*superseded)
            for actor in superseded[0].tolist():
                self._staged.pop(actor, None)
        if self.gate.lag == 0 and self.gate.held:
            self._stage(*self.gate.take_held())
        batches = self.gate.try_open(self.parameters.published, self.slab.live_run)
        if batches is None:
            return False
        self.parameters.refresh()
        if self.parameters.applied != self.gate.needed_version - 1:
            raise RuntimeError(f"policy version: got {self.parameters.applied} after the sync point, expected "
                               f"{self.gate.needed_version - 1}")
        for actors, seqs in batches:
            if self.gate.lag == 0:
                self._answer_staged(actors, seqs)
            else:
                self.run_batch(actors, seqs)
        return True

    def _stage(self, actors: np.ndarray, seqs: np.ndarray) -> None:
        """`--sync_lag=0`: stores the held requests' steps (observation, reward, done; no action yet), which
        completes the actors' unrolls of the rollout that just ended, and keeps their inputs to act on at the
        opening (`_answer_staged`). A step the unroll store refuses is served at once instead: its actor plays the
        rollout again from its start, as after any lost step (`_store`)."""
        actors, seqs, runs = self._requests(actors, seqs)
        if not len(actors):
            return
        requests = self._read(actors, seqs, runs)
        if requests is None:
            return
        b = self._assemble(requests)
        env_ids = requests.env_ids
        state_before = self.state_table.gather(torch.from_numpy(env_ids).to(self.device))
        observation = self._staging_np[:b].copy()
        step = _observed_fields(requests, torch.from_numpy(observation), self.parameters.applied)
        try:
            completed = self.unroll_store.append(torch.from_numpy(env_ids), step, state_before, complete=False)
        except Exception:  # the gate has not counted the step: the actors replay the rollout they owe
            log.exception("unroll store failed; actors %s start over with fresh rows", requests.actors.tolist())
            self.actor_run[requests.actors] = 0
            self.gate.start_over(requests.actors, np.zeros(len(requests.actors), bool))
            self.run_batch(requests.actors, requests.seqs)
            return
        self.gate.stage(requests.actors, requests.seqs, requests.runs)
        for i, actor in enumerate(requests.actors.tolist()):
            rows = slice(i * self.k, (i + 1) * self.k)
            self._staged[actor] = _Requests(
                requests.actors[i:i + 1], requests.seqs[i:i + 1], requests.runs[i:i + 1],
                requests.arrivals[i:i + 1], env_ids[rows], requests.reward[rows], requests.done[rows],
                requests.truncated[rows], requests.prev_action[rows], observation=observation[rows])
        if completed is not None:
            self.sink(completed)  # may block: back-pressure from the training side

    def _answer_staged(self, actors: np.ndarray, seqs: np.ndarray) -> None:
        """`--sync_lag=0`, at the opening: acts on the staged steps of `actors` (in actor order) with the new
        parameters, answers them, and writes the actions and outputs into their stored steps."""
        staged = [self._staged.pop(actor) for actor in actors.tolist()]
        requests = _Requests(*(np.concatenate([getattr(r, f.name) for r in staged])
                               for f in dataclasses.fields(_Requests)))
        b = len(requests.env_ids)
        self._staging_np[:b] = requests.observation
        for name in ("env_ids", "prev_action", "reward", "done"):
            self._inputs_np[name][:b] = getattr(requests, name)
        version = self.parameters.applied
        try:
            action, outputs, _ = self._act(b)
            self._write_back(requests, action)
        except Exception:
            answered = self.slab.reply_seq[requests.actors] == requests.seqs
            self._answer(requests.actors[~answered], requests.seqs[~answered], REPLY_FAILED)
            raise
        self.on_batch(b, request_latencies_s(time.monotonic(), requests.arrivals))
        self.unroll_store.complete_last(torch.from_numpy(requests.env_ids), {
            "action": action, "policy_version": torch.full((b,), version, dtype=torch.int64), **outputs})

    def _env_ids(self, actors: np.ndarray) -> np.ndarray:
        """int64 [n * K]: the rows of `actors`, actor by actor."""
        return (actors[:, None] * self.k + np.arange(self.k)).reshape(-1)

    def _requests(self, actors: np.ndarray, seqs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The live requests (actors, seqs, runs), one per slot, in arrival order.

        Drops notifications that outlived their request (the slot holds a newer one, or one being written),
        re-wakes slots whose request was answered already (a new serving process notifies again the request its
        predecessor left), and answers stale requests (their actor run was replaced) without reading their rows.
        The run of each request is read here, once, after its sequence number (see `_serve`).
        """
        slab = self.slab
        pending = seqs == slab.request_seq[actors]
        answered = pending & (slab.reply_seq[actors] == seqs)
        if answered.any():
            self.reply(np.unique(actors[answered]))  # the reply is in the slab already: wake its reader again
        current = pending & ~answered
        actors, seqs = actors[current], seqs[current]
        # One request per slot (the newest), in arrival order.
        _, last = np.unique(actors[::-1], return_index=True)
        keep = np.sort(len(actors) - 1 - last)
        actors, seqs = actors[keep], seqs[keep]
        runs = slab.request_run[actors]
        stale = slab.live_run[actors] != runs
        if stale.any():
            self._answer(actors[stale], seqs[stale], REPLY_STALE)
        return actors[~stale], seqs[~stale], runs[~stale]

    def _answer(self, actors: np.ndarray, seqs: np.ndarray, status: int) -> None:
        self.slab.reply_status[actors] = status
        self.slab.reply_seq[actors] = seqs
        self.reply(actors)

    def _run_batch(self, actors: np.ndarray, seqs: np.ndarray) -> None:
        actors, seqs, runs = self._requests(actors, seqs)
        actors, seqs, runs = self._gating.admit(actors, seqs, runs)
        if not len(actors):
            return
        try:
            served = self._serve(actors, seqs, runs)
        except Exception:
            answered = self.slab.reply_seq[actors] == seqs
            self._answer(actors[~answered], seqs[~answered], REPLY_FAILED)
            raise
        if served is None:
            return
        completed, timing = served
        start = time.perf_counter()
        if completed is not None:
            self.sink(completed)  # may block: back-pressure from the training side
        timing["inference/sink_ms"] = (time.perf_counter() - start) * 1e3
        self.on_timing(timing)

    def _gather(self, actors: np.ndarray, env_ids: np.ndarray) -> tuple[np.ndarray, ...]:
        """Copies the requests' slab rows out: observations into the staging buffer's first rows, and
        (arrival_s [n], reward [B], done [B], truncated [B]) returned."""
        slab = self.slab
        # One row memcpy per env with NumPy: torch's index_select here woke the intra-op thread pool on every
        # batch and cost 40% of the inference thread beside a training step (H100 profile, R2D2 Pong).
        np.take(self._observations_np, env_ids, axis=0, out=self._staging_np[:len(env_ids)], mode="clip")
        return slab.arrival_s[actors], slab.reward[env_ids], slab.done[env_ids], slab.truncated[env_ids]

    def _invalid(self, actors: np.ndarray, seqs: np.ndarray, observation: np.ndarray, reward: np.ndarray,
                 done: np.ndarray, truncated: np.ndarray) -> np.ndarray:
        """bool [n]: the requests whose copied values fail `wire.check_step_values` (rewards float32 [n * K],
        done and truncated bool [n * K]) or `wire.check_observation_values` (observations [n * K, ...]: a NaN or
        an inf); each is answered REPLY_INVALID with the check's message."""
        k = self.k
        invalid = invalid_step_values(reward, done, truncated).reshape(-1, k).any(axis=1)
        invalid |= invalid_observations(observation, k)
        if not invalid.any():
            return invalid
        for i in np.flatnonzero(invalid).tolist():
            rows = slice(i * k, (i + 1) * k)
            try:
                check_step_values(reward[rows], done[rows], truncated[rows])
                check_observation_values(observation[rows])
                message = ("step: got values that fail the step checks, expected finite rewards and observations "
                           "and 0/1 flags")
            except WireError as error:
                message = str(error)
            self.slab.set_error(int(actors[i]), message)
            log.warning("actor %d: invalid request %d rejected: %s", actors[i], seqs[i], message)
        self._answer(actors[invalid], seqs[invalid], REPLY_INVALID)
        return invalid

    def _serve(self, actors: np.ndarray, seqs: np.ndarray, runs: np.ndarray
               ) -> tuple[Unroll | None, dict[str, float]] | None:
        """Serves live requests; returns the completed unrolls (a time-major batch, or None) and the milliseconds
        spent per stage: prepare (slab rows to staging), policy (to the device, forward, results back), reply,
        store (unroll store).
        None if every request's slot changed while its rows were read."""
        clock = [time.perf_counter()]
        requests = self._read(actors, seqs, runs)
        if requests is None:
            return None
        b = self._assemble(requests)
        version = self._gating.policy_version()
        clock.append(time.perf_counter())
        acted = self._act(b)
        clock.append(time.perf_counter())
        # Answer first: everything below is bookkeeping the actors need not wait for.
        self._write_back(requests, acted[0])
        completed_rollout = self._gating.stepped(requests.actors)
        self.on_batch(b, request_latencies_s(time.monotonic(), requests.arrivals))
        clock.append(time.perf_counter())
        completed = self._store(requests, acted, version, completed_rollout)
        clock.append(time.perf_counter())
        stages = ("prepare", "policy", "reply", "store")
        return completed, {f"inference/{name}_ms": (clock[i + 1] - clock[i]) * 1e3 for i, name in enumerate(stages)}

    def _read(self, actors: np.ndarray, seqs: np.ndarray, runs: np.ndarray) -> _Requests | None:
        """Copies the requests' slab rows out (observations into the staging buffer) and drops the requests that
        must not become steps; None if none is left."""
        slab, k = self.slab, self.k
        env_ids = self._env_ids(actors)
        arrivals, reward, done, truncated = self._gather(actors, env_ids)
        # Seqlock-style check: a slot whose sequence number or run changed since `_requests` read them was
        # rewritten while we copied it (the serving protocol rules it out; a copy torn between two runs must
        # still never become a step). Its new request has a notification of its own; this one is dropped.
        changed = (slab.request_seq[actors] != seqs) | (slab.request_run[actors] != runs)
        # Rows an shm actor wrote itself were never decoded by the serving process: the values it checks are
        # checked here, on our copies (so the actor cannot change them after the check), and a bad request is
        # answered REPLY_INVALID with the reason instead of becoming a step.
        observation = self._staging_np[:len(env_ids)]
        invalid = self._invalid(actors, seqs, observation, reward, done, truncated) & ~changed
        dropped = changed | invalid
        if dropped.any():
            rows = np.repeat(~dropped, k)
            kept = int(rows.sum())
            self._staging_np[:kept] = self._staging_np[:len(rows)][rows]
            actors, seqs, runs, arrivals = actors[~dropped], seqs[~dropped], runs[~dropped], arrivals[~dropped]
            env_ids, reward, done, truncated = env_ids[rows], reward[rows], done[rows], truncated[rows]
            if not len(actors):
                return None
        return _Requests(actors, seqs, runs, arrivals, env_ids, reward, done, truncated)

    def _assemble(self, requests: _Requests) -> int:
        """Resets the rows of new actor runs, counts the episodes the steps end, and writes the batch's inputs
        into the host input buffers (`requests.done`, `truncated` and `prev_action` as the steps record them);
        returns the batch's rows B."""
        first = self._start_new_runs(requests.actors, requests.runs)
        requests.reward[first] = 0.0
        requests.done = requests.done | first
        requests.truncated = requests.truncated & ~first
        env_ids = requests.env_ids
        requests.prev_action = self.prev_action[env_ids]
        self._count_episodes(env_ids, requests.reward, requests.done & ~first)
        b = len(env_ids)
        for name, values in (("env_ids", env_ids), ("prev_action", requests.prev_action),
                             ("reward", requests.reward), ("done", requests.done)):
            self._inputs_np[name][:b] = values
        return b

    def _start_new_runs(self, actors: np.ndarray, runs: np.ndarray) -> np.ndarray:
        """Fresh rows (state, unrolls, previous action) for the actors whose run the tables do not hold: first
        contact of their env ids, or their actor restarted. bool [n * K]: the rows whose step is a run's first."""
        is_new = self.actor_run[actors] != runs
        if is_new.any():
            new_ids = self._env_ids(actors[is_new])
            self.state_table.reset(new_ids)
            self.unroll_store.reset(torch.from_numpy(new_ids))
            self.prev_action[new_ids] = 0
            self.actor_run[actors[is_new]] = runs[is_new]
        return np.repeat(is_new, self.k)

    def _act(self, b: int) -> tuple[torch.Tensor, dict[str, torch.Tensor], Any]:
        """The policy on the first `b` rows of the input buffers: (host action [B] or [B, D], host outputs, device
        state before the step)."""
        host = self._inputs_host
        inputs = InferenceBatch(env_ids=host["env_ids"][:b], observation=self._staging[:b],
                                reward=host["reward"][:b], done=host["done"][:b], prev_action=host["prev_action"][:b])
        return self.policy(inputs)

    def _write_back(self, requests: _Requests, action: torch.Tensor) -> None:
        """The actions into the slab's action rows and the previous-action table; the actors are answered.
        Raises ValueError (the batch's actors get REPLY_FAILED) for actions of another shape or kind than the
        env's: int [B] for a Discrete space, float [B, D] for a Box."""
        actions = action.numpy()
        expected = (len(requests.env_ids), *self.action_shape)
        kinds = "f" if self.action_shape else "iu"
        if tuple(actions.shape) != expected or actions.dtype.kind not in kinds:
            raise ValueError(f"agent.act: action: got {actions.dtype.name} {list(actions.shape)}, expected "
                             f"{'float32' if self.action_shape else 'int64'} {list(expected)}")
        self.slab.action[requests.env_ids] = actions
        self.prev_action[requests.env_ids] = actions
        self._answer(requests.actors, requests.seqs, REPLY_OK)

    def _store(self, requests: _Requests, acted: tuple[torch.Tensor, dict[str, torch.Tensor], Any], version: int,
               completed_rollout: object | None) -> Unroll | None:
        """Appends the batch's step to the unroll store; the unrolls it completed (a time-major batch) or None."""
        action, outputs, state_before = acted
        b = len(requests.env_ids)
        step = {**_observed_fields(requests, self._staging[:b], version), "action": action, **outputs}
        try:
            return self.unroll_store.append(torch.from_numpy(requests.env_ids), step, state_before)
        except Exception:
            # The actors have their actions and the state table and prev_action have moved on, but this step is
            # missing from the unrolls: an unroll spanning the hole would pair states, actions and rewards that do
            # not follow each other. These actors' next steps start over as first contacts (zero state, fresh
            # unrolls, done set, reward 0); the episodes in progress go uncounted.
            actors = requests.actors
            log.exception("unroll store failed; actors %s start over with fresh rows", actors.tolist())
            self.actor_run[actors] = 0
            self._gating.start_over(actors, completed_rollout)
            return None

    def _count_episodes(self, env_ids: np.ndarray, reward: np.ndarray, ended: np.ndarray) -> None:
        table = self.state_table
        table.episode_return[env_ids] += reward
        table.episode_length[env_ids] += 1
        if ended.any():
            ids = env_ids[ended]
            # The step that reports done opens the new episode: it counts as the new episode's first step.
            self.on_episodes(FinishedEpisodes(ids, table.episode_return[ids].copy(), table.episode_length[ids] - 1))
            table.episode_return[ids] = 0.0
            table.episode_length[ids] = 1


def _observed_fields(requests: _Requests, observation: torch.Tensor, version: int) -> dict[str, torch.Tensor]:
    """The unroll-store fields of the requests' step that do not depend on the action: observation [B, ...],
    reward, done, truncated, prev_action and policy_version [B] (the parameters' version that acts on it)."""
    return {
        "observation": observation,
        "reward": torch.from_numpy(requests.reward),
        "done": torch.from_numpy(requests.done),
        "truncated": torch.from_numpy(requests.truncated),
        "prev_action": torch.from_numpy(requests.prev_action),
        "policy_version": torch.full((len(requests.env_ids),), version, dtype=torch.int64),
    }


def serve_inference(inference: CentralInference, batcher: RequestBatcher, stop: threading.Event,
                    record_value: Callable[[str, float], None]) -> None:
    """One inference device's thread: batches of ready slots until `stop` is set; `record_value` gets the
    milliseconds each batch waited for (`inference/wait_ms`)."""
    # With a sync point the loop also polls it: the learner's publish is what opens it.
    wait_s = 0.1 if inference.gate is None else 0.005
    while not stop.is_set():
        if inference.gate is not None:
            inference.release_held()
        start = time.perf_counter()
        batch = batcher.next_batch(wait_s)
        if batch is None:
            continue
        record_value("inference/wait_ms", (time.perf_counter() - start) * 1e3)
        try:
            inference.run_batch(*batch)
        except Exception:  # one bad batch must not stop inference for everyone (its actors got FAILED)
            log.exception("inference batch failed")


def request_latencies_s(now: float, arrivals: np.ndarray) -> list[float]:
    """Seconds from each request's arrival to its answer at `now` (monotonic clock), for the latency metric.

    `arrivals` [n] come from the slab, which an actor on this host writes itself: an absurd one (inf, NaN, a time in
    the future) is left out rather than turning the row's latency percentiles into inf or NaN."""
    latencies = now - np.asarray(arrivals, dtype=np.float64)
    return latencies[np.isfinite(latencies) & (latencies >= 0.0)].tolist()
