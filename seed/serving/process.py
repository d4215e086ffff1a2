"""The serving process: the learner's front end for actors, a separate OS process with its own GIL.

It runs the learner's side of each transport (seed/transport/link.py has the list): `SlabService` over gRPC on
every listen address, and `ShmHandover` on `P.shm` beside each unix:P address (unless --shm_actors=false or TLS).
Both write the actors' steps into the step slab, which inference answers.

The learner starts it (`ServingProcess.start`) with the slab layout, the env spec, the listen addresses and
these inherited file descriptors: request pipes (to each inference device), one reply eventfd per actor index
(woken by inference, seed/transport/notify.py), a lifeline pipe the learner never writes, and an events pipe
(JSON lines back to the learner: bound addresses, finished episodes' raw returns, a fatal error). The process
exits when the learner tells it to (SIGTERM) or when the learner disappears (the lifeline reaches end of file,
or its parent changes), so a killed learner never leaves a process holding its port.

    python -m seed.serving.process   (reads its configuration as one JSON object on stdin)
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from seed.envs.base import EnvSpec
from seed.runtime.supervised_thread import SupervisedThread, episodes_fault_from_environment
from seed.transport import TransportSecurity
from seed.transport.slab import SlabLayout

log = logging.getLogger(__name__)


@dataclasses.dataclass
class ServingConfig:
    """Everything the serving process needs; travels as JSON on its stdin."""

    layout: SlabLayout
    spec: EnvSpec
    addresses: list[str]
    request_fds: list[int]
    reply_fds: list[int]  # one reply eventfd per actor index
    lifeline_fd: int  # read end of a pipe the learner never writes: end of file = the learner exited
    events_fd: int
    max_workers: int
    parent_pid: int
    max_message_bytes: int
    security: TransportSecurity  # the token travels on the process's stdin, never in its argv
    shm_actors: bool = False  # offer actors on this host the shared-memory path

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @staticmethod
    def from_json(text: str) -> ServingConfig:
        values = json.loads(text)
        layout = values.pop("layout")
        layout["observation_shape"] = tuple(layout["observation_shape"])
        spec = values.pop("spec")
        spec["observation_shape"] = tuple(spec["observation_shape"])
        security = TransportSecurity(**values.pop("security"))
        return ServingConfig(layout=SlabLayout(**layout), spec=EnvSpec(**spec), security=security, **values)


class _EventWriter:
    """JSON lines to the learner; writes from several threads never interleave."""

    def __init__(self, fd: int):
        self._file = os.fdopen(fd, "w", buffering=1)
        self._lock = threading.Lock()

    def send(self, **event: Any) -> None:
        with self._lock:
            try:
                self._file.write(json.dumps(event) + "\n")
            except (BrokenPipeError, ValueError):  # the learner is gone; the watchdog ends this process
                pass


def _die_with_parent(parent_pid: int, stop: threading.Event) -> None:
    """Ends the process when the learner is gone (SIGKILLed learners included)."""
    try:  # Linux: the kernel sends SIGTERM when the parent dies
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass

    def watch() -> None:
        while not stop.wait(0.5):
            if os.getppid() != parent_pid:
                stop.set()

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def serve(config: ServingConfig) -> None:
    """Runs the gRPC server until SIGTERM or the learner's exit."""
    from seed.transport import start_grpc_server
    from seed.transport.grpc.service import SlabService
    from seed.transport.slab import StepSlab

    stop = threading.Event()
    # The handler only sets a flag: calling stop.set() from a signal handler can deadlock when the signal lands
    # while this thread is inside the same Event's lock (seen with SIGTERM arriving during stop.wait()).
    terminated = [False]
    signal.signal(signal.SIGTERM, lambda *_: terminated.__setitem__(0, True))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the learner, which stops us in order
    _die_with_parent(config.parent_pid, stop)
    events = _EventWriter(config.events_fd)
    slab = StepSlab.attach(config.layout)
    service = SlabService(config.spec, slab, config.request_fds, config.reply_fds,
                          lambda r: events.send(episodes=r), stop)

    def watch_lifeline() -> None:
        while os.read(config.lifeline_fd, 64):  # the learner never writes: this returns at its exit
            pass
        stop.set()

    threading.Thread(target=watch_lifeline, name="lifeline", daemon=True).start()
    # The shared-memory handover listens before gRPC does: an actor waits until gRPC answers and then tries the
    # handover, so it must be there by then (the other order sent an actor that raced the learner's start to gRPC).
    handover = _start_handover(config, service, stop)
    try:
        server, health, bound = start_grpc_server(service, config.addresses, config.max_workers,
                                                  security=config.security,
                                                  max_message_bytes=config.max_message_bytes)
    except (RuntimeError, ValueError) as error:
        if handover is not None:
            handover.close()
        events.send(error=str(error))
        sys.exit(3)
    events.send(bound=bound)
    while not terminated[0] and not stop.wait(0.2):
        pass
    stop.set()
    if handover is not None:
        handover.close()
    server.stop(grace=1.0).wait(5)


