"""The wheel is the whole product: built from a clean copy of the sources, installed (not editable) into a
fresh virtual environment, and run from a directory outside the repository, it has every module (R2D2
included), its data files, working console scripts, and seed-bench / seed-report that write where their
flags say; every agent (V-trace, R2D2, PPO, MuZero) trains with a real learner and actor.

The virtual environment does not see the system's site-packages: it holds torch (installed first, from the
Makefile's TORCH_SPEC, so that no CUDA build is pulled), the wheel and the `atari` extra with the
dependencies they declare, and nothing else. A module the runtime imports but setup.py does not declare (psutil
once: R2D2 died at start on a plain install) fails here, whatever the machine running the tests has installed.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys

import pytest

from seed.agents import names as agent_names
from seed.runtime import checkpoint
from tests.conftest import REPO, read_metrics, wait_for

pytestmark = pytest.mark.wheel

# What setup.py builds from: the same list the Dockerfiles copy into their build context.
SOURCES = ("setup.py", "pyproject.toml", "protos", "seed", "agents", "envs")
# Source roots and the package each installs as (setup.py's package_dir).
ROOTS = {"seed": "seed", "agents": "seed.agents", "envs": "seed.envs"}
DATA_FILES = ("seed/bench/configs.yaml", "seed/bench/pricing_current.yaml", "seed/bench/pricing_paper_2019.yaml",
              "seed/envs/atari57_scores.csv")

IMPORT_EVERY_MODULE = """
import importlib, json, pkgutil, sys
import seed
modules = {}
for info in pkgutil.walk_packages(seed.__path__, "seed."):
    if info.name.rsplit(".", 1)[-1] == "__main__":  # running it would start the CLI
        continue
    modules[info.name] = importlib.import_module(info.name).__file__
