"""gRPC plumbing shared by the learner's server and the actors' channels, one job per module:

  security.py  TransportSecurity (mutual TLS, the shared token) and which listen addresses need it
  guard.py     StreamGuard: the server's token check and limits against hostile or broken clients
  server.py    start_grpc_server: options, receive limit, guard and credentials put together
  channel.py   open_channel: an actor's channel to the learner

Every process that serves or dials the learner builds its server or channel here, so transport settings live
in one place. The security is built from the flags once (seed.learner.main, seed.actor.loop) and passed in.
"""

from seed.transport.channel import CHANNEL_OPTIONS, open_channel
from seed.transport.guard import (
    DEFAULT_HANDSHAKE_TIMEOUT_S,
    DEFAULT_IDLE_TIMEOUT_S,
    STREAM_METHOD,
    TOKEN_KEYS,
    StreamGuard,
    check_token,
)
from seed.transport.security import (
    REDACTED,
    TransportConfigError,
    TransportSecurity,
    check_listen_security,
    is_loopback,
    listen_addresses,
)
from seed.transport.server import DEFAULT_MAX_MESSAGE_BYTES, GRPC_OPTIONS, SERVER_KEEPALIVE, start_grpc_server

__all__ = [
    "CHANNEL_OPTIONS", "DEFAULT_HANDSHAKE_TIMEOUT_S", "DEFAULT_IDLE_TIMEOUT_S", "DEFAULT_MAX_MESSAGE_BYTES",
    "GRPC_OPTIONS", "REDACTED", "SERVER_KEEPALIVE", "STREAM_METHOD", "TOKEN_KEYS", "StreamGuard",
    "TransportConfigError", "TransportSecurity", "check_listen_security", "check_token", "is_loopback",
    "listen_addresses", "open_channel", "start_grpc_server",
]
