"""Env groups (--env_groups, seed/actor/env_groups.py): the layout of an actor's groups on the learner, the grouped
envs being the same envs as one batch, requests of the groups in flight together, and real learner / actor
processes training with groups, refusing mismatched flags, handling a superseded actor, a restarted learner
and launch/local.sh's actor restarts."""

import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent import futures

import numpy as np
import pytest

from seed.actor.env_groups import GroupedActor, group_slots, make_actor, make_env_groups
from seed.actor.loop import Actor
from seed.actor.main import SUPERSEDED_EXIT_CODE
from seed.bench import measure
from seed.bench.transport_ceiling import ZeroActionService
from seed.config import ActorConfig, LearnerConfig, actor_config_class
from seed.envs import make_batch, make_spec
from tests.conftest import REPO, read_metrics, wait_for
from tests.test_end_to_end import _actor_args, _learner_args

CONNECTED = re.compile(r"actor (\d+) connected over \w+ \(run [0-9a-f]+, env ids (\d+)\.\.(\d+)\)")


# ----------------------------------------------------------------------------------------------- layout


def test_group_slots_partition_each_actors_env_ids_into_learner_streams():
    slots = [s for actor in range(3) for s in group_slots(actor, envs_per_actor=8, env_groups=2)]
    assert [s.stream_index for s in slots] == list(range(6))
    ids = [i for s in slots for i in range(s.first_env_id, s.first_env_id + s.num_envs)]
    assert ids == list(range(24))  # distinct, every env id of 3 actors x 8 envs, in stream order
    assert [s.first_env_id for s in group_slots(1, 8, 4)] == [8, 10, 12, 14]
    with pytest.raises(ValueError, match=r"--env_groups: got 3, expected a divisor of --envs_per_actor \(8\)"):
        group_slots(0, 8, 3)


def test_flags_that_do_not_divide_are_refused_naming_both():
    error = ActorConfig(envs_per_actor=6, env_groups=4).env_groups_error()
    assert "--env_groups: got 4" in error and "--envs_per_actor (6)" in error
    assert ActorConfig(envs_per_actor=6, env_groups=0).env_groups_error() is not None
    assert ActorConfig(envs_per_actor=6, env_groups=3).env_groups_error() is None
    config = LearnerConfig(num_actors=3, envs_per_actor=6, env_groups=2)
    assert (config.actor_streams, config.envs_per_stream, config.num_envs) == (6, 3, 18)
    with pytest.raises(ValueError, match="expected 1 for seed.actor.loop.Actor"):
        Actor(ActorConfig(env="fake:vector", envs_per_actor=4, env_groups=2))
    assert type(make_actor(ActorConfig(env="fake:vector", envs_per_actor=4))) is Actor
    assert type(make_actor(ActorConfig(env="fake:vector", envs_per_actor=4, env_groups=2))) is GroupedActor


def test_grouped_envs_are_the_actors_envs_with_their_env_ids_and_seeds():
    # CartPole seeds env i with seed + env id: the groups of actor 1 must be exactly its 4 envs of one batch.
    config = ActorConfig(env="gym:CartPole-v1", envs_per_actor=4, env_groups=2, actor_index=1, seed=7)
    grouped = make_env_groups(config)
    whole = make_batch(config.env, 4, 4, config.env_options())
    try:
        assert [g.num_envs for g in grouped.groups] == [2, 2]
        np.testing.assert_array_equal(np.concatenate([g.reset() for g in grouped.groups]), whole.reset())
        actions = np.array([0, 1, 1, 0])
        for _ in range(30):
            a, b = grouped.step(actions), whole.step(actions)
            np.testing.assert_array_equal(a.observation, b.observation)
            np.testing.assert_array_equal(a.done, b.done)
            assert [(e.env_index, e.steps) for e in a.finished] == [(e.env_index, e.steps) for e in b.finished]
        assert len(set(map(tuple, grouped.reset().round(6)))) == 4  # four different envs, not one twice
    finally:
        grouped.close()
        whole.close()
    fake = make_env_groups(actor_config_class()(env="fake:vector", envs_per_actor=6, env_groups=3,
                                                fake_episode_length=2))
    fake.reset()
    fake.step(np.zeros(6, np.int64))
    assert sorted(e.env_index for e in fake.step(np.zeros(6, np.int64)).finished) == list(range(6))


