"""The learner's gRPC unix socket admits only its own user (seed/transport/server.py `_listen_unix`).

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
