"""A bad --env at every entry point (seed-learner, its --print_config, seed-actor, seed-eval, seed-bench): one line
naming the flag, the value and what is expected, as `--agent=foo` gets, and no traceback. Real processes: each
family's refusal through the learner's configuration (--print_config) and the actor, which check it themselves;
one of them through each entry point that reaches it by a path of its own (a run, seed-eval, seed-bench), so the
file takes about 35 s on 2 cores."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.test_evaluate import write_checkpoint

BAD_ENVS = {  # --env value -> what its one line must say it expected
    "atari:Pongg": "expected a CamelCase ALE game name such as 'Pong'",
    "minatar:pong": "expected one of asterix, breakout, freeway, seaquest, space_invaders",
    "gym:NoSuchEnv-v0": "expected a registered gymnasium id such as CartPole-v1",
}


def _one_line_error(command: list[str], cwd: str, tool: str, env: str, returncode: int = 2) -> str:
    """Runs `command`; asserts it exits `returncode` with exactly one line on stderr, from `tool`, naming --env's
    value and what was expected, and no traceback. Returns the line."""
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=120)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == returncode and "Traceback" not in done.stderr, (done.returncode, done.stderr[-3000:])
    assert len(lines) == 1 and lines[0].startswith(f"{tool}: "), done.stderr[-3000:]
    assert f"--env={env}:" in lines[0] and BAD_ENVS[env] in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("env, print_config", [(env, True) for env in sorted(BAD_ENVS)] + [("atari:Pongg", False)],
                         ids=[f"print_config-{env}" for env in sorted(BAD_ENVS)] + ["run-atari:Pongg"])
def test_seed_learner(tmp_path, env, print_config):
    """--print_config checks the env too: it prints no configuration for an env that cannot be built."""
    command = [sys.executable, "-m", "seed.learner.main", f"--env={env}", f"--logdir={tmp_path}/run"]
    _one_line_error(command + ["--print_config"] * print_config, str(tmp_path), "seed-learner", env)
    assert not os.path.exists(tmp_path / "run" / "config.json")


@pytest.mark.parametrize("env", sorted(BAD_ENVS))
def test_seed_actor(tmp_path, env):
    command = [sys.executable, "-m", "seed.actor.main", f"--env={env}", f"--server_address=unix:{tmp_path}/none.sock"]
    _one_line_error(command, str(tmp_path), "seed-actor", env)


@pytest.mark.parametrize("env", ["minatar:pong"])
def test_seed_eval_on_a_checkpoint_whose_env_does_not_build(tmp_path, env):
    """A checkpoint whose saved --env this installation cannot build (a renamed game, a plug-in family not
    loaded): the line names the checkpoint too, since the user typed no --env."""
    logdir = str(tmp_path / "run")
    os.makedirs(logdir)
    write_checkpoint(logdir, extra_config={"env": env})
    line = _one_line_error([sys.executable, "-m", "seed.evaluate", f"--logdir={logdir}", "--episodes=1"],
                           str(tmp_path), "seed-eval", env)
    assert f"checkpoint {logdir}/checkpoint-00000001.pt: " in line


@pytest.mark.parametrize("env", ["gym:NoSuchEnv-v0"])
def test_seed_bench(tmp_path, env):
    command = [sys.executable, "-m", "seed.bench", "--config=cartpole", f"--env={env}", "--noprogress",
               "--duration_s=5", f"--runs_dir={tmp_path}/runs"]
    _one_line_error(command, str(tmp_path), "seed-bench", env, returncode=1)
    assert not os.path.exists(tmp_path / "runs")
