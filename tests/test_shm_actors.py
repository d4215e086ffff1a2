"""The shared-memory path for actors on the learner's host (seed/transport/shm/link.py, seed/transport/shm/handover.py):
real learner processes, and either real actor processes or `ShmLink`s driven from the test.

The gRPC path's counterparts: tests/test_actor.py (superseded runs, both transports), tests/test_serving*.py,
tests/test_protocol.py, tests/test_transport_security.py (the gRPC token checks)."""

import base64
import os
import signal
import socket
import stat
import threading
import time

import numpy as np
import pytest

from seed._proto import seed_pb2
from seed.actor.loop import Actor
from seed.config import actor_config_class
from seed.transport import notify
from seed.transport.shm import protocol as shm_protocol
from seed.transport.shm.link import ShmLink, ShmRejected, ShmSuperseded, ShmUnavailable
from tests.conftest import read_metrics, wait_for
from tests.test_end_to_end import _actor_args, _learner_args

K = 4


def _handshake(index: int, run_id: int, **overrides) -> seed_pb2.Handshake:
    """The handshake seed-actor would send for the learner of `_learner_args` (fake:vector, 4 envs)."""
    config = actor_config_class()(env="fake:vector", envs_per_actor=K, actor_index=index, fake_episode_length=20)
    actor = Actor(config)
    try:
        handshake = actor._handshake(run_id)
    finally:
        actor.envs.close()
    for name, value in overrides.items():
        setattr(handshake, name, value)
    return handshake


def _link(path: str, index: int, run_id: int, token: str = "") -> ShmLink:
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    return ShmLink.connect(path, _handshake(index, run_id), metadata, threading.Event())


def _step() -> tuple[np.ndarray, ...]:
    observation = np.zeros((K, 8), np.float32)
    return observation, np.ones(K, np.float32), np.zeros(K, bool), np.zeros(K, bool)


def _start_learner(processes, tmp_path, **overrides):
    address = f"unix:{tmp_path}/learner.sock"
    learner = processes.learner(_learner_args(str(tmp_path / "run"), address, **overrides))
    path = shm_protocol.handover_path(address)
    wait_for(lambda: "listening on" in processes.output(learner) or learner.poll() is not None, 120,
             "the learner to serve", on_timeout=lambda: processes.output(learner))
    assert learner.poll() is None, processes.output(learner)
    return learner, address, path


def _train_steps(logdir):
    rows = read_metrics(logdir)
    return rows[-1]["train_steps"] if rows else 0


def test_the_handover_socket_is_there_before_grpc_listens(processes, tmp_path):
    """An actor with --transport=auto waits until gRPC answers and then tries the handover socket: were gRPC first,
    an actor racing the learner's start would fall back to gRPC (seen in a MinAtar test once the learner started
    2 s sooner). Watched every millisecond from before the learner starts: when the unix socket appears, so has
    the handover socket."""
    address = f"unix:{tmp_path}/learner.sock"
    grpc_socket, path = f"{tmp_path}/learner.sock", shm_protocol.handover_path(address)
    learner = processes.learner(_learner_args(str(tmp_path / "run"), address))
    deadline = time.monotonic() + 120
    while not os.path.exists(grpc_socket):
        assert learner.poll() is None and time.monotonic() < deadline, processes.output(learner)
        time.sleep(0.001)
    assert os.path.exists(path), "the gRPC socket appeared before the handover socket"


