"""The actors' channel to the learner (`open_channel`), with the client certificate when TLS is on."""

from __future__ import annotations

import grpc

from seed.transport.security import TransportSecurity

# gRPC's own reconnect backoff (1 s, growing 1.6x to 120 s by default) runs inside a channel that waits for the
# learner: an actor started before its learner, or waiting out a learner restart, would connect up to two minutes
# after the learner is back (a soak run measured 28 s). Retrying a local or in-cluster address every 0.1-1 s
# costs nothing; the actor's own backoff between streams (--reconnect_max_backoff_s) still applies on top.
RECONNECT_BACKOFF_MS = {"initial": 100, "min": 100, "max": 1000}

CHANNEL_OPTIONS = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1),
                   ("grpc.initial_reconnect_backoff_ms", RECONNECT_BACKOFF_MS["initial"]),
                   ("grpc.min_reconnect_backoff_ms", RECONNECT_BACKOFF_MS["min"]),
                   ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MS["max"])]


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
