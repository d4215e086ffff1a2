"""--deterministic: real `launch/local.sh` runs (learner + actor processes over gRPC) of HTS PPO on CartPole
stop after a fixed number of updates (--max_train_steps); one seed gives the same parameters bit for bit, also
with another split of the envs into actor processes; another seed does not. The same with --sync_lag=0, whose
every rollout is trained with the parameters that played it."""

import os
import subprocess
import sys

import pytest
import torch

from seed.runtime import checkpoint
from tests.conftest import REPO, read_metrics

UPDATES = 4


def _run(tmp_path, name, seed, num_actors=2, envs_per_actor=2, sync_lag=1):
    logdir = str(tmp_path / name)
    args = ["--agent=ppo", "--env=gym:CartPole-v1", "--deterministic", f"--seed={seed}", f"--logdir={logdir}",
            f"--num_actors={num_actors}", f"--envs_per_actor={envs_per_actor}", "--sync_every=32",
            f"--max_train_steps={UPDATES}", "--torch_threads=1", "--log_interval_s=1", f"--sync_lag={sync_lag}"]
    result = subprocess.run([os.path.join(REPO, "launch", "local.sh"), *args], cwd=REPO, capture_output=True,
                            text=True, timeout=150, env=dict(os.environ, PYTHON=sys.executable, PYTHONUNBUFFERED="1"))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    _, state = checkpoint.latest(logdir)
    assert state["counters"]["train_steps"] == UPDATES, output[-3000:]
    rows = [row for row in read_metrics(logdir) if row.get("policy_lag_updates") is not None]
    lags = [row["policy_lag_updates"] for row in rows]
    if sync_lag == 1:  # the first rollout is trained with the parameters that played it, every later one an update on
        assert lags and 0 < max(lags) <= 1, lags
    else:  # every rollout with the parameters that played it: the importance ratios start at 1
        assert lags and max(lags) == 0, lags
        kls = [row["policy/behaviour_lag_kl"] for row in rows]
        assert max(abs(kl) for kl in kls) < 1e-6, kls
    return state["agent"]["network"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """`run(seed, ...)`: _run's parameters, each configuration run once for the module (both tests use seed 5 with
    sync lag 1 on 2 x 2 envs)."""
    done = {}

    def cached(seed, num_actors=2, envs_per_actor=2, sync_lag=1):
        key = (seed, num_actors, envs_per_actor, sync_lag)
        if key not in done:
            name = f"seed{seed}_{num_actors}x{envs_per_actor}_lag{sync_lag}"
            done[key] = _run(tmp_path_factory.mktemp(name), name, seed, num_actors, envs_per_actor, sync_lag)
        return done[key]

    return cached


def _identical(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_one_seed_gives_bit_identical_parameters_and_another_seed_does_not(run):
    first = run(seed=5)
    again = run(seed=5, num_actors=1, envs_per_actor=4)  # same envs, one actor process
    other = run(seed=6)
    assert _identical(first, again)
    assert not _identical(first, other)


def test_synchronous_ppo_is_bit_identical_across_actor_splits(run):
    first = run(seed=5, sync_lag=0)
    again = run(seed=5, num_actors=1, envs_per_actor=4, sync_lag=0)
    assert _identical(first, again)
    assert not _identical(first, run(seed=5))  # the same seed acting one update behind
