"""seed-eval: a real `seed-eval` process on CartPole checkpoints written by the real checkpoint module (an
untrained V-trace agent and one whose network is set by hand to a balancing controller), its JSON report and
MP4 video, its errors; the video recorder, the episode shares and the env frames it records."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from seed.agents import agent_class
from seed.envs import make_spec
from seed.evaluate import EVAL_SEED_OFFSET, EpisodeVideo, episode_quotas, open_video_writer
from seed.learner.configuration import resolve_config
from seed.runtime import checkpoint
from tests.conftest import REPO
from tests.test_checkpoint import make_learner, write_code_running_checkpoint

imageio = pytest.importorskip("imageio.v2", reason="the video extra (pip install -e '.[video]') is not installed")

ENV = "gym:CartPole-v1"
TIMEOUT_S = 120
# CartPole balances with action 1 (push right) iff this . [x, x_dot, theta, theta_dot] > 0 (500 on every seed
# tried); the untrained network's sampled policy scores about 22.
CONTROLLER = (0.1, 0.5, 1.0, 1.0)


def write_checkpoint(logdir: str, controller: tuple[float, ...] | None = None, seed: int = 7,
                     extra_config: dict | None = None) -> dict:
    """Saves an untrained V-trace CartPole agent (or one set to `controller`) with seed.runtime.checkpoint, in the
    layout the learner writes: agent, optimizer, counters, config. Returns the saved config."""
    config = resolve_config({"agent": "vtrace", "env": ENV, "logdir": logdir, "seed": seed})
    spec = make_spec(config.env, config.env_options())
    agent = agent_class(config.agent)(spec, config)
    if controller is not None:
        set_controller(agent.network, controller)
    saved = {**vars(config), **(extra_config or {})}
    save_like_the_learner(logdir, agent, saved, {"env_frames": 12_345, "train_steps": 67, "episodes": 8})
    return saved


def save_like_the_learner(logdir: str, agent, saved_config: dict, counters: dict) -> None:
    """`agent` saved with seed.runtime.checkpoint in the learner's layout: agent, optimizer, counters, config."""
    optimizer = torch.optim.Adam(agent.network.parameters())
    checkpoint.save(logdir, {"agent": agent.state_dict(), "optimizer": optimizer.state_dict(),
                             "counters": counters, "config": saved_config})


def set_controller(network: torch.nn.Module, weights: tuple[float, ...]) -> None:
    """MLP 4-64-64 + policy head computing logits [0, 100 w.x]: h0 = relu(w.x), h1 = relu(-w.x), passed through
    the second layer, logit 1 = 100 (h0 - h1)."""
    first, second = network.body.torso.layers[0], network.body.torso.layers[2]
    with torch.no_grad():
        for layer in (first, second, network.policy):
            layer.weight.zero_()
            layer.bias.zero_()
        w = torch.tensor(weights)
        first.weight[0], first.weight[1] = w, -w
        second.weight[0, 0] = second.weight[1, 1] = 1.0
        network.policy.weight[1, 0], network.policy.weight[1, 1] = 100.0, -100.0


def seed_eval(args: list[str], cwd: str, preamble: str = "") -> subprocess.CompletedProcess:
    """Runs seed-eval's entry point in a fresh interpreter (`preamble` runs first, e.g. to hide a package)."""
    code = f"{preamble}\nimport sys\nfrom seed.evaluate import run\nsys.argv = ['seed-eval'] + {args!r}\nrun()"
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT_S,
                          env=dict(os.environ, PYTHONPATH=REPO))


def mp4_frames(path: str) -> list[np.ndarray]:
    with imageio.get_reader(path) as reader:
        return [frame for frame in reader.iter_data()]


@pytest.fixture(scope="module")
def untrained(tmp_path_factory):
    """(logdir, saved config) of an untrained agent; the config holds a key this version does not know."""
    logdir = str(tmp_path_factory.mktemp("untrained"))
    return logdir, write_checkpoint(logdir, extra_config={"flag_of_a_future_version": 3})


@pytest.fixture(scope="module")
def untrained_eval(untrained, tmp_path_factory):
    """seed-eval on the untrained checkpoint: (completed process, report, video path)."""
    logdir = untrained[0]
    video = str(tmp_path_factory.mktemp("video") / "episode.mp4")
    done = seed_eval([f"--logdir={logdir}", "--episodes=7", "--num_envs=3", f"--video={video}"], logdir)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(os.path.join(logdir, "eval.json")) as f:
        return done, json.load(f), video


