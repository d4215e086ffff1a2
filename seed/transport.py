"""gRPC plumbing shared by the learner's server and the actors' channels: options, listen addresses, security.

Every process that serves or dials the learner builds its server or channel here, so transport settings live
in one place:

* listen addresses: loopback and the unix socket by default; a non-loopback address needs --auth_token(_file)
  or mutual TLS, or an explicit --allow_insecure_remote (see `check_listen_security`);
* mutual TLS (--tls_cert/--tls_key/--tls_ca) and a shared token (--auth_token or --auth_token_file) that the
  actor sends as call metadata and the server checks with a constant-time compare on the seed.Learner/Stream
  call. The grpc.health.v1 service stays unauthenticated (Kubernetes probes, the launcher and seed-bench use it;
  it reveals only SERVING / NOT_SERVING);
* limits against hostile or broken clients: a receive limit per message, a cap on concurrent calls
  (RESOURCE_EXHAUSTED beyond it), a cap on streams that have not sent their handshake yet, a deadline for the
  handshake and an idle deadline for streams whose client stopped talking (see `StreamGuard`).
"""

from __future__ import annotations

import dataclasses
import hmac
import ipaddress
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from seed._proto import seed_pb2_grpc

STREAM_METHOD = "/seed.Learner/Stream"
TOKEN_KEYS = ("authorization", "x-seed-token")  # metadata keys the token may travel in; "authorization": "Bearer T"
DEFAULT_MAX_MESSAGE_BYTES = 64 << 20  # receive limit until the caller computes one from the env spec
DEFAULT_HANDSHAKE_TIMEOUT_S = 10.0
DEFAULT_IDLE_TIMEOUT_S = 120.0
REDACTED = "<redacted>"  # what a config shows once its token has been installed (never logged or checkpointed)
GRPC_OPTIONS = [("grpc.max_receive_message_length", DEFAULT_MAX_MESSAGE_BYTES), ("grpc.max_send_message_length", -1),
                ("grpc.so_reuseport", 0)]  # server defaults; start_grpc_server sets the receive limit it is given
SERVER_KEEPALIVE = [("grpc.keepalive_time_ms", 30_000), ("grpc.keepalive_timeout_ms", 10_000),
                    ("grpc.http2.min_ping_interval_without_data_ms", 5_000)]


class TransportConfigError(ValueError):
    """Transport flags that cannot work together (names the flag, the value received and what is expected)."""


