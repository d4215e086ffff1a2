"""Box (continuous) action spaces through the framework: the EnvSpec contract, gym's Box envs (clipping, the MuJoCo
tasks), the agents' refusal of an action space they do not act on, and a Box agent (tests/toy_box_agent/) trained
by the real learner, its training process and two actors on `gym:Pendulum-v1` (FIFO queue and replay)."""

import dataclasses
import json
import pickle
import signal
import subprocess
import sys
from types import SimpleNamespace

import gymnasium
import numpy as np
import pytest
import torch

from seed._proto import seed_pb2
from seed.agents import registry
from seed.contracts.agent import IncompatibleActionSpace, check_action_space
from seed.envs import make_batch, make_spec
from seed.envs.base import EnvSpec
from seed.transport import wire
from tests.conftest import REPO, read_metrics, serve_steps, wait_for

PLUGIN_ENV = {"SEED_RL_PLUGINS": "tests.toy_box_agent"}
PENDULUM = EnvSpec("gym:Pendulum-v1", (3,), "float32", 0, action_shape=(1,), action_low=(-2.0,), action_high=(2.0,))

# gymnasium's v5 MuJoCo tasks: (action dimensions, bound, observation size), from their documentation.
MUJOCO_TASKS = {
    "Hopper-v5": (3, 1.0, 11),
    "HalfCheetah-v5": (6, 1.0, 17),
    "Walker2d-v5": (6, 1.0, 17),
    "Ant-v5": (8, 1.0, 105),
    "Humanoid-v5": (17, 0.4, 348),
}


def _mujoco_missing() -> str | None:
    try:
        import mujoco  # noqa: F401
    except ImportError as error:
        return f"the mujoco extra is not installed (pip install -e '.[mujoco]'): {error}"
    return None


# ---- the contract


def test_gym_specs_describe_their_action_space():
    assert make_spec("gym:Pendulum-v1") == PENDULUM
    assert PENDULUM.continuous and PENDULUM.action_space == "Box(1,)"
    assert (PENDULUM.action_dtype, PENDULUM.batch_action_dtype) == ("float32", "float32")
    cartpole = make_spec("gym:CartPole-v1")
    assert cartpole == EnvSpec("gym:CartPole-v1", (4,), "float32", 2)
    assert not cartpole.continuous and cartpole.action_space == "Discrete(2)"
    assert (cartpole.action_dtype, cartpole.batch_action_dtype) == ("int32", "int64")
    assert (cartpole.action_shape, cartpole.action_low, cartpole.action_high) == ((), (), ())


@pytest.mark.parametrize("fields,expected", [
    (dict(num_actions=2), "gym:Pendulum-v1: num_actions: got 2, expected 0 for a Box action space"),
    (dict(action_shape=(1, 1)), "action_shape: got (1, 1), expected () (Discrete) or (D,) with D >= 1 (Box)"),
    (dict(action_shape=(0,), action_low=(), action_high=()), "action_shape: got (0,), expected ()"),
    (dict(action_low=(-2.0, -2.0)), "action_low: got 2 values, expected 1 (action_shape (1,))"),
    (dict(action_high=(-3.0,)), "action bounds: got low (-2.0,), high (-3.0,), expected low <= high"),
    (dict(action_low=(float("nan"),)), "action bounds: got low (nan,), high (2.0,), expected low <= high"),
    (dict(action_shape=(), num_actions=3), "action_low/action_high: got (-2.0,)/(2.0,), expected () for a "
                                           "Discrete action space"),
])
def test_an_env_spec_with_inconsistent_action_fields_is_refused_naming_the_field(fields, expected):
    with pytest.raises(ValueError) as refused:
        dataclasses.replace(PENDULUM, **fields)
    assert expected in str(refused.value)


