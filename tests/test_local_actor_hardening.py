"""What an actor on the learner's host can do with what the shared-memory path hands it, and what it must not be
able to do to the learner (issue 25): shrink the step slab, desynchronise a request pipe, stall or crash the
batcher with an absurd arrival time; and who it hands its token to.

Real processes throughout: the actor side is a separate process holding the descriptors, the foreign listener
runs as another user (nobody, uid 65534: that test needs root to start it and skips without)."""

import contextlib
import logging
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import pytest

from seed._proto import seed_pb2
from seed.inference.central import request_latencies_s
from seed.transport import notify
from seed.transport.shm import protocol as shm_protocol
from seed.transport.shm.link import ShmLink, ShmUnavailable
from seed.transport.slab import StepSlab
from tests.conftest import REPO, wait_for
from tests.test_end_to_end import _learner_args

K = 4
NOBODY = 65534


@pytest.fixture
def slab():
    slab = StepSlab.create(num_actors=3, envs_per_actor=K, observation_shape=(8,), observation_dtype="float32")
    yield slab
    slab.release()


def _python(script: str, *args, **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", script, *map(str, args)], cwd=REPO, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **popen)


# The actor side: receives the slab's descriptor over a unix socket (SCM_RIGHTS, as from the handover) and
# truncates the file.
_TRUNCATING_ACTOR = """
import os, socket, sys
sock = socket.socket(fileno=int(sys.argv[1]))
_, fds, _, _ = socket.recv_fds(sock, 1, 1)
try:
    os.ftruncate(fds[0], 0)
    print("truncated")
except OSError as error:
    print("refused", error.errno)
"""

# The learner side: maps the slab before the actor acts (as the learner and the serving process do), then reads
# every byte of it once told to.
_SLAB_READER = """
import mmap, sys, zlib
with mmap.mmap(int(sys.argv[1]), int(sys.argv[2])) as mapping:
    print("mapped", flush=True)
    sys.stdin.readline()
    print("read", zlib.crc32(mapping[:]), flush=True)
"""


def test_an_actor_cannot_shrink_the_slab_under_the_learner(slab):
    """The slab's memfd goes to every shm actor writable; its size is sealed, so an actor's ftruncate fails (EPERM)
    instead of ending the learner with SIGBUS at its next read of the slab."""
    import errno
    import zlib

    slab.observation[:] = np.arange(slab.observation.size, dtype=np.float32).reshape(slab.observation.shape)
    fd, nbytes = slab.layout.fd, slab.nbytes
    reader = _python(_SLAB_READER, fd, nbytes, pass_fds=(fd,))
    assert reader.stdout.readline().strip() == "mapped"
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours, theirs:
        actor = _python(_TRUNCATING_ACTOR, theirs.fileno(), pass_fds=(theirs.fileno(),))
        socket.send_fds(ours, [b"x"], [fd])
        actor_output, _ = actor.communicate(timeout=60)
    assert actor_output.split() == ["refused", str(errno.EPERM)], actor_output
    assert os.fstat(fd).st_size == nbytes
    reader_output, _ = reader.communicate("go\n", timeout=60)
    assert reader.returncode == 0, (reader.returncode, reader_output)  # -7 (SIGBUS) had the file shrunk
    assert reader_output.split()[-2:] == ["read", str(zlib.crc32(os.pread(fd, nbytes, 0)))]
    assert slab.observation[-1, -1] == slab.observation.size - 1  # and the learner's own mapping reads too


# A well-behaved writer in its own process: `count` notifications of actor `actor`, sequence numbers 1..count.
_NOTIFYING_ACTOR = """
import sys
from seed.transport import notify
fd, actor, count = map(int, sys.argv[1:4])
for seq in range(1, count + 1):
    notify.send_request(fd, actor, seq)
"""


def test_a_malformed_notification_is_dropped_alone(slab, caplog):
    """A 5-byte write to a request pipe shifted every later 16-byte notification of every writer (a byte stream
    joins writes); in packet mode it is one packet, dropped alone, and said once with its size."""
    read_fd, write_fd = notify.new_request_channel()
    count = 300  # more than the pipe holds: the writers block until the batcher reads, as under load
    try:
        batcher = notify.RequestBatcher(read_fd, slab, batch_rows=2 * K, timeout_s=0.0)
        os.write(write_fd, b"\x01\x02\x03\x04\x05")
        writers = [_python(_NOTIFYING_ACTOR, write_fd, actor, count, pass_fds=(write_fd,)) for actor in (0, 2)]
        received: dict[int, list[int]] = {0: [], 2: []}
        deadline = time.monotonic() + 60
        with caplog.at_level(logging.WARNING, logger="seed.transport.notify"):
            while sum(map(len, received.values())) < 2 * count and time.monotonic() < deadline:
                batch = batcher.next_batch(0.5)
                if batch is None:
                    continue
                for actor, seq in zip(*batch, strict=True):
                    received.setdefault(int(actor), []).append(int(seq))
        for writer in writers:
            assert writer.wait(timeout=60) == 0, writer.communicate()[0]
    finally:
        os.close(read_fd), os.close(write_fd)
    expected = list(range(1, count + 1))
    assert received == {0: expected, 2: expected}, {a: seqs[:10] for a, seqs in received.items()}
    assert batcher.rejected == 1
    assert "dropped malformed notifications (1 of 5 bytes), expected packets of 16 bytes" in caplog.text


def _write_request(slab: StepSlab, actor: int) -> int:
    return slab.write_request(actor, 1, np.zeros((K, 8), np.float32), np.zeros(K, np.float32), np.zeros(K, bool),
                              np.zeros(K, bool))


@pytest.mark.parametrize("arrival_s", [float("inf"), float("-inf"), float("nan"), 1e300])
def test_an_absurd_arrival_time_is_batched_normally(slab, arrival_s):
    """An shm actor writes its slot's arrival_s itself: +inf or 1e300 made the batch deadline overflow the poll
    timeout (OverflowError in the inference thread, which ends the run). The deadline stays within batch_timeout
    of now, so the request is served with the others."""
    read_fd, write_fd = notify.new_request_channel()
    try:
        batcher = notify.RequestBatcher(read_fd, slab, batch_rows=3 * K, timeout_s=0.05)
        seq = _write_request(slab, 0)
        slab.arrival_s[0] = arrival_s
        notify.send_request(write_fd, 0, seq)
        actors, seqs = batcher.next_batch(1.0)  # a partial batch: it goes at the (clamped) deadline
        assert actors.tolist() == [0] and seqs.tolist() == [seq]
        for actor in (1, 2):  # and the batcher serves on, the absurd slot among true ones
            notify.send_request(write_fd, actor, _write_request(slab, actor))
        notify.send_request(write_fd, 0, seq)
        actors, _ = batcher.next_batch(1.0)
        assert sorted(actors.tolist()) == [0, 1, 2]
    finally:
        os.close(read_fd), os.close(write_fd)



def test_an_absurd_arrival_time_stays_out_of_the_latency_metric():
    """The same absurd arrival_s reached the row's latency percentiles as inf or NaN (now - arrival); it is left
    out, the true latencies kept."""
    arrivals = np.array([99.5, float("inf"), float("-inf"), float("nan"), 1e300, 99.9, 120.0])
    assert request_latencies_s(100.0, arrivals) == pytest.approx([0.5, 0.1])

def _foreign_listener(path: str, report_fd: int) -> int:
    """Forks another user's listener on `path`: it binds and listens as nobody, accepts one connection and writes
    to `report_fd` how many bytes it received and whether the token was among them. Its pid, once it listens."""
    ready_read, ready_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: only system calls, then _exit (no Python state of the test is touched)
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(path)
            listener.listen(1)
            os.write(ready_write, b"listening")
            os.close(ready_write)
            listener.settimeout(60)
            connection, _ = listener.accept()
            connection.settimeout(3)
            received = b""
            with contextlib.suppress(TimeoutError):
                while chunk := connection.recv(1 << 16):
                    received += chunk
            os.write(report_fd, f"received {len(received)} {b's3cret' in received}".encode())
        finally:
            os._exit(0)
    os.close(ready_write)
    with os.fdopen(ready_read, "rb") as ready:
        assert ready.read() == b"listening"  # end of file once it listens (or failed, and said nothing)
    return pid


@pytest.mark.skipif(os.getuid() != 0, reason="a listener of another user needs root to start it")
def test_an_actor_sends_no_token_to_a_listener_of_another_user():
    """In a directory others can write, another user can listen on `P.shm` before the learner: the actor checks
    who listens (SO_PEERCRED) before its hello, which carries the token."""
    shared = tempfile.mkdtemp(prefix="seed-shared-", dir="/tmp")  # like /tmp: anyone may create, sticky
    os.chmod(shared, 0o1777)
    path = os.path.join(shared, "learner.sock.shm")
    report_read, report_write = os.pipe()
    pid = None
    try:
        pid = _foreign_listener(path, report_write)
        os.close(report_write)
        assert os.stat(path).st_uid == NOBODY
        handshake = seed_pb2.Handshake(actor_index=0, run_id=1, num_envs=K)
        with pytest.raises(ShmUnavailable) as refused:
            ShmLink.connect(path, handshake, (("authorization", "Bearer s3cret"),), threading.Event(), timeout_s=10)
        message = str(refused.value)
        assert f"peer uid: got {NOBODY} (pid {pid}), expected this actor's uid 0 or root (0)" in message, message
        assert path in message and "s3cret" not in message
        with os.fdopen(report_read, "rb") as report:
            assert report.read() == b"received 0 False"  # not one byte of the hello
        assert os.waitpid(pid, 0)[1] == 0
        pid = None
    finally:
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        shutil.rmtree(shared)


def test_a_learner_with_a_token_fails_at_start_when_its_handover_path_is_taken(processes, tmp_path):
    """Something the learner cannot remove sits at `P.shm` (a directory here; another user's socket in a sticky
    /tmp behaves the same for a learner that is not root). With a token that is fatal, naming the path: whoever
    holds it would get the tokens of the actors that connect. Without a token it offers gRPC only, in one line."""
    address = f"unix:{tmp_path}/learner.sock"
    path = shm_protocol.handover_path(address)
    os.mkdir(path)
    learner = processes.learner(_learner_args(str(tmp_path / "run"), address, auth_token="s3cret"))
    wait_for(lambda: "listening on" in processes.output(learner) or learner.poll() is not None, 120,
             "the learner to start or fail", on_timeout=lambda: processes.output(learner))
    assert learner.wait(timeout=60) != 0, processes.output(learner)
    output = processes.output(learner)
    assert f"shared-memory handover socket {path}: cannot claim it" in output, output[-3000:]
    assert "s3cret" not in output
    assert stat.S_ISDIR(os.lstat(path).st_mode)  # left as it was

    tokenless = processes.learner(_learner_args(str(tmp_path / "run2"), address), "tokenless")
    wait_for(lambda: "listening on" in processes.output(tokenless) or tokenless.poll() is not None, 120,
             "the learner without a token to serve", on_timeout=lambda: processes.output(tokenless))
    assert tokenless.poll() is None, processes.output(tokenless)
    assert f"shared-memory path for local actors not offered: ['{path}']" in processes.output(tokenless)