# ----------------------------------------------------------------------------------------------- double buffering


class _SlowEnvs:
    """An EnvBatch wrapper whose step takes `seconds_per_env` per env (sleeping: no CPU, whatever the load)."""

    def __init__(self, batch, seconds_per_env: float):
        self.batch, self.seconds_per_env = batch, seconds_per_env
        self.spec, self.num_envs = batch.spec, batch.num_envs

    def reset(self):
        return self.batch.reset()

    def step(self, actions):
        time.sleep(self.seconds_per_env * self.num_envs)
        return self.batch.step(actions)

    def close(self):
        self.batch.close()


class _DelayedService(ZeroActionService):
    """The transport ceiling answering each step after `delay_s` (its streams wait side by side)."""

    def __init__(self, spec, envs_per_stream, delay_s):
        super().__init__(spec, envs_per_stream)
        self.delay_s = delay_s

    def Stream(self, request_iterator, context):  # noqa: N802 - the gRPC method name
        for reply in super().Stream(request_iterator, context):
            if reply.HasField("actions"):
                time.sleep(self.delay_s)
            yield reply


def _steps_in(seconds, tmp_path, env_groups):
    """(agent steps per second, fraction of the time waiting) of one actor of 4 envs that each take 10 ms
    per step (40 ms for all four) against a server answering 25 ms after each request."""
    import grpc

    from seed._proto import seed_pb2_grpc

    address = f"unix:{tmp_path}/slow{env_groups}.sock"
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    seed_pb2_grpc.add_LearnerServicer_to_server(_DelayedService(make_spec("fake:vector"), 4 // env_groups, 0.025),
                                                server)
    server.add_insecure_port(address)
    server.start()
    stats = tmp_path / f"stats{env_groups}.jsonl"
    actor = make_actor(ActorConfig(env="fake:vector", envs_per_actor=4, env_groups=env_groups,
                                   server_address=address, stats_file=str(stats), stats_interval_s=0.2))
    if env_groups == 1:
        actor.envs = _SlowEnvs(actor.envs, 0.010)
    else:
        actor.envs.groups = [_SlowEnvs(g, 0.010) for g in actor.envs.groups]
    thread = threading.Thread(target=actor.run, daemon=True)
    try:
        thread.start()
        wait_for(lambda: actor.agent_steps > 0, 30, "the first answered step")
        start = time.time() + 0.5
        time.sleep(0.5 + seconds)
        window = measure.actor_window(measure.read_jsonl(str(stats)), start, time.time())
    finally:
        actor.request_stop()
        thread.join(timeout=10)
        server.stop(grace=0)
    return window["agent_steps"] / window["seconds"], window["waited_s"] / window["seconds"]


def test_two_groups_step_one_group_while_the_others_request_is_answered(tmp_path):
    # One group: step 40 ms, then wait 25 ms for the answer: 4 steps per 65 ms (~62/s), 38% of it waiting.
    # Two groups of 2: each group's 25 ms answer hides behind the other group's 20 ms of stepping (5 ms
    # left): 4 steps per ~45 ms (~89/s). Groups that waited for their own answer before stepping the next
    # group would do 2 x (20 + 25) = 90 ms per 4 steps, worse than one group.
    one_rate, one_waiting = _steps_in(3.0, tmp_path, env_groups=1)
    two_rate, two_waiting = _steps_in(3.0, tmp_path, env_groups=2)
    print(f"agent steps/s: 1 group {one_rate:.0f} (waiting {one_waiting:.0%}), "
          f"2 groups {two_rate:.0f} (waiting {two_waiting:.0%})")
    assert two_rate > 1.2 * one_rate
    assert one_waiting > 0.25 and two_waiting < 0.6 * one_waiting


# ----------------------------------------------------------------------------------------------- processes


def _train_steps(logdir):
    rows = read_metrics(logdir)
    return rows[-1]["train_steps"] if rows else 0


def _streams(output):
    """{learner actor stream: (first env id, last env id)} of every handshake in the learner's output."""
    return {int(m.group(1)): (int(m.group(2)), int(m.group(3))) for m in CONNECTED.finditer(output)}


def test_grouped_actors_train_cartpole_with_every_env_id_stepping(processes, tmp_path):
    """HTS PPO trains only on a batch holding an unroll of every env: training proves all 8 env ids step."""
    logdir = str(tmp_path / "run")
    address = f"unix:{tmp_path}/learner.sock"
    common = dict(env="gym:CartPole-v1", envs_per_actor=4, env_groups=2)
    learner = processes.learner(_learner_args(logdir, address, **common, agent="ppo", sync_every=16,
                                              unroll_length=16, batch_size=8))
    actors = [processes.actor(_actor_args(address, i, **common), f"actor{i}") for i in range(2)]
    wait_for(lambda: _train_steps(logdir) >= 4, 120, "HTS training on every env's unrolls",
             on_timeout=lambda: processes.output(learner) + "".join(processes.output(a) for a in actors))
    streams = _streams(processes.output(learner))
    # Two actors x two groups: four learner streams of two envs each, together env ids 0..7 once each.
    assert streams == {0: (0, 1), 1: (2, 3), 2: (4, 5), 3: (6, 7)}, processes.output(learner)
    assert "with 2 env groups (env ids 4..5 as learner actor 2, 6..7 as learner actor 3;" in processes.output(actors[1])
    rows = read_metrics(logdir)
    assert rows[-1]["episodes"] > 0 and rows[-1]["env_frames"] >= 4 * 16 * 8
    assert all(a.poll() is None for a in actors)


def test_mismatched_env_groups_are_refused_with_the_flags_named(processes, tmp_path):
    # Flags that cannot work are refused at start by both processes.
    for module, args in (("seed.actor.main", ["--env=fake:vector", "--envs_per_actor=4", "--env_groups=3"]),
                         ("seed.learner.main", ["--env=fake:vector", "--envs_per_actor=4", "--env_groups=3",
                                                "--print_config"])):
        completed = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                                   timeout=60, cwd=REPO)
        assert completed.returncode == 2, completed.stderr
        assert "--env_groups: got 3" in completed.stderr and "--envs_per_actor (4)" in completed.stderr
    # A grouped actor against a learner without groups: the handshake is refused and the actor says why.
    logdir = str(tmp_path / "run")
    address = f"unix:{tmp_path}/learner.sock"
    processes.learner(_learner_args(logdir, address))
    actor = processes.actor(_actor_args(address, 0, env_groups=2), "actor0")
    assert actor.wait(timeout=90) == 2
    output = processes.output(actor)
    assert "num_envs: got 2, expected 4" in output and "--env_groups=2" in output, output


