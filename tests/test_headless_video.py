"""seed-eval --video on CartPole on a machine with no display (no DISPLAY, WAYLAND_DISPLAY or XDG_RUNTIME_DIR):
the video is made and stderr carries no SDL complaint about the missing runtime directory, while a video driver
the user chose is still used, its errors shown (envs/gym.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.test_evaluate import TIMEOUT_S, write_checkpoint

pytest.importorskip("imageio.v2", reason="the video extra (pip install -e '.[video]') is not installed")
pytest.importorskip("pygame", reason="CartPole's rendering needs pygame (the video extra)")

DISPLAY_VARIABLES = ("DISPLAY", "WAYLAND_DISPLAY", "XDG_RUNTIME_DIR", "SDL_VIDEODRIVER", "SDL_AUDIODRIVER")


def _headless(**extra: str) -> dict[str, str]:
    environment = {k: v for k, v in os.environ.items() if k not in DISPLAY_VARIABLES}
    return dict(environment, PYTHONPATH=REPO, **extra)


def test_seed_eval_video_on_a_headless_machine_prints_no_sdl_error(tmp_path):
    """Before: stderr had `error: XDG_RUNTIME_DIR is invalid or not set in the environment.` (SDL probing a real
    video driver) before a correct report."""
    logdir = str(tmp_path / "run")
    os.makedirs(logdir)
    write_checkpoint(logdir)
    video = str(tmp_path / "episode.mp4")
    code = ("import sys\nfrom seed.evaluate import run\n"
            f"sys.argv = ['seed-eval', '--logdir={logdir}', '--episodes=1', '--num_envs=1', '--video={video}']\nrun()")
    done = subprocess.run([sys.executable, "-c", code], cwd=logdir, capture_output=True, text=True,
                          timeout=TIMEOUT_S, env=_headless())
    assert done.returncode == 0, done.stderr[-3000:]
    assert "XDG_RUNTIME_DIR" not in done.stderr, done.stderr[-3000:]
    assert "error:" not in done.stderr.lower(), done.stderr[-3000:]
    assert os.path.getsize(video) > 0 and "return mean" in done.stdout


def test_a_video_driver_the_user_chose_is_kept_with_its_errors():
    """SDL_VIDEODRIVER=x11 with no X server: the render fails loudly, as SDL says, rather than being swapped for the
    dummy driver."""
    code = ("from envs.gym import GymEnv\nenv = GymEnv('CartPole-v1', 0, render_rgb=True)\n"
            "env.reset()\nprint(env.render_rgb().shape)")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S,
                          env=_headless(SDL_VIDEODRIVER="x11"))
    assert done.returncode != 0, (done.stdout, done.stderr[-3000:])
    assert "x11" in done.stderr.lower(), done.stderr[-3000:]
