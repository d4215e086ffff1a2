"""The soak tool's namespace mode (launch/soak.py --hosts=netns, seed/bench/soak_netns.py) for a few seconds with
one fault of each kind: a partition, 1% loss, an actor host powered off, the learner's host killed and restarted.
Its report must show each fault healed with every actor back, the learner resumed from the newest checkpoint and
no learner crash besides the injected one."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from seed.bench.netns_hosts import REPO, why_no_namespaces
from seed.bench.soak_netns import KINDS, percentile


def test_percentile_interpolates_between_ranks():
    assert percentile([], 95) is None
    assert percentile([3.0], 95) == 3.0
    assert percentile([4.0, 1.0, 2.0, 3.0], 50) == 2.5  # sorted 1 2 3 4: halfway between ranks 1 and 2
    assert percentile([0.0, 10.0], 95) == 9.5


def test_soak_netns_one_fault_of_each_kind(tmp_path):
    reason = why_no_namespaces()
    if reason:
        pytest.skip(reason)
    out = tmp_path / "soak.json"
    command = [sys.executable, os.path.join(REPO, "launch", "soak.py"), "--hosts=netns", "--env=fake:vector",
               "--duration_s=100", "--max_faults=4", "--actor_hosts=2", "--actors_per_host=1", "--gap_s_min=0.5",
               "--gap_s_max=0.5", "--partition_s=2", "--loss_s=2", "--poweroff_s=1", "--learner_down_s=1",
               "--checkpoint_interval_s=2", "--back_timeout_s=40", f"--workdir={tmp_path / 'work'}", f"--out={out}"]
    soak = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
    try:
        log = soak.communicate(timeout=170)[0][-3000:]
    except subprocess.TimeoutExpired:
        soak.terminate()  # the soak tool removes its hosts on SIGTERM
        log = soak.communicate(timeout=90)[0][-3000:]
        pytest.fail(f"the soak did not finish within 170 s (a loaded machine?)\n{log}")
    if not out.exists():
        pytest.fail(f"no report; exit {soak.returncode}\n{log}")
    report = json.loads(out.read_text())
    assert [f["kind"] for f in report["faults"]] == list(KINDS), log
    assert report["learner_crashes"] == 0, report["learner_crash_details"]
    assert report["learner_restarts"] == 1 and report["checkpoints_lost"] == 0, log
    assert report["stopped_cleanly"], log
    for fault in report["faults"]:
        assert fault["healed_at_s"] >= fault["injected_at_s"] + fault["seconds"] - 0.5, fault
        # every actor stepped again after the heal (a short run's bounds are loose: the learner warms up)
        assert fault["recovery_s"] is not None and fault["recovery_s"] <= 40, fault
        assert set(fault["actors_back_s"]) == {"0", "1"}, fault
    learner = report["faults"][-1]
    assert learner["checkpoint_at_kill"] is not None, learner
    assert learner["resumed_from"]["train_steps"] >= learner["checkpoint_at_kill"]["train_steps"], learner
    poweroff = report["faults"][2]
    assert poweroff["actors"] == [poweroff["host"] - 2], poweroff  # one actor per host: the one on that host
    # The powered-off actor was started again: a second log for it; the other actor's process lived on.
    work = tmp_path / "work"
    assert (work / f"actor{poweroff['actors'][0]}.2.log").exists(), sorted(os.listdir(work))
    assert not (work / f"actor{1 - poweroff['actors'][0]}.2.log").exists(), sorted(os.listdir(work))
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"soak{soak.pid % 100000}-" not in left, left  # its hosts were removed