def test_superseded_grouped_actor_exits_and_a_restarted_learner_is_rejoined(processes, tmp_path):
    logdir = str(tmp_path / "run")
    address = f"unix:{tmp_path}/learner.sock"
    first_learner = processes.learner(_learner_args(logdir, address, env_groups=2), "learner1")
    first = processes.actor(_actor_args(address, 0, env_groups=2), "actor0")
    other = processes.actor(_actor_args(address, 1, env_groups=2), "actor1")
    wait_for(lambda: _train_steps(logdir) >= 5 and len(_streams(processes.output(first_learner))) == 4, 90,
             "training with four streams", on_timeout=lambda: processes.output(first_learner))
    # A second live actor 0: the newer one takes both groups' streams, the older one exits and says so.
    duplicate = processes.actor(_actor_args(address, 0, env_groups=2), "actor0-duplicate")
    wait_for(lambda: first.poll() is not None, 60, "the superseded actor to exit",
             on_timeout=lambda: processes.output(first) + processes.output(duplicate))
    assert first.returncode == SUPERSEDED_EXIT_CODE
    output = processes.output(first)
    assert "--actor_index=0: another actor took over this index" in output
    assert re.search(r"--actor_index=0 env group [01] \(learner actor [01], env ids", output), output
    assert output.count("connected to") == 1  # it never reconnected
    # The learner restarts (SIGTERM, checkpoint, new process on the same logdir): every group reconnects.
    steps = _train_steps(logdir)
    first_learner.send_signal(signal.SIGTERM)
    assert first_learner.wait(timeout=30) == 0
    second_learner = processes.learner(_learner_args(logdir, address, env_groups=2), "learner2")
    wait_for(lambda: len(_streams(processes.output(second_learner))) == 4 and _train_steps(logdir) >= steps + 10,
             90, "training after the learner restart", on_timeout=lambda: processes.output(second_learner))
    for actor in (duplicate, other):
        # The learner logs a stream at its handshake; the actor says "connected" once every group's reply is in.
        wait_for(lambda a=actor: processes.output(a).count("connected to") >= 2, 30, "the actor to say it rejoined",
                 on_timeout=lambda a=actor: processes.output(a))
        assert actor.poll() is None and processes.output(actor).count("connected to") == 2, processes.output(actor)
        assert "superseded by a newer actor run" not in processes.output(actor)


