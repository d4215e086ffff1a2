"""Learning: the real launcher (learner + 2 actor processes) trains CartPole-v1 to a high mean return.

Slow tests (minutes each); CI runs them. They stop as soon as the target is reached.
"""

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO, read_metrics

pytestmark = pytest.mark.slow


def _train_until(tmp_path, args, target, timeout_s):
    logdir = str(tmp_path / "run")
    log_path = tmp_path / "local.log"
    with open(log_path, "wb") as log:
        launcher = subprocess.Popen([os.path.join(REPO, "launch", "local.sh"), f"--logdir={logdir}", *args],
                                    stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                                    env=dict(os.environ, PYTHON=sys.executable, PYTHONUNBUFFERED="1"))
    best, start = None, time.monotonic()
    try:
        while time.monotonic() - start < timeout_s and launcher.poll() is None:
            returns = [r["episode_return_mean"] for r in read_metrics(logdir) if r["episode_return_mean"] is not None]
            best = max(returns) if returns else None
            if best is not None and best >= target:
                break
            time.sleep(2)
    finally:
        launcher.send_signal(signal.SIGTERM)
        code = launcher.wait(timeout=60)
    output = log_path.read_text(errors="replace")
    assert best is not None and best >= target, f"best mean return {best} < {target}\n{output[-3000:]}"
    assert code == 0, output[-3000:]
    return time.monotonic() - start


def test_vtrace_learns_cartpole(tmp_path):
    elapsed = _train_until(tmp_path, ["--agent=vtrace", "--env=gym:CartPole-v1", "--seed=1"], 400, timeout_s=600)
    print(f"V-trace reached a mean return of 400 in {elapsed:.0f}s")


def test_r2d2_learns_cartpole(tmp_path):
    elapsed = _train_until(tmp_path, ["--agent=r2d2", "--env=gym:CartPole-v1", "--seed=1"], 400, timeout_s=900)
    print(f"R2D2 reached a mean return of 400 in {elapsed:.0f}s")
