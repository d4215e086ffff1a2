"""The learner's gRPC unix socket admits only its own user (seed/transport/grpc/server.py `_listen_unix`).

gRPC (grpcio 1.85) gives the server no peer uid for a unix connection (no SO_PEERCRED in the peer string or the
auth context), so the shared-memory handover's rule (the peer must run as the learner's user) is kept by the
socket's mode: 0600, set before the socket has its name, whatever the umask. Another user's connect() is refused by
the kernel (EACCES); root and the learner's user connect. Real processes: the server runs under umask 0 (where
gRPC's own socket was 0777), the other user's client is a forked process as nobody (needs root; skips without)."""

from __future__ import annotations

import errno
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.conftest import REPO

NOBODY = 65534

_SERVER = """
import os, sys
os.umask(0)  # the widest: gRPC's own socket would be 0777
from seed._proto import seed_pb2_grpc
from seed.transport import start_grpc_server
server, _, bound = start_grpc_server(seed_pb2_grpc.LearnerServicer(), ["unix:" + sys.argv[1]], max_workers=4)
print("listening", bound, flush=True)
sys.stdin.readline()
server.stop(grace=0.5).wait(5)
print("stopped", flush=True)
"""


def _connect_as_nobody(path: str) -> int:
    """errno of a connect() to `path` by a forked process of user nobody (0: connected)."""
    report_read, report_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # only system calls, then _exit
        code = 255
        try:
            os.close(report_read)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                try:
                    sock.connect(path)
                    code = 0
                except OSError as error:
                    code = error.errno
        finally:
            os.write(report_write, bytes([code]))
            os._exit(0)
    os.close(report_write)
    with os.fdopen(report_read, "rb") as report:
        code = report.read()
    os.waitpid(pid, 0)
    return code[0]


@pytest.mark.skipif(os.getuid() != 0, reason="a client of another user needs root to start it")
def test_another_user_cannot_connect_to_the_learners_unix_socket():
    """Before: the socket was 0777 under umask 0 (0755 under 022: 0777 & ~umask), and nobody connected."""
    directory = tempfile.mkdtemp(prefix="seed-grpc-unix-", dir="/tmp")
    os.chmod(directory, 0o755)  # nobody may reach the socket's name: only its mode keeps it out
    path = os.path.join(directory, "learner.sock")
    server = subprocess.Popen([sys.executable, "-c", _SERVER, path], cwd=REPO, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = server.stdout.readline()
        assert line.startswith("listening"), line + server.communicate(timeout=30)[0]
        mode = os.lstat(path).st_mode
        assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600, oct(mode)
        assert os.listdir(directory) == ["learner.sock"]  # the private staging directory is gone
        assert _connect_as_nobody(path) == errno.EACCES
        with grpc.insecure_channel(f"unix:{path}") as channel:  # this user (root) is served
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=30)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        out, _ = server.communicate("\n", timeout=30)
        assert server.returncode == 0 and "stopped" in out, out
        assert not os.path.exists(path)  # the name goes with the server, as gRPC's own did
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        shutil.rmtree(directory)


# --- the actor's side: no stream (its call carries the token) to a listener of another user ----------------------

_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_SETTINGS, _SETTINGS_ACK = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00", b"\x00\x00\x00\x04\x01\x00\x00\x00\x00"


def _foreign_http2_listener(path: str, seconds: float) -> tuple[int, int]:
    """Forks a listener on `path` as nobody that answers HTTP/2's connection setup (SETTINGS, then its ACK), so a
    gRPC channel to it becomes READY as to a learner, and records what its first client sends for `seconds`.
    (pid, read end of a pipe that gets those bytes when it is done)."""
    ready_read, ready_write = os.pipe()
    report_read, report_write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(ready_read), os.close(report_read)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(path)
            os.chmod(path, 0o777)  # anyone may connect, as to a socket made under umask 0
            listener.listen(8)
            os.write(ready_write, b"listening")
            os.close(ready_write)
            listener.settimeout(seconds)
            connection, _ = listener.accept()
            connection.sendall(_SETTINGS)
            received, acked = b"", False
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                connection.settimeout(max(0.01, deadline - time.monotonic()))
                try:
                    chunk = connection.recv(1 << 16)
                except TimeoutError:
                    break
                if not chunk:
                    break
                received += chunk
                if not acked and len(received) >= len(_PREFACE) + 9:
                    connection.sendall(_SETTINGS_ACK)
                    acked = True
            os.write(report_write, received)
        finally:
            os._exit(0)
    os.close(ready_write), os.close(report_write)
    with os.fdopen(ready_read, "rb") as ready:
        assert ready.read() == b"listening"
    return pid, report_read


def _frame_types(data: bytes) -> list[int]:
    """The HTTP/2 frame types a client sent after its connection preface (HEADERS = 1 opens a call)."""
    assert data.startswith(_PREFACE), data[:40]
    types, at = [], len(_PREFACE)
    while at + 9 <= len(data):
        length = int.from_bytes(data[at:at + 3], "big")
        types.append(data[at + 3])
        at += 9 + length
    return types


@pytest.mark.skipif(os.getuid() != 0, reason="a listener of another user needs root to start it")
def test_an_actor_opens_no_stream_to_a_unix_listener_of_another_user(tmp_path):
    """In a directory others can write, another user listens on the learner's unix path first and answers like a
    gRPC server: the actor's channel is READY, but the actor checks the listener's uid (SO_PEERCRED) and opens no
    stream, so no HEADERS frame (the call with the token) reaches it. Before, the Stream call went out at once."""
    shared = tempfile.mkdtemp(prefix="seed-shared-", dir="/tmp")  # like /tmp: anyone may create, sticky
    os.chmod(shared, 0o1777)
    path = os.path.join(shared, "learner.sock")
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token-0123456789\n")
    pid, report = _foreign_http2_listener(path, seconds=120)
    actor = subprocess.Popen([sys.executable, "-m", "seed.actor.main", "--env=fake:vector",
    f"--server_address=unix:{path}",
                              "--actor_index=0", "--envs_per_actor=2", f"--auth_token_file={token_file}",
                              "--transport=grpc"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    try:
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(actor.stdout), daemon=True)
        reader.start()
        deadline = time.monotonic() + 90
        while not any("listener uid: got" in line for line in lines) and time.monotonic() < deadline \
                and actor.poll() is None:
            time.sleep(0.2)
        time.sleep(2)  # a stream, had the actor opened one, would be on the wire by now
        actor.kill()
        actor.wait()
        reader.join(10)
        output = "".join(lines)
        with os.fdopen(report, "rb") as received:
            data = received.read()
        os.waitpid(pid, 0)
        pid = None
        assert f"unix:{path}: listener uid: got {NOBODY} (pid " in output, output[-3000:]
        assert "s3cret" not in output
        assert 1 not in _frame_types(data), _frame_types(data)  # no HEADERS: no call, no token
    finally:
        if actor.poll() is None:
            actor.kill()
            actor.wait()
        if pid is not None:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        shutil.rmtree(shared)
