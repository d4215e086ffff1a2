"""The rule that keeps CUDA-graph captures safe across threads (seed/runtime/cuda_graphs.py), on the CPU: a capture
(exclusive) never overlaps a replay or eager random draw (shared) of another thread; shared holders overlap; a
shared holder may capture without deadlock. tests/test_cuda.py runs the same rule on real graphs."""

import random
import threading
import time

import pytest

from seed.runtime.cuda_graphs import GraphLock


class _Inside:
    """Who is inside the lock right now, checked on every entry: the invariant the lock promises."""

    def __init__(self):
        self._lock = threading.Lock()
        self.shared: dict[int, int] = {}  # thread -> depth
        self.exclusive: int | None = None
        self.violations: list[str] = []
        self.max_concurrent_shared = 0

    def enter(self, kind: str) -> None:
        me = threading.get_ident()
        with self._lock:
            others_shared = [t for t, d in self.shared.items() if d and t != me]
            if kind == "exclusive":
                if others_shared:
                    self.violations.append(f"capture while threads {others_shared} share")
                if self.exclusive not in (None, me):
                    self.violations.append("two captures at once")
                self.exclusive = me
            else:
                if self.exclusive not in (None, me):
                    self.violations.append("a replay inside another thread's capture")
                self.shared[me] = self.shared.get(me, 0) + 1
                self.max_concurrent_shared = max(self.max_concurrent_shared,
                                                 sum(1 for d in self.shared.values() if d))

    def leave(self, kind: str) -> None:
        me = threading.get_ident()
        with self._lock:
            if kind == "exclusive":
                self.exclusive = None
            else:
                self.shared[me] -= 1


def _run(threads: list[threading.Thread], timeout_s: float = 30.0) -> None:
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
        assert not t.is_alive(), f"thread {t.name} still waits after {timeout_s} s: a deadlock"


def test_a_capture_waits_for_shared_holders_and_holds_new_ones_off():
    lock, order = GraphLock(), []
    sharing, capture_waiting = threading.Event(), threading.Event()

    def replayer():
        with lock.shared():
            sharing.set()
            assert capture_waiting.wait(5)
            time.sleep(0.05)  # the capture must still be waiting
            order.append("replay ends")

    def capturer():
        assert sharing.wait(5)
        capture_waiting.set()
        with lock.exclusive():
            order.append("capture")
            time.sleep(0.05)
            order.append("capture ends")

    def late_replayer():
        assert capture_waiting.wait(5)
        while not lock.state()["writers_waiting"] and "capture" not in order:
            time.sleep(0.001)
        with lock.shared():  # arrives while the capture waits: goes after it (captures are preferred)
            order.append("late replay")

    _run([threading.Thread(target=f, name=f.__name__) for f in (replayer, capturer, late_replayer)])
    assert order == ["replay ends", "capture", "capture ends", "late replay"]
    assert lock.state() == {"shared": 0, "exclusive": False, "writers_waiting": 0}


def test_shared_holders_run_together():
    lock, barrier = GraphLock(), threading.Barrier(3, timeout=5)

    def replayer():
        with lock.shared():
            barrier.wait()  # all three inside at once, or the barrier breaks

    _run([threading.Thread(target=replayer) for _ in range(3)])


def test_a_shared_holder_captures_after_the_others_leave_and_shares_again():
    lock, order = GraphLock(), []
    other_in, upgrading = threading.Event(), threading.Event()

    def trainer():  # holds the lock for its step, captures a new shape inside it
        with lock.shared():
            assert other_in.wait(5)
            upgrading.set()
            with lock.exclusive():
                order.append("capture")
                assert lock.state()["shared"] == 0
            assert lock.state()["shared"] >= 1  # its own hold is back
            with lock.shared():  # nesting still works
                order.append("replay after capture")

    def inference():
        with lock.shared():
            other_in.set()
            assert upgrading.wait(5)
            time.sleep(0.05)
            order.append("inference leaves")

    _run([threading.Thread(target=trainer), threading.Thread(target=inference)])
    assert order == ["inference leaves", "capture", "replay after capture"]
    assert lock.state()["shared"] == 0


def test_two_shared_holders_that_both_capture_do_not_deadlock():
    lock, barrier, captures = GraphLock(), threading.Barrier(2, timeout=5), []

    def both():
        with lock.shared():
            barrier.wait()  # both share, then both want to capture
            with lock.exclusive():
                captures.append(threading.get_ident())
                with lock.exclusive():  # a capture inside a capture of the same thread nests
                    pass

    _run([threading.Thread(target=both) for _ in range(2)])
    assert len(set(captures)) == 2


