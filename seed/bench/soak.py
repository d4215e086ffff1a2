"""`python -m seed.bench.soak`: V-trace runs under repeated faults, measured.

For every env in --envs (default CartPole and fake:atari, run concurrently) it starts a real learner and
--num_actors actor processes, then, on a schedule drawn from --seed:

  every --kill_every_s   SIGKILL one random actor (restarted after --actor_restart_delay_s, as a replacement
                         pod would be) and SIGSTOP another one for --stop_s seconds, then SIGCONT;
  once, mid-run          SIGKILL the learner (in place of that slot's actor faults) and restart it on its logdir;
  once, the slot after   the restarted learner's experience sink raises (the test-only hook
                         SEED_FAULT_SINK_RAISE_AFTER_S, seed/runtime/supervised_thread.py): the learner must exit
                         non-zero
                         with the traceback in its log within seconds; the soak then restarts it at once on its
                         logdir, as launch/local.sh does with a learner that exits non-zero.

It writes a JSON report (--out) per env: learner crashes besides the injected kill, seconds until the learner's
env_frames_per_sec is back to 80% of its pre-fault level after each fault, frames and train steps lost across
the learner restart (bounded by one --checkpoint_interval_s), actors reconnected, and whether the episode
return improved; for the sink fault, how long the learner took to exit and whether it resumed. The process exits 1
if a figure misses its bound.

    python -m seed.bench.soak --duration_s=600 --out=docs/reliability/soak-600s.json
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from absl import app, flags

from seed.bench import soak_analysis as analysis
from seed.runtime.supervised_thread import SINK_FAULT_ENV

ENV_FLAGS = {  # per env: learner and actor flags light enough for a 2-core machine
    "gym:CartPole-v1": {"torch_threads": 1},
    "fake:atari": {"torch_threads": 1, "network": "nature", "batch_size": 8, "use_lstm": False, "learning_rate": 1e-3},
}
SINK_EXIT_BOUND_S = 20.0  # a learner whose sink died must be gone this soon (stop, checkpoint, exit), as on SIGTERM
RESUMED = re.compile(r"resumed from .*: env_frames=([\d,]+) train_steps=([\d,]+)")


@dataclasses.dataclass
class SoakOptions:
    duration_s: float = 600.0
    kill_every_s: float = 30.0
    stop_s: float = 20.0
    num_actors: int = 4
    envs_per_actor: int = 4
    seed: int = 0
    checkpoint_interval_s: float = 10.0
    log_interval_s: float = 2.0
    actor_restart_delay_s: float = 1.0
    recovery_fraction: float = 0.8


@dataclasses.dataclass
class Fault:
    t_s: float
    kind: str  # "actors" (one SIGKILL + one SIGSTOP), "learner" (SIGKILL) or "sink" (the sink raises)
    killed: int = -1
    stopped: int = -1


def plan_faults(options: SoakOptions, rng: random.Random) -> list[Fault]:
    """Fault slots every kill_every_s, leaving one slot at the end for the last recovery; the middle slot
    kills the learner instead of actors, and the slot after it (if there is one) makes the sink raise."""
    slots = [k * options.kill_every_s for k in range(1, int(options.duration_s // options.kill_every_s))]
    if not slots:
        raise ValueError(f"--duration_s: got {options.duration_s}, expected at least 2 x --kill_every_s "
                         f"({2 * options.kill_every_s})")
    learner_slot = len(slots) // 2
    faults = []
    for i, t in enumerate(slots):
        if i == learner_slot:
            faults.append(Fault(t, "learner"))
        elif i == learner_slot + 1:
            faults.append(Fault(t, "sink"))
        else:
            killed, stopped = rng.sample(range(options.num_actors), 2)
            faults.append(Fault(t, "actors", killed, stopped))
    return faults


class SoakRun:
    """One env's learner and actors, the faults injected into them and the samples read from them."""

    def __init__(self, env: str, options: SoakOptions, directory: str, rng: random.Random):
        self.env = env
        self.options = options
        self.directory = directory
        self.logdir = os.path.join(directory, "logdir")
        self.address = f"unix:{tempfile.mkdtemp(prefix='soak-')}/learner.sock"  # short path: unix socket limit
        self.faults = plan_faults(options, rng)
        self.extra = ENV_FLAGS.get(env, {"torch_threads": 1})
        self.learner: subprocess.Popen | None = None
        self.learner_number = 0
        self.learner_expected_exit = False
        self.learner_crashes: list[str] = []
        self.actors: dict[int, subprocess.Popen] = {}
        self.actor_expected_exit: set[int] = set()
        self.actor_crashes: list[str] = []
        self.samples: list[analysis.Sample] = []
        self.events: list[dict[str, Any]] = []
        self.restart: dict[str, Any] = {}
        self.sink_fault: dict[str, Any] = {}
        self._metrics_offset = 0
        self._start = time.monotonic()

    # ----------------------------------------------------------------------------------------- processes

    def now(self) -> float:
        return time.monotonic() - self._start

    def _spawn(self, args: list[str], log_name: str, environment: dict[str, str] | None = None
               ) -> subprocess.Popen:
        log = open(os.path.join(self.directory, log_name), "ab")
        env = {k: v for k, v in os.environ.items() if k != SINK_FAULT_ENV}
        return subprocess.Popen([sys.executable, *args], stdout=log, stderr=subprocess.STDOUT,
                                env=dict(env, PYTHONUNBUFFERED="1", **(environment or {})))

    def _env_flags(self) -> list[str]:
        return [f"--env={self.env}", f"--envs_per_actor={self.options.envs_per_actor}", f"--seed={self.options.seed}"]

    def start_learner(self, environment: dict[str, str] | None = None) -> None:
        self.learner_number += 1
        extra = [f"--{k}={v}" for k, v in self.extra.items()]
        self.learner = self._spawn(
            ["-m", "seed.learner.main", *self._env_flags(), "--agent=vtrace", f"--logdir={self.logdir}",
             f"--server_address={self.address}", f"--num_actors={self.options.num_actors}",
             f"--checkpoint_interval_s={self.options.checkpoint_interval_s}",
             f"--log_interval_s={self.options.log_interval_s}", "--total_environment_frames=1e12", *extra],
            f"learner.{self.learner_number}.log", environment)
        self.learner_expected_exit = False

    def start_actor(self, index: int) -> None:
        self.actors[index] = self._spawn(
            ["-m", "seed.actor.main", *self._env_flags(), f"--actor_index={index}",
             f"--server_address={self.address}", "--reconnect_max_backoff_s=1", "--log_interval_s=1e9"],
            f"actor{index}.log")
        self.actor_expected_exit.discard(index)

    def learner_output(self, number: int | None = None) -> str:
        with open(os.path.join(self.directory, f"learner.{number or self.learner_number}.log"), errors="replace") as f:
            return f.read()

    def connections(self, index: int) -> int:
        path = os.path.join(self.directory, f"actor{index}.log")
        if not os.path.exists(path):
            return 0
        with open(path, errors="replace") as f:
            return f.read().count(f"[actor {index}] connected to")

    def read_metrics(self) -> None:
        path = os.path.join(self.logdir, "metrics.jsonl")
        if not os.path.exists(path):
            return
        with open(path) as f:
            f.seek(self._metrics_offset)
            data = f.read()
        complete = data[:data.rfind("\n") + 1]
        self._metrics_offset += len(complete.encode())
        for line in complete.splitlines():
            if line.strip():
                row = json.loads(line)
                self.samples.append(analysis.Sample(self.now(), float(row["env_frames_per_sec"]), row["env_frames"],
                                                    row["train_steps"], row.get("episode_return_mean"),
                                                    self.learner_number))

    def check_processes(self) -> None:
        """Counts and restarts processes that exited without being told to (crashes); the learner that the sink
        fault ends is restarted at once and not counted."""
        if self._sink_fault_exit():
            return
        if self.learner is not None and self.learner.poll() is not None and not self.learner_expected_exit:
            self.learner_crashes.append(f"learner {self.learner_number} exited with {self.learner.returncode} "
                                        f"at {self.now():.1f}s")
            self.start_learner()
        for index, actor in list(self.actors.items()):
            if actor.poll() is not None and index not in self.actor_expected_exit:
                self.actor_crashes.append(f"actor {index} exited with {actor.returncode} at {self.now():.1f}s")
                self.start_actor(index)

    # --------------------------------------------------------------------------------------------- faults

    def kill_actor(self, index: int) -> None:
        self.actor_expected_exit.add(index)
        self.actors[index].send_signal(signal.SIGKILL)
        self.actors[index].wait()
        self.events.append({"t_s": round(self.now(), 2), "event": "SIGKILL", "actor": index})

    def kill_learner(self) -> None:
        before = [s for s in self.samples if s.learner == self.learner_number]
        self.restart["killed_at_s"] = round(self.now(), 2)
        self.restart["last_row_before_kill"] = dataclasses.asdict(before[-1]) if before else None
        self.restart["connections_before"] = {i: self.connections(i) for i in self.actors}
        self.learner_expected_exit = True
        self.learner.send_signal(signal.SIGKILL)
        self.learner.wait()
        self.events.append({"t_s": round(self.now(), 2), "event": "SIGKILL", "learner": self.learner_number})

    def run(self, stop: threading.Event) -> None:
        """Starts everything, injects the planned faults, samples until --duration_s, then stops everything."""
        options = self.options
        os.makedirs(self.directory, exist_ok=True)
        self._start = time.monotonic()
        self.start_learner()
        for index in range(options.num_actors):
            self.start_actor(index)
        timers: list[tuple[float, Any]] = []  # (due time, action)
        for fault in self.faults:
            timers.append((fault.t_s, lambda f=fault: self._inject(f, timers)))
        try:
            while self.now() < options.duration_s and not stop.is_set():
                due = [t for t in timers if t[0] <= self.now()]
                for item in due:
                    timers.remove(item)
                    item[1]()
                self.read_metrics()
                self.check_processes()
                self._watch_restart()
                time.sleep(0.2)
        finally:
            self._stop_all()
            self.read_metrics()

    def _inject(self, fault: Fault, timers: list) -> None:
        if fault.kind == "sink":  # armed when the learner was restarted; it fires inside the learner
            self.events.append({"t_s": round(self.now(), 2), "event": "sink fault due", "learner": self.learner_number})
            return
        if fault.kind == "learner":
            self.kill_learner()
            timers.append((self.now() + 1.0, self._restart_learner))
            return
        self.kill_actor(fault.killed)
        timers.append((self.now() + self.options.actor_restart_delay_s, lambda: self.start_actor(fault.killed)))
        stopped = self.actors[fault.stopped]
        stopped.send_signal(signal.SIGSTOP)
        self.events.append({"t_s": round(self.now(), 2), "event": "SIGSTOP", "actor": fault.stopped})

        def resume() -> None:
            stopped.send_signal(signal.SIGCONT)
            self.events.append({"t_s": round(self.now(), 2), "event": "SIGCONT", "actor": fault.stopped})

        timers.append((self.now() + self.options.stop_s, resume))

    def _sink_fault_exit(self) -> bool:
        """If the learner armed with the sink fault exited: record how and restart it (local.sh's policy)."""
        armed = self.sink_fault.get("learner")
        if armed != self.learner_number or self.learner.poll() is None or "exited_at_s" in self.sink_fault:
            return False
        output = self.learner_output()
        self.sink_fault.update(exited_at_s=round(self.now(), 2), exit_code=self.learner.returncode,
                               traceback_logged="Traceback" in output and "InjectedFault" in output,
                               thread_named="thread 'experience-sink' died" in output)
        self.events.append({"t_s": round(self.now(), 2), "event": "exit", "learner": self.learner_number,
                            "code": self.learner.returncode})
        self.start_learner()
        self.sink_fault["restarted_at_s"] = round(self.now(), 2)
        self.sink_fault["restarted_learner"] = self.learner_number
        self.events.append({"t_s": round(self.now(), 2), "event": "start", "learner": self.learner_number})
        return True

    def _restart_learner(self) -> None:
        sink = next((f for f in self.faults if f.kind == "sink"), None)
        environment = None
        if sink is not None:
            # Armed in the restarted learner, due at the sink fault's slot.
            environment = {SINK_FAULT_ENV: f"{max(1.0, sink.t_s - self.now()):.1f}"}
            self.sink_fault["learner"] = self.learner_number + 1
        self.start_learner(environment)
        self.restart["restarted_at_s"] = round(self.now(), 2)
        self.events.append({"t_s": round(self.now(), 2), "event": "start", "learner": self.learner_number})

    def _watch_restart(self) -> None:
        """After the restart: when the learner resumed, and when each surviving actor connected again."""
        if (self.sink_fault.get("learner") == self.learner_number and "died_at_s" not in self.sink_fault
                and "thread 'experience-sink' died" in self.learner_output()):
            self.sink_fault["died_at_s"] = round(self.now(), 2)  # to the 0.2 s polling period
        if "restarted_learner" in self.sink_fault and "resumed_at_s" not in self.sink_fault:
            match = RESUMED.search(self.learner_output(self.sink_fault["restarted_learner"]))
            if match:
                self.sink_fault["resumed"] = [int(match.group(i).replace(",", "")) for i in (1, 2)]
                self.sink_fault["resumed_at_s"] = round(self.now(), 2)
        if "restarted_at_s" not in self.restart:
            return
        if "resumed" not in self.restart:
            match = RESUMED.search(self.learner_output())
            if match:
                self.restart["resumed"] = [int(match.group(i).replace(",", "")) for i in (1, 2)]
                self.restart["resumed_at_s"] = round(self.now(), 2)
        reconnected = self.restart.setdefault("reconnected_at_s", {})
        for index, before in self.restart["connections_before"].items():
            if index not in reconnected and self.connections(index) > before:
                reconnected[index] = round(self.now(), 2)

    def _stop_all(self) -> None:
        self.learner_expected_exit = True
        self.actor_expected_exit.update(self.actors)
        for actor in self.actors.values():
            if actor.poll() is None:
                actor.send_signal(signal.SIGCONT)
                actor.send_signal(signal.SIGTERM)
        if self.learner.poll() is None:
            self.learner.send_signal(signal.SIGTERM)
        for process in [*self.actors.values(), self.learner]:
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        # A learner SIGTERMed while still starting (its handlers not yet installed) was stopped, not crashed.
        starting = self.learner.returncode == -signal.SIGTERM and "listening on" not in self.learner_output()
        if self.learner.returncode != 0 and not starting:
            self.learner_crashes.append(f"learner {self.learner_number} exited with {self.learner.returncode} "
                                        "on SIGTERM at the end")

    # --------------------------------------------------------------------------------------------- report

    def report(self) -> dict[str, Any]:
        options = self.options
        pre_window = min(10.0, options.kill_every_s / 3)
        faults = []
        ends = [f.t_s for f in self.faults[1:]] + [options.duration_s]
        for fault, until in zip(self.faults, ends, strict=True):
            # The sink fault fires inside the learner a little after its slot: count from when it died.
            t_s = self.sink_fault.get("died_at_s", fault.t_s) if fault.kind == "sink" else fault.t_s
            pre = analysis.pre_fault_fps(self.samples, t_s, pre_window)
            recovered = (analysis.recovery_s(self.samples, t_s, until, pre, options.log_interval_s,
                                             options.recovery_fraction) if pre else None)
            entry = {"t_s": fault.t_s, "kind": fault.kind, "pre_fault_fps": round(pre, 1) if pre else None,
                     "recovery_s": recovered}
            if fault.kind == "actors":
                entry.update(killed_actor=fault.killed, stopped_actor=fault.stopped, stop_s=options.stop_s)
            faults.append(entry)
        recoveries = [f["recovery_s"] for f in faults]
        report = {
            "env": self.env,
            "learner_crashes": len(self.learner_crashes), "learner_crash_details": self.learner_crashes,
            "actor_crashes": len(self.actor_crashes), "actor_crash_details": self.actor_crashes,
            "injected": {"actor_sigkills": sum(f.kind == "actors" for f in self.faults),
                         "actor_sigstops": sum(f.kind == "actors" for f in self.faults), "learner_sigkills": 1,
                         "sink_exceptions": sum(f.kind == "sink" for f in self.faults)},
            "faults": faults,
            "recovery_s_max": max((r for r in recoveries if r is not None), default=None),
            "recovery_s_mean": (round(sum(r for r in recoveries if r is not None) / max(1, len(recoveries)), 2)),
            "all_recovered": all(r is not None for r in recoveries),
            "learner_restart": self._restart_report(pre_window),
            "sink_fault": self._sink_fault_report(faults),
            "actor_connections": {i: self.connections(i) for i in range(options.num_actors)},
            "return": analysis.return_trend(self.samples),
            "env_frames": self.samples[-1].env_frames if self.samples else 0,
            "train_steps": self.samples[-1].train_steps if self.samples else 0,
            "mean_fps": round(sum(s.fps for s in self.samples) / max(1, len(self.samples)), 1),
            "events": self.events,
        }
        return report

    def _sink_fault_report(self, faults: list[dict[str, Any]]) -> dict[str, Any] | None:
        """The sink fault: when it was due, how long the learner took to exit (and how), the restart, the resume
        and the recovery time (FPS back to the recovery fraction, counted from when the fault was due)."""
        fault = next((f for f in faults if f["kind"] == "sink"), None)
        if fault is None:
            return None
        out = {key: self.sink_fault.get(key) for key in ("exit_code", "traceback_logged", "thread_named", "died_at_s",
                                                         "exited_at_s", "restarted_at_s", "resumed_at_s", "resumed")}
        out["due_at_s"] = fault["t_s"]
        died, exited = self.sink_fault.get("died_at_s"), self.sink_fault.get("exited_at_s")
        out["exit_after_death_s"] = round(exited - died, 2) if None not in (died, exited) else None
        out["recovery_s"] = fault["recovery_s"]  # from died_at_s to FPS back at the recovery fraction
        return out

    def _restart_report(self, pre_window: float) -> dict[str, Any]:
        restart = self.restart
        out: dict[str, Any] = {key: restart.get(key) for key in ("killed_at_s", "restarted_at_s", "resumed_at_s")}
        last = restart.get("last_row_before_kill")
        if last and "resumed" in restart:
            kill = restart["killed_at_s"]
            pre = analysis.pre_fault_fps(self.samples, kill, pre_window) or 0.0
            steps_rate = analysis.rate(self.samples, kill - 3 * pre_window, kill, "train_steps")
            out.update(analysis.restart_losses(analysis.Sample(**last), kill, *restart["resumed"], pre, steps_rate,
                                               self.options.checkpoint_interval_s, self.options.log_interval_s))
        reconnected = restart.get("reconnected_at_s", {})
        expected = sorted(restart.get("connections_before", {}))
        out["actors_expected"] = len(expected)
        out["actors_reconnected"] = len(reconnected)
        if reconnected and restart.get("restarted_at_s") is not None:
            out["reconnect_s_max"] = round(max(reconnected.values()) - restart["restarted_at_s"], 2)
        return out