@dataclasses.dataclass(frozen=True)
class TransportSecurity:
    """How the learner's server and the actors' channels authenticate each other.

    tls_cert, tls_key: PEM files of this side's certificate and key (server: its serving cert; actor: its client cert).
    tls_ca: PEM file of the CA that signed the other side's certificate. All three together enable mutual TLS.
    auth_token: the shared secret, from --auth_token or the file named by --auth_token_file ('' = none).
    tls_server_name: actor only: the name the server certificate must carry when it differs from the dialled host.
    allow_insecure_remote: learner only: listen on a non-loopback address with neither token nor TLS.
    """

    tls_cert: str = ""
    tls_key: str = ""
    tls_ca: str = ""
    auth_token: str = dataclasses.field(default="", repr=False)
    tls_server_name: str = ""
    allow_insecure_remote: bool = False

    @property
    def tls(self) -> bool:
        return bool(self.tls_cert)

    @property
    def authenticated(self) -> bool:
        return self.tls or bool(self.auth_token)

    @classmethod
    def from_config(cls, config: Any, read_files: bool = True) -> TransportSecurity:
        """From any config with the TransportOptions fields (seed.config); reads --auth_token_file.

        read_files=False (e.g. --print_config) checks the flags without touching the files; the token is then
        REDACTED. A config whose token was already moved into the default security (learner_main) yields that
        default.
        """
        token = getattr(config, "auth_token", "")
        if token == REDACTED:
            return default_security()
        token_file = getattr(config, "auth_token_file", "")
        if token and token_file:
            raise TransportConfigError("--auth_token and --auth_token_file: got both, expected at most one")
        if token_file and not read_files:
            token = REDACTED
        elif token_file:
            try:
                with open(token_file) as f:
                    token = f.read().strip()
            except OSError as error:
                raise TransportConfigError(f"--auth_token_file: cannot read {token_file!r}: {error.strerror}") from None
            if not token:
                raise TransportConfigError(f"--auth_token_file: got an empty file {token_file!r}, expected a token")
        tls = {name: getattr(config, name, "") for name in ("tls_cert", "tls_key", "tls_ca")}
        given = [name for name, value in tls.items() if value]
        if given and len(given) != 3:
            missing = sorted(set(tls) - set(given))
            raise TransportConfigError(f"--{', --'.join(missing)}: got none, expected --tls_cert, --tls_key and "
                                       "--tls_ca together (mutual TLS)")
        for name in given if read_files else ():
            if not os.path.isfile(tls[name]):
                raise TransportConfigError(f"--{name}: got {tls[name]!r}, expected an existing PEM file")
        return cls(auth_token=token, tls_server_name=getattr(config, "tls_server_name", ""),
                   allow_insecure_remote=bool(getattr(config, "allow_insecure_remote", False)), **tls)

    def _read(self, name: str) -> bytes:
        with open(getattr(self, name), "rb") as f:
            return f.read()

    def server_credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials([(self._read("tls_key"), self._read("tls_cert"))],
                                           root_certificates=self._read("tls_ca"), require_client_auth=True)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(root_certificates=self._read("tls_ca"),
                                            private_key=self._read("tls_key"), certificate_chain=self._read("tls_cert"))

    def call_metadata(self) -> tuple[tuple[str, str], ...]:
        """Metadata for the Stream call (the token, if any)."""
        return (("authorization", f"Bearer {self.auth_token}"),) if self.auth_token else ()


# The learner's main installs the security built from its flags here, so that callers of start_grpc_server
# that do not pass `security` (the serving path) still get it.
_default_security = TransportSecurity()


def set_default_security(security: TransportSecurity) -> None:
    global _default_security
    _default_security = security


def default_security() -> TransportSecurity:
    return _default_security


def listen_addresses(server_address: str) -> list[str]:
    addresses = [a.strip() for a in server_address.split(",") if a.strip()]
    if not addresses:
        raise ValueError(f"--server_address: got {server_address!r}, expected a comma-separated list of addresses")
    return addresses


def is_loopback(address: str) -> bool:
    """True for unix sockets and TCP addresses on the loopback interface (127.0.0.0/8, ::1, localhost)."""
    if address.startswith(("unix:", "unix-abstract:")):
        return True
    host = address.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name other than localhost, or an empty host (all interfaces)
        return False


def check_listen_security(addresses: list[str], security: TransportSecurity) -> None:
    """Refuses a non-loopback listen address without a token or TLS unless --allow_insecure_remote is set."""
    if security.authenticated or security.allow_insecure_remote:
        return
    remote = [a for a in addresses if not is_loopback(a)]
    if remote:
        raise TransportConfigError(
            f"--server_address: got {','.join(remote)}, a non-loopback address with no --auth_token/--auth_token_file "
            "and no --tls_cert/--tls_key/--tls_ca; expected unix:/path or 127.0.0.1:PORT, or credentials, or "
            "--allow_insecure_remote to let anyone who reaches the port drive the learner")


def check_token(metadata: tuple, expected: str) -> str | None:
    """None if the call metadata carries `expected` (constant-time compare), else why not (never the secret)."""
    values = {key: value for key, value in metadata if key in TOKEN_KEYS}
    if not values:
        return (f"metadata {TOKEN_KEYS[0]}: got none, expected 'Bearer <token>' (or {TOKEN_KEYS[1]}: <token>) "
                "with the learner's --auth_token")
    for key, value in values.items():
        got = value[len("Bearer "):] if key == "authorization" and value.startswith("Bearer ") else value
        if isinstance(got, bytes):
            got = got.decode("latin-1")
        if hmac.compare_digest(got.encode("utf-8", "surrogateescape"), expected.encode()):
            return None
    return (f"metadata {'/'.join(values)}: got a wrong token, expected the learner's --auth_token "
            "(see --auth_token_file)")


