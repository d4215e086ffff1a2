"""The wire format of the shared-memory handover between the serving process and an actor on its host.

For every `unix:P` listen address the serving process also listens on the unix socket `P.shm` (mode 0600, the
learner's user only; `handover_path`). gRPC owns `P` itself, so the file descriptors cannot travel over it;
a sibling socket in the same directory has the same reach and the same permissions. One connection is one
actor run, framed as uint32 little-endian length + payload (at most MAX_FRAME_BYTES):

  actor -> learner  hello: JSON {"metadata": [[key, value], ...], "handshake": base64 of a seed.Handshake}
                    (metadata is what the actor would put in its gRPC call: the token, if any)
  learner -> actor  JSON {"ok": true, "first_env_id": int, "learner_run": str, "layout": SlabLayout fields}
                    with SCM_RIGHTS [slab memfd, request pipe of the actor's inference device, actor's reply
                    eventfd], or {"ok": false, "code": a grpc.StatusCode name, "details": str} and no fds
  actor -> learner  from then on only serialized seed.StepBatch messages holding just `finished` (episode stats)
  learner -> actor  an error frame before it closes the connection (a malformed episodes frame, shutdown)

Either side closing the connection ends the run: the actor reconnects with a new run id, as after a gRPC
stream's UNAVAILABLE.
"""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

MAX_FRAME_BYTES = 1 << 16
NUM_FDS = 3  # slab memfd, request pipe (write end), reply eventfd
_LENGTH = struct.Struct("<I")


class FrameError(ValueError):
    """A frame that breaks the handover's format (names the field, the value received and the value expected)."""


def handover_path(address: str) -> str | None:
    """The handover socket of a gRPC listen or dial address: `P.shm` for `unix:P` (also `unix:///P`), None for
    any other address (TCP, unix-abstract:)."""
    if not address.startswith("unix:"):
        return None
    path = address[len("unix:"):]
    if path.startswith("//"):  # unix:///absolute/path
        path = path[2:]
    return path + ".shm"


def encode_frame(payload: bytes) -> bytes:
    if len(payload) > MAX_FRAME_BYTES:
        raise FrameError(f"frame: got {len(payload)} bytes, expected at most {MAX_FRAME_BYTES}")
    return _LENGTH.pack(len(payload)) + payload


def send_frame(sock: socket.socket, payload: bytes, fds: list[int] | None = None) -> None:
    data = encode_frame(payload)
    if fds:
        sent = socket.send_fds(sock, [data], fds)
        if sent < len(data):
            sock.sendall(data[sent:])
    else:
        sock.sendall(data)


def send_json(sock: socket.socket, value: dict[str, Any], fds: list[int] | None = None) -> None:
    send_frame(sock, json.dumps(value).encode(), fds)


def _read_exactly(sock: socket.socket, n: int, start: bytes = b"") -> bytes | None:
    data = bytearray(start)
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


def _payload(sock: socket.socket, head: bytes) -> bytes | None:
    """The payload of the frame whose first bytes are `head`; None at end of stream."""
    header = _read_exactly(sock, _LENGTH.size, head[:_LENGTH.size])
    if header is None:
        return None
    (length,) = _LENGTH.unpack(header)
    if length > MAX_FRAME_BYTES:
        raise FrameError(f"frame length: got {length} bytes, expected at most {MAX_FRAME_BYTES}")
    return _read_exactly(sock, length, head[_LENGTH.size:])


def read_frame(sock: socket.socket) -> bytes | None:
    """One frame's payload, or None if the other side closed the connection first."""
    return _payload(sock, b"")


def read_frame_with_fds(sock: socket.socket) -> tuple[bytes | None, list[int]]:
    """One frame's payload and the descriptors that came with its first bytes (the caller owns them)."""
    # The descriptors ride on the frame's first byte; reading only the length keeps a later frame unread.
    head, fds, _, _ = socket.recv_fds(sock, _LENGTH.size, NUM_FDS)
    if not head:
        return None, fds
    return _payload(sock, head), fds


def read_json(payload: bytes, what: str) -> dict[str, Any]:
    try:
        value = json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise FrameError(f"{what}: got {len(payload)} bytes that are not JSON ({error}), expected a JSON object") \
            from None
    if not isinstance(value, dict):
        raise FrameError(f"{what}: got a JSON {type(value).__name__}, expected a JSON object")
    return value
