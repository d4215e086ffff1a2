"""Slurm: launch/slurm/submit.sh's heterogeneous job on a real Slurm cluster (tests/slurm_lab.py: munged, slurmctld
and three slurmd on namespace hosts; node h1 has the feature `learner`, h2 and h3 `actor`).

* Bad submissions are refused before sbatch, naming what is missing.
* A job trains CartPole over TCP across the hosts; an actor node loses power mid-run: Slurm marks it down and
  requeues the job (the learner checkpoints on its SIGTERM), the node comes back, the job runs again and its
  learner resumes; the run reaches its end, the actors exit 0 on the learner's word and the job ends by itself.
* `scancel` mid-run: the learner checkpoints; a resubmitted job resumes from it.

Skips, saying why, without root, namespaces or Slurm (launch/install_test_tools.sh installs slurm-wlm and munge).
Everything started is removed afterwards, also on failure: jobs, daemons (by pid), namespaces, the directory.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

from seed.runtime import checkpoint
from tests.conftest import REPO, read_metrics, wait_for
from tests.namespace_lab import lab_on_namespace_hosts
from tests.slurm_lab import SlurmLab, why_no_slurm

pytestmark = pytest.mark.slow

SUBMIT = os.path.join(REPO, "launch", "slurm", "submit.sh")
TARGET_RETURN = 60.0  # CartPole's random policy averages about 22
# V-trace on CartPole, 2 actors x 8 envs: reaches the target within the frames on 2 shared cores.
ENV_FLAGS = "--env=gym:CartPole-v1\n--envs_per_actor=8\n"
LEARNER_FLAGS = ("--agent=vtrace\n--learning_rate=0.005\n--batch_size=16\n--unroll_length=20\n--torch_threads=1\n"
                 "--log_interval_s=1\n--checkpoint_interval_s=600\n--finished_linger_s=20\n"
                 "--total_environment_frames={frames}\n")
ACTOR_FLAGS = "--reconnect_max_backoff_s=2\n--log_interval_s=10\n"


@pytest.fixture(scope="module")
def lab():
    """The cluster, shared by this file's tests (starting it takes a few seconds); removed after them."""
    yield from lab_on_namespace_hosts(why_no_slurm, "slurm", SlurmLab, prefix="seed-slurm-")


def flags_dir(directory: str, frames: int) -> str:
    path = os.path.join(directory, "flags")
    os.makedirs(path, exist_ok=True)
    for name, text in (("env.flags", ENV_FLAGS), ("learner.flags", LEARNER_FLAGS.format(frames=frames)),
                       ("actor.flags", ACTOR_FLAGS)):
        with open(os.path.join(path, name), "w") as f:
            f.write(text)
    return path