def _start_handover(config: ServingConfig, service: Any, stop: threading.Event) -> Any:
    """The shared-memory handover on `<path>.shm` of every unix listen address (seed/transport/shm/handover.py),
    or None: the learner refused shm actors (--shm_actors=false), requires mutual TLS (no TLS identity can be
    checked on that socket), or listens on no unix socket."""
    from seed.transport.shm.handover import ShmHandover
    from seed.transport.shm.protocol import handover_path

    paths = [path for path in map(handover_path, config.addresses) if path]
    if not config.shm_actors or config.security.tls or not paths:
        return None
    handover = ShmHandover(service, paths, config.security.auth_token, stop)
    try:
        handover.start()
    except OSError as error:  # e.g. `<path>.shm` longer than a unix socket path may be: gRPC actors still work
        handover.close()
        print(f"[learner] shared-memory path for local actors not offered: {paths}: {error}", file=sys.stderr,
              flush=True)
        return None
    return handover


class ServingProcess:
    """The learner's handle on its serving process: start, wait until it serves, restart, stop.

    Args:
      layout: the slab to serve into (created by the learner).
      spec, addresses, max_workers, security, max_message_bytes: as for the gRPC server (seed.transport).
      request_write_fds: write ends of the request pipes, one per inference device.
      reply_fds: one reply eventfd per actor index (seed/transport/notify.py), also handed to shm actors.
      lifeline_read_fd: read end of a pipe whose write end only the learner holds (and never writes).
      on_episodes: called with the (env id, raw return) pairs the actors report, on the `serving-events` thread
        (`events_thread`: one per serving process, supervised by the learner).
      shm_actors: offer actors on this host the shared-memory path (seed/transport/shm/handover.py).
    """

    def __init__(self, layout: SlabLayout, spec: EnvSpec, addresses: list[str], max_workers: int,
                 request_write_fds: list[int], reply_fds: list[int], lifeline_read_fd: int,
                 on_episodes: Callable[[list[tuple[int, float]]], None],
                 security: TransportSecurity, max_message_bytes: int, shm_actors: bool = False):
        self._layout, self._spec, self._addresses, self._max_workers = layout, spec, addresses, max_workers
        self._security, self._max_message_bytes = security, max_message_bytes
        self._request_fds, self._reply_fds, self._lifeline_fd = request_write_fds, list(reply_fds), lifeline_read_fd
        self._on_episodes = episodes_fault_from_environment(on_episodes)
        self._shm_actors = shm_actors
        self._process: subprocess.Popen | None = None
        self._ready = threading.Event()
        self._error: str | None = None
        self.bound_addresses: list[str] = []
        self.restarts = 0
        self.events_thread: SupervisedThread | None = None  # reads the current process's events

    def start(self, timeout_s: float = 60.0) -> list[str]:
        """Starts the process and returns its bound addresses once it serves; raises if it cannot."""
        events_read, events_write = os.pipe()
        self._ready.clear()
        self._error = None
        config = ServingConfig(self._layout, self._spec, self._addresses, self._request_fds, self._reply_fds,
                               self._lifeline_fd, events_write, self._max_workers, os.getpid(),
                               self._max_message_bytes, self._security, self._shm_actors)
        fds = (*self._request_fds, *self._reply_fds, self._lifeline_fd, events_write, self._layout.fd)
        self._process = subprocess.Popen([sys.executable, "-m", "seed.serving.process"], stdin=subprocess.PIPE,
                                         pass_fds=fds, text=True)
        os.close(events_write)
        self._process.stdin.write(config.to_json())
        self._process.stdin.close()
        self.events_thread = SupervisedThread(lambda: self._read_events(events_read), "serving-events")
        self.events_thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._ready.wait(0.1):
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(self._error or f"serving process exited with {self._process.returncode} "
                                                  f"before serving (waited up to {timeout_s:.0f}s)")
        if self._error:
            raise RuntimeError(self._error)
        return self.bound_addresses

    def _read_events(self, fd: int) -> None:
        with os.fdopen(fd) as lines:
            for line in lines:
                event = json.loads(line)
                if "episodes" in event:
                    self._on_episodes(event["episodes"])
                elif "bound" in event:
                    self.bound_addresses = event["bound"]
                    self._ready.set()
                elif "error" in event:
                    self._error = event["error"]
                    self._ready.set()

    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def restart(self) -> bool:
        """Starts a fresh serving process after the last one died; actors reconnect by themselves. Whether it
        serves again; the caller retries later if not (e.g. its port is still held)."""
        self.restarts += 1
        print(f"[learner] serving process exited with {self._process.returncode}; restarting it", flush=True)
        try:
            self.start()
            return True
        except RuntimeError as error:
            print(f"[learner] serving process did not start: {error}; retrying", flush=True)
            return False

    def stop(self) -> None:
        process = self._process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def main() -> None:
    """Reads the configuration from stdin and serves; a failure before serving reaches the learner as an error
    event (with the traceback on stderr), so the learner can say why its serving process did not start."""
    logging.basicConfig(level=logging.WARNING)
    config = ServingConfig.from_json(sys.stdin.read())
    try:
        serve(config)
    except Exception as error:
        try:
            _EventWriter(config.events_fd).send(error=f"serving process failed: {type(error).__name__}: {error}")
        except OSError:
            pass
        raise


if __name__ == "__main__":
    main()
