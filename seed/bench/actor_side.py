"""Baseline for benchmarks: IMPALA-style actor-side inference, to compare with SEED's central inference.

Each actor process holds its own copy of the agent's network on its CPU, picks actions locally for its K
envs (one forward pass per agent step, batched over the K envs), builds unrolls locally with the same
`UnrollStore` the learner uses, and ships every completed set of K unrolls to the learner. The learner
queues them (bounded FIFO: a full queue blocks the actors' pushes, as in IMPALA), trains V-trace with the
same agent, loss and optimizer as `seed-learner`, and serves its parameters; an actor fetches them after
every push when their version changed, i.e. at the start of each of its unrolls, as IMPALA's actors do.

Same machine, env, network and loss as the framework; only where inference runs differs. Transport: gRPC
over the same kind of socket, two unary methods on a generic service (`seed.ActorSide`); tensors travel as
raw bytes behind a small JSON header (`pack_tensors`). The actor's latency samples are its local inference
times (one forward pass over K envs), the counterpart of SEED's round trip.

    python -m seed.bench.actor_side --role=learner --env=fake:vector --num_actors=2 --envs_per_actor=8 \
        --logdir=/tmp/as --server_address=unix:/tmp/as/learner.sock
    python -m seed.bench.actor_side --role=actor --actor_index=0 ... (the same flags)

Only the V-trace agent is supported (its `act` samples from the policy it trains off-policy-corrected).
"""

from __future__ import annotations

import json
import os
import signal
import struct
import threading
import time
from concurrent import futures
from typing import Any

import grpc
import numpy as np
import torch
from absl import app, flags
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from seed.actor.stats import ActorStats
from seed.config import LearnerConfig, explicit_flags
from seed.contracts import InferenceBatch
from seed.contracts.training import Unroll
from seed.envs import make_batch, make_spec
from seed.envs.base import EnvSpec
from seed.experience.training_batches import Prefetcher, UnrollQueue
from seed.inference.unroll_store import UnrollStore
from seed.learner.configuration import define_learner_flags, learner_fields, resolve_config

SERVICE = "seed.ActorSide"
GRPC_OPTIONS = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1),
                ("grpc.so_reuseport", 0)]
_ALIGN = 8


# ----------------------------------------------------------------------------------------------- tensors <-> bytes


def pack_tensors(tensors: dict[str, torch.Tensor]) -> bytes:
    """{name: tensor} -> one bytes object: uint32 header length, JSON header, 8-byte aligned raw data."""
    header, chunks, offset = [], [], 0
    for name, tensor in tensors.items():
        array = np.ascontiguousarray(tensor.detach().cpu().numpy())
        data = array.tobytes()
        header.append({"name": name, "dtype": array.dtype.name, "shape": list(array.shape), "offset": offset})
        padding = -len(data) % _ALIGN
        chunks.append(data + b"\0" * padding)
        offset += len(data) + padding
    header_bytes = json.dumps(header).encode()
    header_bytes += b" " * (-(4 + len(header_bytes)) % _ALIGN)
    return struct.pack("<I", len(header_bytes)) + header_bytes + b"".join(chunks)


def unpack_tensors(payload: bytes) -> dict[str, torch.Tensor]:
    """Inverse of `pack_tensors`; the tensors own writable copies of the data."""
    (header_length,) = struct.unpack_from("<I", payload)
    header = json.loads(payload[4:4 + header_length])
    base = 4 + header_length
    buffer = bytearray(payload[base:])  # one copy, writable, so torch can take it without warnings
    tensors = {}
    for entry in header:
        count = int(np.prod(entry["shape"], dtype=np.int64))
        array = np.frombuffer(buffer, dtype=entry["dtype"], count=count, offset=entry["offset"])
        tensors[entry["name"]] = torch.from_numpy(array.reshape(entry["shape"]))
    return tensors


