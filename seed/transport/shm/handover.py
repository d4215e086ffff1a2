"""The serving process's side of the shared-memory path: hands an authenticated actor on this host the step
slab's descriptors, so its steps skip protobuf, gRPC and this process entirely.

Per unix listen address `unix:P` it listens on `P.shm` (seed/transport/shm/protocol.py has the frames). One
thread per connection, never on a step's path:

1. the peer must run as the learner's user (SO_PEERCRED; the socket file is mode 0600 too), and its hello
   must carry the token the gRPC guard checks (`check_token`, the same function) when the learner has one;
2. its Handshake goes through `SlabService.check_handshake`, the gRPC stream's check (actor index, K, run id,
   env spec), and `SlabService.register` makes its run the live one (a newer run of an index supersedes the
   older, whichever transport either uses); once the learner's run is over it is refused with OUT_OF_RANGE
   (`wire.RUN_FINISHED`, as a gRPC stream would be), and the actor exits 0;
3. only then are the descriptors sent: the slab's memfd (its size sealed: seed/transport/slab.py), the write end
   of the request pipe of the actor's inference device (packet mode: seed/transport/notify.py) and the actor's
   reply eventfd (created by the learner, one per actor index; the serving process's gRPC streams of that index
   wait on the same one);
4. afterwards the connection carries the actor's finished-episode stats, checked like a StepBatch's
   (`SlabService.check_episode`); a malformed one gets an error frame and the connection is closed.

The learner refuses the path (no `P.shm` socket, so `--transport=auto` actors use gRPC) with
`--shm_actors=false`, and when it requires mutual TLS: a TLS identity cannot be checked on this socket.

`P.shm` may be taken: in a directory others can write (/tmp), another user can create it first and listen there.
Actors check their peer's uid before they send the hello (seed/transport/shm/link.py); a learner with a token that
cannot claim `P.shm` (remove what is there, bind, listen) fails at start naming the path (HandoverPathTaken)
rather than leave the name to someone else. Without a token there is no secret to lose: it says so in one line
and serves gRPC only.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import os
import socket
import stat
import struct
import tempfile
import threading

from google.protobuf.message import DecodeError

from seed._proto import seed_pb2
from seed.transport import wire
from seed.transport.grpc.service import SlabService
from seed.transport.security import check_token
from seed.transport.shm import protocol as shm_protocol

HELLO_TIMEOUT_S = 10.0
_MAX_UNIX_PATH_BYTES = 108  # sun_path, NUL included (Linux)


class HandoverPathTaken(RuntimeError):
    """The learner has a token and cannot listen on a handover path: something it cannot remove is there (another
    user's socket in a shared directory, a file, a directory). Fatal, so the learner fails at start."""


class ShmHandover:
    """Listens on the handover sockets of a serving process.

    Args:
      service: the gRPC service, whose checks, registration and episode sink the handover reuses.
      paths: the handover socket paths (`shm_protocol.handover_path` of each unix listen address).
      auth_token: the learner's token ('' = none).
      stop: set when the serving process shuts down.
    """

    def __init__(self, service: SlabService, paths: list[str], auth_token: str, stop: threading.Event):
        self.service = service
        self.paths = paths
        self.auth_token = auth_token
        self.stop = stop
        self._listeners: list[socket.socket] = []
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()

    def start(self) -> None:
        """Listens on every path. Raises OSError if a path cannot be claimed (the serving process then offers no
        shm path and gRPC actors still work), or HandoverPathTaken instead when the learner has a token."""
        for path in self.paths:
            try:
                listener = self._claim(path)
            except OSError as error:
                if not self.auth_token or len(os.fsencode(path)) >= _MAX_UNIX_PATH_BYTES:
                    raise  # a path too long to bind is one nobody can listen on: no actor can be misled
                self.close()
                raise HandoverPathTaken(
                    f"shared-memory handover socket {path}: cannot claim it ({type(error).__name__}: {error}), "
                    "expected to remove what is there and listen: whoever holds it would receive the token of "
                    "every actor on this host that connects there. Remove it, or use --server_address=unix: in a "
                    "directory only this user can write (or --shm_actors=false)") from error
            self._listeners.append(listener)
            threading.Thread(target=self._accept, args=(listener,), name="shm-handover", daemon=True).start()

    @staticmethod
    def _claim(path: str) -> socket.socket:
        """A listening socket bound to `path` (mode 0600), after removing a dead learner's socket there.

        The process-wide umask is left alone (other threads create files meanwhile): the socket is bound in a
        private directory (mode 0700) beside `path`, made 0600 there, then linked to `path`, so it is never
        reachable by another user with a wider mode. link() refuses to replace anything at `path`, as bind did."""
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(os.lstat(path).st_mode):
                os.unlink(path)  # a dead learner's socket; a live one holds its gRPC address, so we'd not be here
        private = tempfile.mkdtemp(prefix=".", dir=os.path.dirname(os.path.abspath(path)))  # 0700
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            staged = os.path.join(private, "s")
            listener.bind(staged)
            os.chmod(staged, 0o600)  # connecting needs write permission only
            listener.listen(128)
            os.link(staged, path)
        except BaseException:
            listener.close()
            raise
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(private, "s"))
            os.rmdir(private)
        listener.settimeout(0.5)
        return listener

    def close(self) -> None:
        """Stops listening and closes every actor's connection (they reconnect, like gRPC streams)."""
        for listener, path in zip(self._listeners, self.paths, strict=False):  # fewer if start failed
            listener.close()
            with contextlib.suppress(OSError):
                os.unlink(path)
        with self._lock:
            for connection in self._connections:
                with contextlib.suppress(OSError):
                    connection.shutdown(socket.SHUT_RDWR)

    def _accept(self, listener: socket.socket) -> None:
        while not self.stop.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:  # closed
                return
            threading.Thread(target=self._serve, args=(connection,), name="shm-actor", daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
        with self._lock:
            self._connections.add(connection)
        try:
            with connection:
                connection.settimeout(HELLO_TIMEOUT_S)
                attached = self._handshake(connection)
                if attached is None:
                    return
                connection.settimeout(None)
                self._receive_episodes(connection, *attached)
        except (OSError, shm_protocol.FrameError):
            pass  # the actor went away or broke the framing; its run ends with the connection
        finally:
            with self._lock:
                self._connections.discard(connection)

    def _refuse(self, connection: socket.socket, code: str, details: str) -> None:
        with contextlib.suppress(OSError):
            shm_protocol.send_json(connection, {"ok": False, "code": code, "details": details})

    def _handshake(self, connection: socket.socket) -> tuple[int, int] | None:
        """Authenticates and checks the hello; sends the descriptors. (actor index, first env id), or None if
        refused."""
        pid, uid, _ = struct.unpack("3i", connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        if uid != os.getuid():
            self._refuse(connection, "UNAUTHENTICATED", f"peer uid: got {uid} (pid {pid}), expected the learner's "
                                                        f"uid {os.getuid()}")
            return None
        try:
            payload = shm_protocol.read_frame(connection)
        except TimeoutError:
            self._refuse(connection, "DEADLINE_EXCEEDED", f"hello: got no frame within {HELLO_TIMEOUT_S:g}s of "
                                                          "connecting, expected the hello first")
            return None
        if payload is None:
            return None
        try:
            hello = shm_protocol.read_json(payload, "hello")
            metadata = tuple(tuple(pair) for pair in hello.get("metadata", ()))
            if not all(len(pair) == 2 and all(isinstance(v, str) for v in pair) for pair in metadata):
                raise shm_protocol.FrameError(f"hello.metadata: got {hello.get('metadata')!r}, expected a list of "
                                              "[key, value] string pairs")
        except (shm_protocol.FrameError, TypeError) as error:
            self._refuse(connection, "INVALID_ARGUMENT", str(error))
            return None
        if self.auth_token:
            problem = check_token(metadata, self.auth_token)
            if problem:
                self._refuse(connection, "UNAUTHENTICATED", problem)
                return None
        try:
            handshake = seed_pb2.Handshake.FromString(base64.b64decode(hello.get("handshake", ""), validate=True))
        except (DecodeError, ValueError, TypeError) as error:
            self._refuse(connection, "INVALID_ARGUMENT", f"hello.handshake: got something that is not a base64 "
                                                         f"seed.Handshake ({error}), expected one")
            return None
        problem = self.service.check_handshake(handshake)
        if problem:
            self._refuse(connection, "INVALID_ARGUMENT", f"handshake rejected: {problem}")
            return None
        service, actor = self.service, handshake.actor_index
        told = service.slab.tell_finished(actor)
        if told is not None:  # the learner's run is over: the actor exits 0 (what gRPC says with RUN_FINISHED)
            self._refuse(connection, wire.RUN_FINISHED.name, told)
            return None
        first_env_id = service.register(handshake, "shm")
        layout = service.slab.layout
        fds = [layout.fd, service.request_fds[actor % len(service.request_fds)], service.reply_fds[actor]]
        shm_protocol.send_json(connection, {"ok": True, "first_env_id": first_env_id,
                                            "learner_run": service.learner_run,
                                            "layout": dataclasses.asdict(layout)}, fds)
        return actor, first_env_id

    def _receive_episodes(self, connection: socket.socket, actor: int, first_env_id: int) -> None:
        while (payload := shm_protocol.read_frame(connection)) is not None:
            try:
                step = seed_pb2.StepBatch.FromString(payload)
                for i, episode in enumerate(step.finished):
                    self.service.check_episode(i, episode)
            except (DecodeError, wire.WireError) as error:
                self._refuse(connection, "INVALID_ARGUMENT", f"actor {actor}: episodes frame: {error}")
                return
            self.service.report_episodes(first_env_id, step.finished)