def test_seed_eval_report_and_video(untrained, untrained_eval):
    saved = untrained[1]
    done, report, video = untrained_eval
    assert "flag_of_a_future_version" in done.stderr  # tolerated, with a warning that names it
    assert "return mean" in done.stdout
    assert report["checkpoint"] == os.path.abspath(checkpoint.checkpoint_path(untrained[0]))
    assert report["counters"] == {"env_frames": 12_345, "train_steps": 67, "episodes": 8}
    assert (report["agent"], report["env"], report["policy"]) == (
        "vtrace", ENV, "sampled from the policy; Box actions: the mode (the squashed Gaussian mean)")
    assert report["seed"] == saved["seed"] + EVAL_SEED_OFFSET
    assert report["episodes"] == 7 and report["num_envs"] == 3
    returns = report["returns"]
    assert len(returns) == len(report["lengths"]) == len(report["frames"]) == len(report["env_indices"]) == 7
    assert sorted(report["env_indices"]) == [0, 0, 0, 1, 1, 2, 2]  # shares 3, 2, 2
    assert report["return_min"] == min(returns) and report["return_max"] == max(returns)
    assert report["return_min"] <= report["return_mean"] <= report["return_max"]
    assert report["return_mean"] == pytest.approx(np.mean(returns))
    assert report["return_median"] == pytest.approx(np.median(returns))
    assert returns == report["shaped_returns"] == [float(n) for n in report["lengths"]]  # CartPole pays 1 a step
    assert report["env_frames_played"] == sum(report["frames"])
    assert report["human_normalized"] is None and report["wall_time_s"] > 0
    # The video: env 0's first episode, one frame per agent step, CartPole's 600 x 400 screen.
    first_length = report["lengths"][report["env_indices"].index(0)]
    assert report["video"]["episode_length"] == first_length
    assert report["video"]["frames"] == first_length
    frames = mp4_frames(video)
    assert len(frames) == first_length
    assert frames[0].shape == (400, 600, 3)