class _Tracked:
    """One live Stream call as the guard sees it."""

    __slots__ = ("context", "handshaken", "waiting_since")

    def __init__(self, context: grpc.ServicerContext):
        self.context = context
        self.handshaken = False
        self.waiting_since: float | None = time.monotonic()  # waiting on the client (to send, or to read)


class StreamGuard(grpc.ServerInterceptor):
    """Authenticates Stream calls and bounds what a silent or hostile client can hold on the server.

    * token: UNAUTHENTICATED unless the call metadata carries the learner's token (constant-time compare);
    * at most `max_pending` streams may be waiting for their first message; more are RESOURCE_EXHAUSTED;
    * the first message must arrive within `handshake_timeout_s` (DEADLINE_EXCEEDED naming the handshake);
    * a stream whose client has neither sent nor read for `idle_timeout_s` seconds is cancelled, so its server
      thread is freed (a SIGSTOPped actor is not idle for that long; a dead peer is also caught by keepalive).
    Health checks pass untouched.
    """

    def __init__(self, auth_token: str, max_pending: int, handshake_timeout_s: float, idle_timeout_s: float):
        self.auth_token = auth_token
        self.max_pending = max_pending
        self.handshake_timeout_s = handshake_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self._lock = threading.Lock()
        self._streams: set[_Tracked] = set()
        self._closed = threading.Event()
        self._watchdog = threading.Thread(target=self._watch, name="stream-guard", daemon=True)
        self._watchdog.start()

    def close(self) -> None:
        self._closed.set()

    def pending(self) -> int:
        with self._lock:
            return sum(not s.handshaken for s in self._streams)

    def intercept_service(self, continuation: Callable, handler_call_details: grpc.HandlerCallDetails):
        handler = continuation(handler_call_details)
        if handler_call_details.method != STREAM_METHOD or handler is None:
            return handler
        if self.auth_token:
            problem = check_token(tuple(handler_call_details.invocation_metadata or ()), self.auth_token)
            if problem:
                return _rejection(handler, grpc.StatusCode.UNAUTHENTICATED, problem)
        return grpc.stream_stream_rpc_method_handler(
            self._guarded(handler.stream_stream), request_deserializer=_tolerant(handler.request_deserializer),
            response_serializer=handler.response_serializer)

    def _guarded(self, behavior: Callable) -> Callable:
        def stream(request_iterator: Iterator, context: grpc.ServicerContext) -> Iterator:
            tracked = _Tracked(context)
            with self._lock:
                pending = sum(not s.handshaken for s in self._streams)
                if pending >= self.max_pending:
                    context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                  f"streams awaiting a handshake: got {pending + 1}, expected at most "
                                  f"{self.max_pending}; send the Handshake right after opening the stream")
                self._streams.add(tracked)
            try:
                first = self._first_message(request_iterator, context)
                requests = _TrackedRequests(request_iterator, tracked, first, context)
                for response in behavior(requests, context):
                    tracked.waiting_since = time.monotonic()  # until the client has taken the reply
                    yield response
                    tracked.waiting_since = None
            finally:
                with self._lock:
                    self._streams.discard(tracked)
        return stream

    def _first_message(self, request_iterator: Iterator, context: grpc.ServicerContext) -> Any:
        """The first request (or None if the client closed first), within `handshake_timeout_s`."""
        box: queue.SimpleQueue = queue.SimpleQueue()

        def read() -> None:
            try:
                box.put(("ok", next(request_iterator)))
            except StopIteration:
                box.put(("ok", None))
            except Exception as error:  # noqa: BLE001 - handed to the stream's thread
                box.put(("error", error))

        threading.Thread(target=read, name="handshake-reader", daemon=True).start()
        try:
            kind, value = box.get(timeout=self.handshake_timeout_s)
        except queue.Empty:
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                          f"handshake: got no message within {self.handshake_timeout_s:g}s of opening the stream, "
                          "expected a Handshake first")
        if kind == "error":
            raise value
        return value

    def _watch(self) -> None:
        while not self._closed.wait(1.0):
            now = time.monotonic()
            with self._lock:
                idle = [s for s in self._streams
                        if s.handshaken and s.waiting_since is not None and now - s.waiting_since > self.idle_timeout_s]
            for tracked in idle:
                tracked.context.cancel()


