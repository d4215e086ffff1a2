"""`seed-eval`: plays a checkpoint's evaluation policy for N episodes and reports the returns.

    seed-eval --logdir=logs/vtrace-gym-CartPole-v1 --episodes=20
    seed-eval --checkpoint=/data/run1/checkpoint.pt --episodes=30 --num_envs=8 --video=pong.mp4
    seed-eval --logdir=logs/vtrace-atari-Pong --eval_greedy --out=pong-greedy.json

Everything about the run comes from the checkpoint: its saved learner configuration rebuilds the env spec and
the agent (keys this version does not know are ignored with a warning), and its parameters are loaded into
the agent's network. Checkpoints are read with `torch.load(weights_only=True)` (seed/runtime/checkpoint.py `read`), so
a downloaded one cannot run code: one that holds other Python objects is refused. The policy is the agent's
`evaluation_act` (V-trace: a sample from the policy, or its argmax with `--eval_greedy`; R2D2: epsilon-greedy
with the checkpoint's `eval_epsilon`; MuZero: the checkpoint's search without root noise, its most visited action
(pUCT) or the argmax of its improved policy (Gumbel)).

`--num_envs` envs are stepped together in this process, one batched forward pass per agent step, with each
env's agent state kept like the learner keeps it (done=True on the first step and after every episode end,
so the network resets its LSTM state and frame stack). Env k plays a fixed share of the `--episodes`
(N // M, plus one for the first N mod M envs): counting the first N episodes to finish would favour short
ones. Envs are seeded from `--seed` (default: the checkpoint's seed + EVAL_SEED_OFFSET, so evaluation
episodes differ from the training ones).

Returns are raw episode returns (the env's score: game points for Atari, goals for Football), the sum of
`StepResult.raw_reward`; `shaped_returns` are the sums of the rewards the agent trained on. Lengths are in
agent steps, `frames` in env frames (agent steps x action repeat). Atari results also get human-normalised
scores, (score - random) / (human - random).

The JSON report (`--out`, default `<logdir>/eval.json`) holds the summary, the per-episode values, the
checkpoint's path and counters, agent, env, seed and wall time. `--video=FILE.mp4|.gif` records env 0's first
episode (needs the `video` extra: `pip install 'seed-rl-torch[video]'`). `--wandb_project` also logs the summary
and the video to a Weights & Biases run (job type eval, grouped with the learner's run by the logdir's name, at the
checkpoint's env frames; seed/metrics/wandb_sink.py). User errors exit with status 2.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
from absl import app, flags

from seed.config import LearnerConfig, define_flags, explicit_flags, learner_config_class
from seed.metrics.wandb_sink import check_wandb_mode
from seed.runtime.quick_exit import freeze_objects_at_exit

EVAL_SEED_OFFSET = 1_000_000  # eval env k uses seed + k; training envs use seed + env id < num_envs
VIDEO_EXTENSIONS = (".mp4", ".gif")
VIDEO_INSTALL_HINT = "pip install 'seed-rl-torch[video]' (or: pip install imageio imageio-ffmpeg pygame)"


class UserError(Exception):
    """A problem with what the user asked for; seed-eval prints it and exits with status 2."""


def _flag(default: Any, help: str) -> Any:  # noqa: A002 - mirrors absl's naming
    return dataclasses.field(default=default, metadata={"help": help})


@dataclasses.dataclass
class EvalConfig:
    logdir: str = _flag("", "Evaluate the latest checkpoint of this learner logdir.")
    checkpoint: str = _flag("", "Evaluate this checkpoint file instead (overrides --logdir's checkpoint). Read "
                                "with torch.load(weights_only=True): a file holding other Python objects than "
                                "tensors, NumPy arrays and plain data is refused, never run.")
    episodes: int = _flag(10, "Episodes to play, shared out over the envs.")
    num_envs: int = _flag(4, "Envs stepped together in this process (at most --episodes are used).")
    seed: int = _flag(-1, f"Seeds envs (env k: seed + k), torch and NumPy; -1 = the checkpoint's seed + "
                          f"{EVAL_SEED_OFFSET:,}.")
    eval_greedy: bool = _flag(False, "V-trace: play the policy's argmax instead of sampling; default: the "
                                     "checkpoint's --eval_greedy.")
    agent: str = _flag("", "If set, the checkpoint must hold this agent (vtrace or r2d2).")
    env: str = _flag("", "If set, the checkpoint must have been trained on this env (e.g. atari:Pong).")
    out: str = _flag("", "JSON report; default <logdir>/eval.json (the checkpoint's directory with --checkpoint).")
    video: str = _flag("", "Record env 0's first episode to this .mp4 or .gif file ('' = no video).")
    video_fps: float = _flag(30.0, "Frames per second of the video (one frame per agent step).")
    device: str = _flag("cpu", "Device for the network: cpu or cuda:N.")
    wandb_project: str = _flag("", "Weights & Biases: log the summary and the video to this project ('' = off; "
                                   "needs the wandb extra).")
    wandb_entity: str = _flag("", "Weights & Biases: the team or user owning --wandb_project ('' = your default).")
    wandb_mode: str = _flag("online", "Weights & Biases: online, offline or disabled.")


# ----------------------------------------------------------------------------------------------- checkpoint


def load_checkpoint(logdir: str, path: str = "") -> tuple[str, dict[str, Any]]:
    """(path, checkpoint dict) of `path`, or else of `logdir`'s latest checkpoint (seed.runtime.checkpoint).

    The one place that knows how checkpoints are found; errors list what the logdir holds instead. Files are
    read by `checkpoint.read` (torch.load weights_only=True): a file that holds Python objects beyond tensors,
    NumPy arrays and plain data is refused without running any of it.
    """
    from seed.runtime import checkpoint

    if path:
        if not os.path.isfile(path):
            raise UserError(f"--checkpoint: got {path!r}, expected an existing checkpoint file")
        try:
            return path, checkpoint.read(path)
        except checkpoint.UnsafeCheckpoint as error:
            raise UserError(f"--checkpoint: refused: {error}") from None
        except Exception as error:  # a truncated or foreign file: say which, without a traceback
            raise UserError(f"--checkpoint: {path!r} cannot be read as a checkpoint ({error})") from None
    if not logdir:
        raise UserError("--logdir or --checkpoint: got neither, expected a learner logdir or a checkpoint file")
    if not os.path.isdir(logdir):
        raise UserError(f"--logdir: got {logdir!r}, expected an existing learner logdir")
    found = checkpoint.latest(logdir)  # the newest checkpoint that loads (a corrupt newer one is skipped)
    if found is None:
        listing = ", ".join(sorted(os.listdir(logdir))) or "nothing"
        raise UserError(f"--logdir: {logdir!r} holds no loadable checkpoint (expected checkpoint-<n>.pt files); "
                        f"found: {listing}")
    return found


def learner_config(saved: dict[str, Any], source: str) -> LearnerConfig:
    """The configuration saved in a checkpoint, as its agent's class (`learner_config_class`). Keys this version
    does not know are dropped with a warning, other agents' fields (saved by versions with one configuration
    for all agents) silently; fields the checkpoint lacks keep their defaults."""
    from seed.agents import registry
    from seed.learner.configuration import learner_fields

    try:
        config_class = learner_config_class(registry.agent_class(saved.get("agent", LearnerConfig.agent)))
    except ValueError as error:
        raise UserError(f"checkpoint {source}: {error}") from None
    names = {f.name for f in dataclasses.fields(config_class)}
    unknown = sorted(set(saved) - set(learner_fields()))
    if unknown:
        print(f"seed-eval: warning: ignoring configuration keys of {source} that this version does not know: "
              f"{unknown}", file=sys.stderr)
    return config_class(**{key: value for key, value in saved.items() if key in names})


def check_checkpoint(state: dict[str, Any], path: str, agent: str, env: str) -> LearnerConfig:
    """The checkpoint's configuration, after checking its layout and that it matches `agent`/`env` if given."""
    missing = [key for key in ("agent", "config") if key not in state]
    if missing:
        raise UserError(f"checkpoint {path}: has keys {sorted(state)}, expected at least 'agent' and 'config' "
                        f"(missing {missing})")
    config = learner_config(state["config"], path)
    for name, wanted, saved in (("agent", agent, config.agent), ("env", env, config.env)):
        if wanted and wanted != saved:
            raise UserError(f"--{name}: got {wanted!r}, but checkpoint {path} holds agent {config.agent!r} "
                            f"trained on env {config.env!r}; expected --{name}={saved} or no --{name}")
    return config


