"""gRPC plumbing shared by the learner's server and the actors' channels: options, listen addresses, server start.

Every process that serves or dials the learner builds its server or channel here, so transport settings
(message size limits, and later credentials) live in one place.
"""

from __future__ import annotations

import os
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from seed._proto import seed_pb2_grpc

GRPC_OPTIONS = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1),
                ("grpc.so_reuseport", 0)]


def listen_addresses(server_address: str) -> list[str]:
    addresses = [a.strip() for a in server_address.split(",") if a.strip()]
    if not addresses:
        raise ValueError(f"--server_address: got {server_address!r}, expected a comma-separated list of addresses")
    return addresses


def start_grpc_server(servicer: seed_pb2_grpc.LearnerServicer, addresses: list[str], max_workers: int
                      ) -> tuple[grpc.Server, health.HealthServicer, list[str]]:
    """Binds every address (TCP host:port or unix:/path); returns the server and the bound addresses."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="grpc"),
                         options=GRPC_OPTIONS)
    seed_pb2_grpc.add_LearnerServicer_to_server(servicer, server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    bound = []
    for address in addresses:
        if address.startswith("unix:"):
            path = address[len("unix:"):]
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            if os.path.exists(path):  # a stale socket from a previous learner on this logdir
                os.unlink(path)
        try:
            port = server.add_insecure_port(address)
        except RuntimeError as error:
            raise RuntimeError(f"--server_address: cannot listen on {address!r}: {error}") from None
        if port == 0 and not address.startswith("unix:"):
            raise RuntimeError(f"--server_address: cannot listen on {address!r}")
        bound.append(address if address.startswith("unix:") else f"{address.rsplit(':', 1)[0]}:{port}")
    server.start()
    for service in ("", "seed.Learner"):
        health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    return server, health_servicer, bound


CHANNEL_OPTIONS = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]


def open_channel(address: str) -> grpc.Channel:
    """A channel to the learner at `address` (host:port or unix:/path)."""
    return grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