class _Undecodable:
    """A request whose bytes are not a valid message; the stream aborts when the servicer reaches it."""

    def __init__(self, size: int, error: Exception):
        self.size = size
        self.error = error


def _tolerant(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    """Wraps the request deserializer so a malformed message becomes an INVALID_ARGUMENT naming it (gRPC itself
    would answer INTERNAL "Exception deserializing request!")."""
    if deserializer is None:
        return None

    def deserialize(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as error:  # noqa: BLE001 - protobuf raises DecodeError, but any failure means the same
            return _Undecodable(len(data), error)

    return deserialize


class _TrackedRequests:
    """The request iterator handed to the servicer: replays the first message, then records waits on the client;
    aborts the stream (INVALID_ARGUMENT) at a message that did not parse."""

    def __init__(self, iterator: Iterator, tracked: _Tracked, first: Any, context: grpc.ServicerContext):
        self._iterator = iterator
        self._tracked = tracked
        self._first = first
        self._first_pending = True
        self._context = context

    def __iter__(self) -> _TrackedRequests:
        return self

    def __next__(self) -> Any:
        if self._first_pending:
            self._first_pending = False
            self._tracked.handshaken = True
            self._tracked.waiting_since = None
            if self._first is None:
                raise StopIteration
            return self._checked(self._first, "first message")
        self._tracked.waiting_since = time.monotonic()
        try:
            message = next(self._iterator)
        finally:
            self._tracked.waiting_since = None
        return self._checked(message, "message")

    def _checked(self, message: Any, what: str) -> Any:
        if isinstance(message, _Undecodable):
            self._context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"{what}: got {message.size} bytes that do not parse as a seed.ActorMessage "
                                f"({message.error}), expected a serialized ActorMessage (protos/seed.proto)")
        return message


def _rejection(handler: grpc.RpcMethodHandler, code: grpc.StatusCode, details: str) -> grpc.RpcMethodHandler:
    def reject(_request_iterator: Iterator, context: grpc.ServicerContext) -> Iterator:
        context.abort(code, details)
        yield  # pragma: no cover - abort raises

    return grpc.stream_stream_rpc_method_handler(reject, request_deserializer=handler.request_deserializer,
                                                 response_serializer=handler.response_serializer)


def start_grpc_server(servicer: seed_pb2_grpc.LearnerServicer, addresses: list[str], max_workers: int,
                      security: TransportSecurity | None = None, max_message_bytes: int | None = None,
                      handshake_timeout_s: float = DEFAULT_HANDSHAKE_TIMEOUT_S,
                      idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
                      ) -> tuple[grpc.Server, health.HealthServicer, list[str]]:
    """Binds every address (TCP host:port or unix:/path); returns the server, its health service, the bound addresses.

    Args:
      max_workers: server threads; also the most concurrent calls (more get RESOURCE_EXHAUSTED at once rather
        than queueing behind streams that never end). One actor stream holds one thread.
      security: TLS and token; None = what `set_default_security` installed (the learner's flags).
      max_message_bytes: the largest message the server accepts (bytes); None = DEFAULT_MAX_MESSAGE_BYTES.
      handshake_timeout_s, idle_timeout_s: see StreamGuard (seconds).
    """
    security = security if security is not None else default_security()
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


CHANNEL_OPTIONS = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]


def open_channel(address: str, security: TransportSecurity | None = None) -> grpc.Channel:
    """A channel to the learner at `address` (host:port or unix:/path), with the client certificate if TLS is set.

    The token is not part of the channel: pass `security.call_metadata()` to the Stream call.
    """
    security = security or TransportSecurity()
    if not security.tls:
        return grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
    options = list(CHANNEL_OPTIONS)
    if security.tls_server_name:
        options.append(("grpc.ssl_target_name_override", security.tls_server_name))
    return grpc.secure_channel(address, security.channel_credentials(), options=options)