def pack_unrolls(batch: Unroll) -> bytes:
    """A time-major batch of unrolls (steps [L, B, ...], state [B, ...], env ids [B]) as bytes."""
    tensors = {f"steps/{k}": v for k, v in batch.steps.items()}
    tensors.update({f"state/{k}": v for k, v in batch.initial_state.items()})
    tensors["env_id"] = batch.env_id
    return pack_tensors(tensors)


def unpack_unrolls(payload: bytes) -> Unroll:
    """The time-major batch of `pack_unrolls` (views into one buffer)."""
    tensors = unpack_tensors(payload)
    steps = {k[len("steps/"):]: v for k, v in tensors.items() if k.startswith("steps/")}
    state = {k[len("state/"):]: v for k, v in tensors.items() if k.startswith("state/")}
    return Unroll(steps, state, tensors["env_id"])


def _loss(agent: Any, unrolls: Unroll) -> torch.Tensor:
    """The agent's scalar loss on a time-major batch, whichever loss interface the agent has: `loss(unrolls)`
    returning (loss, metrics), or `loss(TrainingBatch(unrolls))` returning an object with `.loss`."""
    try:
        from seed.contracts.training import TrainingBatch
    except ImportError:
        TrainingBatch = None  # noqa: N806
    out = agent.loss(unrolls if TrainingBatch is None else TrainingBatch(unrolls))
    return out.loss if hasattr(out, "loss") else out[0]


def env_options(config: LearnerConfig) -> dict[str, Any]:
    return config.env_options()


def dial_address(server_address: str) -> str:
    from seed.local_launcher import actor_address

    return actor_address(server_address)


# ----------------------------------------------------------------------------------------------- learner