# ----------------------------------------------------------------------------------------------- episodes


@dataclasses.dataclass(frozen=True)
class Episode:
    """One finished evaluation episode of env `env_index`."""

    env_index: int
    raw_return: float  # the env's score (game points, goals)
    shaped_return: float  # sum of the rewards the agent trained on
    length: int  # agent steps
    frames: int  # env frames
    truncated: bool


def episode_quotas(episodes: int, num_envs: int) -> np.ndarray:
    """Episodes per env, int64 [min(num_envs, episodes)]: N // M each, one more for the first N mod M envs."""
    envs = min(num_envs, episodes)
    return np.array([episodes // envs + (k < episodes % envs) for k in range(envs)], np.int64)


def play(agent: Any, env_batch: Any, quotas: np.ndarray, device: Any, video: EpisodeVideo | None = None
         ) -> list[Episode]:
    """Plays `agent.evaluation_act` on the M envs of `env_batch` until env k has finished `quotas[k]` episodes.

    Feeds the network what the learner feeds it: done=True and reward 0 on the first step, then each step's
    reward and done (done: the observation is a new episode's first), and the previous action. `video` is
    started after the reset and sees each step's done flags [M]. Returns the episodes in the order they
    finished.
    """
    import torch

    from seed.contracts import InferenceBatch
    from seed.contracts.storage import to_torch

    m = env_batch.num_envs
    network = agent.network.to(device).eval()
    state = {key: value.to(device) for key, value in agent.initial_state(m).items()}
    env_ids = torch.arange(m, device=device)
    observation = env_batch.reset()
    if video is not None:
        video.start()
    reward = np.zeros(m, np.float32)
    done = np.ones(m, bool)
    spec = env_batch.spec  # actions: int64 [M] (Discrete) or float32 [M, D] (Box)
    prev_action = np.zeros((m, *spec.action_shape), spec.batch_action_dtype)
    remaining = quotas.copy()
    episodes: list[Episode] = []
    while remaining.any():
        batch = InferenceBatch(env_ids, to_torch(observation).to(device), torch.from_numpy(reward).to(device),
                               torch.from_numpy(done).to(device), torch.from_numpy(prev_action).to(device))
        with torch.no_grad():
            out = agent.evaluation_act(network, batch, state)
        state = out.state
        actions = out.action.cpu().numpy().astype(spec.batch_action_dtype)
        step = env_batch.step(actions)
        for stats in step.finished:
            if remaining[stats.env_index] > 0:
                remaining[stats.env_index] -= 1
                episodes.append(Episode(stats.env_index, stats.raw_return, stats.episode_return, stats.steps,
                                        stats.frames, stats.truncated))
        if video is not None:
            video.after_step(step.done)
        observation, reward, done, prev_action = step.observation, step.reward, step.done, actions
    return episodes


# ----------------------------------------------------------------------------------------------- video


def check_video(path: str, fps: float) -> None:
    """Checks `--video` and `--video_fps` and that the video extra is installed (a UserError naming the missing
    package otherwise), before anything is played."""
    extension = os.path.splitext(path)[1].lower()
    if extension not in VIDEO_EXTENSIONS:
        raise UserError(f"--video: got {path!r}, expected a file name ending in {' or '.join(VIDEO_EXTENSIONS)}")
    if fps <= 0:
        raise UserError(f"--video_fps: got {fps}, expected > 0")
    packages = ["imageio"] + (["imageio_ffmpeg"] if extension == ".mp4" else [])
    for package in packages:
        try:
            __import__(package)
        except ImportError as error:
            raise UserError(f"--video: needs the Python package {package.replace('_', '-')!r} of the video extra, "
                            f"which is not installed ({error}); install it with {VIDEO_INSTALL_HINT}") from None


def open_video_writer(path: str, fps: float) -> Any:
    """An imageio writer for `path` (checked by `check_video`): .mp4 is H.264 through imageio-ffmpeg, .gif
    goes through Pillow."""
    import imageio.v2 as imageio

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if path.lower().endswith(".mp4"):
        # macro_block_size=1: no resizing; frames are padded to even sizes instead (yuv420p needs them).
        return imageio.get_writer(path, format="FFMPEG", mode="I", fps=fps, codec="libx264", macro_block_size=1,
                                  pixelformat="yuv420p", ffmpeg_log_level="error")
    return imageio.get_writer(path, mode="I", duration=1000.0 / fps, loop=0)


class EpisodeVideo:
    """Records env 0's first episode: one frame per agent step, the screen the agent acted on (the reset
    screen, then the screen after every step but the one that ends the episode). An episode of L agent steps
    gives exactly L frames in an MP4 (a GIF encoder merges identical consecutive frames, so it may hold fewer).

    Args:
      writer: from `open_video_writer`.
      render: () -> uint8 [H, W, 3], env 0's current screen (the env's `render_rgb`).
    """

    def __init__(self, writer: Any, render: Callable[[], np.ndarray]):
        self.writer = writer
        self.render = render
        self.frames = 0
        self.finished = False

    def start(self) -> None:
        """Adds the reset screen; call right after the env batch's reset."""
        self._add()

    def _add(self) -> None:
        frame = np.asarray(self.render(), np.uint8)
        if frame.ndim != 3 or frame.shape[-1] != 3:
            raise RuntimeError(f"render_rgb: got a frame of shape {frame.shape}, expected [H, W, 3]")
        pad = ((0, frame.shape[0] % 2), (0, frame.shape[1] % 2), (0, 0))  # H.264 in yuv420p needs even sizes
        self.writer.append_data(np.pad(frame, pad) if any(p[1] for p in pad[:2]) else frame)
        self.frames += 1

    def after_step(self, done: np.ndarray) -> None:
        if self.finished:
            return
        if done[0]:  # env 0 has already been reset: its screen shows the next episode
            self.close()
        else:
            self._add()

    def close(self) -> None:
        if not self.finished:
            self.finished = True
            self.writer.close()


def env_renderer(env_batch: Any) -> Callable[[], np.ndarray]:
    """env 0's `render_rgb`, or a UserError if the env family cannot render RGB frames."""
    envs = getattr(env_batch, "envs", None)
    render = getattr(envs[0], "render_rgb", None) if envs else None
    if render is None:
        raise UserError(f"--video: env {env_batch.spec.name} cannot render RGB frames, expected an env whose family's "
                        "envs have render_rgb() (envs/__init__.py)")
    return render


# ----------------------------------------------------------------------------------------------- report


def summarize(episodes: list[Episode]) -> dict[str, Any]:
    """Mean / median / min / max / std of the raw returns, and the per-episode values."""
    returns = np.array([e.raw_return for e in episodes], np.float64)
    return {
        "episodes": len(episodes),
        "return_mean": float(returns.mean()),
        "return_median": float(np.median(returns)),
        "return_min": float(returns.min()),
        "return_max": float(returns.max()),
        "return_std": float(returns.std()),
        "returns": returns.tolist(),
        "shaped_returns": [e.shaped_return for e in episodes],
        "lengths": [e.length for e in episodes],
        "frames": [e.frames for e in episodes],
        "truncated": [e.truncated for e in episodes],
        "env_indices": [e.env_index for e in episodes],
    }


def human_normalized(env: str, returns: list[float], settings: dict[str, Any]) -> dict[str, Any] | None:
    """Mean and median human-normalised score, (return - random) / (human - random), of the returns; None for a
    family without reference scores or an env without them (printed). `settings`: the checkpoint's configuration."""
    from seed import envs

    try:
        reference = envs.reference_scores(env, settings)
    except (ValueError, KeyError, OSError) as error:
        print(f"seed-eval: no human-normalised score: {error}", file=sys.stderr)
        return None
    if reference is None:
        return None
    human, random = reference
    scores = (np.asarray(returns, np.float64) - random) / (human - random)
    return {"mean": float(scores.mean()), "median": float(np.median(scores)), "human": human, "random": random,
            "scores": scores.tolist()}


def policy_description(config: LearnerConfig) -> str:
    """How the checkpoint's agent picks actions when it evaluates, in words (the agent says)."""
    return type(config).agent_class.evaluation_policy(config)


def evaluate(options: EvalConfig, explicit: set[str]) -> dict[str, Any]:
    """Loads the checkpoint, plays the episodes, writes the video; returns the report. `explicit`: the flags
    the user typed (an untyped --eval_greedy keeps the checkpoint's)."""
    import torch

    from seed.contracts.agent import check_action_space
    from seed.envs import evaluation_options, make_batch, make_spec

    if options.episodes < 1:
        raise UserError(f"--episodes: got {options.episodes}, expected >= 1")
    if options.num_envs < 1:
        raise UserError(f"--num_envs: got {options.num_envs}, expected >= 1")
    if not (options.device == "cpu" or options.device.startswith("cuda")):
        raise UserError(f"--device: got {options.device!r}, expected cpu or cuda:N")
    if options.wandb_project and check_wandb_mode(options.wandb_mode):
        raise UserError(check_wandb_mode(options.wandb_mode))
    path, state = load_checkpoint(options.logdir, options.checkpoint)
    config = check_checkpoint(state, path, options.agent, options.env)
    try:  # the checkpoint's env as this installation knows it (a renamed game, a plug-in family not loaded)
        spec = make_spec(config.env, config.env_options())
        env_options = {**config.env_options(), **evaluation_options(config.env)}
    except ValueError as error:
        raise UserError(f"checkpoint {path}: {error}") from None
    if "eval_greedy" in explicit:
        if "eval_greedy" not in {f.name for f in dataclasses.fields(config)}:
            raise UserError(f"--eval_greedy: got {options.eval_greedy} for a checkpoint of --agent={config.agent}, "
                            "which has no such setting; expected an agent that samples a policy (vtrace, ppo)")
        config.eval_greedy = options.eval_greedy
    seed = options.seed if options.seed >= 0 else config.seed + EVAL_SEED_OFFSET
    if options.video:
        check_video(options.video, options.video_fps)
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    env_options.update(seed=seed, render_rgb=bool(options.video))
    try:
        check_action_space(type(config).agent_class, spec, config.agent)
    except ValueError as error:
        raise UserError(str(error)) from None
    agent = type(config).agent_class(spec, config)
    agent.load_state_dict(state["agent"])
    quotas = episode_quotas(options.episodes, options.num_envs)
    env_batch = make_batch(config.env, len(quotas), 0, env_options)
    start = time.monotonic()
    video = None
    try:
        if options.video:
            render = env_renderer(env_batch)
            video = EpisodeVideo(open_video_writer(options.video, options.video_fps), render)
        episodes = play(agent, env_batch, quotas, torch.device(options.device), video)
    finally:
        if video is not None:
            video.close()
        env_batch.close()
    wall_time_s = time.monotonic() - start
    report = {
        "schema": "seed-eval/1",
        "checkpoint": os.path.abspath(path),
        "counters": dict(state.get("counters", {})),
        "agent": config.agent,
        "env": config.env,
        "policy": policy_description(config),
        "seed": seed,
        "num_envs": len(quotas),
        **summarize(episodes),
        "human_normalized": None,
        "env_frames_played": int(sum(e.frames for e in episodes)),
        "wall_time_s": round(wall_time_s, 3),
        "video": None,
    }
    report["human_normalized"] = human_normalized(config.env, report["returns"], dataclasses.asdict(config))
    if video is not None:
        first = next(e for e in episodes if e.env_index == 0)
        report["video"] = {"path": os.path.abspath(options.video), "frames": video.frames,
                           "episode_length": first.length, "episode_return": first.raw_return,
                           "fps": options.video_fps}
    return report


def default_out(options: EvalConfig) -> str:
    if options.out:
        return options.out
    directory = os.path.dirname(os.path.abspath(options.checkpoint)) if options.checkpoint else options.logdir
    return os.path.join(directory, "eval.json")


def summary_line(report: dict[str, Any]) -> str:
    counters = report["counters"]
    frames = counters.get("env_frames")
    line = (f"seed-eval: {report['episodes']} episodes of {report['env']} ({report['agent']}, "
            f"{report['policy']}; checkpoint at {frames:,} env frames): " if frames is not None else
            f"seed-eval: {report['episodes']} episodes of {report['env']} ({report['agent']}, {report['policy']}): ")
    line += (f"return mean {report['return_mean']:.2f} median {report['return_median']:.2f} "
             f"min {report['return_min']:.2f} max {report['return_max']:.2f}")
    if report["human_normalized"] is not None:
        line += (f"; human-normalised mean {report['human_normalized']['mean']:.3f} "
                 f"median {report['human_normalized']['median']:.3f}")
    return line + f" ({report['wall_time_s']:.1f} s)"


def log_to_wandb(options: EvalConfig, report: dict[str, Any]) -> None:
    """--wandb_project: the evaluation's settings, its summary numbers (eval/return_mean, ...) and the video in a
    W&B run at the checkpoint's env frames. A W&B failure is one warning (seed/metrics/sinks.py), not an error:
    the report is already written."""
    from seed.metrics.recording import MetricsWriter
    from seed.metrics.sinks import SinkSettings

    logdir = options.logdir or os.path.dirname(os.path.abspath(options.checkpoint))
    wandb_flags = {"wandb_project": options.wandb_project, "wandb_entity": options.wandb_entity,
                   "wandb_mode": options.wandb_mode}
    writer = MetricsWriter.open(SinkSettings(logdir, wandb_flags, job_type="eval"), ["wandb"])
    step = int(report["counters"].get("env_frames", 0))
    writer.write_config({**dataclasses.asdict(options), **{key: report[key] for key in
                                                           ("checkpoint", "agent", "env", "policy", "seed")}})
    row = {f"eval/{key}": report[key] for key in ("episodes", "return_mean", "return_median", "return_min",
                                                  "return_max", "return_std", "wall_time_s")}
    if report["human_normalized"] is not None:
        row["eval/human_normalized_mean"] = report["human_normalized"]["mean"]
    writer.write({**row, "env_frames": step})
    if report["video"] is not None:
        writer.write_video(report["video"]["path"], step)
    writer.close()


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    values = {f.name: flags.FLAGS[f.name].value for f in dataclasses.fields(EvalConfig)}
    options = EvalConfig(**values)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*pkg_resources.*")  # pygame's, when gym envs render
            report = evaluate(options, set(explicit_flags(EvalConfig, flags.FLAGS)))
    except UserError as error:
        print(f"seed-eval: {error}", file=sys.stderr)
        sys.exit(2)
    out = default_out(options)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(report, f, indent=2)
    print(summary_line(report))
    print(f"seed-eval: wrote {os.path.abspath(out)}" +
          (f" and {report['video']['path']} ({report['video']['frames']} frames)" if report["video"] else ""))
    if options.wandb_project:
        log_to_wandb(options, report)


def run() -> None:
    freeze_objects_at_exit()
    define_flags(EvalConfig)
    app.run(main)


if __name__ == "__main__":
    run()
