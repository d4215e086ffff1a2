"""Priority Refresh (seed/experience/priority_refresh.py): every replay item's priority recomputed with the latest
published
network, the generation check, the oldest priority's age, and a real R2D2 learner with the refresher on."""

from __future__ import annotations

import copy
import threading
import time

import numpy as np
import pytest
import torch

from seed.agents.r2d2.agent import R2D2Agent
from seed.agents.r2d2.agent import R2D2Agent as Agent
from seed.contracts.training import Unroll
from seed.envs import make_spec
from seed.experience.priority_refresh import PriorityRefresher, make_priority_refresher
from seed.experience.replay import PrioritizedReplay
from seed.inference.parameter_publisher import ParameterPublisher
from tests.conftest import read_metrics

ALPHA = 0.9


def _config(tmp_path, **overrides):
    from seed.learner.configuration import resolve_config

    values = dict(agent="r2d2", env="fake:vector", logdir=str(tmp_path / "run"), num_actors=1, envs_per_actor=2,
                  burn_in=2, unroll_length=4, batch_size=4, torch_threads=1, target_update_interval=100)
    values.update(overrides)
    return resolve_config(values)


def _unroll(agent: Agent, seed: int) -> Unroll:
    """A random sequence of burn_in + unroll_length + 1 steps of the agent's env, as inference stores it."""
    c, spec = agent.config, agent.spec
    length = c.burn_in + c.unroll_length + 1
    g = torch.Generator().manual_seed(seed)
    steps = {
        "observation": torch.randn(length, *spec.observation_shape, generator=g),
        "reward": torch.randn(length, generator=g),
        "done": torch.rand(length, generator=g) < 0.1,
        "truncated": torch.zeros(length, dtype=torch.bool),
        "valid": torch.ones(length, dtype=torch.bool),
        "action": torch.randint(0, spec.num_actions, (length,), generator=g),
        "prev_action": torch.randint(0, spec.num_actions, (length,), generator=g),
        "policy_version": torch.zeros(length, dtype=torch.int64),
        "q_values": torch.randn(length, spec.num_actions, generator=g),
    }
    state = {k: torch.randn(v[0].shape, generator=g) for k, v in agent.initial_state(1).items()}
    return Unroll(steps, state, torch.tensor(seed % 2))


def _filled_replay(agent: Agent, count: int, capacity: int | None = None) -> tuple[PrioritizedReplay, list[Unroll]]:
    replay = PrioritizedReplay(capacity or count, ALPHA, 0.6, min_size=1, replay_ratio=1e9, batch_size=4,
                               max_insert_lead=10**9)
    unrolls = [_unroll(agent, i) for i in range(count)]
    replay.insert(Unroll.stack(unrolls), np.ones(count))
    return replay, unrolls


def _trained(network: torch.nn.Module, seed: int) -> torch.nn.Module:
    """`network` with every weight moved, as if trained."""
    changed = copy.deepcopy(network)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in changed.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    return changed


def _refresher(agent, replay, publisher, **overrides) -> PriorityRefresher:
    args = dict(version=0, target_update_interval=100, interval_s=0.1, batch_size=4, device=torch.device("cpu"),
                stop=threading.Event())
    args.update(overrides)
    return PriorityRefresher(replay, agent.priorities, agent.network, agent.target_network, publisher, **args)


def _stored(replay: PrioritizedReplay, slots) -> np.ndarray:
    return replay.tree.get(np.asarray(slots)) ** (1.0 / ALPHA)


@pytest.mark.parametrize("target_update_interval", [100, 1])
def test_a_sweep_sets_every_priority_to_what_the_latest_published_network_gives(tmp_path, target_update_interval):
    agent = Agent(make_spec("fake:vector", {}), _config(tmp_path))
    replay, unrolls = _filled_replay(agent, 10)
    publisher = ParameterPublisher(copy.deepcopy(agent.network), torch.device("cpu"))
    refresher = _refresher(agent, replay, publisher, target_update_interval=target_update_interval)
    initial_target = copy.deepcopy(agent.target_network)
    latest = _trained(agent.network, seed=1)
    publisher.publish(latest.state_dict(), version=1)  # what the learner does after update 1

    assert refresher.sweep() == 10  # three forward passes: 4 + 4 + 2 slots
    # Update 1 crosses a multiple of an interval of 1 (the agent copies its target then), not of 100.
    target = latest if target_update_interval == 1 else initial_target
    expected = agent.priorities(Unroll.stack(unrolls), latest, target, 1).double().numpy()
    np.testing.assert_allclose(_stored(replay, range(10)), expected, rtol=1e-5)
    stale = agent.priorities(Unroll.stack(unrolls), agent.network, agent.target_network, 0).double().numpy()
    assert not np.allclose(expected, stale, rtol=1e-3)  # the network the refresher started with would differ
    assert refresher.version == 1
    assert replay.stats()["replay/refreshed_priorities"] == 10


