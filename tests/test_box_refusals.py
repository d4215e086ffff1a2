"""Refusals on a Box env's real transports: one real learner process (`gym:Pendulum-v1`, the toy Box agent of
tests/toy_box_agent/, its policy broken to NaN for env id 5 only) and a well-behaved actor that keeps stepping
through every refusal. Bad messages are made by hand: NaN and inf observations and rewards and wrong observation
shapes over gRPC and over the shared-memory slab, handshakes with another action space, NaN actions from the
learner (refused by seed-actor over either transport), and misshapen actions from a hand-made gRPC learner. Every
error names the field, the value received and the value expected. The learner trains from the FIFO queue in its
own process, and the toy loss refuses action columns other than float32 [T + 1, B, 1]: that training goes on
through every refusal is also the FIFO path's check."""

import threading
from concurrent import futures

import grpc
import numpy as np
import pytest

from seed._proto import seed_pb2, seed_pb2_grpc
from seed.actor.loop import Actor
from seed.config import ActorConfig
from seed.envs.base import EnvSpec
from seed.transport import wire
from seed.transport.link import InvalidReplyError
from seed.transport.shm import protocol as shm_protocol
from seed.transport.shm.link import ShmLink, ShmRejected
from tests.conftest import Processes, read_metrics, wait_for

K = 2
PENDULUM = EnvSpec("gym:Pendulum-v1", (3,), "float32", 0, action_shape=(1,), action_low=(-2.0,), action_high=(2.0,))
NAN_ENV_ID = 5  # actor 2's second env: the toy policy's actions there are NaN
ACTIONS = "expected finite float32 actions of Box(1,) (bounds [-2.0]..[2.0], clipped by the env)"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The learner (3 actor slots of K envs) and a good actor on index 0 over gRPC, stepping throughout."""
    directory = tmp_path_factory.mktemp("box_refusals")
    processes = Processes(str(directory))
    address, logdir = f"unix:{directory}/learner.sock", str(directory / "run")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SEED_RL_PLUGINS", "tests.toy_box_agent")
        learner = processes.learner([
            "--agent=toy_box", "--env=gym:Pendulum-v1", f"--logdir={logdir}", f"--server_address={address}",
            "--num_actors=3", f"--envs_per_actor={K}", "--batch_size=2", "--unroll_length=4",
            "--log_interval_s=0.5", "--torch_threads=1", "--checkpoint_interval_s=3600", "--notraining_process",
            f"--toy_box_nan_env_id={NAN_ENV_ID}"])
    stop = threading.Event()
    good = Actor(ActorConfig(env="gym:Pendulum-v1", envs_per_actor=K, actor_index=0, server_address=address,
                             transport="grpc"), stop)
    thread = threading.Thread(target=good.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: good.agent_steps > 40 or learner.poll() is not None, 120, "the good actor to step",
                 on_timeout=lambda: processes.output(learner))
        assert learner.poll() is None, processes.output(learner)
        yield processes, learner, address, logdir, good
    finally:
        stop.set()
        good.request_stop()
        thread.join(timeout=10)
        processes.stop_all()


def _unaffected(run) -> None:
    """The good actor keeps stepping on its first connection and the learner keeps training."""
    processes, learner, _, logdir, good = run
    steps = good.agent_steps
    trained = (read_metrics(logdir) or [{"train_steps": 0}])[-1]["train_steps"]
    wait_for(lambda: good.agent_steps > steps + 40, 30, "the good actor to keep stepping")
    wait_for(lambda: read_metrics(logdir) and read_metrics(logdir)[-1]["train_steps"] > trained, 30,
             "the learner to keep training", on_timeout=lambda: processes.output(learner))
    assert good.connections == 1 and learner.poll() is None


def _handshake(actor_index: int, run_id: int = 7, spec: EnvSpec = PENDULUM) -> seed_pb2.Handshake:
    return seed_pb2.Handshake(actor_index=actor_index, run_id=run_id, num_envs=K, spec=wire.spec_to_proto(spec))


def _step(observation: np.ndarray, reward: np.ndarray | None = None) -> seed_pb2.ActorMessage:
    reward = np.zeros(K, np.float32) if reward is None else reward
    return seed_pb2.ActorMessage(step=seed_pb2.StepBatch(
        observation=wire.encode_tensor(observation), reward=wire.encode_tensor(reward),
        done=wire.encode_tensor(np.zeros(K, bool)), truncated=wire.encode_tensor(np.zeros(K, bool))))


def _stream(address: str, messages: list[seed_pb2.ActorMessage]) -> tuple[list, grpc.RpcError | None]:
    """The learner's replies to `messages` on one stream, and the error that ended it (None: it did not)."""
    replies = []
    with grpc.insecure_channel(address) as channel:
        try:
            for reply in seed_pb2_grpc.LearnerStub(channel).Stream(iter(messages)):
                replies.append(reply)
                if len(replies) == len(messages):
                    break
        except grpc.RpcError as error:
            return replies, error
    return replies, None