def test_the_spec_survives_json_protobuf_and_old_pickles():
    """The serving process gets the spec as JSON, the learner an actor's as protobuf: both give the same spec back
    (tuples, not lists). A pickle of a discrete spec made before the action fields existed still loads, as
    Discrete; so does a handshake without them."""
    assert EnvSpec(**json.loads(json.dumps(dataclasses.asdict(PENDULUM)))) == PENDULUM
    assert wire.spec_from_proto(wire.spec_to_proto(PENDULUM)) == PENDULUM
    assert wire.spec_mismatch(wire.spec_from_proto(wire.spec_to_proto(PENDULUM)), PENDULUM) is None
    old = EnvSpec("gym:CartPole-v1", (4,), "float32", 2)
    for name in ("action_shape", "action_low", "action_high"):
        del old.__dict__[name]  # what a pickle from before the fields holds
    loaded = pickle.loads(pickle.dumps(old))
    assert loaded == EnvSpec("gym:CartPole-v1", (4,), "float32", 2) and not loaded.continuous
    old_proto = seed_pb2.EnvSpec(env="gym:CartPole-v1", observation_shape=[4], observation_dtype="float32",
                                 num_actions=2, action_repeat=1, frame_stack=1)
    assert wire.spec_from_proto(old_proto) == make_spec("gym:CartPole-v1")


# ---- gym's Box envs


class _EchoAction(gymnasium.Env):
    """A Box env whose observation is the action it was stepped with: what the gym family hands the env."""

    observation_space = gymnasium.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    action_space = gymnasium.spaces.Box(np.array([-1.0, 0.0], np.float32), np.array([1.0, 3.0], np.float32))

    def __init__(self, render_mode=None):
        self.render_mode = render_mode

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.array(action, np.float32), 0.0, False, False, {}


def test_a_box_env_clips_actions_into_its_bounds():
    """Bounds [-1, 1] x [0, 3]: each action reaches the env clipped per dimension, in both directions; actions
    inside the bounds reach it unchanged."""
    if "seed-test/EchoAction-v0" not in gymnasium.registry:
        gymnasium.register("seed-test/EchoAction-v0", entry_point=_EchoAction)
    batch = make_batch("gym:seed-test/EchoAction-v0", 3, 0, {})
    assert batch.spec.action_low == (-1.0, 0.0) and batch.spec.action_high == (1.0, 3.0)
    batch.reset()
    step = batch.step(np.array([[5.0, -2.0], [-7.5, 9.0], [0.25, 2.5]], np.float32))
    batch.close()
    np.testing.assert_array_equal(step.observation, [[1.0, 0.0], [-1.0, 3.0], [0.25, 2.5]])


def test_a_gym_env_with_another_action_space_is_refused_naming_it():
    from seed.envs.gym import action_fields

    with pytest.raises(ValueError, match=r"--env=gym:X: action space is Box\(-1.0, 1.0, \(2, 2\), float32\), "
                                         "expected Discrete or a one-dimensional Box"):
        action_fields("X", gymnasium.spaces.Box(-1, 1, (2, 2), np.float32))


@pytest.mark.parametrize("task", sorted(MUJOCO_TASKS))
def test_the_mujoco_tasks_construct_and_step(task, tmp_path, monkeypatch):
    missing = _mujoco_missing()
    if missing:
        pytest.skip(missing)
    monkeypatch.chdir(tmp_path)  # MuJoCo writes its warnings (MUJOCO_LOG.TXT) into the working directory
    dims, bound, observation_size = MUJOCO_TASKS[task]
    bound = float(np.float32(bound))  # the bounds as the env has them: float32 values
    spec = make_spec(f"gym:{task}")
    assert spec == EnvSpec(f"gym:{task}", (observation_size,), "float32", 0, action_shape=(dims,),
                           action_low=(-bound,) * dims, action_high=(bound,) * dims)
    batch = make_batch(f"gym:{task}", 2, 0, {"seed": 1})
    try:
        assert batch.reset().shape == (2, observation_size)
        actions = np.random.default_rng(0).uniform(-2 * bound, 2 * bound, (2, dims)).astype(np.float32)
        for _ in range(3):
            step = batch.step(actions)  # half of them beyond the bounds: clipped
        assert step.observation.dtype == np.float32 and step.observation.shape == (2, observation_size)
        assert np.isfinite(step.observation).all() and np.isfinite(step.reward).all()
    finally:
        batch.close()


# ---- agents and action spaces