def check(report: dict[str, Any], options: SoakOptions) -> list[str]:
    """The figures that miss their bound, as sentences naming the env, the figure, got and expected."""
    problems = []
    for env, run in report["runs"].items():
        if run["learner_crashes"]:
            problems.append(f"{env}: learner_crashes: got {run['learner_crashes']}, expected 0 "
                            f"({run['learner_crash_details']})")
        if not run["all_recovered"]:
            slow = [f["t_s"] for f in run["faults"] if f["recovery_s"] is None]
            problems.append(f"{env}: recovery: FPS not back to {options.recovery_fraction:.0%} of its pre-fault "
                            f"level before the next fault after the faults at {slow}s, expected every fault")
        restart = run["learner_restart"]
        if not restart.get("within_one_checkpoint_interval"):
            problems.append(f"{env}: learner restart losses: got {restart.get('lost_env_frames')} frames / "
                            f"{restart.get('lost_train_steps')} train steps, expected at most "
                            f"{restart.get('max_lost_env_frames')} / {restart.get('max_lost_train_steps')} "
                            f"(one checkpoint interval)")
        sink = run.get("sink_fault")
        if sink is not None and not (sink["exit_code"] not in (None, 0) and sink["traceback_logged"]
                                     and sink["resumed"] and sink["exit_after_death_s"] is not None
                                     and sink["exit_after_death_s"] <= SINK_EXIT_BOUND_S):
            problems.append(f"{env}: sink fault: got {sink}, expected a non-zero exit with the traceback logged "
                            f"within {SINK_EXIT_BOUND_S:.0f}s of the thread's death and a resumed learner")
        if restart["actors_reconnected"] != restart["actors_expected"]:
            problems.append(f"{env}: actors reconnected after the learner restart: got "
                            f"{restart['actors_reconnected']}, expected {restart['actors_expected']}")
    return problems


