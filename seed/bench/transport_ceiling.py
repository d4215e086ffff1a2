"""The transport ceiling: a bare `seed.Learner` gRPC server that answers every step with zero actions.

It speaks the real protocol (protos/seed.proto) to unmodified `seed-actor` processes: it answers the
handshake, then replies to each StepBatch (K observations) with a prebuilt ActionBatch of K zeros at once,
with no batching, no inference and no training. Env steps per second through it are the most the actors,
their envs and gRPC can move on this machine; `seed-bench` divides the framework's rate by it to express
the framework's overhead as a ratio.

    python -m seed.bench.transport_ceiling --server_address=unix:/tmp/ceiling.sock --env=fake:vector --envs_per_actor=64

It takes the actors' env flags (EnvOptions and every env family's), so the handshake's spec check passes exactly as
with the learner; with --env_groups=G each actor's G groups are G streams of K / G envs, as on the learner.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from concurrent import futures

import grpc
from absl import app, flags
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from seed._proto import seed_pb2, seed_pb2_grpc
from seed.config import build_config, define_flags, env_options_class, explicit_flags
from seed.envs import make_spec
from seed.envs.base import EnvSpec
from seed.transport import wire
from seed.transport.grpc.service import read_handshake

GRPC_OPTIONS = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1),
                ("grpc.so_reuseport", 0)]


class ZeroActionService(seed_pb2_grpc.LearnerServicer):
    """Answers the handshake like the learner (spec checked), then every step with K zero actions."""

    def __init__(self, spec: EnvSpec, envs_per_actor: int):
        self.spec = spec
        self.envs_per_actor = envs_per_actor
        self.steps = 0  # step messages answered, over all streams (approximate: no lock on the hot path)
        self._reply = seed_pb2.LearnerMessage(
            actions=seed_pb2.ActionBatch(action=wire.encode_tensor(spec.zero_actions(envs_per_actor))))

    def _check_handshake(self, handshake: seed_pb2.Handshake) -> str | None:
        if handshake.num_envs != self.envs_per_actor:
            return f"num_envs: got {handshake.num_envs}, expected {self.envs_per_actor} (--envs_per_actor)"
        return wire.spec_mismatch(wire.spec_from_proto(handshake.spec), self.spec)

    def Stream(self, request_iterator: Iterator[seed_pb2.ActorMessage], context: grpc.ServicerContext):
        handshake = read_handshake(request_iterator, context, self._check_handshake)
        if handshake is None:
            return
        yield seed_pb2.LearnerMessage(handshake_reply=seed_pb2.HandshakeReply(
            first_env_id=handshake.actor_index * handshake.num_envs, learner_run="transport-ceiling"))
        reply = self._reply
        for _ in request_iterator:
            self.steps += 1
            yield reply


def serve(addresses: list[str], spec: EnvSpec, envs_per_actor: int, max_workers: int = 64
          ) -> tuple[grpc.Server, ZeroActionService]:
    """Starts the server on every address (host:port or unix:/path) and marks it SERVING."""
    service = ZeroActionService(spec, envs_per_actor)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="ceiling"),
                         options=GRPC_OPTIONS)
    seed_pb2_grpc.add_LearnerServicer_to_server(service, server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for address in addresses:
        if server.add_insecure_port(address) == 0 and not address.startswith("unix:"):
            raise RuntimeError(f"--server_address: cannot listen on {address!r}")
    server.start()
    for name in ("", "seed.Learner"):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return server, service


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    FLAGS = flags.FLAGS
    env_options = build_config(env_options_class(), explicit_flags(env_options_class(), FLAGS))
    spec = make_spec(env_options.env, env_options.env_options())
    addresses = [a.strip() for a in FLAGS.server_address.split(",") if a.strip()]
    # With --env_groups every group of an actor is its own stream of envs_per_actor / env_groups envs.
    server, service = serve(addresses, spec, env_options.envs_per_stream,
                            max_workers=FLAGS.num_actors * env_options.env_groups + 8)
    print(f"[ceiling] env={env_options.env} envs_per_actor={env_options.envs_per_actor} "
          f"env_groups={env_options.env_groups} "
          f"listening on {', '.join(addresses)}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    server.stop(grace=0.5)
    print(f"[ceiling] answered {service.steps:,} step messages", flush=True)


def run() -> None:
    define_flags(env_options_class())  # the same env flags as the actors: the handshake's spec check must pass
    flags.DEFINE_string("server_address", "unix:/tmp/seed-ceiling.sock", "Comma-separated listen addresses.")
    flags.DEFINE_integer("num_actors", 4, "Expected actor processes (sizes the server's thread pool).")
    app.run(main)


if __name__ == "__main__":
    run()
