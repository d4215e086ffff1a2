"""CUDA-graph capture, safe across the threads of one process.

    with graph_use():                       # any thread that replays a graph or runs CUDA work that draws random
        graph.replay()                      # numbers (an eager search, a training step): shared, cheap
    with capture_graph(graph, pool=pool):   # a capture: exclusive; waits for every other holder to leave
        output = fn(static_inputs)

Why: every capture and every replay moves the device's default CUDA generator. `capture_begin` puts that
generator in capture mode for the whole process; a replay, or an eager random op, in another thread meanwhile
fails (`Offset increment outside graph capture encountered unexpectedly`, or `Attempt to increase offset for a
CUDA generator not in capture mode`), and a capture that ends while another runs takes the other out of capture
mode. Seen on an H200: the inference thread captured `act` (--cuda_graphs) while the training thread replayed
reanalysis's graphed search, and the learner died.

The rule, for every graph the framework or an agent makes: a capture holds the process's `GRAPH_LOCK`
exclusively; replays and eager CUDA work hold it shared. Shared holders run together; a capture waits until none
is inside and new shared holders wait behind a waiting capture (captures are rare: once per shape). A thread that
holds the lock shared may capture (the training step captures reanalysis's search on its first call of a shape):
it gives up its own shared hold while it waits and takes it back, atomically, when the capture ends (or when its
wait raises, e.g. on Ctrl-C), so two such threads never deadlock. Both kinds nest in one thread.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch


class GraphLock:
    """A readers-writer lock whose writers are graph captures (see the module docstring).

    Reentrant in both modes per thread; a shared holder may take it exclusively (its shared hold is released
    while it waits and restored when it leaves). Writers are preferred: a thread that holds nothing waits for a
    waiting writer before it may share.
    """

    def __init__(self):
        self._cond = threading.Condition(threading.Lock())
        self._shared = 0  # shared holds of all threads, counted with nesting
        self._writer: int | None = None  # thread ident of the exclusive holder
        self._writer_depth = 0
        self._writers_waiting = 0
        self._local = threading.local()  # .shared: this thread's shared holds

    def _own_shared(self) -> int:
        return getattr(self._local, "shared", 0)

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        """Replay graphs or run eager CUDA work; never inside another thread's capture."""
        me = threading.get_ident()
        with self._cond:
            if self._writer != me:
                # Wait for the writer; a thread already sharing must not wait for waiting writers (they wait for it).
                while self._writer is not None or (self._writers_waiting and not self._own_shared()):
                    self._cond.wait()
            self._shared += 1
            self._local.shared = self._own_shared() + 1
        try:
            yield
        finally:
            with self._cond:
                self._shared -= 1
                self._local.shared -= 1
                if self._shared == 0:
                    self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Capture a graph: no other thread replays or draws random numbers meanwhile."""
        me = threading.get_ident()
        with self._cond:
            if self._writer == me:
                self._writer_depth += 1
                given_up = 0
            else:
                given_up = self._own_shared()
                self._shared -= given_up  # this thread's own holds do not keep it out
                self._writers_waiting += 1
                try:
                    if given_up:
                        self._cond.notify_all()  # another upgrading thread may be waiting for exactly these
                    while self._writer is not None or self._shared:
                        self._cond.wait()
                except BaseException:  # the wait was interrupted (Ctrl-C, an injected error): still sharing, as before
                    self._shared += given_up
                    self._cond.notify_all()  # sharers held off by this waiting writer may go on
                    raise
                finally:
                    self._writers_waiting -= 1
                self._writer, self._writer_depth = me, 1
        try:
            yield
        finally:
            with self._cond:
                self._writer_depth -= 1
                if self._writer_depth == 0:
                    self._writer = None
                    self._shared += given_up  # back to sharing, with no other writer in between
                    self._cond.notify_all()

    def state(self) -> dict[str, int | bool]:
        """For tests and diagnostics: the holds right now."""
        with self._cond:
            return {"shared": self._shared, "exclusive": self._writer is not None,
                    "writers_waiting": self._writers_waiting}


GRAPH_LOCK = GraphLock()


def graph_use() -> contextlib.AbstractContextManager[None]:
    """Shared hold of the process's graph lock: around a replay or eager CUDA work that may draw random numbers."""
    return GRAPH_LOCK.shared()


@contextlib.contextmanager
def capture_graph(graph: torch.cuda.CUDAGraph, pool=None) -> Iterator[None]:
    """`torch.cuda.graph(graph, pool)` under an exclusive hold of the process's graph lock, gradients off.

    thread_local capture: other threads may go on with CUDA work that draws no random numbers (copies, the
    allocator) while this one captures."""
    with GRAPH_LOCK.exclusive(), torch.no_grad(), torch.cuda.graph(graph, pool=pool,
                                                                      capture_error_mode="thread_local"):
        yield
