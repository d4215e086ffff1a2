"""The training process's newest parameters and their version, in shared memory, under a lock the kernel releases.

The training process (the writer) copies its network's state dict here after every update; the learner's main
thread (the reader) copies it into each inference device's staging. Each holds an exclusive POSIX record lock
(fcntl) on one memfd while it copies. The kernel drops a record lock when the process holding it dies, however it
dies (SIGKILL, the OOM killer), so neither side can wait on a lock whose holder is gone, as it could on the POSIX
semaphore of a multiprocessing.Lock. The lock is taken without blocking and retried after a short sleep (50 us
growing to 2 ms), and every half second of waiting the caller's `on_wait` decides whether to go on: a holder that
is alive but stuck is the caller's to judge.

The version travels with the weights: the writer stores its update's number beside them under the same lock, so
the reader publishes exactly the version it copied, even when the child has written update v + 1 since it reported
v. A mark set before the copy and cleared after it tells the next holder that the previous one died halfway.

Record locks belong to a (process, file) pair: within one process they do not exclude threads, and closing any
descriptor of the file drops them. Each side takes the lock from one thread only (the child's main thread, the
learner's main thread) and keeps its descriptor open for its lifetime.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from multiprocessing import reduction

import torch

_WAIT_CALLBACK_S = 0.5  # seconds between `on_wait` calls while the lock is held by the other side


class ParametersHalfWritten(RuntimeError):
    """The previous holder of the lock left in the middle of writing the parameters (it died)."""

    def __init__(self, version: int):
        super().__init__(f"shared parameters: half-written after version {version} (their writer died while "
                         "copying the next update's)")
        self.version = version


class SharedParameters:
    """A state dict's tensors and their version in shared host memory, with the lock that guards both.

    Args:
      state: the network's state dict (any device): shapes, dtypes and the initial values.
      version: the policy version of `state` (train steps made).

    Pickled only into a process being spawned (the memfd's descriptor travels with it, as a Pipe's does).
    """

    def __init__(self, state: dict[str, torch.Tensor], version: int):
        self.tensors = {name: tensor.detach().to("cpu", copy=True).share_memory_() for name, tensor in state.items()}
        self._header = torch.tensor([version, 0], dtype=torch.int64).share_memory_()  # (version, writing 0/1)
        self._fd = os.memfd_create("seed-parameters-lock", os.MFD_CLOEXEC)

    def __getstate__(self) -> dict:
        return {"tensors": self.tensors, "header": self._header, "fd": reduction.DupFd(self._fd)}

    def __setstate__(self, state: dict) -> None:
        self.tensors, self._header, self._fd = state["tensors"], state["header"], state["fd"].detach()

    def close(self) -> None:
        """Closes this process's descriptor of the lock (no side holds the lock any more)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    @property
    def version(self) -> int:
        """The version last written, read without the lock (for messages and tests)."""
        return int(self._header[0])

    @contextlib.contextmanager
    def writing(self, version: int, on_wait: Callable[[float], None]) -> Iterator[dict[str, torch.Tensor]]:
        """Writer: holds the lock and yields the tensors to copy into; on a normal exit they are `version`'s."""
        with self._locked(on_wait):
            self._header[1] = 1
            yield self.tensors
            self._header[0] = version
            self._header[1] = 0

    @contextlib.contextmanager
    def reading(self, on_wait: Callable[[float], None]) -> Iterator[tuple[dict[str, torch.Tensor], int]]:
        """Reader: holds the lock and yields (tensors, their version). Raises ParametersHalfWritten if the writer
        died while copying."""
        with self._locked(on_wait):
            version, writing = self._header.tolist()
            if writing:
                raise ParametersHalfWritten(version)
            yield self.tensors, version

    @contextlib.contextmanager
    def _locked(self, on_wait: Callable[[float], None]) -> Iterator[None]:
        """Holds the record lock; `on_wait(seconds waited)` runs every half second while the other side holds it
        and may raise to give up."""
        start = time.monotonic()
        next_call = start + _WAIT_CALLBACK_S
        sleep_s = 50e-6
        while True:
            try:
                fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as error:
                if error.errno not in (errno.EACCES, errno.EAGAIN):
                    raise
            now = time.monotonic()
            if now >= next_call:
                on_wait(now - start)
                next_call = now + _WAIT_CALLBACK_S
            time.sleep(sleep_s)
            sleep_s = min(2 * sleep_s, 2e-3)
        try:
            yield
        finally:
            fcntl.lockf(self._fd, fcntl.LOCK_UN)