def run_soak(envs: list[str], options: SoakOptions, workdir: str, concurrent: bool = True) -> dict[str, Any]:
    rng = random.Random(options.seed)
    runs = [SoakRun(env, options, os.path.join(workdir, re.sub(r"\W", "_", env)), rng) for env in envs]
    stop = threading.Event()
    if concurrent:
        threads = [threading.Thread(target=run.run, args=(stop,), name=run.env) for run in runs]
        for thread in threads:
            thread.start()
        try:
            for thread in threads:
                thread.join()
        except KeyboardInterrupt:
            stop.set()
            for thread in threads:
                thread.join()
    else:
        for run in runs:
            run.run(stop)
    report = {"options": dataclasses.asdict(options), "envs": envs, "concurrent": concurrent, "workdir": workdir,
              "runs": {run.env: run.report() for run in runs}}
    report["problems"] = check(report, options)
    report["passed"] = not report["problems"]
    return report


FLAGS = flags.FLAGS


def define_flags() -> None:
    for f in dataclasses.fields(SoakOptions):
        define = flags.DEFINE_integer if f.type in ("int", int) else flags.DEFINE_float
        define(f.name, f.default, f"see seed/bench/soak.py ({f.name})")
    flags.DEFINE_string("envs", "gym:CartPole-v1,fake:atari", "Comma-separated envs, one V-trace run each.")
    flags.DEFINE_bool("concurrent", True, "Run the envs at the same time (else one after the other).")
    flags.DEFINE_string("workdir", "", "Where logs and logdirs go; default a new temporary directory.")
    flags.DEFINE_string("out", "soak.json", "The JSON report.")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    options = SoakOptions(**{f.name: FLAGS[f.name].value for f in dataclasses.fields(SoakOptions)})
    workdir = FLAGS.workdir or tempfile.mkdtemp(prefix="seed-soak-")
    envs = [e.strip() for e in FLAGS.envs.split(",") if e.strip()]
    try:
        report = run_soak(envs, options, workdir, FLAGS.concurrent)
    except ValueError as error:
        print(f"seed.bench.soak: {error}", file=sys.stderr)
        sys.exit(2)
    os.makedirs(os.path.dirname(os.path.abspath(FLAGS.out)), exist_ok=True)
    with open(FLAGS.out, "w") as f:
        json.dump(report, f, indent=1)
    for env, run in report["runs"].items():
        restart = run["learner_restart"]
        sink = run.get("sink_fault") or {}
        print(f"[soak] {env}: sink fault: exit {sink.get('exit_code')} {sink.get('exit_after_death_s')}s after the "
              f"sink died, "
              f"recovery_s={sink.get('recovery_s')}", flush=True)
        print(f"[soak] {env}: learner_crashes={run['learner_crashes']} recovery_s_max={run['recovery_s_max']} "
              f"lost_frames={restart.get('lost_env_frames')} lost_train_steps={restart.get('lost_train_steps')} "
              f"reconnected={restart['actors_reconnected']}/{restart['actors_expected']} "
              f"return {run['return']['first_window_mean']} -> {run['return']['last_window_mean']}", flush=True)
    print(f"[soak] {'passed' if report['passed'] else 'FAILED: ' + '; '.join(report['problems'])} -> {FLAGS.out}",
          flush=True)
    sys.exit(0 if report["passed"] else 1)


def run() -> None:
    define_flags()
    app.run(main)


if __name__ == "__main__":
    run()