@pytest.mark.parametrize("agent", ["r2d2", "muzero"])
def test_agents_that_take_discrete_actions_refuse_a_box_env(agent):
    with pytest.raises(IncompatibleActionSpace) as refused:
        check_action_space(registry.agent_class(agent), PENDULUM, agent)
    assert str(refused.value) == (f"--env=gym:Pendulum-v1: got a Box(1,) action space; --agent={agent} takes "
                                  "Discrete actions")
    check_action_space(registry.agent_class(agent), make_spec("gym:CartPole-v1"), agent)  # accepted


def test_a_box_agent_refuses_a_discrete_env_and_a_bad_declaration_is_named(plugin_in_this_process):
    plugin_in_this_process("tests.toy_box_agent")  # importing it registers toy_box: restored after the test
    from tests.toy_box_agent.agent import ToyBoxAgent

    with pytest.raises(IncompatibleActionSpace, match=r"^--env=gym:CartPole-v1: got a Discrete\(2\) action space; "
                                                      r"--agent=toy_box takes Box actions$"):
        check_action_space(ToyBoxAgent, make_spec("gym:CartPole-v1"), "toy_box")
    check_action_space(ToyBoxAgent, PENDULUM, "toy_box")

    class Misdeclared(ToyBoxAgent):
        action_spaces = ("continuous",)

    with pytest.raises(ValueError, match=r"Misdeclared.action_spaces: got \('continuous',\), expected a non-empty "
                                         "tuple of 'discrete', 'box'"):
        check_action_space(Misdeclared, PENDULUM, "misdeclared")


