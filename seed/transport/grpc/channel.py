"""The actors' channel to the learner (`open_channel`), with the client certificate when TLS is on."""

from __future__ import annotations

import os
import socket
import struct

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
# busy learner still answers them; the server accepts pings this often (seed/transport/grpc/server.py).
KEEPALIVE_TIME_MS = 2_000
KEEPALIVE_TIMEOUT_MS = 3_000

# A name lookup whose query is lost (a DNS server that is restarting or unreachable: a namespace host's, or a
# container network's gateway whose MAC changed, launch/docker/pin_bridge_mac.sh) is given up after
# DNS_QUERY_TIMEOUT_MS rather than gRPC's 120 s (c-ares' own retries took 11 s against a silent server): the
# attempt fails, and the actor dials again on a fresh channel that asks again (seed/actor/loop.py,
# Actor._wait_for_learner). The learner's name is a cluster or local one (a Service, a container, /etc/hosts, a
# scheduler's node name), answered in milliseconds.
DNS_QUERY_TIMEOUT_MS = 2_000

CHANNEL_OPTIONS = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1),
                   ("grpc.initial_reconnect_backoff_ms", RECONNECT_BACKOFF_MS["initial"]),
                   ("grpc.min_reconnect_backoff_ms", RECONNECT_BACKOFF_MS["min"]),
                   ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MS["max"]),
                   ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS), ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
                   ("grpc.http2.max_pings_without_data", 0),  # keep pinging while a step waits for its reply
                   ("grpc.dns_ares_query_timeout", DNS_QUERY_TIMEOUT_MS)]


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


def unix_listener_problem(address: str) -> str | None:
    """For a `unix:P` address: why the process listening on P must not be sent this actor's stream (it runs as
    another user than this actor's, and not as root: SO_PEERCRED, the shared-memory actors' rule), else None.
    None for other addresses and when nothing listens on P (the channel's own failure says so).

    The learner's socket is mode 0600 (seed/transport/grpc/server.py), so an actor of another user cannot reach it;
    but in a directory others can write (/tmp) another user may hold P and listen there, and the Stream call
    carries the token. Checked on a connection of its own just before the stream opens."""
    if not address.startswith("unix:"):
        return None
    path = address[len("unix:"):]
    path = path[2:] if path.startswith("//") else path  # unix:///absolute/path
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5.0)
        try:
            sock.connect(path)
        except OSError:
            return None
        pid, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                          struct.calcsize("3i")))
    if uid in (os.getuid(), 0):
        return None
    return (f"{address}: listener uid: got {uid} (pid {pid}), expected this actor's uid {os.getuid()} or root (0): "
            "another user listens there; no stream opened (its call would carry the token)")
