"""The learner's gRPC server: options, listen addresses, the guard and the credentials put together.

Limits against hostile or broken clients: a receive limit per message, a cap on concurrent calls
(RESOURCE_EXHAUSTED beyond it), and the stream guard's (seed/transport/guard.py).
"""

from __future__ import annotations

import os
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from seed._proto import seed_pb2_grpc
from seed.transport.guard import DEFAULT_HANDSHAKE_TIMEOUT_S, DEFAULT_IDLE_TIMEOUT_S, StreamGuard
from seed.transport.security import TransportSecurity, check_listen_security

DEFAULT_MAX_MESSAGE_BYTES = 64 << 20  # receive limit until the caller computes one from the env spec
GRPC_OPTIONS = [("grpc.max_receive_message_length", DEFAULT_MAX_MESSAGE_BYTES), ("grpc.max_send_message_length", -1),
                ("grpc.so_reuseport", 0)]  # server defaults; start_grpc_server sets the receive limit it is given
# Actors ping every 2 s (seed/transport/channel.py KEEPALIVE_TIME_MS) to notice a partition quickly; a client
# pinging more often than min_ping_interval_without_data_ms while the server sends nothing (a step waiting on a
# busy learner) would be sent GOAWAY "too_many_pings" after two strikes, so the server allows every 1 s.
SERVER_KEEPALIVE = [("grpc.keepalive_time_ms", 30_000), ("grpc.keepalive_timeout_ms", 10_000),
                    ("grpc.http2.min_ping_interval_without_data_ms", 1_000)]


def start_grpc_server(servicer: seed_pb2_grpc.LearnerServicer, addresses: list[str], max_workers: int,
                      security: TransportSecurity | None = None, max_message_bytes: int | None = None,
                      handshake_timeout_s: float = DEFAULT_HANDSHAKE_TIMEOUT_S,
                      idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
                      ) -> tuple[grpc.Server, health.HealthServicer, list[str]]:
    """Binds every address (TCP host:port or unix:/path); returns the server, its health service, the bound addresses.

    Args:
      max_workers: server threads; also the most concurrent calls (more get RESOURCE_EXHAUSTED at once rather
        than queueing behind streams that never end). One actor stream holds one thread.
      security: TLS and token (the learner's flags); None = neither, so only loopback addresses are allowed.
      max_message_bytes: the largest message the server accepts (bytes); None = DEFAULT_MAX_MESSAGE_BYTES.
      handshake_timeout_s, idle_timeout_s: see StreamGuard (seconds).
    """
    security = security if security is not None else TransportSecurity()
    check_listen_security(addresses, security)
    max_message_bytes = max_message_bytes or DEFAULT_MAX_MESSAGE_BYTES
    guard = StreamGuard(security.auth_token, max_pending=max(2, max_workers // 4),
                        handshake_timeout_s=handshake_timeout_s, idle_timeout_s=idle_timeout_s)
    options = [*[o for o in GRPC_OPTIONS if o[0] != "grpc.max_receive_message_length"],
               ("grpc.max_receive_message_length", max_message_bytes), *SERVER_KEEPALIVE]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="grpc"),
                         interceptors=[guard], options=options, maximum_concurrent_rpcs=max_workers)
    server.stream_guard = guard  # type: ignore[attr-defined]
    seed_pb2_grpc.add_LearnerServicer_to_server(servicer, server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    credentials = security.server_credentials() if security.tls else None
    bound = []
    for address in addresses:
        if address.startswith("unix:"):
            path = address[len("unix:"):]
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            if os.path.exists(path):  # a stale socket from a previous learner on this logdir
                os.unlink(path)
        try:
            port = (server.add_secure_port(address, credentials) if credentials
                    else server.add_insecure_port(address))
        except RuntimeError as error:
            raise RuntimeError(f"--server_address: cannot listen on {address!r}: {error}") from None
        if port == 0 and not address.startswith("unix:"):
            raise RuntimeError(f"--server_address: cannot listen on {address!r}")
        bound.append(address if address.startswith("unix:") else f"{address.rsplit(':', 1)[0]}:{port}")
    server.start()
    for service in ("", "seed.Learner"):
        health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    return server, health_servicer, bound
