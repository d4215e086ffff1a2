"""The actors' channel to the learner (`open_channel`), with the client certificate when TLS is on."""

from __future__ import annotations

import grpc

from seed.transport.security import TransportSecurity

# gRPC's own reconnect backoff (1 s, growing 1.6x to 120 s by default) runs inside a channel that waits for the
# learner: an actor started before its learner, or waiting out a learner restart, would connect up to two minutes
# after the learner is back (a soak run measured 28 s). Retrying a local or in-cluster address every 0.1-1 s
# costs nothing; the actor's own backoff between streams (--reconnect_max_backoff_s) still applies on top.
RECONNECT_BACKOFF_MS = {"initial": 100, "min": 100, "max": 1000}


# A connection whose peer went silent (a partition, a powered-off host) is only noticed by TCP when a
# retransmission finally fails, minutes later; and once the link is back, the stalled connection resumes only at
# its next retransmission, which backs off exponentially (a 15 s partition measured 15 s of extra stall). So the
# channel pings the learner every KEEPALIVE_TIME_MS, also while a step waits for its reply, and closes the
# connection when a ping is not answered within KEEPALIVE_TIMEOUT_MS: the stream fails (UNAVAILABLE), and the
# actor dials again at least every RECONNECT_BACKOFF_MS["max"] until the learner answers, so it is back within
# about a second of the link returning. Pings are answered by gRPC's transport thread, not Python code, so a
# busy learner still answers them; the server accepts pings this often (seed/transport/server.py).
KEEPALIVE_TIME_MS = 2_000
KEEPALIVE_TIMEOUT_MS = 3_000

CHANNEL_OPTIONS = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1),
                   ("grpc.initial_reconnect_backoff_ms", RECONNECT_BACKOFF_MS["initial"]),
                   ("grpc.min_reconnect_backoff_ms", RECONNECT_BACKOFF_MS["min"]),
                   ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MS["max"]),
                   ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS), ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
                   ("grpc.http2.max_pings_without_data", 0)]  # keep pinging while a step waits for its reply


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