def test_local_launcher_restarts_a_killed_grouped_actor(tmp_path):
    logdir = str(tmp_path / "run")
    log_path = tmp_path / "local.log"
    env = dict(os.environ, PYTHON=sys.executable, PYTHONUNBUFFERED="1")
    with open(log_path, "wb") as log:
        launcher = subprocess.Popen(
            [os.path.join(REPO, "launch", "local.sh"), f"--logdir={logdir}", "--env=fake:vector", "--num_actors=2",
             "--envs_per_actor=4", "--env_groups=2", "--batch_size=4", "--unroll_length=10", "--log_interval_s=0.5",
             "--torch_threads=1", "--checkpoint_interval_s=3600"],
            stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env)
    output = lambda: log_path.read_text(errors="replace")  # noqa: E731
    try:
        wait_for(lambda: _train_steps(logdir) >= 5 and len(_streams(output())) == 4, 120, "training with groups",
                 on_timeout=output)
        pid = int(wait_for(lambda: _actor_pid(launcher.pid, 1), 10, "actor 1's pid"))
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: "[local] actor 1 exited with -9; restarting" in output(), 30, "the restart", on_timeout=output)
        # The new actor 1 takes both of its groups' streams back (no supersession: the old one is dead).
        wait_for(lambda: output().count("actor 2 connected") == 2 and output().count("actor 3 connected") == 2, 60,
                 "the restarted actor's two streams", on_timeout=output)
        steps = _train_steps(logdir)
        wait_for(lambda: _train_steps(logdir) >= steps + 10, 60, "training after the restart", on_timeout=output)
        assert "superseded by" not in output()
    finally:
        launcher.send_signal(signal.SIGTERM)
        launcher.wait(timeout=60)


def _actor_pid(launcher_pid: int, index: int) -> int | None:
    """The pid of `seed.actor.main --actor_index=index` among the launcher's children."""
    for task in os.listdir(f"/proc/{launcher_pid}/task"):
        with open(f"/proc/{launcher_pid}/task/{task}/children") as f:
            for child in f.read().split():
                try:
                    with open(f"/proc/{child}/cmdline", "rb") as cmd:
                        args = cmd.read().split(b"\0")
                except FileNotFoundError:
                    continue
                if b"seed.actor.main" in args and f"--actor_index={index}".encode() in args:
                    return int(child)
    return None
