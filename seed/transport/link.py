"""A transport, seen from each side: the actor's `ActorLink` and the learner's endpoint, with one family of errors.

The actor's side. One actor run (one run id) is one link. Each transport's `connect` dials the learner and
handshakes (actor index, run id, K, env spec, the token): `GrpcLink` (seed/transport/grpc/link.py: one gRPC stream,
any host) and `ShmLink` (seed/transport/shm/link.py: the learner's step slab itself, on the learner's host). Then
`step` hands one step of the K envs to the learner and returns their K actions, checked against the env spec;
`cancel` (any thread, a signal handler) makes a waiting `step` end with LinkDown; `close` ends the run. The actor
(seed/actor/loop.py) picks the transport (--transport) and never sees which one it steps through.

The learner's side: the serving process (seed/serving/process.py) runs one endpoint per transport, and each ends every
step in `StepSlab.write_request` plus a request-pipe notification (seed/transport/slab.py, notify.py), so inference
answers both alike, in the slab, with a wake-up of the actor's reply eventfd:

  gRPC  `SlabService` (grpc/service.py) on every listen address (host:port, unix:P), served by
        `start_grpc_server` (grpc/server.py: TLS, the token's guard, limits); a stream thread per actor run.
  shm   `ShmHandover` (shm/handover.py) on `P.shm` beside each unix:P address, unless --shm_actors=false or the
        learner requires TLS: checks the peer's uid and the token, hands over the slab's descriptors; the actor
        then writes its slot itself.

Both check a handshake with `SlabService.check_handshake` and make the run its index's live one with
`SlabService.register` (a newer run supersedes an older one whichever transport either uses).

Errors. Each implementation translates its own failures (gRPC status codes, a closed handover socket, a slab reply
status) into this family, so the actor has one error path (`Actor.run`):

  LinkDown              the learner cannot be reached now, or this run ended (learner or serving process restarted,
                        connection lost, inference failed): reconnect with a new run id after a backoff
  RunFinished           the learner's run is over (its total frames reached; told as `wire.RUN_FINISHED` on gRPC,
                        by the slab's `run_finished` on shm): nothing more to do, the actor exits 0 (--exit_when_done)
  LinkFatal             retrying cannot help; the actor ends:
    ConfigurationError  the learner rejected this actor (handshake, token, a malformed step)
    SupersededError     a newer run of this actor index took the index over while this one was alive
    InvalidReplyError   the learner's actions are ones the actor refuses to step its envs with
"""

from __future__ import annotations

import abc

import numpy as np

from seed.envs.base import BatchStep


class LinkError(RuntimeError):
    """A link's failure, translated by the transport that met it (see the module docstring)."""


class LinkDown(LinkError):
    """The learner cannot be reached now, or this run ended: reconnect with a new run id after a backoff.
    `transport`: the one that failed ("grpc", "shm"), for the actor's log."""

    def __init__(self, message: str, transport: str):
        super().__init__(message)
        self.transport = transport


class RunFinished(LinkError):
    """The learner said its run is over (seed/transport/slab.py: `finished_message`): the actor ends with status 0.
    Only a learner that reached its end says so; one that restarts just goes away (LinkDown). `transport`: the
    one that told it."""

    def __init__(self, message: str, transport: str):
        super().__init__(message)
        self.transport = transport


class LinkFatal(LinkError):
    """Retrying cannot help: the actor ends (seed-actor exits with a message, see seed/actor/main.py)."""


class ConfigurationError(LinkFatal):
    """The learner rejected this actor (e.g. a different env spec, a wrong token, a malformed step)."""


class SupersededError(LinkFatal):
    """A newer actor run took over this actor's index while this one was alive: reconnecting would evict it."""


class InvalidReplyError(LinkFatal):
    """The learner's reply is one the actor refuses to step its envs with (actions of the wrong dtype or shape, a
    NaN or inf in a Box action): the message names the field, the value received and the value expected."""


class ActorLink(abc.ABC):
    """One actor run's connection to the learner, handshaken. Build with the transport's `connect`.

    Attributes:
      first_env_id: the learner's env id of this actor's first env (the handshake reply's).
      transport: what the run goes over, for the actor's log: "grpc", "grpc+lz4" or "shm".
    """

    first_env_id: int
    transport: str

    @abc.abstractmethod
    def step(self, step: BatchStep) -> np.ndarray:
        """Hands one step of the K envs (frames [K, *obs], rewards, dones, truncations, finished episodes) to the
        learner; their actions, checked against the env spec: int32 [K] (Discrete) or float32 [K, D] (Box).
        Raises LinkDown, RunFinished or a LinkFatal, nothing else of the transport's own."""

    def cancel(self) -> None:
        """Makes a `step` waiting in another thread end with LinkDown soon (request_stop, SIGTERM). The default
        does nothing: a link that polls the actor's stop event while it waits needs no more."""
        return None

    @abc.abstractmethod
    def close(self) -> None:
        """Ends the run and frees what the link holds (stream, sockets, descriptors, mappings)."""
