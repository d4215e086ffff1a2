"""How a step gets from an actor to inference, one folder per transport (docs/ARCHITECTURE.md, "Rooms"):

  link.py      ActorLink: the actor's side of every transport, and the errors it raises (LinkDown: reconnect;
               LinkFatal: end); its docstring names each transport's learner-side endpoint
  slab.py      StepSlab: the shared step slab every transport ends in (`write_request`), one slot per actor
  notify.py    request pipes, reply eventfds, RequestBatcher: the notifications that order the slab
  security.py  TransportSecurity (mutual TLS, the shared token, `check_token`) and which listen addresses need it
  wire.py      the seed.proto records <-> numpy, and the checks every transport applies to a step
  grpc/        any host: channel.py (an actor's channel), link.py (GrpcLink), server.py + guard.py (the learner's
               server and its limits), service.py (SlabService: handshake check, one stream per actor),
               compression.py (lz4)
  shm/         the learner's host: protocol.py (the handover socket's frames), handover.py (the learner's side:
               the slab's descriptors for an authenticated actor), link.py (the actor's side: writes the slab)

Every process that serves or dials the learner builds its server, channel or link here, so transport settings
live in one place. The security is built from the flags once (seed.learner.main, seed.actor.loop) and passed in.
"""

from seed.transport.grpc.channel import CHANNEL_OPTIONS, open_channel
from seed.transport.grpc.guard import DEFAULT_HANDSHAKE_TIMEOUT_S, DEFAULT_IDLE_TIMEOUT_S, STREAM_METHOD, StreamGuard
from seed.transport.grpc.server import DEFAULT_MAX_MESSAGE_BYTES, GRPC_OPTIONS, SERVER_KEEPALIVE, start_grpc_server
from seed.transport.security import (
    REDACTED,
    TOKEN_KEYS,
    TransportConfigError,
    TransportSecurity,
    check_listen_security,
    check_token,
    is_loopback,
    listen_addresses,
)

__all__ = [
    "CHANNEL_OPTIONS", "DEFAULT_HANDSHAKE_TIMEOUT_S", "DEFAULT_IDLE_TIMEOUT_S", "DEFAULT_MAX_MESSAGE_BYTES",
    "GRPC_OPTIONS", "REDACTED", "SERVER_KEEPALIVE", "STREAM_METHOD", "TOKEN_KEYS", "StreamGuard",
    "TransportConfigError", "TransportSecurity", "check_listen_security", "check_token", "is_loopback",
    "listen_addresses", "open_channel", "start_grpc_server",
]
