"""The learner's gRPC server: options, listen addresses, the guard and the credentials put together.

Limits against hostile or broken clients: a receive limit per message, a cap on concurrent calls
(RESOURCE_EXHAUSTED beyond it), and the stream guard's (seed/transport/grpc/guard.py).
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
import threading
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from seed._proto import seed_pb2_grpc
from seed.transport.grpc.guard import DEFAULT_HANDSHAKE_TIMEOUT_S, DEFAULT_IDLE_TIMEOUT_S, StreamGuard
from seed.transport.security import TransportSecurity, check_listen_security

DEFAULT_MAX_MESSAGE_BYTES = 64 << 20  # receive limit until the caller computes one from the env spec
GRPC_OPTIONS = [("grpc.max_receive_message_length", DEFAULT_MAX_MESSAGE_BYTES), ("grpc.max_send_message_length", -1),
                ("grpc.so_reuseport", 0)]  # server defaults; start_grpc_server sets the receive limit it is given
# Actors ping every 2 s (seed/transport/grpc/channel.py KEEPALIVE_TIME_MS) to notice a partition quickly; a client
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
    bound, unix_sockets = [], []
    for address in addresses:
        try:
            if address.startswith("unix:"):
                unix_sockets.append(_listen_unix(server, address[len("unix:"):], credentials))
                bound.append(address)
                continue
            port = (server.add_secure_port(address, credentials) if credentials
                    else server.add_insecure_port(address))
        except (RuntimeError, OSError) as error:
            raise RuntimeError(f"--server_address: cannot listen on {address!r}: {error}") from None
        if port == 0:
            raise RuntimeError(f"--server_address: cannot listen on {address!r}")
        bound.append(f"{address.rsplit(':', 1)[0]}:{port}")
    _unlink_on_stop(server, unix_sockets)
    server.start()
    for service in ("", "seed.Learner"):
        health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    return server, health_servicer, bound


def _listen_unix(server: grpc.Server, path: str, credentials: grpc.ServerCredentials | None) -> tuple[str, int]:
    """Listens on the unix socket `path`, mode 0600: only this user (and root) can connect. (path, its inode).

    gRPC cannot tell the server a unix peer's uid (grpcio 1.85: no SO_PEERCRED in its peer string or auth
    context), so the file mode does the shared-memory handover's peer check: another user's connect() is refused
    by the kernel (EACCES). The socket is bound in a private directory (mode 0700) beside `path`, made 0600 there,
    then linked to `path`: never reachable with a wider mode, whatever the umask (which is process-wide, so it is
    not touched). A stale socket at `path` (a previous learner's) is removed first; link() refuses anything else."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(os.lstat(path).st_mode):  # a stale socket from a previous learner on this logdir
            os.unlink(path)
    private = tempfile.mkdtemp(prefix=".", dir=directory)  # mode 0700
    staged = os.path.join(private, "s")
    try:
        port = (server.add_secure_port(f"unix:{staged}", credentials) if credentials
                else server.add_insecure_port(f"unix:{staged}"))  # bound (and listening) on return
        if port == 0:
            raise RuntimeError(f"cannot bind {staged}")
        os.chmod(staged, 0o600)  # connecting needs write permission
        os.link(staged, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(staged)
        os.rmdir(private)
    return path, os.lstat(path).st_ino


def _unlink_on_stop(server: grpc.Server, sockets: list[tuple[str, int]]) -> None:
    """gRPC removes the socket it bound (the staged name) when it stops; this removes the linked names, unless a
    newer learner's socket has taken one."""
    if not sockets:
        return
    stop = server.stop

    def stop_and_unlink(grace: float | None) -> threading.Event:
        for path, inode in sockets:
            with contextlib.suppress(FileNotFoundError):
                if os.lstat(path).st_ino == inode:
                    os.unlink(path)
        return stop(grace)

    server.stop = stop_and_unlink  # type: ignore[method-assign]
