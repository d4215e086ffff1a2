"""The server-side guard of the Stream call (`StreamGuard`, a gRPC interceptor): the token check and limits
against hostile or broken clients.

The token travels as call metadata ("authorization: Bearer T" or "x-seed-token: T") and is checked with a
constant-time compare on the seed.Learner/Stream call; the grpc.health.v1 service stays unauthenticated
(Kubernetes probes, the launcher and seed-bench use it; it reveals only SERVING / NOT_SERVING). Limits: a cap
on streams that have not sent their handshake yet, a deadline for the handshake, an idle deadline for streams
whose client stopped talking, and an INVALID_ARGUMENT naming a message that does not parse.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from seed.transport.security import check_token

STREAM_METHOD = "/seed.Learner/Stream"
DEFAULT_HANDSHAKE_TIMEOUT_S = 10.0
DEFAULT_IDLE_TIMEOUT_S = 120.0


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
