"""seed-bench: a real short run (learner + actor processes), the transport ceiling, the actor-side baseline,
and the pure helpers (windows, percentiles, configurations, sweeps)."""

import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

from seed.bench import configs, jobs, measure, results, sweep
from seed.bench.actor_side import pack_tensors, unpack_tensors, unpack_unrolls
from tests.conftest import REPO, wait_for

SMOKE_FLAGS = ["--config=fake_mlp", "--num_actors=2", "--envs_per_actor=8", "--batch_size=4",
               "--duration_s=8", "--warmup_s=2", "--noprogress"]  # 4 s once measured no learner frames under load


@pytest.fixture(scope="module")
def smoke_result(tmp_path_factory):
    # Started outside the repository with relative --out and --runs_dir: both resolve against this directory,
    # and the processes seed-bench starts get absolute paths only.
    out_dir = tmp_path_factory.mktemp("bench")
    completed = subprocess.run(
        [sys.executable, "-m", "seed.bench", *SMOKE_FLAGS, "--out=result.json", "--runs_dir=runs"],
        cwd=out_dir, capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr[-3000:]
    with open(out_dir / "result.json") as f:
        return json.load(f), completed.stdout, out_dir


def test_smoke_run_writes_every_key_with_positive_rates(smoke_result):
    result, stdout, out_dir = smoke_result
    missing = [key for key in results.REQUIRED_RESULT_KEYS if key not in result]
    assert not missing, missing
    framework = result["framework"]
    for key in ("env_frames_per_sec", "env_frames_per_sec_learner", "agent_steps_per_sec",
                "round_trip_latency_ms_p50", "round_trip_latency_ms_p99", "learner_latency_ms_p50",
                "inference_batch_size_mean"):
        assert framework[key] is not None and framework[key] > 0, (key, framework[key])
    assert framework["train_steps_per_sec"] is not None
    assert framework["cpu_seconds"]["learner"] > 0 and framework["cpu_seconds"]["actors"] > 0
    assert framework["round_trip_latency_ms_p99"] >= framework["round_trip_latency_ms_p50"]
    # fake:vector has action repeat 1: frames and agent steps agree, and actors and learner roughly agree.
    assert framework["env_frames_per_sec"] == pytest.approx(framework["agent_steps_per_sec"])
    assert framework["env_frames_per_sec_learner"] == pytest.approx(framework["env_frames_per_sec"], rel=0.5)
    assert framework["gpu"] is None or isinstance(framework["gpu"], list)
    config = result["configuration"]
    assert (config["agent"], config["env"], config["num_actors"], config["envs_per_actor"]) == \
        ("vtrace", "fake:vector", 2, 8)
    assert config["cpu_cores"] == os.cpu_count()
    for key in ("network", "devices", "torch", "grpc", "python", "inference_device", "training_device"):
        assert key in config, key
    assert config["training_process"] is True  # V-trace on the CPU trains in its own process by default
    assert result["baselines"] == {"actor_side": None, "transport": None, "env_only": None}
    assert "| framework |" in stdout
    # Every file of the run is under the --runs_dir given relative to where seed-bench started.
    run_dir = framework["run_dir"]
    assert os.path.isabs(run_dir) and run_dir.startswith(str(out_dir / "runs") + os.sep)
    assert sorted(os.listdir(run_dir)) == ["actor0.log", "actor0.stats.jsonl", "actor1.log", "actor1.stats.jsonl",
                                           "learner", "server.log"]
    assert os.path.getsize(os.path.join(run_dir, "learner", "metrics.jsonl")) > 0
    assert f"wrote {out_dir / 'result.json'}" in stdout


def test_transport_ceiling_answers_real_actor_with_zero_actions(tmp_path):
    from seed.actor.loop import Actor
    from seed.bench.transport_ceiling import serve
    from seed.config import ActorConfig
    from seed.envs import make_spec
    from seed.transport.link import ConfigurationError

    address = f"unix:{tmp_path}/ceiling.sock"
    server, service = serve([address], make_spec("fake:vector"), envs_per_actor=16)
    try:
        stats = tmp_path / "actor.jsonl"
        config = ActorConfig(env="fake:vector", envs_per_actor=16, server_address=address, stats_file=str(stats),
                             stats_interval_s=0.2)
        actor = Actor(config)
        thread = threading.Thread(target=actor.run, daemon=True)
        thread.start()
        wait_for(lambda: len(measure.read_jsonl(str(stats))) >= 3, 30, "three stats rows")
        actor.request_stop()
        thread.join(timeout=10)
        rows = measure.read_jsonl(str(stats))
        assert rows[-1]["final"] and rows[-1]["agent_steps"] > 0
        assert rows[-1]["agent_steps"] == 16 * rows[-1]["round_trips"]
        assert service.steps >= rows[-1]["round_trips"] - 1
        # The ceiling checks the handshake like the learner does.
        wrong = Actor(ActorConfig(env="fake:vector", envs_per_actor=4, server_address=address))
        with pytest.raises(ConfigurationError, match="num_envs"):
            wrong.run()
    finally:
        server.stop(grace=0)


def test_actor_side_baseline_measures_frames(tmp_path):
    setup, _ = configs.build_setup("fake_mlp", configs.DEFAULT_CONFIGS,
                                   {"num_actors": 1, "envs_per_actor": 8, "batch_size": 4})
    job = jobs.actor_side_job(setup, str(tmp_path / "actor_side"), duration_s=4)
    result = measure.measure(job, duration_s=4, warmup_s=1, progress=False)
    assert result["env_frames_per_sec"] > 0
    assert result["env_frames_per_sec_learner"] is not None and result["env_frames_per_sec_learner"] > 0
    assert result["round_trip_latency_ms_p50"] > 0  # the actor's local inference time


def test_tensor_packing_round_trip():
    tensors = {"a": torch.arange(6, dtype=torch.float32).view(2, 3), "b": torch.tensor([True, False, True]),
               "c": torch.zeros(0, 4, dtype=torch.uint8), "d": torch.tensor([7], dtype=torch.int64)}
    back = unpack_tensors(pack_tensors(tensors))
    assert set(back) == set(tensors)
    for key, value in tensors.items():
        assert back[key].dtype == value.dtype and torch.equal(back[key], value)


def test_unroll_packing_keeps_every_field():
    from seed.bench.actor_side import pack_unrolls
    from seed.contracts.training import Unroll

    unrolls = [Unroll({"reward": torch.full((5,), float(i)), "observation": torch.zeros(5, 3, dtype=torch.uint8)},
                      {"lstm_h": torch.full((4,), float(i))}, torch.tensor(i)) for i in range(3)]
    back = unpack_unrolls(pack_unrolls(Unroll.stack(unrolls))).unbind()
    assert [int(u.env_id) for u in back] == [0, 1, 2]
    assert torch.equal(back[2].steps["reward"], unrolls[2].steps["reward"])
    assert torch.equal(back[1].initial_state["lstm_h"], unrolls[1].initial_state["lstm_h"])


def test_actor_window_interpolates_counts_and_weights_latency():
    def row(t, steps, samples, count):
        return {"time": t, "agent_steps": steps, "env_frames": 4 * steps, "round_trips": steps // 8,
                "cpu_s": t / 2, "latency_ms": samples, "latency_count": count}

    rows = [row(0.0, 0, [], 0), row(1.0, 800, [1.0] * 10, 100), row(2.0, 1600, [3.0] * 10, 10),
            row(3.0, 2400, [5.0], 1)]
    window = measure.actor_window(rows, start=0.5, end=2.4)
    assert window["seconds"] == pytest.approx(1.9)
    assert window["agent_steps"] == pytest.approx(1520)  # interpolated: 1920 at 2.4 s minus 400 at 0.5 s
    assert window["env_frames"] == pytest.approx(4 * 1520)
    # Rows whose span centre is in the window: the ones written at 1.0 (centre 0.5) and 2.0 (centre 1.5).
    assert sorted(set(window["samples"])) == [1.0, 3.0]
    p50, = measure.weighted_percentiles(window["samples"], window["weights"], (50,))
    assert p50 == 1.0  # the 1 ms window stands for 100 round trips, the 3 ms one for 10
    assert measure.actor_window(rows, start=5.0, end=6.0) is None


def test_weighted_percentiles_match_numpy_for_equal_weights():
    samples = list(np.random.default_rng(0).exponential(size=1001))
    p50, p99 = measure.weighted_percentiles(samples, [1.0] * len(samples), (50, 99))
    assert p50 == pytest.approx(np.percentile(samples, 50), rel=0.01)
    assert p99 == pytest.approx(np.percentile(samples, 99), rel=0.05)


def test_bench_configs_resolve_and_unknown_keys_are_named(tmp_path):
    named = configs.load_bench_configs(configs.DEFAULT_CONFIGS)
    for name in ("fake_mlp", "fake_atari", "cartpole", "pong_vtrace", "pong_r2d2", "r2d2_atari_gpu"):
        assert name in named
    # The shipped file is package data next to the code, not a path into a source checkout's launch/.
    assert configs.DEFAULT_CONFIGS == os.path.join(os.path.dirname(configs.__file__), "configs.yaml")
    with pytest.raises(measure.BenchError, match=r"--bench_configs: got '/nonexistent.yaml', expected an existing"):
        configs.load_bench_configs("/nonexistent.yaml")
    setup, extra = configs.build_setup("fake_mlp", configs.DEFAULT_CONFIGS, {"num_actors": 3})
    assert setup.config.num_actors == 3 and setup.config.envs_per_actor == 64
    assert setup.config.env == "fake:vector" and extra["duration_s"] > 0
    assert setup.description.endswith("(overridden: num_actors=3)"), setup.description  # the result file says so
    path = tmp_path / "configs.yaml"
    path.write_text("broken:\n  env: fake:vector\n  num_actorz: 2\n")
    with pytest.raises(measure.BenchError, match=r"configs.yaml.*num_actorz"):
        configs.build_setup("broken", str(path), {})
    with pytest.raises(measure.BenchError, match="expected one of"):
        configs.build_setup("nope", configs.DEFAULT_CONFIGS, {})
    with pytest.raises(measure.BenchError, match="logdir"):
        configs.build_setup("fake_mlp", configs.DEFAULT_CONFIGS, {"logdir": "/tmp/x"})


def test_network_width_sweep_scales_the_mlp():
    setup, _ = configs.build_setup("fake_mlp", configs.DEFAULT_CONFIGS, {"mlp_sizes": "16,8"})
    points = sweep.sweep_setups(setup, "network_width", [1, 4])
    assert [p.config.mlp_sizes for _, p in points] == ["16,8", "64,32"]
    points = sweep.sweep_setups(setup, "actors", [1, 2])
    assert [p.config.num_actors for _, p in points] == [1, 2]
    assert points[1][1].name == "fake_mlp-actors2"
    points = sweep.sweep_setups(setup, "env_groups", [1, 4])
    assert [(p.config.env_groups, p.config.actor_streams, p.config.envs_per_stream) for _, p in points] == \
        [(1, 4, 64), (4, 16, 16)]
    with pytest.raises(measure.BenchError, match="--env_groups: got 3"):
        sweep.sweep_setups(setup, "env_groups", [3])  # 64 envs per actor do not split into 3 groups


def test_sweep_table_and_plot(smoke_result, tmp_path):
    result, _, _ = smoke_result
    points = [{"value": v, "result": result} for v in (1, 2)]
    table = sweep.sweep_table("actors", points)
    assert table.count("\n") == 3 and "| 2 |" in table
    path = tmp_path / "sweep.png"
    sweep.sweep_plot("actors", points, "test", str(path))
    assert path.stat().st_size > 1000


def test_cli_errors_are_one_line(tmp_path):
    completed = subprocess.run([sys.executable, "-m", "seed.bench", "--config=nope", "--noprogress"],
                               cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert completed.returncode == 1
    assert "seed-bench: --config: got 'nope'" in completed.stderr
    started = time.monotonic()
    completed = subprocess.run([sys.executable, "-m", "seed.bench", "--config=fake_mlp", "--baselines=foo"],
                               cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert completed.returncode == 1 and "--baselines" in completed.stderr
    assert time.monotonic() - started < 30


def _dry_run_commands(tmp_path, *flags):
    script = os.path.join(REPO, "launch", "gpu_check.sh")
    completed = subprocess.run([script, "--dry_run", "--out_dir=gpu", *flags], cwd=tmp_path, capture_output=True,
                               text=True, timeout=60)
    assert completed.returncode == 0, completed.stderr
    return [line[2:].split() for line in completed.stderr.splitlines() if line.startswith("+ ")]


def test_gpu_check_dry_run_prints_every_step_of_the_gpu_path(tmp_path):
    """launch/gpu_check.sh --dry_run --learn: the CUDA tests, the search bench, both benches with their env_only
    ceilings on shipped GPU configurations, MuZero stopped and resumed in one logdir, the 8-minute Pong run with
    evaluation envs, the reports; nothing is written."""
    from seed.presets import PRESETS

    assert subprocess.run(["bash", "-n", os.path.join(REPO, "launch", "gpu_check.sh")]).returncode == 0
    commands = _dry_run_commands(tmp_path, "--learn")
    out_dir = str(tmp_path / "gpu")
    tests = next(c for c in commands if "pytest" in c)
    assert "tests/test_cuda.py" in tests and "tests/test_graph_lock.py" in tests
    search = next(c for c in commands if "search-gpu" in c)
    assert "--batch=16,256" in search and "--simulations=50" in search and "--actions=18" in search
    named = configs.load_bench_configs(configs.DEFAULT_CONFIGS)
    benches = [c for c in commands if c[0] == "seed-bench" and "search-gpu" not in c]
    assert [dict(a[2:].split("=", 1) for a in c[1:] if "=" in a)["name"] for c in benches] == [
        "r2d2_atari_gpu", "pong_vtrace_gpu"]
    for command in benches:
        args = dict(a[2:].split("=", 1) for a in command[1:] if "=" in a)
        assert args["config"] in named and named[args["config"]]["training_device"] == "cuda:0"
        assert args["baselines"] == "env_only" and args["out"] == f"{out_dir}/{args['name']}.json"
    launches = [c for c in commands if "seed.local_launcher" in c]
    muzero = [c for c in launches if "--preset=atari100k_muzero_gpu" in c]
    assert [c[c.index("-k") + 2] for c in muzero] == ["90", "60"]  # timeout -s TERM -k 60 SECONDS
    assert len({next(a for a in c if a.startswith("--logdir=")) for c in muzero}) == 1  # resumed in the same logdir
    learn = [c for c in launches if "--preset=pong_vtrace_gpu" in c]
    assert len(learn) == 1 and learn[0][learn[0].index("-k") + 2] == "480"
    assert PRESETS["pong_vtrace_gpu"]["num_eval_envs"] > 0
    assert any(c[0] == "seed-report" and "--curves" in c for c in commands)
    assert commands[-1][-2:] == ["seed.bench.gpu_check_report", out_dir]
    assert not os.path.exists(out_dir)  # a dry run writes nothing
    # Without --learn the 8-minute run is left out; --only picks steps and refuses unknown ones.
    assert not any("--preset=pong_vtrace_gpu" in c for c in _dry_run_commands(tmp_path))
    only = _dry_run_commands(tmp_path, "--only=muzero_resume")
    assert sum("seed.local_launcher" in c for c in only) == 2 and not any("search-gpu" in c for c in only)
    refused = subprocess.run([os.path.join(REPO, "launch", "gpu_check.sh"), "--dry_run", "--only=nope"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "--only: got 'nope'" in refused.stderr


def test_gpu_check_report_reads_the_steps_results(tmp_path):
    """seed.bench.gpu_check_report on the files the steps write: statuses, the headline numbers against the targets,
    Tracebacks and the resume found in the logs, the evaluation curve and its last score."""
    import json

    from seed.bench import gpu_check_report

    (tmp_path / "steps.tsv").write_text("search_gpu\t0\t31\nmuzero_resume\t1\t170\n")
    (tmp_path / "search_gpu.json").write_text(json.dumps({"machine": {"device": "NVIDIA H200"}, "results": {
        "puct_b256": {"eager": {"search_ms_median": 200.0}, "graphed": {"search_ms_median": 20.0},
                      "evaluation_visit_counts_equal": True},
        "gumbel_b256": {"eager": {"search_ms_median": 210.0}, "graphed": {"search_ms_median": 30.0}}}}))
    (tmp_path / "r2d2_atari_gpu.json").write_text(json.dumps({
        "env_frames_per_sec": 90_000.0, "round_trip_latency_ms_p50": 3.0, "actor_waiting_fraction": 0.3,
        "baselines": {"env_only": {"env_frames_per_sec": 150_000.0}}, "gpu": [{"utilization_pct_mean": 40.0}]}))
    (tmp_path / "muzero_first.log").write_text("Traceback (most recent call last):\n  boom\n")
    (tmp_path / "muzero_resumed.log").write_text("[learner] resumed from /x/checkpoint-00000001.pt: ...\n")
    (tmp_path / "muzero_metrics.jsonl").write_text("\n".join(json.dumps(r) for r in [
        {"train_steps_per_sec": 0.0, "env_frames_per_sec": 5000.0},
        {"train_steps_per_sec": 6.0, "env_frames_per_sec": 300.0, "inference/sink_ms": 150.0,
         "experience/ratio_wait_ms": 140.0},
        {"train_steps_per_sec": 8.0, "env_frames_per_sec": 400.0, "inference/sink_ms": 130.0,
         "experience/ratio_wait_ms": 120.0}]))
    (tmp_path / "learn_metrics.jsonl").write_text("\n".join(json.dumps(r) for r in [
        {"time_s": 10, "env_frames": 1e6, "eval/return_running_mean_100": None},
        {"time_s": 20, "env_frames": 2e6, "eval/return_running_mean_100": -20.0},
        {"time_s": 480, "env_frames": 3e7, "eval/return_running_mean_100": 18.5}]))
    assert gpu_check_report.main([str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps"] == [{"step": "search_gpu", "exit_code": 0, "seconds": 31},
                                {"step": "muzero_resume", "exit_code": 1, "seconds": 170}]
    assert summary["r2d2_atari_gpu"]["fraction_of_ceiling"] == pytest.approx(0.6)
    assert summary["pong_vtrace_gpu"] is None  # no file: not measured, never guessed
    muzero = summary["muzero_resume"]
    assert muzero["tracebacks"] == 1 and muzero["resumed"] and muzero["rows_while_training"] == 2
    assert muzero["train_steps_per_sec"] == pytest.approx(7.0) and muzero["inference_sink_ms"] == pytest.approx(140.0)
    assert summary["learn"]["final_score"] == 18.5 and summary["learn"]["reached_target_at"]["time_s"] == 480
    assert [p["score"] for p in summary["learn"]["curve"]] == [-20.0, 18.5]
    report = (tmp_path / "report.md").read_text()
    assert "| search, 256 trees, puct (graphed, ms) | 20.0 | <= 25 | met |" in report
    assert "| search, 256 trees, gumbel (graphed, ms) | 30.0 | <= 25 | missed |" in report
    assert "| r2d2_atari_gpu FPS / ceiling | 0.60 | >= 0.70 | missed |" in report
    assert "| muzero Tracebacks (both runs) | 1 | 0 | missed |" in report
    assert gpu_check_report.main([str(tmp_path / "absent")]) == 2


def test_env_speed_counts_agent_steps_and_env_frames():
    from seed.bench.env_speed import measure

    result = measure("fake:atari", num_envs=2, processes=2, duration_s=1.0)
    assert result["agent_steps_per_sec"] > 0
    # fake:atari repeats each action 4 frames; both processes stepped (2 x 2 envs, 100-step episodes).
    assert result["env_frames_per_sec"] == pytest.approx(4 * result["agent_steps_per_sec"], rel=1e-3)
    assert result["processes"] == 2 and result["cores_used"] > 0


def _exits_like_a_failed_import(index, *args):
    """An env_speed worker that dies before reporting, as one whose imports fail in the child does."""
    import os

    os._exit(7)


def test_env_speed_fails_at_once_naming_a_worker_that_died():
    from seed.bench.env_speed import EnvSpeedError, measure

    started = time.monotonic()
    with pytest.raises(EnvSpeedError, match=r"env_speed worker 0 \(pid \d+, --env=fake:vector, env ids 0..1\) "
                                            r"exited with code 7 without a result"):
        measure("fake:vector", num_envs=2, processes=1, duration_s=60.0, target=_exits_like_a_failed_import)
    assert time.monotonic() - started < 30  # not duration_s + 300 s
    # A worker whose own code raises reports the error itself (here: the env family cannot be built).
    with pytest.raises(EnvSpeedError, match=r"env_speed worker [01] .* failed: ValueError: --env: got 'nope:x'"):
        measure("nope:x", num_envs=2, processes=2, duration_s=60.0)
    assert time.monotonic() - started < 60


def test_env_only_baseline_steps_the_actors_envs_without_a_server(tmp_path):
    setup, _ = configs.build_setup("fake_mlp", configs.DEFAULT_CONFIGS,
                                   {"num_actors": 2, "envs_per_actor": 8, "env_groups": 2})
    job = jobs.env_only_job(setup, str(tmp_path / "env_only"), duration_s=4)
    assert job.server_cmd is None and len(job.actor_cmds) == 2
    assert "--actor_index=1" in job.actor_cmds[1] and "--envs_per_actor=8" in job.actor_cmds[1]
    result = measure.measure(job, duration_s=4, warmup_s=1, progress=False)
    assert result["env_frames_per_sec"] > 0 and result["actors_measured"] == 2
    assert result["actor_waiting_fraction"] == 0.0  # nothing to wait for
    assert result["cpu_seconds"]["learner"] is None and result["cpu_seconds"]["actors"] > 0
    assert result["env_frames_per_sec_learner"] is None


BOX_ENV = "gym:Pendulum-v1"  # one action in [-2, 2]


def test_box_specs_give_random_actions_in_their_bounds_and_zero_actions_in_the_wire_dtype():
    from seed.envs.base import EnvSpec

    box = EnvSpec("fake:box", (3,), "float32", 0, action_shape=(2,), action_low=(-1.0, 0.0), action_high=(1.0, 4.0))
    actions = box.random_actions(np.random.default_rng(0), 500)
    assert actions.dtype == np.float32 and actions.shape == (500, 2)
    assert (actions >= [-1.0, 0.0]).all() and (actions <= [1.0, 4.0]).all() and actions[:, 1].max() > 3.5
    assert box.zero_actions(3).shape == (3, 2) and box.zero_actions(3).dtype == np.float32
    discrete = EnvSpec("fake:d", (3,), "float32", 6)
    indices = discrete.random_actions(np.random.default_rng(0), 500)
    assert indices.dtype == np.int32 and set(indices.tolist()) == set(range(6))
    assert discrete.zero_actions(3).tolist() == [0, 0, 0] and discrete.zero_actions(3).dtype == np.int32


def test_env_speed_steps_a_box_env():
    from seed.bench.env_speed import step_randomly
    from seed.envs import make_batch

    batch = make_batch(BOX_ENV, 2, 0)
    steps = iter(range(50))
    counts = step_randomly(batch, 0, lambda: next(steps, None) is not None)
    batch.close()
    assert counts["agent_steps"] == 100


def test_transport_ceiling_and_actor_side_baseline_run_a_box_env(tmp_path):
    """The ceiling answers a real actor on a Box env with float32 zero actions; the actor-side baseline acts and
    trains V-trace's tanh-Gaussian policy on it."""
    from seed.actor.loop import Actor
    from seed.bench.transport_ceiling import serve
    from seed.config import ActorConfig
    from seed.envs import make_spec

    address = f"unix:{tmp_path}/ceiling.sock"
    server, service = serve([address], make_spec(BOX_ENV), envs_per_actor=2)
    try:
        stats = tmp_path / "actor.jsonl"
        actor = Actor(ActorConfig(env=BOX_ENV, envs_per_actor=2, server_address=address, stats_file=str(stats),
                                  stats_interval_s=0.2))
        thread = threading.Thread(target=actor.run, daemon=True)
        thread.start()
        wait_for(lambda: len(measure.read_jsonl(str(stats))) >= 3, 30, "three stats rows")
        actor.request_stop()
        thread.join(timeout=10)
        assert measure.read_jsonl(str(stats))[-1]["agent_steps"] > 0 and service.steps > 0
    finally:
        server.stop(grace=0)
    setup, _ = configs.build_setup("fake_mlp", configs.DEFAULT_CONFIGS,
                                   {"env": BOX_ENV, "num_actors": 1, "envs_per_actor": 4, "batch_size": 2})
    result = measure.measure(jobs.actor_side_job(setup, str(tmp_path / "actor_side"), duration_s=4), duration_s=4,
                             warmup_s=1, progress=False)
    assert result["env_frames_per_sec"] > 0 and result["env_frames_per_sec_learner"] > 0