def test_a_slot_rewritten_during_a_sweep_keeps_its_new_sequences_priority(tmp_path):
    agent = Agent(make_spec("fake:vector", {}), _config(tmp_path))
    replay, _ = _filled_replay(agent, 8)
    publisher = ParameterPublisher(copy.deepcopy(agent.network), torch.device("cpu"))
    calls = []

    def priorities_while_inserting(unrolls, network, target_network, version):
        if not calls:  # between the read of slots 0-3 and the write of their priorities
            replay.insert(Unroll.stack([_unroll(agent, 100)]), np.array([123.0]))  # the full ring recycles slot 0
        calls.append(1)
        return agent.priorities(unrolls, network, target_network, version)

    refresher = _refresher(agent, replay, publisher)
    refresher._priorities = priorities_while_inserting
    assert refresher.sweep() == 7
    assert _stored(replay, [0])[0] == pytest.approx(123.0)
    stats = replay.stats()
    assert stats["replay/stale_priority_refreshes"] == 1 and stats["replay/refreshed_priorities"] == 7


def test_the_oldest_priority_age_drops_after_a_sweep(tmp_path):
    agent = Agent(make_spec("fake:vector", {}), _config(tmp_path))
    replay, _ = _filled_replay(agent, 6)
    time.sleep(0.3)
    before = replay.stats()["replay/oldest_priority_age_s"]
    assert before >= 0.3
    refresher = _refresher(agent, replay, ParameterPublisher(copy.deepcopy(agent.network), torch.device("cpu")))
    refresher.sweep()
    assert replay.stats()["replay/oldest_priority_age_s"] < before


def test_an_agent_without_a_replay_is_refused_naming_the_flag(tmp_path):
    """--priority_refresh_interval_s is a replay flag: --agent=vtrace refuses it when the configuration resolves,
    naming the agents that have it."""
    from seed.learner.configuration import resolve_config

    with pytest.raises(ValueError, match=r"--priority_refresh_interval_s: got 5.0 with --agent=vtrace, which has "
                                         r"no such setting; a flag of --agent=r2d2 or --agent=muzero"):
        resolve_config(dict(agent="vtrace", env="fake:vector", logdir=str(tmp_path / "run"),
                            priority_refresh_interval_s=5.0))
    assert make_priority_refresher(_config(tmp_path, priority_refresh_interval_s=0.0), R2D2Agent, None, None, 0,
                                   threading.Event(), print) is None


def test_an_r2d2_learner_on_cartpole_refreshes_every_priority_while_it_trains(processes, tmp_path):
    """The real learner (training process on), one CartPole actor: updates happen and the refresher sweeps the
    replay with parameters the training published."""
    from seed.learner.learner import Learner

    config = _config(tmp_path, env="gym:CartPole-v1", server_address=f"unix:{tmp_path}/s", envs_per_actor=4,
                     replay_capacity=64, replay_min_size=8, max_train_steps=40, log_interval_s=0.5,
                     priority_refresh_interval_s=0.1, checkpoint_interval_s=3600)
    learner = Learner(config)
    assert learner.parts.training_process is not None and learner.parts.priority_refresher is not None
    raised: list[BaseException] = []

    def run():
        try:
            learner.run()
        except BaseException as error:  # noqa: BLE001 - inspected by the test
            raised.append(error)

    runner = threading.Thread(target=run)
    runner.start()
    processes.actor([f"--{k}={v}" for k, v in dict(env="gym:CartPole-v1", server_address=f"unix:{tmp_path}/s",
                                                    actor_index=0, envs_per_actor=4).items()], "actor0")
    runner.join(120)
    if runner.is_alive():
        learner.request_stop()
        runner.join(30)
        pytest.fail("the learner did not stop at --max_train_steps")
    assert not raised, raised
    assert learner.parts.metrics.train_steps == 40
    refresher = learner.parts.priority_refresher
    assert not refresher.thread.is_alive()
    assert refresher.sweeps >= 1 and refresher.version > 0  # it swept with a trained network
    rows = read_metrics(config.logdir)
    assert rows[-1]["replay/refreshed_priorities"] > 0, rows[-1]
    assert any((r.get("replay/refresh_items_per_s") or 0) > 0 for r in rows), rows[-1]
    assert rows[-1]["replay/oldest_priority_age_s"] >= 0