modules["seed"] = seed.__file__
print(json.dumps(modules))
"""


def source_modules() -> set[str]:
    """Every module of the source tree, named as installed (agents/r2d2/agent.py -> seed.agents.r2d2.agent),
    the generated gRPC stubs included."""
    modules = {"seed._proto", "seed._proto.seed_pb2", "seed._proto.seed_pb2_grpc"}
    for directory, package in ROOTS.items():
        for root, dirs, files in os.walk(os.path.join(REPO, directory)):
            dirs[:] = [d for d in dirs if d not in ("__pycache__", "_proto")]
            relative = os.path.relpath(root, os.path.join(REPO, directory))
            prefix = package if relative == "." else f"{package}.{relative.replace(os.sep, '.')}"
            for name in files:
                if name == "__init__.py":
                    modules.add(prefix)
                elif name.endswith(".py") and name != "__main__.py":
                    modules.add(f"{prefix}.{name[:-3]}")
    return modules


def run(cmd: list[str], cwd: str, timeout: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    completed = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True,
                               timeout=timeout)
    assert completed.returncode == 0, f"{cmd} failed ({completed.returncode}):\n{completed.stdout[-3000:]}\n" \
                                      f"{completed.stderr[-3000:]}"
    return completed


def torch_requirement() -> list[str]:
    """pip's arguments for torch: $TORCH_SPEC (what `make install TORCH_SPEC=...` was given) or the Makefile's
    default. A bare `torch` from the wheel's requirements would pull the CUDA build (several GB)."""
    spec = os.environ.get("TORCH_SPEC")
    if not spec:
        with open(os.path.join(REPO, "Makefile")) as f:
            spec = re.search(r"^TORCH_SPEC \?= (.+)$", f.read(), re.MULTILINE).group(1)
    return shlex.split(spec)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(venv bin directory, venv site-packages, an empty working directory outside the repository, env)."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"
    source.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "_proto", "*.egg-info", "build")
    for name in SOURCES:  # a clean copy: no stale build/ or generated stubs from the checkout end up in the wheel
        path = os.path.join(REPO, name)
        if os.path.isdir(path):
            shutil.copytree(path, source / name, ignore=ignore)
        else:
            shutil.copy2(path, source / name)
    # A stale build/ from an earlier build of a checkout, holding a module since moved away: it must not ship.
    stale = source / "build" / "lib" / "seed" / "report.py"
    stale.parent.mkdir(parents=True)
    stale.write_text('"""seed/report.py before it moved to seed/bench/report.py."""\n')
    dist = root / "dist"
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "--quiet",
         "--wheel-dir", dist, source], cwd=str(root), timeout=240)
    wheels = list(dist.glob("seed_rl_torch-*.whl"))
    assert len(wheels) == 1, os.listdir(dist)
    venv = root / "venv"
    # Isolated from the system's site-packages; --without-pip: no ensurepip needed (Debian's python3 lacks it
    # without python3-venv), the system's pip installs into the venv through --python.
    run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=str(root), timeout=120)
    bin_dir = venv / "bin"
    # --no-compile: Python compiles what it imports on first use, instead of pip compiling all of torch.
    pip = [sys.executable, "-m", "pip", "--python", bin_dir / "python", "install", "--quiet", "--no-compile"]
    run(pip + torch_requirement(), cwd=str(root), timeout=600)
    run(pip + [f"{wheels[0]}[atari]"], cwd=str(root), timeout=600)
    site = run([bin_dir / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
               cwd=str(root), timeout=60).stdout.strip()
    work = root / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    return bin_dir, site, str(work), env


def test_wheel_has_every_module_and_data_file(installed):
    bin_dir, site, work, env = installed
    modules = json.loads(run([bin_dir / "python", "-c", IMPORT_EVERY_MODULE], cwd=work, timeout=120, env=env).stdout)
    # The venv's own copy, not an editable install of the checkout that the system site may hold.
    outside = {name: path for name, path in modules.items() if not path.startswith(site + os.sep)}
    assert not outside, outside
    # Isolated: nothing of the system's site-packages (here pytest, of the test extra) is importable.
    run([bin_dir / "python", "-c", "import importlib.util; assert importlib.util.find_spec('pytest') is None"],
        cwd=work, timeout=60, env=env)
    expected = source_modules()
    assert "seed.agents.r2d2.agent" in expected and "seed.bench.cli" in expected
    assert sorted(expected - set(modules)) == []  # nothing of the source tree left out of the wheel
    assert sorted(set(modules) - expected) == []
    for path in DATA_FILES:
        assert os.path.getsize(os.path.join(site, path)) > 0, path


def test_learner_prints_the_r2d2_config(installed):
    bin_dir, site, work, env = installed
    completed = run([bin_dir / "seed-learner", "--agent=r2d2", "--print_config"], cwd=work, timeout=120, env=env)
    config = json.loads(completed.stdout[completed.stdout.index("{"):completed.stdout.rindex("}") + 1])
    assert config["agent"] == "r2d2" and config["burn_in"] > 0


def test_bench_and_report_run_outside_the_repository(installed):
    bin_dir, site, work, env = installed
    out, runs = os.path.join(work, "results", "cartpole.json"), os.path.join(work, "runs")
    run([bin_dir / "seed-bench", "--config=cartpole", "--duration_s=10", "--noprogress", f"--out={out}",
         f"--runs_dir={runs}"], cwd=work, timeout=180, env=env)
    with open(out) as f:
        result = json.load(f)
    assert result["env_frames_per_sec"] > 0
    assert result["framework"]["run_dir"].startswith(runs + os.sep)
    assert result["configuration"]["seed_version"] == "0.1.0"
    assert result["configuration"]["git_commit"] is None  # an installed copy is no checkout
    completed = run([bin_dir / "seed-report", out, f"--out={os.path.join(work, 'report')}"], cwd=work, timeout=120,
                    env=env)
    assert "| cartpole | - | 2 |" in completed.stdout and "Priced with the current price table" in completed.stdout
    assert os.path.getsize(os.path.join(work, "report.png")) > 1000
    # The bench's learner logdir is a real run: seed-eval plays its checkpoint, seed-report --curves draws it.
    logdir = os.path.join(result["framework"]["run_dir"], "learner")
    evaluation = os.path.join(work, "eval.json")
    run([bin_dir / "seed-eval", f"--logdir={logdir}", "--episodes=2", f"--out={evaluation}"], cwd=work, timeout=120,
        env=env)
    with open(evaluation) as f:
        assert json.load(f)["episodes"] == 2
    run([bin_dir / "seed-report", "--curves", logdir, f"--out={os.path.join(work, 'curves')}"], cwd=work,
        timeout=120, env=env)
    assert os.path.getsize(os.path.join(work, "curves", "curves_gym_CartPole-v1.png")) > 1000
    # Nothing was written to the working directory but what the flags named.
    assert sorted(os.listdir(work)) == ["curves", "eval.json", "report.md", "report.png", "results", "runs"]


# Flags beyond `--agent` that make an agent's first training step come within seconds on CartPole (the others
# need none): R2D2 starts training after 32 sequences in replay instead of its CartPole default of 100; SAC (Box
# actions only, so on Pendulum-v1) after 64 transitions instead of CleanRL's 5,000, in batches of 32.
AGENT_FLAGS = {"r2d2": ["--replay_min_size=32"], "sac": ["--replay_min_size=64", "--batch_size=32",
                                                         "--replay_ratio=32"]}
AGENT_ENVS = {"sac": "gym:Pendulum-v1"}  # the others train on gym:CartPole-v1


# `make test` installs the default agent and MuZero (the one with the most dependencies: Numba's search) from the
# wheel; the other agents' runs from the wheel are in `make test-learning` (their modules are in the wheel either
# way: test_wheel_has_every_module_and_data_file).
IN_MAKE_TEST = ("vtrace", "muzero")


@pytest.mark.parametrize("agent", [agent if agent in IN_MAKE_TEST else pytest.param(agent, marks=pytest.mark.learning)
                                   for agent in agent_names()])
def test_every_agent_trains_from_a_plain_install(installed, tmp_path, agent):
    """`seed-learner --agent=<agent>` and one `seed-actor` on CartPole, from the venv that holds only the wheel,
    the atari extra and what they declare (the defaults: the training process and the shared-memory actor path):
    the learner makes training steps, and both processes exit with status 0 on SIGTERM."""
    bin_dir, site, work, env = installed
    logdir = tmp_path / "run"
    address = f"unix:{logdir}/learner.sock"
    common = [f"--env={AGENT_ENVS.get(agent, 'gym:CartPole-v1')}", f"--server_address={address}"]
    started = []
    try:
        for name, command in (
                ("learner", [bin_dir / "seed-learner", f"--agent={agent}", *common, f"--logdir={logdir}",
                             "--num_actors=1", "--log_interval_s=1", "--torch_threads=1", *AGENT_FLAGS.get(agent, [])]),
                ("actor", [bin_dir / "seed-actor", *common, "--actor_index=0"])):
            with open(tmp_path / f"{name}.log", "wb") as log:
                started.append(subprocess.Popen([str(c) for c in command], cwd=str(tmp_path), env=env, stdout=log,
                                                stderr=subprocess.STDOUT))
        learner, actor = started

        def output() -> str:
            return "\n".join(f"--- {name}:\n{(tmp_path / f'{name}.log').read_text(errors='replace')[-3000:]}"
                             for name in ("learner", "actor"))

        def trained() -> bool:
            assert learner.poll() is None and actor.poll() is None, f"a process exited early\n{output()}"
            rows = read_metrics(str(logdir))
            return bool(rows) and rows[-1]["train_steps"] >= 1

        # Seconds on an idle machine; the generous limits are for a CI machine whose 2 cores are shared.
        wait_for(trained, 300, f"{agent}'s first training step", on_timeout=output)
        for process in started:
            process.send_signal(signal.SIGTERM)
        try:
            codes = [process.wait(timeout=120) for process in started]
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running 120 s after SIGTERM\n{output()}") from None
        assert codes == [0, 0], output()
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
                process.wait()
    # SIGTERM's checkpoint holds the steps made (and loads as the learner's own resume would load it).
    saved = checkpoint.latest(str(logdir))
    assert saved is not None and saved[1]["counters"]["train_steps"] >= 1, output()
