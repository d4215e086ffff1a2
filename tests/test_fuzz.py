"""The fuzzing client (seed/bench/fuzz.py) against a real learner while two honest actors train CartPole.

Measures the honest actors' FPS before, during and after >= 1000 hostile messages, and the learner's memory.
Every hostile message must get the expected gRPC error naming the field with got/expected; the honest actors'
FPS during the fuzz must stay >= 80% of the mean of the windows without it; the learner must stay up with
bounded memory and threads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from tests.conftest import REPO, read_metrics, serving_pid, wait_for

NUM_ACTORS, HONEST, K = 6, 2, 4
WINDOW_S = 12.0  # the quiet windows before and after the fuzz (which takes 20 s: 1000 messages at 50/s)


def _status(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM (KiB) and Threads of a process."""
    values = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM", "Threads"):
                values[key] = int(rest.split()[0])
    return values


def _rows(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip().endswith("}")]


def _fps(stats_files: list[str], start: float, end: float) -> float:
    """Env frames per second of all honest actors between two wall-clock times (from their stats rows)."""
    total = 0.0
    for path in stats_files:
        rows = _rows(path)
        before = [r for r in rows if r["time"] <= start]
        within = [r for r in rows if r["time"] <= end]
        first, last = before[-1], within[-1]
        assert last["time"] - first["time"] > 0.5 * (end - start), (path, first, last)
        total += (last["env_frames"] - first["env_frames"]) / (last["time"] - first["time"])
    return total


def test_fuzzer_gets_clear_errors_while_honest_actors_keep_their_fps(processes, tmp_path):
    logdir = str(tmp_path / "run")
    address = f"unix:{tmp_path}/l.sock"
    common = ["--env=gym:CartPole-v1", f"--envs_per_actor={K}"]
    learner = processes.learner([*common, f"--logdir={logdir}", f"--server_address={address}",
                                 f"--num_actors={NUM_ACTORS}", "--torch_threads=1", "--log_interval_s=1",
                                 "--checkpoint_interval_s=3600"])
    stats = [str(tmp_path / f"actor{i}.stats.jsonl") for i in range(HONEST)]
    actors = [processes.actor([*common, f"--server_address={address}", f"--actor_index={i}",
                               f"--stats_file={stats[i]}", "--stats_interval_s=0.5"], f"actor{i}")
              for i in range(HONEST)]
    wait_for(lambda: (rows := read_metrics(logdir)) and rows[-1]["train_steps"] >= 30, 90, "training to start",
             on_timeout=lambda: processes.output(learner))
    time.sleep(3)  # past the first episodes' warm-up

    t0 = time.time()
    time.sleep(WINDOW_S)
    t1 = time.time()
    serving = serving_pid(learner.pid)
    assert serving is not None, processes.output(learner)
    before, serving_before = _status(learner.pid), _status(serving)
    out = tmp_path / "fuzz.json"
    fuzz = subprocess.run([sys.executable, "-m", "seed.bench.fuzz", f"--server_address={address}",
                           "--env=gym:CartPole-v1", f"--envs_per_actor={K}", f"--num_actors={NUM_ACTORS}",
                           f"--first_actor_index={HONEST}", "--messages=1000", "--rate=50", "--seed=7",
                           f"--out={out}"], capture_output=True, text=True, timeout=180, cwd=REPO)
    t2 = time.time()
    during_fuzz = _status(learner.pid)
    time.sleep(WINDOW_S)
    t3 = time.time()
    after, serving_after = _status(learner.pid), _status(serving)

    report = json.loads(out.read_text())
    fps_before, fps_during, fps_after = _fps(stats, t0, t1), _fps(stats, t1, t2), _fps(stats, t2, t3)
    ratio = fps_during / ((fps_before + fps_after) / 2)
    figures = {"fps_before": round(fps_before), "fps_during": round(fps_during), "fps_after": round(fps_after),
               "ratio": round(ratio, 3), "fuzz_seconds": report["seconds"],
               "learner_rss_mib": [round(s["VmRSS"] / 1024) for s in (before, during_fuzz, after)],
               "learner_max_rss_mib": round(after["VmHWM"] / 1024),
               "learner_threads": [s["Threads"] for s in (before, during_fuzz, after)],
               "serving_rss_mib": [round(s["VmRSS"] / 1024) for s in (serving_before, serving_after)],
               "serving_max_rss_mib": round(serving_after["VmHWM"] / 1024)}
    print("fuzz figures:", json.dumps(figures))
    (tmp_path / "figures.json").write_text(json.dumps(figures))
    where = f"{json.dumps(figures)}\n{json.dumps(report)[:6000]}\n{fuzz.stdout[-2000:]}{fuzz.stderr[-3000:]}"

    # Every hostile message got the expected error naming the field, received and expected value.
    assert fuzz.returncode == 0, where
    assert report["hostile_messages"] >= 1000 and report["unexpected"] == 0, where
    categories = report["categories"]
    assert {"handshake.actor_index", "handshake.num_envs", "handshake.spec", "order.step_before_handshake",
            "order.empty_message", "order.second_handshake", "step.observation.shape", "step.observation.dtype",
            "step.observation.data", "step.reward.nonfinite", "step.done.bytes", "step.truncated.bytes",
            "protobuf.garbage", "oversize",
            "duplicate_actor_index", "handshake_deadline"} <= set(categories), where
    for name, entry in categories.items():
        assert entry["unexpected_count"] == 0, (name, entry)
        if name not in ("oversize", "duplicate_actor_index", "handshake_deadline", "order.step_before_handshake",
                        "order.empty_message", "order.second_handshake"):
            assert "got" in entry["example"] and "expected" in entry["example"], (name, entry)
    assert categories["oversize"]["codes"] == {"RESOURCE_EXHAUSTED": categories["oversize"]["count"]}
    assert report["load_streams"]["abandoned"] >= 40 and report["load_streams"]["never_read"] >= 10
    # Impossible finished-episode stats are rejected like every other field; no case is a known gap.
    assert categories["step.finished"]["codes"] == {"INVALID_ARGUMENT": categories["step.finished"]["count"]}, where
    assert not report["known_gaps"], where

    # The learner never crashed, the honest actors never lost their streams, and their FPS held.
    assert learner.poll() is None and all(a.poll() is None for a in actors), where
    for i, actor in enumerate(actors):
        assert processes.output(actor).count(f"[actor {i}] connected to") == 1, processes.output(actor)
    assert ratio >= 0.8, where
    # Memory stays bounded: no growth after the fuzz, an absolute ceiling, and server threads freed.
    assert after["VmRSS"] - before["VmRSS"] < 100 * 1024, where
    assert after["VmHWM"] < 2 * 1024 * 1024, where
    # The serving process (gRPC, where every hostile message lands) too; it was never restarted.
    assert serving_after["VmRSS"] - serving_before["VmRSS"] < 100 * 1024, where
    assert serving_after["VmHWM"] < 1024 * 1024, where
    assert "restarting it" not in processes.output(learner), where
    assert after["Threads"] <= before["Threads"] + 2 * NUM_ACTORS + 8, where
    rows = read_metrics(logdir)
    assert rows[-1]["train_steps"] > 30, where
