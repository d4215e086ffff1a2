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