def _observation(**values) -> np.ndarray:
    """float32 [K, 3] zeros with values at "env_element" keys, e.g. _observation(e1_2=np.nan)."""
    observation = np.zeros((K, 3), np.float32)
    for key, value in values.items():
        env, element = key[1:].split("_")
        observation[int(env), int(element)] = value
    return observation


OBSERVATION = "step.observation"
BAD_STEPS = {
    "nan observation": (_observation(e1_2=np.nan), None,
                        f"{OBSERVATION}: got nan at env 1, element 2 (1 non-finite values), expected finite float32 "
                        "observations"),
    "inf observations": (_observation(e0_0=-np.inf, e1_1=np.inf), None,
                         f"{OBSERVATION}: got -inf at env 0, element 0 (2 non-finite values), expected finite "
                         "float32 observations"),
    "inf reward": (_observation(), np.array([0.0, np.inf], np.float32),
                   "step.reward: got a non-finite value, expected finite rewards (inf at index 1)"),
    "nan reward": (_observation(), np.array([np.nan, 0.0], np.float32),
                   "step.reward: got a non-finite value, expected finite rewards (nan at index 0)"),
    "wider observation": (np.zeros((K, 4), np.float32), None, f"{OBSERVATION}.shape: got [2, 4], expected [2, 3]"),
    "more envs": (np.zeros((K + 1, 3), np.float32), None, f"{OBSERVATION}.shape: got [3, 3], expected [2, 3]"),
    "flat observation": (np.zeros(K * 3, np.float32), None, f"{OBSERVATION}.shape: got [6], expected [2, 3]"),
}


@pytest.mark.parametrize("case", sorted(BAD_STEPS))
def test_a_bad_grpc_step_ends_that_actor_s_stream_only(run, case):
    """INVALID_ARGUMENT naming the field, value and expectation, from the serving process before the slab (inference,
    which checks the rows again for shm actors, never sees it); the same index then serves a good step with float32
    [K, 1] actions in Pendulum's bounds."""
    observation, reward, expected = BAD_STEPS[case]
    processes, learner, address, _, _ = run
    replies, error = _stream(address, [seed_pb2.ActorMessage(handshake=_handshake(1)), _step(observation, reward)])
    assert error is not None and error.code() == grpc.StatusCode.INVALID_ARGUMENT, (replies, error)
    assert error.details() == f"actor 1: {expected}"
    assert "invalid request" not in processes.output(learner)  # inference's REPLY_INVALID (the shm test's, later)
    _unaffected(run)
    replies, error = _stream(address, [seed_pb2.ActorMessage(handshake=_handshake(1, run_id=8)),
                                       _step(_observation())])
    assert error is None, error
    action = replies[1].actions.action
    assert (action.dtype, list(action.shape)) == ("float32", [K, 1])
    values = wire.decode_actions(action, PENDULUM, K)
    assert ((-2.0 <= values) & (values <= 2.0)).all(), values


@pytest.mark.parametrize("spec,expected", [
    (EnvSpec("gym:Pendulum-v1", (3,), "float32", 0, action_shape=(2,), action_low=(-2.0, -2.0),
             action_high=(2.0, 2.0)),
     "spec.action_shape: got (2,), expected (1,); spec.action_low: got (-2.0, -2.0), expected (-2.0,); "
     "spec.action_high: got (2.0, 2.0), expected (2.0,)"),
    (EnvSpec("gym:Pendulum-v1", (3,), "float32", 0, action_shape=(1,), action_low=(-1.0,), action_high=(1.0,)),
     "spec.action_low: got (-1.0,), expected (-2.0,); spec.action_high: got (1.0,), expected (2.0,)"),
    (EnvSpec("gym:Pendulum-v1", (3,), "float32", 3),
     "spec.num_actions: got 3, expected 0; spec.action_shape: got (), expected (1,); spec.action_low: got (), "
     "expected (-2.0,); spec.action_high: got (), expected (2.0,)"),
])
def test_a_handshake_with_another_action_space_is_refused(run, spec, expected):
    replies, error = _stream(run[2], [seed_pb2.ActorMessage(handshake=_handshake(1, spec=spec))])
    assert error is not None and error.code() == grpc.StatusCode.INVALID_ARGUMENT, (replies, error)
    assert error.details() == f"handshake rejected: {expected}"