class ActorSideLearner:
    """Receives unrolls from actor-side-inference actors, trains V-trace on them and serves parameters."""

    def __init__(self, config: LearnerConfig, spec: EnvSpec | None = None):
        if config.agent != "vtrace":
            raise ValueError(f"--agent: got {config.agent!r}, expected vtrace (the actor-side baseline trains V-trace)")
        self.config = config
        os.makedirs(config.logdir, exist_ok=True)
        torch.set_num_threads(config.torch_threads or os.cpu_count() or 1)
        torch.manual_seed(config.seed)
        self.spec = spec or make_spec(config.env, env_options(config))
        self.device = torch.device(config.training_device)
        self.stop_event = threading.Event()
        self.agent = type(config).agent_class(self.spec, config)
        self.agent.network.to(self.device)
        self.optimizer = torch.optim.Adam(self.agent.network.parameters(), lr=config.learning_rate,
                                          eps=config.adam_epsilon, betas=(config.adam_beta1, 0.999))
        self.unroll_queue = UnrollQueue(config.queue_capacity or config.batch_size, self.stop_event)
        self.prefetcher = Prefetcher(self.unroll_queue.get, config.batch_size, self.device, self.stop_event)
        self.version = 0
        self.train_steps = 0
        self.env_frames = 0  # new env frames received (unroll_length steps per unroll x action repeat)
        self._lock = threading.Lock()  # parameters are not read while the optimizer writes them
        self._packed: tuple[int, bytes] = (-1, b"")

    # gRPC methods: raw bytes in, raw bytes out.
    def push_unrolls(self, payload: bytes, context: grpc.ServicerContext) -> bytes:
        unrolls = unpack_unrolls(payload)
        self.unroll_queue.put(unrolls)  # blocks while the queue is full: back-pressure on the actor
        with self._lock:
            self.env_frames += unrolls.batch_size * self.config.unroll_length * self.spec.action_repeat
            version = self.version
        return struct.pack("<q", version)

    def get_parameters(self, payload: bytes, context: grpc.ServicerContext) -> bytes:
        """The packed state dict, or b"" when the caller already has the current version."""
        (known,) = struct.unpack("<q", payload)
        with self._lock:
            if known == self.version:
                return b""
            if self._packed[0] != self.version:
                parameters = {k: v.detach().cpu().clone() for k, v in self.agent.network.state_dict().items()}
                parameters["__version__"] = torch.tensor([self.version])
                self._packed = (self.version, pack_tensors(parameters))
            return self._packed[1]

    def train_step(self) -> bool:
        batch = self.prefetcher.get(timeout=0.2)
        if batch is None:
            return False
        loss = _loss(self.agent, batch)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.config.grad_clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.agent.network.parameters(), self.config.grad_clip_norm)
        with self._lock:
            self.optimizer.step()
            self.version += 1
            self.train_steps += 1
        return True

    def run(self) -> None:
        config = self.config
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2 * config.num_actors + 8), options=GRPC_OPTIONS)
        handlers = {
            "PushUnrolls": grpc.unary_unary_rpc_method_handler(self.push_unrolls),
            "GetParameters": grpc.unary_unary_rpc_method_handler(self.get_parameters),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        health_servicer = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        addresses = [a.strip() for a in config.server_address.split(",") if a.strip()]
        for address in addresses:
            if address.startswith("unix:") and os.path.exists(address[len("unix:"):]):
                os.unlink(address[len("unix:"):])
            server.add_insecure_port(address)
        server.start()
        for name in ("", "seed.Learner", SERVICE):
            health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        self.prefetcher.start()
        print(f"[actor-side learner] env={config.env} network={config.network} listening on {', '.join(addresses)}",
              flush=True)
        metrics_path = os.path.join(config.logdir, "metrics.jsonl")
        start = last_log = time.monotonic()
        last_frames, last_steps = 0, 0
        try:
            while not self.stop_event.is_set():
                self.train_step()
                now = time.monotonic()
                if now - last_log >= config.log_interval_s:
                    with self._lock:
                        frames, steps = self.env_frames, self.train_steps
                    row = {"time_s": round(now - start, 3), "env_frames": frames, "train_steps": steps,
                           "env_frames_per_sec": (frames - last_frames) / (now - last_log),
                           "train_steps_per_sec": (steps - last_steps) / (now - last_log),
                           "queue_size": self.unroll_queue.qsize()}
                    with open(metrics_path, "a") as f:
                        f.write(json.dumps(row) + "\n")
                    last_log, last_frames, last_steps = now, frames, steps
        finally:
            self.stop_event.set()
            server.stop(grace=0.5)
        print(f"[actor-side learner] done: frames={self.env_frames:,} train_steps={self.train_steps:,}", flush=True)


# ----------------------------------------------------------------------------------------------- actor


class ActorSideActor:
    """K envs and a local copy of the network; ships unrolls, refreshes parameters after each push."""

    def __init__(self, config: LearnerConfig, actor_index: int, stats_file: str = "", stats_interval_s: float = 1.0,
                 torch_threads: int = 1):
        self.config = config
        self.actor_index = actor_index
        torch.set_num_threads(torch_threads)
        k = config.envs_per_actor
        self.envs = make_batch(config.env, k, actor_index * k, env_options(config))
        self.spec = self.envs.spec
        self.agent = type(config).agent_class(self.spec, config)
        self.network = self.agent.network.eval()
        self.unroll_store = UnrollStore(k, config.unroll_length, getattr(config, "burn_in", 0))
        self.stats = ActorStats(stats_file, stats_interval_s, self.spec.action_repeat, actor_index)
        self.stop = threading.Event()
        self.version = -1

    def _refresh(self, get_parameters) -> None:
        payload = get_parameters(struct.pack("<q", self.version))
        if payload:
            parameters = unpack_tensors(payload)
            self.version = int(parameters.pop("__version__")[0])
            self.network.load_state_dict(parameters)

    def run(self) -> None:
        address = dial_address(self.config.server_address)
        k = self.config.envs_per_actor
        with grpc.insecure_channel(address, options=GRPC_OPTIONS) as channel:
            grpc.channel_ready_future(channel).result(timeout=120)
            push = channel.unary_unary(f"/{SERVICE}/PushUnrolls")
            get_parameters = channel.unary_unary(f"/{SERVICE}/GetParameters")
            self._refresh(get_parameters)
            env_ids = torch.arange(k)
            state = self.agent.initial_state(k)
            prev_action = torch.zeros((k, *self.spec.action_shape), dtype=getattr(torch, self.spec.batch_action_dtype))
            observation = self.envs.reset()
            # Every env starts an episode: done set, reward 0 (as the learner treats first contact).
            reward = np.zeros(k, np.float32)
            done = np.ones(k, bool)
            truncated = np.zeros(k, bool)
            try:
                while not self.stop.is_set():
                    started = time.perf_counter()
                    with torch.inference_mode():
                        batch = InferenceBatch(env_ids=env_ids, observation=torch.from_numpy(observation),
                                               reward=torch.from_numpy(reward), done=torch.from_numpy(done),
                                               prev_action=prev_action)
                        out = self.agent.act(self.network, batch, state)
                        action = out.action
                        step = {"observation": batch.observation, "reward": batch.reward, "done": batch.done,
                                "truncated": torch.from_numpy(truncated), "prev_action": prev_action,
                                "action": action, **out.outputs}
                        completed = self.unroll_store.append(env_ids, step, state)
                    inference_s = time.perf_counter() - started
                    state, prev_action = out.state, action
                    if completed is not None:
                        (version,) = struct.unpack("<q", push(pack_unrolls(completed)))
                        if version != self.version:
                            self._refresh(get_parameters)
                    result = self.envs.step(action.numpy())
                    observation, reward = result.observation, result.reward.astype(np.float32, copy=False)
                    done, truncated = result.done, result.truncated
                    self.stats.record(k, inference_s)
            except grpc.RpcError as error:
                if not self.stop.is_set():
                    raise SystemExit(
                        f"[actor-side actor {self.actor_index}] learner went away: {error.code().name}") from None
            finally:
                self.stats.write(final=True)
                self.envs.close()


# ----------------------------------------------------------------------------------------------- main


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")

    FLAGS = flags.FLAGS
    config = resolve_config(explicit_flags(learner_fields(), FLAGS))
    if FLAGS.role == "learner":
        learner = ActorSideLearner(config)
        signal.signal(signal.SIGTERM, lambda *_: learner.stop_event.set())
        signal.signal(signal.SIGINT, lambda *_: learner.stop_event.set())
        learner.run()
    elif FLAGS.role == "actor":
        actor = ActorSideActor(config, FLAGS.actor_index, FLAGS.stats_file, FLAGS.stats_interval_s,
                               FLAGS.actor_torch_threads)
        signal.signal(signal.SIGTERM, lambda *_: actor.stop.set())
        signal.signal(signal.SIGINT, lambda *_: actor.stop.set())
        actor.run()
        print(f"[actor-side actor {FLAGS.actor_index}] stopped after {actor.stats.agent_steps:,} agent steps",
              flush=True)
    else:
        raise app.UsageError(f"--role: got {FLAGS.role!r}, expected learner or actor")


def run() -> None:
    define_learner_flags()
    flags.DEFINE_string("role", "learner", "learner or actor.")
    flags.DEFINE_integer("actor_index", 0, "Actor role: this actor's index (env ids [index*K, (index+1)*K)).")
    flags.DEFINE_string("stats_file", "", "Actor role: JSON Lines stats file (see seed/actor/stats.py).")
    flags.DEFINE_float("stats_interval_s", 1.0, "Actor role: seconds between stats rows.")
    flags.DEFINE_integer("actor_torch_threads", 1, "Actor role: torch threads for local inference (IMPALA: 1 CPU).")
    app.run(main)


if __name__ == "__main__":
    run()
