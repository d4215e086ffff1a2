"""The shared-memory handover's socket (seed/serving/shm_handover.py): made mode 0600 without touching the
process-wide umask (other threads of the serving process create files meanwhile), and the learner's own peer
check: an actor of another user that reaches the socket anyway is refused before anything is handed over.

The other-user test runs a real process as nobody (uid 65534): it needs root to start it and skips without."""

from __future__ import annotations

import ast
import contextlib
import os
import socket
import stat
import threading

import pytest

from seed.serving import shm_protocol
from seed.serving.shm_handover import ShmHandover
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
