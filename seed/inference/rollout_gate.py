"""HTS-RL's synchronisation point on the inference side (`--sync=hts`).

Every env plays rollouts of T = `--sync_every` steps. With `--sync_lag=1` (HTS-RL) rollout r is acted with the
parameters of update r - 1 (rollout 0 and 1 with the initial ones) while the learner trains on rollout r - 1: a
policy lag of exactly one update. In this architecture the steps of an actor's K envs arrive together, so the gate
counts steps per actor:

  * an actor whose request is the first step of the next rollout is held (its reply waits);
  * when every actor of this inference device is held and the learner has published the parameters the next
    rollout needs (version base + r for rollout r + 1, base being the version at start), the inference network
    takes exactly that version and the held requests are served, in actor order.

The step that opens rollout r + 1 is also the bootstrap step that completes unroll r (unroll length T + 1), so
the learner receives every env's unroll r at the same time, trains on it while rollout r + 1 is played, and
publishes version base + r + 1 before the next sync point can open. Publishing earlier is impossible (update
r + 1 needs unroll r); the gate checks it anyway.

Actor runs. A training batch needs every env's unroll of one rollout, so the gate keeps, per actor index, the
rollout whose unroll it still owes (`owed`: the first one whose bootstrap step was not served to a run of that
index). A new run of the index (first contact, a restarted actor, a reconnect, every actor at once after a new
serving process) starts at the beginning of that rollout, on fresh rows:

  * usually that is the rollout in progress (the old run was served its last bootstrap step), so the new run
    ends its unroll at the same sync point as everyone;
  * a held request whose run was superseded (the new run handshook, its first step is not there yet) is not
    counted at the sync point but answered stale at once (`drop_superseded`; the old run's stream holds the
    slot until it has a reply): the gate waits for the new run, which plays the rollout in progress;
  * if the gate opened counting a held request that was superseded before it was served (the handshake landed
    in between; or the request was refused as invalid), that request is not served and the index owes the
    rollout that just ended: its new run plays that rollout again (its T + 1 steps complete the missing unrolls,
    acted with the newer version: a policy lag of 0 for those envs) and then the rollout in progress; the other
    actors play the rollout in progress meanwhile and wait for it at the next sync point.

So a rollout that lost an actor's unrolls is completed by that actor's next run rather than trained short or
dropped: every batch still holds one unroll of every env, each unroll one run's consecutive steps, and no sync
point waits for an update that cannot happen. (The FIFO's prefetcher refuses a batch with two unrolls of one env,
seed/experience/training_batches.py, should that ever fail.)

`start_over` does the same for actors whose unrolls in progress were lost (the unroll store failed). A missing
actor holds everyone: HTS is synchronous. A gate that waits longer than `wait_log_s` says for whom (a warning
every `wait_log_every_s`).

`--sync_lag=0` (synchronous PPO, as CleanRL's): rollout r + 1 is acted with the update on rollout r itself, so
the step that opens it cannot be answered before that update, yet it is the bootstrap step the update needs. The
step is therefore split: a held request is *staged* at once (`take_held`, then `stage` for the ones the inference
side stored: its observation, reward and done complete unroll r without an action, and it counts as served), and
is answered at the opening, when the update on rollout r is published, with an action of the new parameters
(which the inference side then writes into the stored step). The gate opens when every actor's request is staged.
The rules above hold for staged requests too: a staged request whose run was superseded is answered stale
(`drop_superseded`); its unroll is complete, so the new run plays the next rollout. A staged request notified
again (a new serving process) is not staged twice.
"""

from __future__ import annotations

import logging
import time

import numpy as np

log = logging.getLogger(__name__)


