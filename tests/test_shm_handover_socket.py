"""The shared-memory handover's socket (seed/transport/shm/handover.py): made mode 0600 without touching the
process-wide umask (other threads of the serving process create files meanwhile), and the learner's own peer
check: an actor of another user that reaches the socket anyway is refused before anything is handed over.

The other-user test runs a real process as nobody (uid 65534): it needs root to start it and skips without."""

from __future__ import annotations

import ast
import contextlib
import os
import select
import socket
import stat
import threading

import pytest

from seed.transport.shm import protocol as shm_protocol
from seed.transport.shm.handover import ShmHandover
from tests.conftest import REPO

NOBODY = 65534


def _no_umask(*_):
    raise AssertionError("os.umask called: it sets the process-wide mask under the serving process's other threads")


def test_the_handover_socket_is_0600_and_the_umask_is_never_set(tmp_path, monkeypatch):
    """Before: the umask was set to 0o077 around bind() and put back, while other threads ran."""
    monkeypatch.setattr(os, "umask", _no_umask)
    path = str(tmp_path / "learner.sock.shm")
    stop = threading.Event()
    handover = ShmHandover(None, [path], "", stop)
    handover.start()
    try:
        mode = os.lstat(path).st_mode
        assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600, oct(mode)
        assert os.listdir(tmp_path) == ["learner.sock.shm"]  # the private staging directory is gone
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(path)  # the listener behind the name
    finally:
        stop.set()
        handover.close()
    assert not os.path.exists(path)


def test_a_file_at_the_handover_path_is_left_alone(tmp_path, monkeypatch):
    """bind() refused a path where a file is; the staged socket's link() must refuse it too, not replace it."""
    monkeypatch.setattr(os, "umask", _no_umask)
    path = tmp_path / "learner.sock.shm"
    path.write_text("not a socket")
    handover = ShmHandover(None, [str(path)], "", threading.Event())
    with pytest.raises(FileExistsError):
        handover.start()
    assert path.read_text() == "not a socket"
    assert sorted(os.listdir(tmp_path)) == ["learner.sock.shm"]


def test_no_module_of_the_learner_sets_the_umask():
    """os.umask sets the mask of every thread: no module under seed/ may call it (reading it means setting it)."""
    calls = []
    for root, _, files in os.walk(os.path.join(REPO, "seed")):
        for name in files:
            if name.endswith(".py"):
                file = os.path.join(root, name)
                with open(file) as f:
                    tree = ast.parse(f.read(), file)
                calls += [f"{os.path.relpath(file, REPO)}:{node.lineno}" for node in ast.walk(tree)
                          if isinstance(node, ast.Attribute) and node.attr == "umask"]
    assert not calls, calls


class _Service:
    """What the handover asks the gRPC service once the peer and the token pass: records the call, refuses."""

    def __init__(self):
        self.asked = []

    def check_handshake(self, handshake):
        self.asked.append(handshake.actor_index)
        return "refused by the test's service"


def _other_users_actor(path: str, hello: bytes) -> tuple[int, bytes, int]:
    """Forks an actor of another user (nobody): it connects to `path`, sends the frame `hello` and reads the
    reply. (its exit status, the reply's bytes, how many descriptors came with them). The child makes only
    system calls, then _exit: nobody cannot run this machine's Python (it lives under /root)."""
    report_read, report_write = os.pipe()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            os.close(report_read)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(20)
            sock.connect(path)
            # A learner that refuses at once answers before any hello: then none is sent (a hello left unread
            # when it closes would make this side's read fail with ECONNRESET). One that waits gets it.
            if not select.select([sock], [], [], 5.0)[0]:
                with contextlib.suppress(BrokenPipeError):
                    sock.sendall(hello)
            received, fds = b"", []
            while True:
                try:
                    data, more, _, _ = socket.recv_fds(sock, 1 << 16, 8)
                except ConnectionResetError:
                    break
                if not data:
                    break
                received, fds = received + data, fds + more
            os.write(report_write, len(fds).to_bytes(4, "little") + received)
            status = 0
        except BaseException as error:
            os.write(2, f"other user's actor: {error!r}\n".encode())
        finally:
            os._exit(status)
    os.close(report_write)
    with os.fdopen(report_read, "rb") as report:
        data = report.read()
    _, status = os.waitpid(pid, 0)
    return status, data[4:], int.from_bytes(data[:4], "little") if data else -1


@pytest.mark.skipif(os.getuid() != 0, reason="an actor of another user needs root to start it")
def test_the_learner_refuses_a_peer_of_another_user_before_the_token_and_handshake():
    """The socket is 0600, so another user cannot normally reach it; should it (a chmod, a descriptor passed on),
    the learner's SO_PEERCRED check refuses the peer even with the right token, naming its uid, and hands over no
    descriptor. Seen failing with the uid check taken out: the hello went on to the service's handshake check."""
    import base64
    import json
    import tempfile

    from seed._proto import seed_pb2

    directory = tempfile.mkdtemp(prefix="seed-handover-", dir="/tmp")
    os.chmod(directory, 0o755)  # nobody may reach the socket
    path = os.path.join(directory, "learner.sock.shm")
    stop = threading.Event()
    service = _Service()
    handover = ShmHandover(service, [path], "s3cret", stop)
    handover.start()
    try:
        os.chmod(path, 0o666)  # the file mode no longer keeps it out: only the learner's own check is left
        handshake = seed_pb2.Handshake(actor_index=0, run_id=1, num_envs=4).SerializeToString()
        hello = shm_protocol.encode_frame(json.dumps({"metadata": [["authorization", "Bearer s3cret"]],
                                                      "handshake": base64.b64encode(handshake).decode()}).encode())
        status, reply, fds = _other_users_actor(path, hello)
        assert status == 0, status
        size = shm_protocol._LENGTH.size  # a frame: its length, then the JSON
        (length,) = shm_protocol._LENGTH.unpack(reply[:size])
        got = dict(reply=json.loads(reply[size:size + length]), fds=fds)
        assert got["reply"]["ok"] is False and got["reply"]["code"] == "UNAUTHENTICATED", got
        assert f"peer uid: got {NOBODY} (pid " in got["reply"]["details"], got
        assert f"expected the learner's uid {os.getuid()}" in got["reply"]["details"], got
        assert got["fds"] == 0 and service.asked == [], (got, service.asked)
    finally:
        stop.set()
        handover.close()
        with contextlib.suppress(OSError):
            os.rmdir(directory)
