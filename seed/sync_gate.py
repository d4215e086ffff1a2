"""HTS-RL's synchronisation point on the inference side (`--sync=hts`).

Every env plays rollouts of T = `--sync_every` steps. Rollout r is acted with the parameters of update r - 1
(rollout 0 and 1 with the initial ones) while the learner trains on rollout r - 1: a policy lag of exactly one
update. In this architecture the steps of an actor's K envs arrive together, so the gate counts steps per actor:

  * an actor whose request is the first step of the next rollout is held (its reply waits);
  * when every actor of this inference device is held and the learner has published the parameters the next
    rollout needs (version base + r for rollout r + 1, base being the version at start), the inference network
    takes exactly that version and the held requests are served, in actor order.

The step that opens rollout r + 1 is also the bootstrap step that completes unroll r (unroll length T + 1), so
the learner receives every env's unroll r at the same time, trains on it while rollout r + 1 is played, and
publishes version base + r + 1 before the next sync point can open. Publishing earlier is impossible (update
r + 1 needs unroll r); the gate checks it anyway.

A new actor run (first contact, restart) joins the rollout in progress with its step count at its start, so
its unroll ends at the same sync point as everyone's. A missing actor holds everyone: HTS is synchronous.
"""

from __future__ import annotations

import numpy as np


class RolloutGate:
    """Args:
      actors: int64 [n], the actor indices this inference device serves (all must reach a sync point).
      num_actors: actor indices are in [0, num_actors).
      rollout_steps: T, agent steps per env per rollout.
      base_version: the policy version the inference network holds at start (the learner's train_steps).
      actors_per_batch: how many released requests are served per inference batch.
    """

    def __init__(self, actors: np.ndarray, num_actors: int, rollout_steps: int, base_version: int = 0,
                 actors_per_batch: int = 1 << 30):
        if rollout_steps < 1:
            raise ValueError(f"sync_every: got {rollout_steps}, expected >= 1")
        self.actors = np.sort(np.asarray(actors, np.int64))
        self.rollout_steps = rollout_steps
        self.base_version = base_version
        self.actors_per_batch = max(1, actors_per_batch)
        self.rollout = 0  # the rollout being played
        self.steps = np.zeros(num_actors, np.int64)  # steps served to each actor's current run, in gate time
        self.run = np.zeros(num_actors, np.int64)  # the run the counts belong to; 0 = none yet
        self.held: dict[int, tuple[int, int]] = {}  # actor -> (seq, run) of its request at the sync point

    @property
    def boundary(self) -> int:
        """The step count at which the next rollout starts (the sync point)."""
        return (self.rollout + 1) * self.rollout_steps

    @property
    def needed_version(self) -> int:
        """The policy version that rollout `rollout + 1` is played with."""
        return self.base_version + self.rollout

    def admit(self, actors: np.ndarray, seqs: np.ndarray, runs: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The requests that may be served now; those at the sync point are held."""
        keep = np.ones(len(actors), bool)
        for i, (actor, seq, run) in enumerate(zip(actors.tolist(), seqs.tolist(), runs.tolist(), strict=True)):
            if run != self.run[actor]:
                self.run[actor] = run
                self.steps[actor] = self.rollout * self.rollout_steps
                self.held.pop(actor, None)
            if self.steps[actor] >= self.boundary:
                self.held[actor] = (seq, run)
                keep[i] = False
        return actors[keep], seqs[keep], runs[keep]

    def stepped(self, actors: np.ndarray) -> None:
        """Counts one served step for each of `actors`."""
        self.steps[actors] += 1

    def try_open(self, published_version: int) -> list[tuple[np.ndarray, np.ndarray]] | None:
        """If every actor is held and `published_version` is the one the next rollout needs: moves to the next
        rollout and returns the held requests as batches of (actors, seqs), in actor order. Else None."""
        if len(self.held) < len(self.actors):
            return None
        if published_version < self.needed_version:
            return None
        if published_version > self.needed_version:
            raise RuntimeError(f"policy version: got {published_version} published at sync point {self.boundary}, "
                               f"expected {self.needed_version} (HTS lets the learner run one update ahead only)")
        self.rollout += 1
        actors = np.array(sorted(self.held), np.int64)
        seqs = np.array([self.held[a][0] for a in actors.tolist()], np.int64)
        self.held.clear()
        n = self.actors_per_batch
        return [(actors[i:i + n], seqs[i:i + n]) for i in range(0, len(actors), n)]