class RolloutGate:
    """Args:
      actors: int64 [n], the actor indices this inference device serves (all must reach a sync point).
      num_actors: actor indices are in [0, num_actors).
      rollout_steps: T, agent steps per env per rollout.
      base_version: the policy version the inference network holds at start (the learner's train_steps).
      actors_per_batch: how many released requests are served per inference batch.
      wait_log_s: seconds an actor may wait at a sync point before the gate logs whom it waits for.
      wait_log_every_s: seconds between two such warnings of one sync point.
    """

    def __init__(self, actors: np.ndarray, num_actors: int, rollout_steps: int, base_version: int = 0,
                 actors_per_batch: int = 1 << 30, wait_log_s: float = 5.0, wait_log_every_s: float = 30.0,
                 lag: int = 1):
        if rollout_steps < 1:
            raise ValueError(f"sync_every: got {rollout_steps}, expected >= 1")
        if lag not in (0, 1):
            raise ValueError(f"sync_lag: got {lag!r}, expected 0 or 1")
        self.lag = lag
        self.actors = np.sort(np.asarray(actors, np.int64))
        self.rollout_steps = rollout_steps
        self.base_version = base_version
        self.actors_per_batch = max(1, actors_per_batch)
        self.rollout = 0  # the rollout being played
        self.steps = np.zeros(num_actors, np.int64)  # steps served to each actor's current run, in gate time
        self.run = np.zeros(num_actors, np.int64)  # the run the counts belong to; 0 = none yet
        self.owed = np.zeros(num_actors, np.int64)  # the first rollout whose unroll the actor index has not given
        self.held: dict[int, tuple[int, int]] = {}  # actor -> (seq, run) of its request at the sync point
        self.staged: dict[int, tuple[int, int]] = {}  # lag 0: actor -> (seq, run) of a held request stored, unanswered
        self.wait_log_s = wait_log_s
        self.wait_log_every_s = wait_log_every_s
        self._waiting_since: float | None = None  # when try_open first found an actor held at this sync point
        self._next_wait_log = 0.0

    @property
    def boundary(self) -> int:
        """The step count at which the next rollout starts (the sync point)."""
        return (self.rollout + 1) * self.rollout_steps

    @property
    def needed_version(self) -> int:
        """The policy version that rollout `rollout + 1` is played with: the update on rollout `rollout - lag`."""
        return self.base_version + self.rollout + 1 - self.lag

    def admit(self, actors: np.ndarray, seqs: np.ndarray, runs: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The requests that may be served now; those at the sync point are held. A request of a new run
        starts that run at the beginning of the rollout its actor index owes."""
        keep = np.ones(len(actors), bool)
        for i, (actor, seq, run) in enumerate(zip(actors.tolist(), seqs.tolist(), runs.tolist(), strict=True)):
            if run != self.run[actor]:
                self.run[actor] = run
                self.steps[actor] = self.owed[actor] * self.rollout_steps
                self.held.pop(actor, None)
            if self.staged.get(actor) == (seq, run):  # notified again (a new serving process): it waits already
                keep[i] = False
                continue
            if self.steps[actor] >= self.boundary:
                self.held[actor] = (seq, run)
                keep[i] = False
        return actors[keep], seqs[keep], runs[keep]

    def stepped(self, actors: np.ndarray) -> np.ndarray:
        """Counts one served step for each of `actors` (int64 [n], distinct). bool [n]: whose step was the
        bootstrap step that completed its unroll of the rollout it owed."""
        actors = np.asarray(actors, np.int64)
        completed = self.steps[actors] == (self.owed[actors] + 1) * self.rollout_steps
        self.owed[actors[completed]] += 1
        self.steps[actors] += 1
        return completed

    def start_over(self, actors: np.ndarray, completed: np.ndarray) -> None:
        """The unrolls in progress of `actors` were lost after their step was served (the inference side starts
        their rows afresh): each plays again from the start of the rollout it owes. `completed`: bool [n], what
        `stepped` returned for them (an unroll completed by the lost step is owed again)."""
        actors = np.asarray(actors, np.int64)
        self.owed[actors[np.asarray(completed, bool)]] -= 1
        self.steps[actors] = self.owed[actors] * self.rollout_steps

    def drop_superseded(self, live_run: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Removes the held (and staged) requests whose run is no longer its index's live run (`live_run`: int64
        [num_actors], the slab's run of each index's latest handshake), so that the sync point waits for the new
        run instead of counting them. Returns them as (actors, seqs) for the inference side to answer stale: the
        old run's stream holds the slot until then, so the new run could not send its first step."""
        actors, seqs = [], []
        for requests in (self.held, self.staged):
            gone = [a for a, (_, run) in requests.items() if run != live_run[a]]
            actors += gone
            seqs += [requests.pop(a)[0] for a in gone]
        return np.array(actors, np.int64), np.array(seqs, np.int64)

    def take_held(self) -> tuple[np.ndarray, np.ndarray]:
        """Lag 0: removes the held requests and returns them (actors, seqs), in actor order, for the inference
        side to store without an action; it calls `stage` with the ones it stored."""
        actors = np.array(sorted(self.held), np.int64)
        seqs = np.array([self.held.pop(a)[0] for a in actors.tolist()], np.int64)
        return actors, seqs

    def stage(self, actors: np.ndarray, seqs: np.ndarray, runs: np.ndarray) -> np.ndarray:
        """Lag 0: the requests (int64 [n] each) whose boundary steps were stored: they count as served (`stepped`)
        and wait to be answered at the opening. Returns `stepped`'s bool [n]."""
        for actor, seq, run in zip(actors.tolist(), seqs.tolist(), runs.tolist(), strict=True):
            self.staged[actor] = (seq, run)
        return self.stepped(actors)

    def try_open(self, published_version: int, live_run: np.ndarray | None = None, now: float | None = None
                 ) -> list[tuple[np.ndarray, np.ndarray]] | None:
        """If every actor is held (lag 0: staged) and `published_version` is the one the next rollout needs: moves
        to the next rollout and returns the held (staged) requests as batches of (actors, seqs), in actor order.
        Else None.

        Call `drop_superseded` first. `live_run` (int64 [num_actors]) and `now` (time.monotonic() seconds) are for
        the warning of a gate that waits: live runs tell a restarted actor from a missing one.
        """
        waiting = self.staged if self.lag == 0 else self.held
        if len(waiting) < len(self.actors) or published_version < self.needed_version:
            self._log_wait(published_version, live_run, time.monotonic() if now is None else now)
            return None
        if published_version > self.needed_version:
            raise RuntimeError(f"policy version: got {published_version} published at sync point {self.boundary}, "
                               f"expected {self.needed_version} (HTS lets the learner run {self.lag} update(s) "
                               "ahead only)")
        self.rollout += 1
        self._waiting_since = None
        actors = np.array(sorted(waiting), np.int64)
        seqs = np.array([waiting[a][0] for a in actors.tolist()], np.int64)
        waiting.clear()
        n = self.actors_per_batch
        return [(actors[i:i + n], seqs[i:i + n]) for i in range(0, len(actors), n)]

    def _log_wait(self, published_version: int, live_run: np.ndarray | None, now: float) -> None:
        """Warns (rate-limited) which actors, or which policy version, a sync point has waited for."""
        waiting = {**self.held, **self.staged}
        if not waiting:
            return
        if self._waiting_since is None:
            self._waiting_since, self._next_wait_log = now, now + self.wait_log_s
            return
        if now < self._next_wait_log:
            return
        self._next_wait_log = now + self.wait_log_every_s
        waited = now - self._waiting_since
        missing = [a for a in self.actors.tolist() if a not in waiting]
        if not missing:
            log.warning("HTS sync point %d (step %d) has waited %.1f s: every actor is at the sync point, waiting "
                        "for policy version %d (published: %d), the learner's update on rollout %d",
                        self.rollout + 1, self.boundary, waited, self.needed_version, published_version,
                        self.rollout - self.lag)
            return
        details = [self._whereabouts(a, live_run) for a in missing[:8]]
        if len(missing) > 8:
            details.append(f"and {len(missing) - 8} more")
        log.warning("HTS sync point %d (step %d) has waited %.1f s for actors %s: %s", self.rollout + 1,
                    self.boundary, waited, ", ".join(map(str, missing)), "; ".join(details))

    def _whereabouts(self, actor: int, live_run: np.ndarray | None) -> str:
        """Why `actor` is not at the sync point, in a few words."""
        live = int(self.run[actor]) if live_run is None else int(live_run[actor])
        if live == 0:
            return f"actor {actor} not connected"
        if live != self.run[actor]:
            return f"actor {actor} has a new run (handshake done, no step yet)"
        return f"actor {actor} at step {int(self.steps[actor])} of {self.boundary}"