def test_a_handshake_whose_action_fields_describe_no_space_is_refused(run):
    handshake = _handshake(1)
    del handshake.spec.action_low[:]
    _, error = _stream(run[2], [seed_pb2.ActorMessage(handshake=handshake)])
    assert error is not None and error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == ("handshake rejected: spec: gym:Pendulum-v1: action_low: got 0 values, expected 1 "
                               "(action_shape (1,))")


def test_bad_shm_steps_are_refused_and_the_learner_serves_on(run):
    """The slab's rows are checked by inference like the serving process checks a StepBatch: REPLY_INVALID with
    the reason, the link's next good step served (float32 [K, 1] actions)."""
    address = run[2]
    link = ShmLink.connect(shm_protocol.handover_path(address), _handshake(1, run_id=21), (), threading.Event())
    try:
        good = (_observation(), np.zeros(K, np.float32), np.zeros(K, bool), np.zeros(K, bool))
        assert link.exchange(*good).shape == (K, 1)
        for case in ("nan observation", "inf observations", "inf reward", "nan reward"):
            observation, reward, expected = BAD_STEPS[case]
            reward = np.zeros(K, np.float32) if reward is None else reward
            with pytest.raises(ShmRejected) as rejected:
                link.exchange(observation, reward, np.zeros(K, bool), np.zeros(K, bool))
            assert (rejected.value.code, rejected.value.details) == ("INVALID_ARGUMENT", f"actor 1: {expected}")
        actions = link.exchange(*good)
        assert actions.dtype == np.float32 and actions.shape == (K, 1) and np.isfinite(actions).all()
    finally:
        link.close()
    _unaffected(run)


@pytest.mark.parametrize("transport,field", [("shm", "slab.action"), ("grpc", "actions.action")])
def test_seed_actor_refuses_nan_actions_from_the_learner(run, transport, field):
    """The toy policy's actions for env id 5 (actor 2's env 1) are NaN: seed-actor steps no env with them and exits
    2 naming the field, the value and what it expects; the other actor and the learner carry on."""
    processes, _, address, _, _ = run
    actor = processes.actor(["--env=gym:Pendulum-v1", f"--server_address={address}", "--actor_index=2",
                             f"--envs_per_actor={K}", f"--transport={transport}"], f"nan_actor_{transport}")
    assert actor.wait(timeout=60) == 2, processes.output(actor)
    assert (f"seed-actor: refused the learner's reply, stepping no env with it: {field}: got nan at env 1, "
            f"dimension 0 (1 non-finite values), {ACTIONS}") in processes.output(actor)
    _unaffected(run)


class _BadLearner(seed_pb2_grpc.LearnerServicer):
    """A hand-made learner: accepts the handshake, then answers every step with `action`."""

    def __init__(self, action: seed_pb2.Tensor):
        self.action = action

    def Stream(self, request_iterator, context):
        for message in request_iterator:
            if message.WhichOneof("message") == "handshake":
                yield seed_pb2.LearnerMessage(handshake_reply=seed_pb2.HandshakeReply(first_env_id=0))
            else:
                yield seed_pb2.LearnerMessage(actions=seed_pb2.ActionBatch(action=self.action))


@pytest.mark.parametrize("action,expected", [
    (np.zeros(K, np.int32), "actions.action.dtype: got 'int32', expected 'float32'"),
    (np.zeros(K, np.float32), "actions.action.shape: got [2], expected [2, 1]"),
    (np.zeros((K, 2), np.float32), "actions.action.shape: got [2, 2], expected [2, 1]"),
    (np.array([[np.inf], [0.5]], np.float32), f"actions.action: got inf at env 0, dimension 0 (1 non-finite "
                                              f"values), {ACTIONS}"),
])
def test_an_actor_refuses_misshapen_or_non_finite_actions(tmp_path, action, expected):
    """Over a real gRPC stream from a hand-made learner: the actor's run ends with InvalidReplyError, before its
    envs step with the reply."""
    address = f"unix:{tmp_path}/bad.sock"
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    seed_pb2_grpc.add_LearnerServicer_to_server(_BadLearner(wire.encode_tensor(action)), server)
    server.add_insecure_port(address)
    server.start()
    actor = Actor(ActorConfig(env="gym:Pendulum-v1", envs_per_actor=K, server_address=address, transport="grpc"))
    try:
        with pytest.raises(InvalidReplyError) as refused:
            actor.run()
        assert str(refused.value) == expected
        assert actor.agent_steps == 0
    finally:
        server.stop(0)

