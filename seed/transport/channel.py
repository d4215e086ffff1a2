"""The actors' channel to the learner (`open_channel`), with the client certificate when TLS is on."""

from __future__ import annotations

import grpc

from seed.transport.security import TransportSecurity

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
