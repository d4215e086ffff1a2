"""`launch/soak.py --hosts=netns`: a learner and actor hosts in network namespaces under the faults only a network
has, injected at random times, with the recovery from each measured.

Host 1 runs the learner (TCP with a token); hosts 2..1+--actor_hosts each run --actors_per_host actors
(seed/bench/netns_hosts.py over launch/netns.sh). After a random gap (--gap_s_min..--gap_s_max) it injects the
next fault of a shuffled round of --kinds, and the next round when that one is done:

  partition  one random host (the learner's cuts every actor off) is cut for --partition_s, alternately by
             pulling its cable at the switch ("link") and by dropping every packet of its link ("drop", nftables),
             then restored
  loss       --loss_percent % of packets dropped each way on a random host's link for --loss_s, then none
  poweroff   every process of a random actor host SIGKILLed at once; after --poweroff_s its actors start again
  learner    the learner's host powered off; after --learner_down_s the learner starts again on its logdir and
             resumes from its newest checkpoint

Per fault it records when it was injected, when it was healed (link restored, loss off, processes started again),
when every actor was back (its first progress line after the heal; actors log one every
--actor_log_interval_s while their steps go through) and so the recovery (back - healed, s); the learner's
env frames/s before and during the fault; for the learner fault, the newest checkpoint on disk at the power cut
and the one the new learner resumed from (a checkpoint is lost if the resume is older). Learner and actor exits
that were not injected are counted as crashes (and restarted). The report (--out) gives per-kind recovery
p50/p95/max and checks the targets: no learner crash besides the injected ones, recovery p95 <= 5 s after a link
or actor host returns, <= 30 s after a learner restart, no checkpoint lost. The process exits 1 if one is missed.

    nohup nice -n 10 python launch/soak.py --hosts=netns --duration_s=1800 \\
        --out=docs/reliability/soak-netns-1800s.json &
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import re
import signal
import sys
import tempfile
import time
from typing import Any

from absl import app, flags

from seed.bench.netns_hosts import NetnsHosts, why_no_namespaces

PORT = 8686
TOKEN = "seed-soak-netns-token-0123456789"
KINDS = ("partition", "loss", "poweroff", "learner")
ENV_FLAGS = {"fake:vector": {"fake_episode_length": 20}}  # per env, given to the learner and the actors
PROGRESS = "env_frames/s="  # the actor's progress line (seed/actor/loop.py), printed only while steps go through
RESUMED = re.compile(r"resumed from (\S+): env_frames=([\d,]+) train_steps=([\d,]+)")
TARGETS_S = {"partition": 5.0, "loss": 5.0, "poweroff": 5.0, "learner": 30.0}  # recovery p95 bounds


@dataclasses.dataclass
class NetnsSoakOptions:
    duration_s: float = 1800.0
    env: str = "gym:CartPole-v1"
    kinds: str = ",".join(KINDS)
    max_faults: int = 0  # stop after this many faults (0: until --duration_s)
    actor_hosts: int = 2
    actors_per_host: int = 2
    envs_per_actor: int = 4
    seed: int = 0
    gap_s_min: float = 10.0
    gap_s_max: float = 40.0
    partition_s: float = 20.0
    loss_s: float = 120.0
    loss_percent: float = 1.0
    poweroff_s: float = 5.0
    learner_down_s: float = 2.0
    back_timeout_s: float = 90.0
    checkpoint_interval_s: float = 10.0
    log_interval_s: float = 1.0
    actor_log_interval_s: float = 0.5


class LogTail:
    """Reads a growing log file; remembers when a progress line was last seen (monotonic s)."""

    def __init__(self, path: str):
        self.path, self.offset, self.text = path, 0, ""
        self.last_progress_at = -1.0

    def poll(self, now: float) -> None:
        if not os.path.exists(self.path):
            return
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        complete = data[:data.rfind(b"\n") + 1]
        self.offset += len(complete)
        text = complete.decode(errors="replace")
        self.text += text
        if PROGRESS in text:
            self.last_progress_at = now


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0..100) by linear interpolation, or None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return round(ordered[low] + (ordered[high] - ordered[low]) * (position - low), 2)


class NetnsSoak:
    """The hosts, the learner and actors on them, the faults injected and what was measured."""

    def __init__(self, options: NetnsSoakOptions, directory: str):
        kinds = [k.strip() for k in options.kinds.split(",") if k.strip()]
        unknown = [k for k in kinds if k not in KINDS]
        if unknown or not kinds:
            raise ValueError(f"--kinds: got {options.kinds!r}, expected a comma-separated subset of {KINDS}")
        if options.actor_hosts < 1 or options.actors_per_host < 1:
            raise ValueError(f"--actor_hosts, --actors_per_host: got {options.actor_hosts}, "
                             f"{options.actors_per_host}, expected >= 1 each")
        self.options, self.kinds, self.directory = options, kinds, directory
        self.rng = random.Random(options.seed)
        # The whole pid: a name no other live soak has (its create first destroys any run of that name).
        self.hosts = NetnsHosts(f"soak{os.getpid()}", 1 + options.actor_hosts, directory)
        self.logdir = os.path.join(directory, "logdir")
        self.token_file = os.path.join(directory, "token")
        self.num_actors = options.actor_hosts * options.actors_per_host
        self.learner = None
        self.learner_number = 0
        self.learner_tail: LogTail | None = None
        self.learner_crashes: list[str] = []
        self.actors: dict[int, Any] = {}
        self.actor_starts: dict[int, int] = {}
        self.actor_tails: dict[int, LogTail] = {}
        self.actor_crashes: list[str] = []
        self.expected_down: set[int] = set()  # actors killed by an injected fault, not yet restarted
        self.learner_down = False
        self.fps: list[tuple[float, float]] = []  # (s since start, learner's env frames/s)
        self.train_steps = 0  # the learner's, from its newest metrics row
        self._metrics_offset = 0
        self.faults: list[dict[str, Any]] = []
        self.partition_modes = ["link", "drop"]
        self._start = time.monotonic()

    # ---------------------------------------------------------------------------------------- processes

    def now(self) -> float:
        return time.monotonic() - self._start

    def host_of(self, actor: int) -> int:
        return 2 + actor // self.options.actors_per_host

    def _env_flags(self) -> list[str]:
        extra = ENV_FLAGS.get(self.options.env, {})
        return [f"--env={self.options.env}", f"--envs_per_actor={self.options.envs_per_actor}",
                f"--auth_token_file={self.token_file}", *[f"--{k}={v}" for k, v in extra.items()]]

    def start_learner(self) -> None:
        o = self.options
        self.learner_number += 1
        name = f"learner.{self.learner_number}"
        self.learner = self.hosts.run_on(1, [
            sys.executable, "-m", "seed.learner.main", *self._env_flags(), "--agent=vtrace",
            f"--logdir={self.logdir}", f"--server_address=0.0.0.0:{PORT}", f"--num_actors={self.num_actors}",
            f"--checkpoint_interval_s={o.checkpoint_interval_s}", f"--log_interval_s={o.log_interval_s}",
            "--total_environment_frames=1e12", "--torch_threads=1", f"--seed={o.seed}"], name)
        self.learner_tail = LogTail(self.learner.log_path)
        self.learner_down = False

    def start_actor(self, index: int) -> None:
        self.actor_starts[index] = self.actor_starts.get(index, 0) + 1
        process = self.hosts.run_on(self.host_of(index), [
            sys.executable, "-m", "seed.actor.main", *self._env_flags(), f"--actor_index={index}",
            f"--server_address={self.hosts.addr(1)}:{PORT}", "--reconnect_max_backoff_s=1",
            f"--log_interval_s={self.options.actor_log_interval_s}", f"--seed={self.options.seed}"],
            f"actor{index}.{self.actor_starts[index]}")
        self.actors[index] = process
        self.actor_tails[index] = LogTail(process.log_path)
        self.expected_down.discard(index)

    def poll(self) -> None:
        """Reads new log lines and metrics; counts and restarts processes that exited by themselves."""
        now = time.monotonic()
        for tail in self.actor_tails.values():
            tail.poll(now)
        if self.learner_tail is not None:
            self.learner_tail.poll(now)
        self._read_metrics()
        if not self.learner_down and self.learner.poll() is not None:
            self.learner_crashes.append(f"learner {self.learner_number} exited with {self.learner.returncode} at "
                                        f"{self.now():.1f}s")
            self.start_learner()
        for index, actor in list(self.actors.items()):
            if index not in self.expected_down and actor.poll() is not None:
                self.actor_crashes.append(f"actor {index} exited with {actor.returncode} at {self.now():.1f}s")
                self.start_actor(index)

    def _read_metrics(self) -> None:
        path = os.path.join(self.logdir, "metrics.jsonl")
        if not os.path.exists(path):
            return
        with open(path, "rb") as f:
            f.seek(self._metrics_offset)
            data = f.read()
        complete = data[:data.rfind(b"\n") + 1]
        self._metrics_offset += len(complete)
        for line in complete.decode(errors="replace").splitlines():
            try:
                row = json.loads(line)
                self.fps.append((self.now(), float(row["env_frames_per_sec"])))
                self.train_steps = int(row["train_steps"])
            except (json.JSONDecodeError, KeyError, ValueError):
                continue

    def mean_fps(self, start_s: float, end_s: float) -> float | None:
        values = [fps for t, fps in self.fps if start_s <= t < end_s]
        return round(sum(values) / len(values), 1) if values else None

    def wait(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.poll()
            time.sleep(0.1)

    def wait_all_back(self, since: float) -> dict[int, float | None]:
        """Seconds from `since` (monotonic) until each actor's first progress line after it (None: not within
        --back_timeout_s)."""
        back: dict[int, float | None] = {}
        deadline = since + self.options.back_timeout_s
        while len(back) < self.num_actors and time.monotonic() < deadline:
            self.poll()
            for index, tail in self.actor_tails.items():
                if index not in back and tail.last_progress_at > since:
                    back[index] = round(tail.last_progress_at - since, 2)
            time.sleep(0.1)
        return {i: back.get(i) for i in range(self.num_actors)}

    # -------------------------------------------------------------------------------------------- faults

    def inject(self, kind: str) -> dict[str, Any]:
        """Injects one fault, heals it, waits for every actor; returns its record."""
        o = self.options
        fault: dict[str, Any] = {"kind": kind, "injected_at_s": round(self.now(), 2),
                                 "load_average_1min": round(os.getloadavg()[0], 1)}  # other work on the machine
        fps_from = self.now()
        if kind == "partition":
            host = self.rng.randint(1, 1 + o.actor_hosts)
            mode = self.partition_modes[sum(f["kind"] == "partition" for f in self.faults) % 2]
            fault.update(host=host, mode=mode, seconds=o.partition_s)
            cut, restore = ((lambda: self.hosts.link(host, "down")), (lambda: self.hosts.link(host, "up"))) \
                if mode == "link" else ((lambda: self.hosts.loss(host, 100)), (lambda: self.hosts.loss(host, 0)))
            cut()
            self.wait(o.partition_s)
            restore()
        elif kind == "loss":
            host = self.rng.randint(1, 1 + o.actor_hosts)
            fault.update(host=host, percent=o.loss_percent, seconds=o.loss_s)
            self.hosts.loss(host, o.loss_percent)
            self.wait(o.loss_s)
            self.hosts.loss(host, 0)
        elif kind == "poweroff":
            host = self.rng.randint(2, 1 + o.actor_hosts)
            killed = [i for i in range(self.num_actors) if self.host_of(i) == host]
            fault.update(host=host, actors=killed, seconds=o.poweroff_s)
            self.expected_down.update(killed)
            self.hosts.poweroff(host)
            self.wait(o.poweroff_s)
            for index in killed:
                self.start_actor(index)
        else:  # learner
            fault.update(host=1, seconds=o.learner_down_s)
            self.learner_down = True
            self.hosts.poweroff(1)
            fault["checkpoint_at_kill"] = self._newest_checkpoint()
            self.wait(o.learner_down_s)
            self.start_learner()
        healed = time.monotonic()
        fault["healed_at_s"] = round(self.now(), 2)
        fault["fps_before"] = self.mean_fps(fps_from - 20, fps_from)
        fault["fps_during"] = self.mean_fps(fps_from, self.now())
        back = self.wait_all_back(healed)
        fault["actors_back_s"] = back
        fault["recovery_s"] = None if None in back.values() else max(back.values())
        if fault["recovery_s"] is not None:
            fault["all_back_at_s"] = round(fault["healed_at_s"] + fault["recovery_s"], 2)
        if kind == "learner":
            fault.update(self._resume_record(fault["checkpoint_at_kill"]))
        print(f"[soak-netns] {self.now():7.1f}s {kind} {json.dumps({k: v for k, v in fault.items() if k != 'kind'})}",
              flush=True)
        return fault

    def _newest_checkpoint(self) -> dict[str, Any] | None:
        # torch: imported by run() before the first fault, not while a learner is down
        from seed.runtime import checkpoint

        latest = checkpoint.latest(self.logdir)
        if latest is None:
            return None
        path, state = latest
        return {"path": os.path.basename(path), "train_steps": int(state["counters"]["train_steps"]),
                "env_frames": int(state["counters"]["env_frames"])}

    def _resume_record(self, saved: dict[str, Any] | None) -> dict[str, Any]:
        """The checkpoint the new learner resumed from against the newest one on disk at the power cut."""
        deadline = time.monotonic() + self.options.back_timeout_s
        match = RESUMED.search(self.learner_tail.text)
        while match is None and time.monotonic() < deadline and self.learner.poll() is None:
            self.wait(0.5)
            match = RESUMED.search(self.learner_tail.text)
        if match is None:  # not resumed within --back_timeout_s: whether a checkpoint was lost is not known
            return {"resumed_from": None, "checkpoint_lost": None}
        resumed = {"path": os.path.basename(match.group(1)), "train_steps": int(match.group(3).replace(",", "")),
                   "env_frames": int(match.group(2).replace(",", ""))}
        lost = saved is not None and resumed["train_steps"] < saved["train_steps"]
        return {"resumed_from": resumed, "checkpoint_lost": lost}

    # ----------------------------------------------------------------------------------------------- run

    def run(self) -> dict[str, Any]:
        o = self.options
        os.makedirs(self.directory, exist_ok=True)
        with open(self.token_file, "w") as f:
            f.write(TOKEN + "\n")
        import seed.runtime.checkpoint  # noqa: F401 - torch's import (seconds on a busy machine) kept out of the learner fault

        try:  # the hosts are removed from their first namespace on (a SIGKILL: by NetnsHosts's reaper)
            self.hosts.create()
            self._start = time.monotonic()
            self.start_learner()
            for index in range(self.num_actors):
                self.start_actor(index)
            first = self.wait_all_back(time.monotonic())
            # The first training step (and its warm-up) stalls every actor for seconds: faults start after it.
            deadline = time.monotonic() + o.back_timeout_s
            while self.train_steps == 0 and time.monotonic() < deadline:
                self.wait(0.2)
            startup = {"actors_first_progress_s": first, "first_train_steps_at_s": round(self.now(), 2)}
            print(f"[soak-netns] started: {startup}", flush=True)
            plan: list[str] = []
            while self.now() < o.duration_s and (o.max_faults == 0 or len(self.faults) < o.max_faults):
                if not plan:
                    plan = self.kinds[:]
                    self.rng.shuffle(plan)
                    if o.max_faults:  # a short run: one of each kind, in the order given
                        plan = self.kinds[:]
                gap = self.rng.uniform(o.gap_s_min, o.gap_s_max)
                if self.now() + gap + self._expected_s(plan[0]) > o.duration_s:
                    break
                self.wait(gap)
                self.faults.append(self.inject(plan.pop(0)))
            self.wait(max(0.0, o.duration_s - self.now()) if o.max_faults == 0 else 0.0)
            stopped_cleanly = self._stop()
        finally:
            self.hosts.destroy()
        return self.report(startup, stopped_cleanly)

    def _expected_s(self, kind: str) -> float:
        """About how long a fault of `kind` takes, heal and recovery included (whether one more fits)."""
        o = self.options
        return {"partition": o.partition_s + 10, "loss": o.loss_s + 10, "poweroff": o.poweroff_s + 20,
                "learner": o.learner_down_s + 40}[kind]

    def _stop(self) -> bool:
        """SIGTERMs the learner (it writes its last checkpoint) and the actors; True if the learner exited 0."""
        self.learner_down = True
        self.expected_down.update(self.actors)
        self.hosts.stop_all(timeout_s=60)
        return self.learner.returncode == 0

    def report(self, startup: dict[str, Any], stopped_cleanly: bool) -> dict[str, Any]:
        by_kind: dict[str, Any] = {}
        for kind in self.kinds:
            faults = [f for f in self.faults if f["kind"] == kind]
            recoveries = [f["recovery_s"] for f in faults if f["recovery_s"] is not None]
            by_kind[kind] = {"count": len(faults), "not_recovered": len(faults) - len(recoveries),
                             "recovery_s_p50": percentile(recoveries, 50), "recovery_s_p95": percentile(recoveries, 95),
                             "recovery_s_max": max(recoveries, default=None), "target_p95_s": TARGETS_S[kind]}
        learner_faults = [f for f in self.faults if f["kind"] == "learner"]
        report = {
            "options": dataclasses.asdict(self.options), "cpu_cores": os.cpu_count(), "workdir": self.directory,
            "hosts": {"learner": self.hosts.addr(1),
                      "actors": {i: self.hosts.addr(self.host_of(i)) for i in range(self.num_actors)}},
            "startup": startup, "faults_injected": len(self.faults), "by_kind": by_kind,
            "learner_crashes": len(self.learner_crashes), "learner_crash_details": self.learner_crashes,
            "actor_crashes": len(self.actor_crashes), "actor_crash_details": self.actor_crashes,
            "checkpoints_lost": sum(f.get("checkpoint_lost") is True for f in learner_faults),
            "learner_resumes_not_seen": sum(f.get("checkpoint_lost") is None for f in learner_faults),
            "learner_restarts": len(learner_faults), "stopped_cleanly": stopped_cleanly,
            "mean_fps": self.mean_fps(0, float("inf")), "faults": self.faults,
            "load_average_1min_at_end": round(os.getloadavg()[0], 1),
        }
        report["problems"] = check(report)
        report["passed"] = not report["problems"]
        return report


def check(report: dict[str, Any]) -> list[str]:
    """The figures that miss their target, as sentences naming the figure, got and expected."""
    problems = []
    if report["learner_crashes"]:
        problems.append(f"learner_crashes: got {report['learner_crashes']} ({report['learner_crash_details']}), "
                        "expected 0 besides the injected ones")
    if report["checkpoints_lost"]:
        problems.append(f"checkpoints_lost: got {report['checkpoints_lost']}, expected 0")
    if report["learner_resumes_not_seen"]:
        problems.append(f"learner restarts without a resume within --back_timeout_s: got "
                        f"{report['learner_resumes_not_seen']}, expected 0")
    if not report["stopped_cleanly"]:
        problems.append("stopped_cleanly: got a learner exit other than 0 on SIGTERM at the end, expected 0")
    for kind, figures in report["by_kind"].items():
        if figures["not_recovered"]:
            problems.append(f"{kind}: {figures['not_recovered']} of {figures['count']} faults without every actor "
                            "back within --back_timeout_s, expected none")
        p95 = figures["recovery_s_p95"]
        if p95 is not None and p95 > figures["target_p95_s"]:
            problems.append(f"{kind}: recovery p95: got {p95} s, expected <= {figures['target_p95_s']} s")
    return problems


FLAGS = flags.FLAGS


def define_flags() -> None:
    flags.DEFINE_enum("hosts", "netns", ["netns"], "netns: learner and actors on hosts in network namespaces.")
    for f in dataclasses.fields(NetnsSoakOptions):
        if f.type in ("str", str):
            flags.DEFINE_string(f.name, f.default, f"see seed/bench/soak_netns.py ({f.name})")
        elif f.type in ("int", int):
            flags.DEFINE_integer(f.name, f.default, f"see seed/bench/soak_netns.py ({f.name})")
        else:
            flags.DEFINE_float(f.name, f.default, f"see seed/bench/soak_netns.py ({f.name})")
    flags.DEFINE_string("workdir", "", "Where logs and the logdir go; default a new temporary directory.")
    flags.DEFINE_string("out", "soak-netns.json", "The JSON report.")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    reason = why_no_namespaces()
    if reason:
        print(f"soak --hosts=netns: {reason}", file=sys.stderr)
        sys.exit(2)
    options = NetnsSoakOptions(**{f.name: FLAGS[f.name].value for f in dataclasses.fields(NetnsSoakOptions)})
    workdir = os.path.abspath(FLAGS.workdir or tempfile.mkdtemp(prefix="seed-soak-netns-"))
    try:
        soak = NetnsSoak(options, workdir)
    except ValueError as error:
        print(f"soak --hosts=netns: {error}", file=sys.stderr)
        sys.exit(2)
    # SIGTERM (a test's timeout, a CI job cancelled) ends the run through run()'s `finally`: no host left behind
    # (after a SIGKILL, NetnsHosts's reaper removes them: tests/test_netns_cleanup.py).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(f"soak --hosts=netns: SIGTERM (signal {signum})"))
    report = soak.run()
    os.makedirs(os.path.dirname(os.path.abspath(FLAGS.out)), exist_ok=True)
    with open(FLAGS.out, "w") as f:
        json.dump(report, f, indent=1)
    for kind, figures in report["by_kind"].items():
        print(f"[soak-netns] {kind}: {figures}", flush=True)
    print(f"[soak-netns] learner_crashes={report['learner_crashes']} actor_crashes={report['actor_crashes']} "
          f"checkpoints_lost={report['checkpoints_lost']} "
          f"{'passed' if report['passed'] else 'FAILED: ' + '; '.join(report['problems'])} -> {FLAGS.out}", flush=True)
    sys.exit(0 if report["passed"] else 1)


def run() -> None:
    define_flags()
    app.run(main)


if __name__ == "__main__":
    run()