@pytest.mark.parametrize("seed", [0, 1])
def test_random_captures_and_replays_never_overlap(seed):
    """200 rounds per thread of captures and replays (some nested, some upgrading from a shared hold) in four
    threads: no capture ever overlaps another thread's replay, and replays did overlap each other."""
    lock, inside = GraphLock(), _Inside()

    def work(worker: int):
        rng = random.Random(seed * 100 + worker)
        for _ in range(200):
            kind = rng.choice(["shared", "shared", "shared", "exclusive", "upgrade"])
            if kind == "upgrade":
                with lock.shared():
                    inside.enter("shared")
                    inside.leave("shared")  # an upgrading thread waits, doing nothing, until it captures
                    with lock.exclusive():
                        inside.enter("exclusive")
                        time.sleep(rng.random() * 1e-4)
                        inside.leave("exclusive")
                    inside.enter("shared")  # and is back inside its shared hold, no other capture in between
                    time.sleep(rng.random() * 1e-4)
                    inside.leave("shared")
                continue
            with getattr(lock, kind)():
                inside.enter(kind)
                time.sleep(rng.random() * 2e-4)
                inside.leave(kind)

    _run([threading.Thread(target=work, args=(w,)) for w in range(4)], timeout_s=60)
    assert inside.violations == []
    assert inside.max_concurrent_shared >= 2
    assert lock.state() == {"shared": 0, "exclusive": False, "writers_waiting": 0}


def test_the_framework_and_the_agents_capture_through_the_lock():
    """Every place that captures a CUDA graph goes through `capture_graph` (a bare torch.cuda.graph would bypass the
    rule): checked over the package sources."""
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    bare = [f"{path.relative_to(root)}:{n}" for folder in ("seed", "agents", "envs")
            for path in (root / folder).rglob("*.py") if path.name != "cuda_graphs.py"
            for n, line in enumerate(path.read_text().splitlines(), 1)
            if "torch.cuda.graph(" in line or "make_graphed_callables" in line or ".capture_begin(" in line]
    assert bare == [], f"captures outside seed/runtime/cuda_graphs.capture_graph: {bare}"


# A process whose main thread shares the lock and upgrades to capture while another thread shares, so it waits;
# a real SIGINT interrupts that wait. Then the other thread leaves and a later capture must get the lock.
INTERRUPTED_UPGRADE = """if True:
    import json, threading, time
    from seed.runtime.cuda_graphs import GraphLock

    lock, other_in, other_may_leave = GraphLock(), threading.Event(), threading.Event()

    def other():  # e.g. the inference thread, inside a replay
        with lock.shared():
            other_in.set()
            other_may_leave.wait(60)

    def announce():  # once the upgrade waits (it counts as a waiting writer only inside its wait)
        while not lock.state()["writers_waiting"]:
            time.sleep(0.001)
        print("waiting", flush=True)

    other_thread = threading.Thread(target=other, daemon=True)
    other_thread.start()
    other_in.wait(60)
    threading.Thread(target=announce, daemon=True).start()
    interrupted = False
    try:
        with lock.shared():  # e.g. the training step
            with lock.exclusive():  # e.g. its first capture of a shape: waits for the other thread
                pass
    except KeyboardInterrupt:
        interrupted = True
    after_interrupt = lock.state()
    other_may_leave.set()
    other_thread.join(60)
    captured = threading.Event()

    def later_capture():
        with lock.exclusive():
            captured.set()

    threading.Thread(target=later_capture, daemon=True).start()
    print(json.dumps({"interrupted": interrupted, "after_interrupt": after_interrupt,
                      "captured": captured.wait(20), "after": lock.state()}), flush=True)
"""


def test_an_upgrade_interrupted_while_it_waits_leaves_the_lock_usable(tmp_path):
    """Ctrl-C (a real SIGINT) while a shared holder waits to capture: its shared hold ends as its `with` block
    unwinds, the lock counts only the other thread's hold, and a later capture gets the lock once that thread
    leaves. Seen failing with the upgrade giving up its hold before the wait and not taking it back when the wait
    raised: the count ended at -1 and the later capture waited forever."""
    import json
    import os
    import signal
    import subprocess
    import sys

    from tests.conftest import REPO

    child = subprocess.Popen([sys.executable, "-c", INTERRUPTED_UPGRADE], cwd=REPO, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=REPO))
    try:
        assert child.stdout.readline() == "waiting\n", child.stderr.read()
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=60)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == 0, err[-3000:]
    found = json.loads(out)
    assert found["interrupted"], found
    assert found["captured"], f"a capture after the interrupted one waited 20 s: {found}"
    assert found["after_interrupt"] == {"shared": 1, "exclusive": False, "writers_waiting": 0}, found
    assert found["after"] == {"shared": 0, "exclusive": False, "writers_waiting": 0}, found