def submit(lab: SlurmLab, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = lab.run([SUBMIT, f"--python={sys.executable}", "--actors_grace_s=30", *args], check=False)
    if check:
        assert result.returncode == 0, f"submit.sh failed: {result.stderr}"
    return result


def text(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def run_logs(lab: SlurmLab, logdir: str) -> str:
    parts = [f"--- {name}\n{text(os.path.join(logdir, name))[-3000:]}" for name in sorted(os.listdir(logdir))
             if name.endswith((".log", ".out"))] if os.path.isdir(logdir) else []
    return "\n".join(parts) + "\n" + lab.logs()


def train_steps(logdir: str) -> int:
    rows = read_metrics(logdir)
    return rows[-1]["train_steps"] if rows else 0


def best_return(logdir: str) -> float:
    returns = [r["episode_return_mean"] for r in read_metrics(logdir) if r.get("episode_return_mean") is not None]
    return max(returns, default=0.0)


def test_submissions_missing_a_part_are_refused_naming_it(lab, tmp_path):
    flags = flags_dir(str(tmp_path), 10_000)
    logdir = os.path.join(lab.directory, "refused")
    cases = {
        "no node has the feature 'gpu-learner'": ["--learner_constraint=gpu-learner"],
        "no actor nodes: no node has the feature 'gpu-actor'": ["--actor_constraint=gpu-actor"],
        "--actor_nodes: got 0, expected >= 1: a job with no actor nodes": ["--actor_nodes=0"],
        "--actor_nodes=3: got 2 node(s) with the feature 'actor', expected at least 3": ["--actor_nodes=3"],
        "--learner_gres=gpu:1: no node with the feature 'learner' has a 'gpu' GRES": ["--learner_gres=gpu:1"],
    }
    for expected, args in cases.items():
        result = submit(lab, f"--logdir={logdir}", f"--flags_dir={flags}", *args, check=False)
        assert result.returncode == 2 and expected in result.stderr, (args, result.stderr)
    assert not os.path.exists(logdir), "a refused submission must not touch the logdir"
    assert lab.run(["squeue", "-h"]).stdout.strip() == "", "a refused submission must not queue a job"


def test_job_trains_survives_a_lost_node_and_ends_by_itself(lab):
    logdir = os.path.join(lab.directory, "run1")
    frames = 200_000
    submitted = time.monotonic()
    job = submit(lab, f"--logdir={logdir}", f"--flags_dir={flags_dir(lab.directory + '/f1', frames)}",
                 "--actor_nodes=2", "--actors_per_node=1").stdout.strip().split(";")[0]
    logs = lambda: run_logs(lab, logdir)  # noqa: E731
    # The same logdir twice: the second learner is refused at submission.
    again = submit(lab, f"--logdir={logdir}", check=False)
    assert again.returncode == 2 and f"job(s) {job} already run it" in again.stderr, again.stderr

    wait_for(lambda: train_steps(logdir) > 0, 240, "the job's first training step", on_timeout=logs)
    placed_s = time.monotonic() - submitted
    learner_log = os.path.join(logdir, "learner.log")
    assert "actor 1 connected over grpc" in text(learner_log), logs()  # the actor on h3 dialled across the bridge

    lost_at = time.monotonic()
    lab.hosts.poweroff(3)  # node h3 loses power: its slurmd and its actor die at once
    wait_for(lambda: lab.job(job)["Restarts"] == "1", 120, "Slurm to requeue the job after h3 failed",
             on_timeout=logs)
    requeued_s = time.monotonic() - lost_at
    lab.start_slurmd(3)  # the node comes back
    wait_for(lambda: text(learner_log).count("resumed from") >= 1, 180, "the requeued job's learner to resume",
             on_timeout=logs)
    steps_at_resume = train_steps(logdir)
    wait_for(lambda: train_steps(logdir) > steps_at_resume, 120, "training after the requeue", on_timeout=logs)
    recovered_s = time.monotonic() - lost_at
    resumed = re.search(r"resumed from \S+: env_frames=([\d,]+)", text(learner_log))
    assert int(resumed.group(1).replace(",", "")) > 0, logs()

    wait_for(lambda: lab.job(job)["JobState"] in ("COMPLETED", "FAILED", "CANCELLED"), 400,
             "the job to end by itself", interval_s=1, on_timeout=logs)
    ended_s = time.monotonic() - submitted
    state = lab.job(job)
    assert (state["JobState"], state["ExitCode"]) == ("COMPLETED", "0:0"), (state, logs())
    actors = text(os.path.join(logdir, "actors.log"))
    assert len(re.findall(r"run finished: .*; exiting", actors)) == 2, logs()  # both actors heard the end
    assert "stopping step" not in text(os.path.join(logdir, f"slurm-{job}.out")), logs()
    assert read_metrics(logdir)[-1]["env_frames"] >= frames
    assert best_return(logdir) >= TARGET_RETURN, logs()
    print(f"slurm: placed and training {placed_s:.1f}s after submission; h3 lost: job requeued after "
          f"{requeued_s:.1f}s, training again {recovered_s:.1f}s after the loss (node back at once); "
          f"job ended {ended_s:.0f}s after submission")


def test_cancel_checkpoints_and_a_resubmitted_job_resumes(lab):
    logdir = os.path.join(lab.directory, "run2")
    flags = flags_dir(lab.directory + "/f2", 10_000_000)
    job = submit(lab, f"--logdir={logdir}", f"--flags_dir={flags}", "--actor_nodes=2", "--actors_per_node=1"
                 ).stdout.strip().split(";")[0]
    logs = lambda: run_logs(lab, logdir)  # noqa: E731
    wait_for(lambda: train_steps(logdir) >= 5, 240, "training", on_timeout=logs)
    lab.run(["scancel", job])
    wait_for(lambda: lab.job(job)["JobState"] == "CANCELLED" and not lab.run(["squeue", "-h"]).stdout.strip(),
             120, "the cancelled job to end", on_timeout=logs)
    learner_log = text(os.path.join(logdir, "learner.log"))
    # SIGTERM from scancel: the learner stopped in order and wrote its checkpoint (not a finished run).
    assert "[learner] done:" in learner_log and "run finished" not in learner_log, logs()
    saved = checkpoint.latest(logdir)
    assert saved is not None, logs()
    frames_saved = saved[1]["counters"]["env_frames"]
    steps_saved = train_steps(logdir)

    submitted = time.monotonic()
    again = submit(lab, f"--logdir={logdir}", "--actor_nodes=2", "--actors_per_node=1").stdout.strip().split(";")[0]
    wait_for(lambda: "resumed from" in text(os.path.join(logdir, "learner.log")), 180,
             "the resubmitted job's learner to resume", on_timeout=logs)
    resumed = re.search(r"resumed from \S+: env_frames=([\d,]+)", text(os.path.join(logdir, "learner.log")))
    assert int(resumed.group(1).replace(",", "")) == frames_saved > 0, logs()
    wait_for(lambda: train_steps(logdir) > steps_saved, 120, "training after the resume", on_timeout=logs)
    resumed_s = time.monotonic() - submitted
    lab.run(["scancel", again])
    print(f"slurm: a resubmitted job resumed and trained {resumed_s:.1f}s after submission")