def _muzero_unrolls(config, count: int, version: int) -> list[Unroll]:
    """`count` random MuZero sequences of fake:vector, each acted at parameter version `version`."""
    g = torch.Generator().manual_seed(count)
    length = config.burn_in + config.unroll_length + 1
    unrolls = []
    for b in range(count):
        policy = torch.rand(length, 4, generator=g)
        steps = dict(observation=torch.randn(length, 8, generator=g), reward=torch.randn(length, generator=g),
                     done=torch.rand(length, generator=g) < 0.1, truncated=torch.zeros(length, dtype=torch.bool),
                     prev_action=torch.zeros(length, dtype=torch.long),
                     action=torch.randint(0, 4, (length,), generator=g), valid=torch.ones(length, dtype=torch.bool),
                     policy_version=torch.full((length,), version, dtype=torch.long),
                     search_policy=policy / policy.sum(-1, keepdim=True), root_value=torch.randn(length, generator=g))
        unrolls.append(Unroll(steps, {}, torch.tensor(b)))
    return unrolls


def test_muzero_refreshed_priorities_equal_the_losses_after_updates_in_the_training_process(tmp_path):
    """With the training process (the default) the learner's own agent never trains: its train_steps stays 0.
    The refresher must bootstrap at the horizon the loss uses for the parameters it refreshes with (their published
    version), which --td_age_updates shortens with a step's age. After 6 updates in a trainer agent (as the training
    process holds it), a sweep with the published parameters gives the priorities the loss gives the same batch.
    Seen failing before the fix, with the learner's agent's step count (0): priorities up to 1.8 apart on these
    sequences (horizon 5 instead of 5 - 6 // 2 = 2)."""
    from seed.agents import agent_class
    from seed.contracts.training import TrainingBatch
    from seed.training.update import train_on_batch

    updates = 6
    config = _config(tmp_path, agent="muzero", burn_in=9, unroll_length=4, batch_size=4, num_simulations=2,
                     td_age_updates=2, target_update_interval=updates, priority_refresh_interval_s=0.1)
    spec = make_spec("fake:vector", {})
    torch.manual_seed(0)
    learner_agent = agent_class("muzero")(spec, config)  # the learner's: never trained with the training process
    trainer = agent_class("muzero")(spec, config)
    trainer.load_state_dict(learner_agent.state_dict())
    optimizer = torch.optim.Adam(trainer.network.parameters(), lr=3e-3)
    for step in range(updates):
        batch = TrainingBatch(Unroll.stack(_muzero_unrolls(config, 4, version=0)), torch.ones(4))
        assert train_on_batch(trainer, optimizer, batch, config, step).trained
        trainer.after_update(step + 1)
    assert learner_agent.train_steps == 0 and trainer.train_steps == updates

    stored = _muzero_unrolls(config, 8, version=0)
    replay = PrioritizedReplay(8, ALPHA, 0.6, min_size=1, replay_ratio=1e9, batch_size=4, max_insert_lead=10**9)
    replay.insert(Unroll.stack(stored), np.ones(8))
    publisher = ParameterPublisher(copy.deepcopy(learner_agent.network), torch.device("cpu"))
    publisher.publish(trainer.network.state_dict(), version=updates)  # what the learner does after update 6
    refresher = make_priority_refresher(config, learner_agent, type("Experience", (), {"replay": replay}), publisher,
                                        0, threading.Event(), lambda values: None)
    assert refresher.sweep() == 8

    trainer.network.eval()
    expected = trainer.loss(TrainingBatch(Unroll.stack(stored), torch.ones(8))).priorities.double().numpy()
    np.testing.assert_allclose(_stored(replay, range(8)), expected, rtol=1e-4)


def test_a_refresh_that_computes_nan_priorities_is_refused_naming_the_field(tmp_path):
    """Priority Refresh writes through the replay's check: a network whose priorities are NaN (a diverged run)
    stops the refresher's sweep with the field named, instead of storing them (as 1.0 in a uniform replay)."""
    agent = Agent(make_spec("fake:vector", {}), _config(tmp_path))
    replay, _ = _filled_replay(agent, 6)
    publisher = ParameterPublisher(copy.deepcopy(agent.network), torch.device("cpu"))
    refresher = PriorityRefresher(replay, lambda unrolls, network, target, version: torch.full(
        (unrolls.reward.shape[1],), float("nan")), agent.network, agent.target_network, publisher, version=0,
        target_update_interval=100, interval_s=0.1, batch_size=4, device=torch.device("cpu"), stop=threading.Event())
    before = replay.tree.get(np.arange(6)).copy()
    with pytest.raises(ValueError, match=r"replay refresh: priorities got nan, nan, nan at rows 0, 1, 2 of 4 \(4 in "
                                         r"all\), expected finite values >= 0"):
        refresher.sweep()
    np.testing.assert_array_equal(replay.tree.get(np.arange(6)), before)