def test_shm_actors_train_and_their_steps_skip_grpc(processes, tmp_path):
    learner, address, path = _start_learner(processes, tmp_path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600  # the learner's user only
    actors = [processes.actor(_actor_args(address, i), f"actor{i}") for i in range(2)]  # --transport=auto
    logdir = str(tmp_path / "run")
    wait_for(lambda: _train_steps(logdir) >= 20, 120, "20 training steps", on_timeout=lambda: processes.output(learner))
    output = processes.output(learner)
    assert "actor 0 connected over shm" in output and "actor 1 connected over shm" in output, output
    assert "connected over grpc" not in output
    for i, actor in enumerate(actors):
        assert f"[actor {i}] connected to {address} over shm" in processes.output(actor)
    rows = read_metrics(logdir)
    assert rows[-1]["episodes"] > 0 and rows[-1]["env_frames"] > 0
    # Finished-episode stats travel over the handover connection (raw returns reach the learner's metrics).
    assert any(r.get("episode_raw_return_mean") is not None for r in rows), rows[-1]
    learner.send_signal(signal.SIGTERM)
    assert learner.wait(timeout=60) == 0
    for actor in actors:  # the learner's exit closed their connections; they reconnect (still running)
        assert actor.poll() is None


def test_stale_and_superseded_requests_on_the_shm_path(processes, tmp_path):
    learner, address, path = _start_learner(processes, tmp_path)
    first = _link(path, 0, run_id=11)
    actions = first.exchange(*_step())
    assert actions.shape == (K,) and actions.dtype == np.int32
    # A run that died after writing its request and before notifying it: the slot holds an unanswered request.
    first.slab.lock_slot(0)
    left = first.slab.write_request(0, first.run_id, *_step())
    first.slab.unlock_slot(0)
    second = _link(path, 0, run_id=22)  # a newer run of index 0 takes it over
    with pytest.raises(ShmSuperseded, match="actor_index 0: superseded by a newer actor run"):
        first.exchange(*_step())  # the older run, still alive, is told instead of writing
    assert first.slab.request_seq[0] == left  # and it wrote nothing
    second.exchange(*_step())  # finishes the leftover request (answered stale) before writing its own
    assert int(second.slab.request_seq[0]) == left + 1 == int(second.slab.reply_seq[0])

    # A request in flight when a newer run handshakes is answered stale: its run learns it was superseded. The
    # newer run (a real actor process: slot locks are per process) writes the slot only once that request is
    # answered, since inference may be reading its rows.
    os.kill(learner.pid, signal.SIGSTOP)  # inference pauses; the serving process (handshakes) does not
    outcome = []
    try:
        # kill() returns once the stop is queued; every thread of the learner stops on its own way back to user
        # space. Only then is the request below certain to be in flight rather than answered.
        wait_for(lambda: _all_threads_stopped(learner.pid), 10, "the learner's threads to stop")
        thread = threading.Thread(target=lambda: outcome.append(_outcome(second)))
        thread.start()
        wait_for(lambda: int(second.slab.request_seq[0]) == left + 2, 30, "the in-flight request")
        third = processes.actor(_actor_args(address, 0, transport="shm"), "actor0-third")
        wait_for(lambda: processes.output(learner).count("actor 0 connected over shm") == 3, 120,
                 "the third run's handshake", on_timeout=lambda: processes.output(third))
        time.sleep(1.0)
        slot = {name: int(getattr(second.slab, name)[0]) for name in ("request_seq", "request_run", "reply_seq",
                                                                       "reply_status", "live_run")}
        assert slot["request_seq"] == left + 2 and slot["request_run"] == 22, (left, slot, _thread_states(learner.pid))
    finally:
        os.kill(learner.pid, signal.SIGCONT)
    thread.join(60)
    assert outcome and isinstance(outcome[0], ShmSuperseded), outcome
    wait_for(lambda: int(second.slab.request_seq[0]) > left + 10, 60, "the third run's steps",
             on_timeout=lambda: processes.output(third))
    assert third.poll() is None and learner.poll() is None
    for link in (first, second):
        link.close()


def test_a_newer_run_connecting_leaves_the_older_runs_reply_wakeup_alone(processes, tmp_path):
    """Both runs of an index share its reply eventfd. A newer run that handshakes between inference answering the
    older run's request and the older run reading the wake-up must not consume that wake-up: the older run holds
    the slot until it reads its reply, so both runs would wait forever (seen in CI as a superseded actor that
    never exited)."""
    _, _, path = _start_learner(processes, tmp_path)
    first = _link(path, 0, run_id=11)
    first.exchange(*_step())
    first.slab.lock_slot(0)
    try:
        seq = first.slab.write_request(0, first.run_id, *_step())
        notify.send_request(first._request_fd, 0, seq)
        wait_for(lambda: first.slab.answered(0, seq), 30, "inference to answer the older run's request")
        second = _link(path, 0, run_id=22)  # handshakes while the older run has not read its wake-up yet
        waiter = threading.Thread(target=first._await_reply, args=(seq,), daemon=True)
        waiter.start()
        waiter.join(10)
        assert not waiter.is_alive(), "the older run never saw the wake-up of its answered request"
    finally:
        first.slab.unlock_slot(0)
    with pytest.raises(ShmSuperseded):
        first.exchange(*_step())  # and its next step learns it was superseded (it exits rather than reconnecting)
    second.exchange(*_step())
    for link in (first, second):
        link.close()


def _thread_states(pid: int) -> list[str]:
    """The scheduler state letter of each thread of `pid` (/proc/<pid>/task/*/stat; 'T' = stopped)."""
    states = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/stat") as f:
            states.append(f.read().rsplit(")", 1)[1].split()[0])
    return states


def _all_threads_stopped(pid: int) -> bool:
    return all(state in ("T", "t") for state in _thread_states(pid))


def _outcome(link: ShmLink):
    try:
        return link.exchange(*_step())
    except Exception as error:  # noqa: BLE001 - the test inspects it
        return error


def test_malformed_shm_requests_are_rejected_and_the_learner_serves_on(processes, tmp_path):
    learner, _, path = _start_learner(processes, tmp_path)
    link = _link(path, 0, run_id=1)
    link.exchange(*_step())
    observation, reward, done, truncated = _step()
    done.view(np.uint8)[2] = 2
    with pytest.raises(ShmRejected) as rejected:
        link.exchange(observation, reward, done, truncated)
    assert rejected.value.code == "INVALID_ARGUMENT"
    assert ("actor 0: step.done.data: got byte value 2 at index 2 (1 such bytes), expected 0 or 1 for dtype 'bool'"
            in rejected.value.details)
    truncated = np.zeros(K, bool)
    truncated.view(np.uint8)[0] = 255
    with pytest.raises(ShmRejected, match="step.truncated.data: got byte value 255 at index 0"):
        link.exchange(observation, np.ones(K, np.float32), np.zeros(K, bool), truncated)
    with pytest.raises(ShmRejected, match="step.reward: got a non-finite value, expected finite rewards"):
        link.exchange(observation, np.full(K, np.nan, np.float32), np.zeros(K, bool), np.zeros(K, bool))
    # Notifications naming no actor of this device, and garbage sequence numbers, are dropped.
    for actor, seq in ((99, 1), (-1, 1), (2**62, 5), (0, -7), (0, 2**62)):
        notify.send_request(link._request_fd, actor, seq)
    # Handshakes that do not match the learner are refused before any descriptor is sent.
    with pytest.raises(ShmRejected, match="num_envs: got 3, expected 4"):
        ShmLink.connect(path, _handshake(1, 5, num_envs=3), (), threading.Event())
    with pytest.raises(ShmRejected, match=r"actor_index: got 7, expected 0 <= actor_index < 2"):
        ShmLink.connect(path, _handshake(7, 5), (), threading.Event())
    # Hellos that are not what the protocol says: an error naming the field, or (framing broken) the connection
    # closes; no descriptors either way.
    for frame, expected in ((b"not json", "hello: got 8 bytes that are not JSON"),
                            (b'{"handshake": "%%%"}', "hello.handshake: got something that is not a base64"),
                            (b'{"metadata": [[1, 2, 3]], "handshake": ""}', "hello.metadata: got [[1, 2, 3]]")):
        reply, fds = _raw_frame(path, shm_protocol.encode_frame(frame))
        assert fds == [] and reply["code"] == "INVALID_ARGUMENT" and expected in reply["details"], reply
    reply, fds = _raw_frame(path, (1 << 30).to_bytes(4, "little") + b"x" * 64)  # a length beyond MAX_FRAME_BYTES
    assert reply is None and fds == []
    # A malformed episodes frame gets an error naming the field, then the connection closes.
    bad = seed_pb2.StepBatch(finished=[seed_pb2.EpisodeStats(env_index=9)]).SerializeToString()
    shm_protocol.send_frame(link._sock, bad)
    reply = shm_protocol.read_json(shm_protocol.read_frame(link._sock), "error")
    assert reply["code"] == "INVALID_ARGUMENT" and "step.finished[0].env_index: got 9, expected 0 <= env_index < 4" \
        in reply["details"], reply
    assert shm_protocol.read_frame(link._sock) is None
    link.close()
    # The learner is alive and serves a fresh run of the same index.
    fresh = _link(path, 0, run_id=2)
    assert fresh.exchange(*_step()).shape == (K,)
    fresh.close()
    assert learner.poll() is None
    assert "dropped" in processes.output(learner)  # the bad notifications were seen and dropped


def _raw_frame(path: str, data: bytes) -> tuple[dict | None, list[int]]:
    """Sends `data` on a fresh handover connection: the learner's reply (None if it just closed) and the
    descriptors that came with it (closed again)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(path)
        sock.sendall(data)
        try:
            payload, fds = shm_protocol.read_frame_with_fds(sock)
        except ConnectionResetError:  # closed with our bytes unread
            return None, []
        for fd in fds:
            os.close(fd)
        return (None if payload is None else shm_protocol.read_json(payload, "reply")), fds


def _raw_hello(path: str, metadata: list) -> tuple[dict, list[int]]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(path)
        hello = {"metadata": metadata, "handshake": base64.b64encode(_handshake(0, 9).SerializeToString()).decode()}
        shm_protocol.send_json(sock, hello)
        payload, fds = shm_protocol.read_frame_with_fds(sock)
        for fd in fds:
            os.close(fd)
        return shm_protocol.read_json(payload, "reply"), fds


def test_shm_actors_authenticate_before_they_get_any_descriptor(processes, tmp_path):
    learner, address, path = _start_learner(processes, tmp_path, auth_token="s3cret")
    reply, fds = _raw_hello(path, [])
    assert not reply["ok"] and reply["code"] == "UNAUTHENTICATED" and fds == []
    assert "expected 'Bearer <token>'" in reply["details"]
    reply, fds = _raw_hello(path, [["authorization", "Bearer n0pe"]])
    assert not reply["ok"] and reply["code"] == "UNAUTHENTICATED" and fds == [] and "n0pe" not in reply["details"]
    reply, fds = _raw_hello(path, [["authorization", "Bearer s3cret"]])
    assert reply["ok"] and len(fds) == shm_protocol.NUM_FDS
    # An actor process with a wrong token is refused like over gRPC: a configuration error, exit 2.
    wrong = processes.actor(_actor_args(address, 0, auth_token="nope", transport="shm"), "wrong")
    assert wrong.wait(timeout=120) == 2, processes.output(wrong)
    assert "metadata authorization: got a wrong token" in processes.output(wrong), processes.output(wrong)
    assert "connected to" not in processes.output(wrong)
    good = processes.actor(_actor_args(address, 1, auth_token="s3cret"), "good")
    wait_for(lambda: "over shm" in processes.output(good), 120, "the actor with the token to attach",
             on_timeout=lambda: processes.output(good))
    assert learner.poll() is None


def test_learner_can_refuse_the_shm_path(processes, tmp_path):
    learner, address, path = _start_learner(processes, tmp_path, shm_actors="false")
    assert not os.path.exists(path)
    with pytest.raises(ShmUnavailable):
        _link(path, 0, run_id=1)
    auto = processes.actor(_actor_args(address, 0), "auto")  # falls back to gRPC
    forced = processes.actor(_actor_args(address, 1, transport="shm", reconnect_max_backoff_s=0.5), "forced")
    wait_for(lambda: "over grpc" in processes.output(auto), 120, "the auto actor over gRPC",
             on_timeout=lambda: processes.output(auto))
    wait_for(lambda: "learner unavailable over shm" in processes.output(forced), 120, "the shm-only actor to retry",
             on_timeout=lambda: processes.output(forced))
    assert "connected to" not in processes.output(forced) and forced.poll() is None
    assert learner.poll() is None


def test_transport_flag_is_checked_at_start(processes, tmp_path):
    bad = processes.actor(_actor_args("localhost:1", 0, transport="shm"), "tcp-shm")
    assert bad.wait(timeout=60) == 2
    assert "--transport=shm: got --server_address='localhost:1'" in processes.output(bad)
    typo = processes.actor(_actor_args("unix:/nonexistent.sock", 0, transport="shared"), "typo")
    assert typo.wait(timeout=60) == 2
    assert "--transport: got 'shared', expected auto, grpc or shm" in processes.output(typo)


@pytest.mark.slow
@pytest.mark.parametrize("shm_actors,transport",
                         [("true", "shm"), pytest.param("false", "grpc", marks=pytest.mark.learning)])
def test_cartpole_learns_through_launch_local_sh(tmp_path, shm_actors, transport):
    """launch/local.sh's actors dial the learner's unix socket: over shared memory unless the learner refuses it."""
    from tests.test_learning import _train_until

    elapsed = _train_until(tmp_path, ["--agent=vtrace", "--env=gym:CartPole-v1", "--seed=1",
                                      f"--shm_actors={shm_actors}"], 150, timeout_s=600)
    output = (tmp_path / "local.log").read_text(errors="replace")
    assert "[actor 0] connected to" in output and f"over {transport}" in output, output[-3000:]
    assert f"over {'grpc' if transport == 'shm' else 'shm'}" not in output
    print(f"V-trace over {transport} reached a mean return of 150 in {elapsed:.0f}s")


def test_handover_socket_sits_beside_the_unix_socket_only():
    assert shm_protocol.handover_path("unix:/run/seed/learner.sock") == "/run/seed/learner.sock.shm"
    assert shm_protocol.handover_path("unix:///run/seed/learner.sock") == "/run/seed/learner.sock.shm"
    assert shm_protocol.handover_path("unix:logs/learner.sock") == "logs/learner.sock.shm"
    for address in ("localhost:8686", "127.0.0.1:8686", "[::1]:8686", "unix-abstract:seed"):
        assert shm_protocol.handover_path(address) is None
    with pytest.raises(shm_protocol.FrameError, match=f"frame: got {shm_protocol.MAX_FRAME_BYTES + 1} bytes"):
        shm_protocol.encode_frame(b"x" * (shm_protocol.MAX_FRAME_BYTES + 1))


def test_a_learner_with_mutual_tls_offers_no_shm_path(processes, tmp_path):
    """A TLS identity cannot be checked on the handover socket: the path is off, and an actor asking for it with
    --tls_* is a configuration error."""
    from tests.certs import make_pki

    pki = make_pki(str(tmp_path / "pki"))
    tls = dict(tls_cert=pki.server_cert, tls_key=pki.server_key, tls_ca=pki.ca)
    learner, address, path = _start_learner(processes, tmp_path, **tls)
    assert not os.path.exists(path)
    actor = processes.actor(_actor_args(address, 0, transport="shm", tls_cert=pki.client_cert,
                                        tls_key=pki.client_key, tls_ca=pki.ca), "tls-shm")
    assert actor.wait(timeout=60) == 2
    assert "--transport=shm: got --server_address=" in processes.output(actor)
    assert "with mutual TLS" in processes.output(actor)
    assert learner.poll() is None