def test_the_learner_refuses_a_box_env_for_a_discrete_agent_at_start(tmp_path):
    """seed-learner exits 2 with one line naming the env, its action space and what the agent takes."""
    run = [sys.executable, "-m", "seed.learner.main", "--agent=r2d2", "--env=gym:Pendulum-v1",
           f"--logdir={tmp_path}", f"--server_address=unix:{tmp_path}/learner.sock"]
    refused = subprocess.run(run, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.strip() == ("seed-learner: --env=gym:Pendulum-v1: got a Box(1,) action space; "
                                      "--agent=r2d2 takes Discrete actions")


# ---- central inference with Box actions


def _box_inference(agent_class, unrolls: list):
    from seed.inference.central import CentralInference, InferenceModel, InferenceOutputs, UnrollLayout
    from seed.transport.slab import StepSlab

    slab = StepSlab.create(2, 2, (3,), "float32", PENDULUM.action_shape, PENDULUM.action_dtype)
    slab.live_run[:] = 1
    config = SimpleNamespace(toy_box_hidden_size=4, toy_box_nan_env_id=-1, discounting=0.99)
    agent = agent_class(PENDULUM, config)
    outputs = InferenceOutputs(reply=lambda actors: None, sink=lambda batch: unrolls.extend(batch.unbind()),
                               on_episodes=lambda episodes: None, on_batch=lambda rows, latencies: None)
    return CentralInference(InferenceModel(agent, agent.network, torch.device("cpu")), slab, UnrollLayout(2), outputs)


def _pendulum_step(actor: int, t: int) -> tuple:
    observation = np.full((2, 3), 0.1 * t + actor, np.float32)
    return actor, 1, observation, np.full(2, -1.0, np.float32), np.zeros(2, bool), np.zeros(2, bool)


def test_inference_answers_float32_action_vectors_and_stores_them_as_columns(plugin_in_this_process):
    """Two actors of 2 envs, 3 steps through the slab: each reply is float32 [2, 1] in [-2, 2]; the unrolls of
    3 steps hold action and prev_action float32 [3, 1], prev_action[t + 1] == action[t] and prev_action[0] == 0
    (a fresh env)."""
    from seed.transport.slab import REPLY_OK

    plugin_in_this_process("tests.toy_box_agent")
    from tests.toy_box_agent.agent import ToyBoxAgent

    unrolls: list = []
    inference = _box_inference(ToyBoxAgent, unrolls)
    served = {0: [], 1: []}
    for t in range(3):
        for actor, (status, actions) in serve_steps(inference, [_pendulum_step(0, t), _pendulum_step(1, t)]).items():
            assert status == REPLY_OK and actions.dtype == np.float32 and actions.shape == (2, 1)
            assert ((-2.0 <= actions) & (actions <= 2.0)).all()
            served[actor].append(actions)
    assert sorted(int(u.env_id) for u in unrolls) == [0, 1, 2, 3]
    for unroll in unrolls:
        actor, env = divmod(int(unroll.env_id), 2)
        expected = np.stack([actions[env] for actions in served[actor]])
        for name in ("action", "prev_action"):
            column = unroll.steps[name]
            assert column.dtype == torch.float32 and tuple(column.shape) == (3, 1), (name, column)
        np.testing.assert_array_equal(unroll.action.numpy(), expected)
        np.testing.assert_array_equal(unroll.prev_action.numpy(), np.concatenate([[[0.0]], expected[:-1]]))


def test_inference_refuses_an_agent_s_actions_of_the_wrong_shape(plugin_in_this_process):
    """An agent answering [B] instead of [B, 1] fails its batch (REPLY_FAILED for its actors), naming the shapes."""
    from seed.transport.slab import REPLY_FAILED

    plugin_in_this_process("tests.toy_box_agent")
    from tests.toy_box_agent.agent import ToyBoxAgent

    class Flat(ToyBoxAgent):
        def act(self, network, batch, state):
            out = super().act(network, batch, state)
            out.action = out.action[:, 0]
            return out

    inference = _box_inference(Flat, [])
    with pytest.raises(ValueError, match=r"^agent.act: action: got float32 \[2\], expected float32 \[2, 1\]$"):
        serve_steps(inference, [_pendulum_step(0, 0)])
    assert int(inference.slab.reply_status[0]) == REPLY_FAILED


# ---- a Box agent through the real learner


def _toy_box_ran(logdir: str, min_steps: int) -> list[dict] | None:
    rows = [r for r in read_metrics(logdir) if "toy_box/action_rank" in r]
    return rows if rows and rows[-1]["train_steps"] >= min_steps else None


def test_a_box_agent_trains_through_the_learner_replay_training_process_and_two_actors(processes, tmp_path,
                                                                                     monkeypatch):
    """Two actors (one over shared memory, one over gRPC) step Pendulum with the learner's float32 [K, 1] actions;
    the unrolls go through the replay into the training process's batch slots, where the loss sees action and
    prev_action columns of float32 [T + 1, B, 1] (it refuses anything else), actions within Pendulum's bounds
    [-2, 2], and prev_action at t + 1 equal to the action at t inside every episode (error exactly 0). The FIFO
    queue's path trains the same agent in tests/test_box_refusals.py."""
    agent = "toy_box_replay"
    for key, value in PLUGIN_ENV.items():
        monkeypatch.setenv(key, value)
    logdir, address = str(tmp_path / "run"), f"unix:{tmp_path}/learner.sock"
    learner = processes.learner([
        f"--agent={agent}", "--env=gym:Pendulum-v1", f"--logdir={logdir}", f"--server_address={address}",
        "--num_actors=2", "--envs_per_actor=2", "--batch_size=4", "--unroll_length=8", "--log_interval_s=0.5",
        "--torch_threads=1", "--checkpoint_interval_s=3600", "--training_process", "--replay_min_size=8",
        "--replay_capacity=64", "--replay_ratio=1"])
    for i, transport in enumerate(("shm", "grpc")):
        processes.actor(["--env=gym:Pendulum-v1", f"--server_address={address}", f"--actor_index={i}",
                         "--envs_per_actor=2", f"--transport={transport}"], f"actor{i}")
    rows = wait_for(lambda: _toy_box_ran(logdir, 5), 120, f"5 {agent} updates",
                    on_timeout=lambda: processes.output(learner))
    for row in rows:
        assert (row["toy_box/action_rank"], row["toy_box/action_dims"]) == (3.0, 1.0), row
        assert -2.0 <= row["toy_box/action_min"] < row["toy_box/action_max"] <= 2.0, row
        assert row["toy_box/prev_action_error"] == 0.0, row
    learner.send_signal(signal.SIGTERM)
    assert learner.wait(timeout=60) == 0, processes.output(learner)
    output = processes.output(learner)
    assert "actor 0 connected over shm" in output and "actor 1 connected over grpc" in output, output