def test_capture_graph_holds_the_process_lock_exclusively(monkeypatch):
    """`capture_graph` on the CPU, with a stand-in for torch.cuda.graph (the GPU tests skip here) that records the
    process's lock when the capture begins: held exclusively, and a replay (`graph_use`) that was inside when the
    capture was asked for had left; gradients off. Seen failing with capture_graph taking the lock shared."""
    import torch

    from seed.runtime import cuda_graphs

    lock, seen, replaying = cuda_graphs.GRAPH_LOCK, {}, threading.Event()

    class StandInCapture:  # in torch.cuda.graph's place: entered last, around the work a capture records
        def __init__(self, graph, pool=None, capture_error_mode="global"):
            seen["graph"], seen["pool"], seen["mode"] = graph, pool, capture_error_mode

        def __enter__(self):
            seen["state"], seen["replay inside"] = lock.state(), replaying.is_set()
            seen["gradients"] = torch.is_grad_enabled()

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(torch.cuda, "graph", StandInCapture)

    def replay():  # inside when the capture is asked for; leaves once the capture waits for it (or has begun)
        with cuda_graphs.graph_use():
            replaying.set()
            deadline = time.monotonic() + 10
            while not lock.state()["writers_waiting"] and "state" not in seen and time.monotonic() < deadline:
                time.sleep(0.001)
            replaying.clear()

    def capture():
        assert replaying.wait(5)
        with cuda_graphs.capture_graph("the graph", pool="the pool"):
            seen["inside"] = lock.state()

    _run([threading.Thread(target=replay), threading.Thread(target=capture)])
    assert seen["state"] == {"shared": 0, "exclusive": True, "writers_waiting": 0}, seen
    assert not seen["replay inside"] and not seen["gradients"], seen
    assert (seen["graph"], seen["pool"], seen["mode"]) == ("the graph", "the pool", "thread_local")
    assert seen["inside"]["exclusive"], seen
    assert lock.state() == {"shared": 0, "exclusive": False, "writers_waiting": 0}


def test_the_training_step_holds_the_process_lock_shared(monkeypatch):
    """`train_on_batch` (seed/training/update.py: what the training thread and the training process run) on a real
    V-trace agent and batch: the agent's update runs inside a shared hold of the process's lock, so a capture in
    another thread (inference's --cuda_graphs) waits for it. Seen failing with the step taking no hold."""
    from seed.runtime.cuda_graphs import GRAPH_LOCK
    from seed.training.optimizers import make_optimizer
    from seed.training.update import train_on_batch
    from tests.test_data_parallel import _agent_and_config, _batches

    agent, spec, config = _agent_and_config("vtrace")
    seen, real_update = [], agent.update

    def update(*args, **kwargs):
        seen.append(GRAPH_LOCK.state())
        return real_update(*args, **kwargs)

    monkeypatch.setattr(agent, "update", update)
    result = train_on_batch(agent, make_optimizer(agent, config), _batches(spec, config, "vtrace")[0], config, 0)
    assert result.trained and "policy_lag_updates" in result.values
    assert seen == [{"shared": 1, "exclusive": False, "writers_waiting": 0}]
    assert GRAPH_LOCK.state() == {"shared": 0, "exclusive": False, "writers_waiting": 0}


def test_an_eager_step_on_the_cpu_takes_no_hold(monkeypatch):
    """`EagerPolicy` on the CPU (a real V-trace agent and state table): the agent's act runs without a hold of the
    process's lock (no CUDA work, the CPU generator), so the inference thread pays nothing for it. Fails with the
    hold taken on every device (the cost this removed: docs/performance/cpu/hot_path_ab/)."""
    import torch

    from seed.contracts import InferenceBatch
    from seed.inference.forward_pass import EagerPolicy
    from seed.inference.state_table import StateTable
    from seed.runtime.cuda_graphs import GRAPH_LOCK
    from tests.test_data_parallel import _agent_and_config

    agent, spec, config = _agent_and_config("vtrace")
    seen, real_act = [], agent.act

    def act(*args, **kwargs):
        seen.append(GRAPH_LOCK.state())
        return real_act(*args, **kwargs)

    monkeypatch.setattr(agent, "act", act)
    table = StateTable(agent.initial_state, config.num_envs, torch.device("cpu"))
    policy = EagerPolicy(agent, agent.network, table, torch.device("cpu"))
    rows = 4
    batch = InferenceBatch(env_ids=torch.arange(rows), observation=torch.zeros((rows, *spec.observation_shape)),
                           reward=torch.zeros(rows), done=torch.zeros(rows, dtype=torch.bool),
                           prev_action=torch.zeros(rows, dtype=torch.int64))
    action, _, _ = policy(batch)
    assert action.shape == (rows,)
    assert seen == [{"shared": 0, "exclusive": False, "writers_waiting": 0}]