def test_a_balancing_policy_scores_higher(untrained_eval, tmp_path):
    logdir = str(tmp_path / "controller")
    os.makedirs(logdir)
    write_checkpoint(logdir, controller=CONTROLLER)
    out = str(tmp_path / "greedy.json")
    done = seed_eval([f"--logdir={logdir}", "--episodes=4", "--num_envs=4", "--eval_greedy", f"--out={out}",
                      "--seed=123"], str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    with open(out) as f:
        report = json.load(f)
    assert report["policy"].startswith("greedy (argmax);") and report["seed"] == 123
    assert report["return_min"] >= 400
    assert report["return_mean"] > untrained_eval[1]["return_max"]


def test_logdir_without_checkpoint_lists_what_it_holds(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    done = seed_eval([f"--logdir={tmp_path}"], str(tmp_path))
    assert done.returncode == 2
    assert "holds no loadable checkpoint" in done.stderr and "checkpoint-<n>.pt" in done.stderr
    assert "found: metrics.jsonl" in done.stderr
    assert "Traceback" not in done.stderr


def test_unreadable_checkpoint(tmp_path):
    (tmp_path / "half.pt").write_bytes(b"PK\x03\x04 not a whole checkpoint")
    done = seed_eval([f"--checkpoint={tmp_path / 'half.pt'}"], str(tmp_path))
    assert done.returncode == 2
    assert f"--checkpoint: '{tmp_path / 'half.pt'}' cannot be read as a checkpoint" in done.stderr


def test_a_checkpoint_that_would_run_code_is_refused(tmp_path):
    """A downloaded checkpoint that runs `touch` when unpickled: seed-eval refuses it, naming the file and what
    it holds, and nothing runs, given as --checkpoint or as the only checkpoint of a --logdir."""
    logdir, marker = tmp_path / "downloaded", str(tmp_path / "code-ran")
    logdir.mkdir()
    evil = str(logdir / "checkpoint-00000001.pt")
    write_code_running_checkpoint(evil, marker)
    done = seed_eval([f"--checkpoint={evil}"], str(tmp_path))
    assert done.returncode == 2, done.stderr[-3000:]
    assert f"--checkpoint: refused: checkpoint {evil}: got the Python object posix.system" in done.stderr
    assert "Traceback" not in done.stderr
    done = seed_eval([f"--logdir={logdir}"], str(tmp_path))
    assert done.returncode == 2, done.stderr[-3000:]
    assert f"checkpoint {evil} does not load (UnsafeCheckpoint" in done.stderr
    assert "holds no loadable checkpoint" in done.stderr
    assert not os.path.exists(marker)


def test_a_learner_checkpoint_with_its_random_states_evaluates(tmp_path):
    """What the learner itself writes (NumPy and Python random states beside the tensors) loads under
    weights_only=True."""
    logdir = str(tmp_path / "run")
    learner = make_learner(logdir)
    learner.checkpoint()
    learner._close()
    assert "rng" in checkpoint.latest(logdir)[1]
    done = seed_eval([f"--logdir={logdir}", "--episodes=2", f"--out={tmp_path / 'eval.json'}"], str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    with open(tmp_path / "eval.json") as f:
        assert json.load(f)["episodes"] == 2


def test_a_muzero_learner_checkpoint_evaluates_with_its_search(tmp_path):
    """seed-eval on what a MuZero learner writes: the agent's evaluation search plays CartPole, and the report
    names the search as the policy."""
    from seed.learner.configuration import resolve_config
    from seed.learner.learner import Learner

    logdir = str(tmp_path / "run")
    config = resolve_config(dict(preset="cartpole_muzero", logdir=logdir, server_address=f"unix:{logdir}/s",
                                 num_simulations=4, torch_threads=1, training_process=False))
    learner = Learner(config)
    learner.checkpoint()
    learner._close()
    done = seed_eval([f"--logdir={logdir}", "--episodes=2", "--num_envs=2", f"--out={tmp_path / 'eval.json'}"],
                     str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    with open(tmp_path / "eval.json") as f:
        report = json.load(f)
    assert report["episodes"] == 2 and report["agent"] == "muzero"
    assert report["policy"] == ("gumbel search of 4 simulations without root noise, argmax of the improved policy")
    assert all(length >= 8 for length in report["lengths"])  # CartPole ends no episode in fewer than 8 steps


def test_checkpoint_of_another_agent_or_env(untrained, tmp_path):
    path = checkpoint.checkpoint_path(untrained[0])
    done = seed_eval([f"--checkpoint={path}", "--agent=r2d2", "--episodes=1"], str(tmp_path))
    assert done.returncode == 2
    assert "--agent: got 'r2d2'" in done.stderr and "holds agent 'vtrace'" in done.stderr
    assert "expected --agent=vtrace" in done.stderr
    done = seed_eval([f"--checkpoint={path}", "--env=atari:Pong", "--episodes=1"], str(tmp_path))
    assert done.returncode == 2
    assert "--env: got 'atari:Pong'" in done.stderr and f"expected --env={ENV}" in done.stderr


def test_missing_video_extra_and_bad_video_name(untrained, tmp_path):
    logdir = untrained[0]
    hide_imageio = "import sys; sys.modules['imageio'] = None  # as if the video extra were not installed"
    done = seed_eval([f"--logdir={logdir}", "--episodes=1", f"--video={tmp_path / 'x.mp4'}",
                      f"--out={tmp_path / 'e.json'}"], str(tmp_path), preamble=hide_imageio)
    assert done.returncode == 2
    assert "'imageio'" in done.stderr and "pip install 'seed-rl-torch[video]'" in done.stderr
    assert not (tmp_path / "e.json").exists() and not (tmp_path / "x.mp4").exists()
    done = seed_eval([f"--logdir={logdir}", "--episodes=1", f"--video={tmp_path / 'x.avi'}"], str(tmp_path))
    assert done.returncode == 2
    assert "--video: got" in done.stderr and ".mp4 or .gif" in done.stderr


def test_episode_shares():
    assert episode_quotas(7, 3).tolist() == [3, 2, 2]
    assert episode_quotas(2, 8).tolist() == [1, 1]  # never more envs than episodes
    assert episode_quotas(8, 4).tolist() == [2, 2, 2, 2]


def test_video_has_one_frame_per_step_until_the_episode_ends(tmp_path):
    """A 5-step episode of env 0: the reset screen plus 4 steps (the 5th is done) make 5 frames; a screen of
    odd size (21 x 15) is padded to even (22 x 16) for H.264. The GIF holds distinct frames exactly too."""
    for name in ("v.mp4", "v.gif"):
        screens = iter(np.full((21, 15, 3), 40 * i, np.uint8) for i in range(10))
        video = EpisodeVideo(open_video_writer(str(tmp_path / name), 10.0), lambda screens=screens: next(screens))
        video.start()
        for done0 in (False, False, False, False, True, False):
            video.after_step(np.array([done0, False]))
        assert video.frames == 5 and video.finished
        if name.endswith(".mp4"):
            frames = mp4_frames(str(tmp_path / name))
            assert [f.shape for f in frames] == [(22, 16, 3)] * 5
            assert [int(f[5, 5, 0]) for f in frames] == pytest.approx([0, 40, 80, 120, 160], abs=6)
        else:
            import imageio.v3 as iio

            assert iio.imread(str(tmp_path / name), index=None).shape[0] == 5


def test_atari_colour_screen_leaves_observations_alone():
    pytest.importorskip("ale_py")
    from seed.envs.atari import AtariEnv

    watched, plain = AtariEnv("Pong", seed=3), AtariEnv("Pong", seed=3)
    assert np.array_equal(watched.reset(), plain.reset())
    for action in (0, 3, 4, 3):
        screen = watched.render_rgb()
        assert screen.shape == (210, 160, 3) and screen.dtype == np.uint8
        assert np.array_equal(watched.step(action).observation, plain.step(action).observation)


def test_football_smm_painting():
    from seed.envs.football import PITCH_COLOUR, SMM_COLOURS, smm_to_rgb

    planes = np.zeros((3, 4, 16), np.uint8)
    planes[0, 0, 0] = 255  # oldest frame's left player: not painted
    planes[1, 2, 12] = 255  # newest frame: left team
    planes[2, 3, 14] = planes[2, 3, 13] = 255  # ball over a right-team player
    image = smm_to_rgb(planes, scale=2)
    assert image.shape == (6, 8, 3)
    assert (image[0, 0] == PITCH_COLOUR).all()
    assert (image[2:4, 4:6] == SMM_COLOURS[0]).all()
    assert (image[5, 7] == SMM_COLOURS[2]).all()
    with pytest.raises(ValueError, match="expected"):
        smm_to_rgb(np.zeros((3, 4, 5)))


def write_box_checkpoint(logdir: str, observation_shift: float) -> None:
    """An untrained PPO agent on Hopper-v5 with observation normalisation, its statistics set to mean
    `observation_shift` and variance 1 (as if it had seen that many steps), and a policy head that depends on
    the observation, saved as the learner saves it."""
    config = resolve_config({"agent": "ppo", "env": "gym:Hopper-v5", "logdir": logdir, "seed": 3,
                             "use_lstm": False, "normalize_observations": True, "mlp_sizes": "64,64"})
    spec = make_spec(config.env, config.env_options())
    torch.manual_seed(0)
    agent = agent_class(config.agent)(spec, config)
    torch.nn.init.orthogonal_(agent.network.mean.weight, 1.0)
    moments = agent.network.normalizer.moments
    with torch.no_grad():
        moments.mean.fill_(observation_shift)
        moments.var.fill_(1.0)
        moments.count.fill_(1000)
    save_like_the_learner(logdir, agent, vars(config), {"env_frames": 1_000, "train_steps": 1, "episodes": 2})


def test_a_continuous_checkpoint_plays_its_mean_action_with_its_statistics_and_writes_mujoco_video(tmp_path):
    """seed-eval on a Box checkpoint (PPO, Hopper-v5): it plays the squashed Gaussian's mean through the saved
    observation statistics (two checkpoints that differ only there play different episodes from the same seed)
    and records env 0's episode from MuJoCo's off-screen renderer with no display and MUJOCO_GL unset."""
    pytest.importorskip("mujoco", reason="the mujoco extra (pip install -e '.[mujoco]') is not installed")
    reports = []
    for shift in (0.0, 3.0):
        logdir = str(tmp_path / f"shift{shift:g}")
        os.makedirs(logdir)
        write_box_checkpoint(logdir, shift)
        video = ["--video=" + os.path.join(logdir, "hopper.mp4")] if shift == 0.0 else []
        done = seed_eval([f"--logdir={logdir}", "--episodes=1", "--num_envs=1", "--seed=5", *video], cwd=str(tmp_path),
                         preamble="import os; [os.environ.pop(k, None) for k in ('MUJOCO_GL', 'DISPLAY')]")
        assert done.returncode == 0, done.stderr[-3000:]
        with open(os.path.join(logdir, "eval.json")) as f:
            reports.append(json.load(f))
    plain, shifted = reports
    assert (plain["agent"], plain["env"]) == ("ppo", "gym:Hopper-v5")
    assert "the mode" in plain["policy"]
    assert np.isfinite(plain["returns"][0]) and plain["lengths"][0] >= 1
    assert (plain["returns"], plain["lengths"]) != (shifted["returns"], shifted["lengths"])
    assert plain["video"]["frames"] == plain["video"]["episode_length"] == plain["lengths"][0]
    frames = mp4_frames(os.path.join(str(tmp_path / "shift0"), "hopper.mp4"))
    assert len(frames) == plain["lengths"][0] and frames[0].shape == (480, 480, 3)
    assert frames[0].std() > 1.0  # a drawn scene, not a blank buffer
