"""Transport security against a real learner: the token (missing, wrong, right), mutual TLS (no client
certificate, a certificate from another CA, the right one), loopback-only defaults, and the stream guard's
limits (handshake deadline, streams awaiting a handshake)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from seed import transport
from seed._proto import seed_pb2, seed_pb2_grpc
from seed.envs import make_spec
from seed.learner.configuration import resolve_config
from seed.learner.learner import Learner
from seed.transport import wire
from tests.certs import make_pki
from tests.conftest import REPO, free_tcp_port, wait_for

TOKEN = "s3cret-token-for-tests-0123456789"


def _start_learner(tmp_path, address: str, security: transport.TransportSecurity):
    config = resolve_config(dict(env="fake:vector", logdir=str(tmp_path / "run"), server_address=address,
                                 num_actors=2, envs_per_actor=4, batch_size=4, unroll_length=5, log_interval_s=0.5,
                                 total_environment_frames=1e12, torch_threads=1))
    learner = Learner(config, security=security)  # what learner_main builds from the flags
    thread = threading.Thread(target=learner.run, daemon=True)
    thread.start()
    wait_for(lambda: learner.bound_addresses, 30, "the learner to listen")
    return learner, thread


@pytest.fixture
def secured_learner(tmp_path, request):
    security = request.param(tmp_path) if callable(request.param) else request.param
    address = f"127.0.0.1:{free_tcp_port()}"
    learner, thread = _start_learner(tmp_path, address, security)
    yield address, security
    learner.request_stop()
    thread.join(timeout=30)


def _handshake(actor_index=0):
    return seed_pb2.ActorMessage(handshake=seed_pb2.Handshake(
        actor_index=actor_index, run_id=11, num_envs=4, spec=wire.spec_to_proto(make_spec("fake:vector"))))


def _first_reply(channel: grpc.Channel, metadata=None, timeout=10.0):
    responses = seed_pb2_grpc.LearnerStub(channel).Stream(iter([_handshake()]), metadata=metadata, timeout=timeout)
    return next(responses)


def _error(channel: grpc.Channel, metadata=None) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        _first_reply(channel, metadata)
    return caught.value


TOKEN_ONLY = transport.TransportSecurity(auth_token=TOKEN)


@pytest.mark.parametrize("secured_learner", [TOKEN_ONLY], indirect=True)
def test_token_is_required_and_never_echoed(secured_learner):
    address, _ = secured_learner
    with grpc.insecure_channel(address) as channel:
        missing = _error(channel)
        assert missing.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "metadata authorization: got none" in missing.details()
        assert "--auth_token" in missing.details()

        wrong = _error(channel, [("authorization", "Bearer not-the-token")])
        assert wrong.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "got a wrong token" in wrong.details() and "expected the learner's --auth_token" in wrong.details()
        assert TOKEN not in wrong.details() and "not-the-token" not in wrong.details()
        # A prefix of the right token is still wrong (the compare is over the whole value).
        assert _error(channel, [("x-seed-token", TOKEN[:-1])]).code() == grpc.StatusCode.UNAUTHENTICATED

        assert _first_reply(channel, [("authorization", f"Bearer {TOKEN}")]).handshake_reply.first_env_id == 0
        assert _first_reply(channel, [("x-seed-token", TOKEN)]).WhichOneof("message") == "handshake_reply"
        # Health checks stay open: probes and the launcher carry no token.
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service="seed.Learner"),
                                                          timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


def _mtls(tmp_path):
    pki = make_pki(str(tmp_path / "pki"))
    return transport.TransportSecurity(tls_cert=pki.server_cert, tls_key=pki.server_key, tls_ca=pki.ca)


@pytest.mark.parametrize("secured_learner", [_mtls], indirect=True)
def test_mutual_tls_rejects_clients_without_a_trusted_certificate(secured_learner, tmp_path):
    address, server = secured_learner
    directory = os.path.dirname(server.tls_ca)
    client = transport.TransportSecurity(tls_cert=os.path.join(directory, "client.pem"),
                                         tls_key=os.path.join(directory, "client.key"), tls_ca=server.tls_ca)
    with transport.open_channel(address, client) as channel:
        assert _first_reply(channel).WhichOneof("message") == "handshake_reply"

    # No client certificate: the TLS handshake fails, the learner is never reached.
    anonymous = grpc.ssl_channel_credentials(root_certificates=open(server.tls_ca, "rb").read())
    with grpc.secure_channel(address, anonymous) as channel:
        assert _error(channel).code() == grpc.StatusCode.UNAVAILABLE

    # A client certificate from another CA.
    other = make_pki(str(tmp_path / "other"))
    stranger = transport.TransportSecurity(tls_cert=other.client_cert, tls_key=other.client_key, tls_ca=server.tls_ca)
    with transport.open_channel(address, stranger) as channel:
        assert _error(channel).code() == grpc.StatusCode.UNAVAILABLE

    # Plaintext against the TLS port.
    with grpc.insecure_channel(address) as channel:
        assert _error(channel).code() == grpc.StatusCode.UNAVAILABLE


def test_tls_flags_must_come_together(tmp_path):
    pki = make_pki(str(tmp_path))

    class Flags:
        tls_cert, tls_key, tls_ca, auth_token, auth_token_file = pki.server_cert, "", pki.ca, "", ""

    with pytest.raises(transport.TransportConfigError, match="--tls_key: got none"):
        transport.TransportSecurity.from_config(Flags)
    Flags.tls_key, Flags.auth_token, Flags.auth_token_file = pki.server_key, "x", str(tmp_path / "t")
    with pytest.raises(transport.TransportConfigError, match="--auth_token and --auth_token_file: got both"):
        transport.TransportSecurity.from_config(Flags)


def test_security_is_passed_in_not_read_from_a_process_default():
    """learner_main hands the security it built to the Learner and blanks the token in the config; a config whose
    token was blanked names the problem instead of silently yielding some process-wide default."""
    from seed.learner.main import transport_security

    config = resolve_config(dict(env="fake:vector", auth_token=TOKEN, server_address="127.0.0.1:1"))
    security = transport_security(config)
    assert security.auth_token == TOKEN and config.auth_token == transport.REDACTED
    with pytest.raises(transport.TransportConfigError, match="auth_token: got '<redacted>'"):
        transport.TransportSecurity.from_config(config)
    assert not hasattr(transport, "set_default_security") and not hasattr(transport, "default_security")


def test_learner_binds_loopback_by_default_and_refuses_open_interfaces(tmp_path):
    def print_config(*flags):
        return subprocess.run([sys.executable, "-m", "seed.learner.main", "--print_config", f"--logdir={tmp_path}",
                               *flags], capture_output=True, text=True, timeout=60, cwd=REPO)

    default = print_config()
    assert default.returncode == 0, default.stderr
    assert '"server_address": "unix:' in default.stdout and "127.0.0.1:8686" in default.stdout

    refused = print_config("--server_address=0.0.0.0:8686")
    assert refused.returncode == 2
    assert "--server_address: got 0.0.0.0:8686, a non-loopback address" in refused.stderr
    assert "--allow_insecure_remote" in refused.stderr

    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    allowed = print_config("--server_address=0.0.0.0:8686", f"--auth_token_file={token_file}")
    assert allowed.returncode == 0, allowed.stderr
    assert TOKEN not in allowed.stdout
    explicit = print_config("--server_address=[::]:8686", "--allow_insecure_remote")
    assert explicit.returncode == 0, explicit.stderr
    assert transport.is_loopback("[::1]:1") and transport.is_loopback("localhost:1")
    assert not transport.is_loopback("[::]:1") and not transport.is_loopback(":8686")


def test_actor_processes_with_and_without_the_token(processes, tmp_path):
    """Real processes over TCP: the right token trains, a wrong one ends the actor with a clear error."""
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    logdir = str(tmp_path / "run")
    address = f"127.0.0.1:{free_tcp_port()}"
    common = ["--env=fake:vector", "--envs_per_actor=4", "--fake_episode_length=20"]
    learner = processes.learner([*common, f"--logdir={logdir}", f"--server_address={address}", "--num_actors=2",
                                 "--batch_size=4", "--unroll_length=10", "--log_interval_s=0.5", "--torch_threads=1",
                                 f"--auth_token_file={token_file}"])
    good = processes.actor([*common, f"--server_address={address}", "--actor_index=0",
                            f"--auth_token_file={token_file}"], "good")
    bad = processes.actor([*common, f"--server_address={address}", "--actor_index=1", "--auth_token=wrong"], "bad")
    wait_for(lambda: "connected to" in processes.output(good), 60, "the actor with the token to connect",
             on_timeout=lambda: processes.output(learner) + processes.output(good))
    assert bad.wait(timeout=60) == 2
    output = processes.output(bad)
    assert "UNAUTHENTICATED" in output or "got a wrong token" in output, output
    assert "metadata authorization: got a wrong token" in output
    assert "wrong" not in output.split("got a wrong token")[0].rsplit("\n", 1)[-1]
    assert learner.poll() is None and good.poll() is None


def test_stream_guard_deadline_and_pending_cap(tmp_path):
    """Streams that never handshake get DEADLINE_EXCEEDED naming the handshake, and at most max_pending of them
    wait at once (RESOURCE_EXHAUSTED beyond); a prompt client is still served."""

    class Echo(seed_pb2_grpc.LearnerServicer):
        def Stream(self, request_iterator, context):
            for message in request_iterator:
                yield seed_pb2.LearnerMessage(handshake_reply=seed_pb2.HandshakeReply(
                    first_env_id=message.handshake.actor_index))

    address = f"unix:{tmp_path}/guard.sock"
    server, _, _ = transport.start_grpc_server(Echo(), [address], max_workers=8, handshake_timeout_s=1.5,
                                               idle_timeout_s=2.0)
    try:
        assert server.stream_guard.max_pending == 2
        channel = grpc.insecure_channel(address)
        silent = [seed_pb2_grpc.LearnerStub(channel).Stream(iter(threading.Event().wait, True)) for _ in range(3)]
        wait_for(lambda: server.stream_guard.pending() == 2, 10, "two streams awaiting a handshake")
        codes = []
        for call in silent:
            with pytest.raises(grpc.RpcError) as caught:
                next(call)
            codes.append((caught.value.code(), caught.value.details()))
        exhausted = [d for c, d in codes if c == grpc.StatusCode.RESOURCE_EXHAUSTED]
        deadline = [d for c, d in codes if c == grpc.StatusCode.DEADLINE_EXCEEDED]
        assert len(exhausted) == 1 and "streams awaiting a handshake: got 3, expected at most 2" in exhausted[0]
        assert len(deadline) == 2 and all("handshake: got no message within 1.5s" in d for d in deadline)
        start = time.monotonic()
        assert _first_reply(channel).WhichOneof("message") == "handshake_reply"
        assert time.monotonic() - start < 1.0
        wait_for(lambda: server.stream_guard.pending() == 0, 10, "no stream left awaiting a handshake")
        # The threads that waited for the silent streams' first message are gone too.
        wait_for(lambda: not [t for t in threading.enumerate() if t.name == "handshake-reader"], 10,
                 "the handshake readers to end")

        # A client that handshakes and then goes quiet is cancelled after idle_timeout_s, freeing its thread.
        release = threading.Event()

        def handshake_then_silence():
            yield _handshake()
            release.wait()

        quiet = seed_pb2_grpc.LearnerStub(channel).Stream(handshake_then_silence())
        assert next(quiet).WhichOneof("message") == "handshake_reply"
        start = time.monotonic()
        with pytest.raises(grpc.RpcError) as caught:
            next(quiet)
        assert caught.value.code() == grpc.StatusCode.CANCELLED and 1.5 < time.monotonic() - start < 6
        release.set()
        channel.close()
    finally:
        server.stop(0)


def test_actor_process_over_mutual_tls_and_token(processes, tmp_path):
    """The flags end to end: a learner process with --tls_* and --auth_token_file on TCP, an actor process with
    its client certificate and the token connects; one without --tls_* never gets in."""
    pki = make_pki(str(tmp_path / "pki"))
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    address = f"127.0.0.1:{free_tcp_port()}"
    common = ["--env=fake:vector", "--envs_per_actor=4", "--fake_episode_length=20", f"--auth_token_file={token_file}"]
    learner = processes.learner([*common, f"--logdir={tmp_path / 'run'}", f"--server_address={address}",
                                 "--num_actors=2", "--batch_size=4", "--unroll_length=10", "--torch_threads=1",
                                 f"--tls_cert={pki.server_cert}", f"--tls_key={pki.server_key}", f"--tls_ca={pki.ca}"])
    good = processes.actor([*common, f"--server_address={address}", "--actor_index=0",
                            f"--tls_cert={pki.client_cert}", f"--tls_key={pki.client_key}", f"--tls_ca={pki.ca}"],
                           "tls")
    wait_for(lambda: "connected to" in processes.output(good), 60, "the TLS actor to connect",
             on_timeout=lambda: processes.output(learner) + processes.output(good))
    # Started once the learner serves, so its failed attempts are refusals, not a learner still starting.
    plain = processes.actor([*common, f"--server_address={address}", "--actor_index=1"], "plain")
    wait_for(lambda: "[actor 1] cannot connect to" in processes.output(plain), 60,
             "the plaintext actor to try and be refused", on_timeout=lambda: processes.output(plain))
    time.sleep(2)
    assert "[actor 1] connected to" not in processes.output(plain)
    assert plain.poll() is None  # it keeps retrying rather than crashing
    assert learner.poll() is None and good.poll() is None
