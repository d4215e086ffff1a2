"""seed-report: the cost arithmetic (paper Tables 4 and 5), the shipped price tables (current and the paper's),
device-name matching, pricing errors, and the CLI on a seed-bench result."""

import json
import os
import subprocess
import sys

import pytest

from seed.bench import pricing as prices
from seed.bench import report

PRICING = prices.table_path("paper")
H100 = "NVIDIA H100 80GB HBM3"  # as nvidia-smi names it


@pytest.fixture
def pricing():
    return prices.resolve_pricing("paper")


@pytest.fixture
def current():
    return prices.resolve_pricing("current")


def test_paper_table_has_the_papers_prices(pricing):
    assert pricing.cpu_core == 0.0475
    assert pricing.accelerator_price("P100") == 1.46
    assert pricing.accelerator_price("TPU v3 core") == 1.00
    assert pricing.accelerator_price("Tesla P100-PCIE-16GB") == 1.46  # matched inside a driver's device name


def test_cost_arithmetic_by_hand(pricing):
    # 55 CPUs and one P100 at 67,000 env frames per second.
    hourly = report.cost_per_hour(55, {"P100": 1}, pricing)
    assert hourly == pytest.approx(55 * 0.0475 + 1.46)  # 4.0725 $/h
    per_billion = report.cost_per_billion_frames(hourly, 67_000)
    assert per_billion == pytest.approx(4.0725 / (67_000 * 3600) * 1e9)  # $16.88
    assert per_billion == pytest.approx(16.884, abs=1e-3)
    # CPU only: 2 cores at 50,000 FPS.
    assert report.cost_per_billion_frames(report.cost_per_hour(2, {}, pricing), 50_000) == \
        pytest.approx(2 * 0.0475 / (50_000 * 3600) * 1e9)
    # 8 TPU v3 cores and 213 CPUs (the paper's Atari R2D2 SEED row): 0.0475 * 213 + 8 = 18.12 $/h.
    assert report.cost_per_hour(213, {"TPU v3 core": 8}, pricing) == pytest.approx(18.1175)
    with pytest.raises(ValueError, match="fps"):
        report.cost_per_billion_frames(1.0, 0)


def test_missing_device_price_names_the_device_and_the_file(pricing):
    with pytest.raises(prices.PricingError) as error:
        report.cost_per_hour(16, {"NVIDIA H100 80GB HBM3": 1}, pricing)
    message = str(error.value)
    assert "NVIDIA H100 80GB HBM3" in message and PRICING in message and "P100" in message
    assert "paper price table" in message and "--pricing=current" in message


def test_malformed_pricing_is_an_error(tmp_path):
    path = tmp_path / "pricing.yaml"
    path.write_text("accelerators:\n  P100: 1.46\n")
    with pytest.raises(prices.PricingError, match="cpu_core"):
        prices.load_pricing(str(path))
    path.write_text("cpu_core: 0.05\naccelerators:\n  P100: cheap\n")
    with pytest.raises(prices.PricingError, match="accelerators.P100"):
        prices.load_pricing(str(path))


def _result(name, fps, cores=2, accelerators=None, baselines=None):
    return {"schema": "seed-bench/1", "name": name, "description": "", "env_frames_per_sec": fps,
            "configuration": {"num_actors": 4, "num_envs": 256,
                              "devices": {"cpu_cores": cores, "accelerators": accelerators or {}}},
            "baselines": baselines or {"actor_side": None, "transport": None}}


def test_rows_ratios_and_table(pricing, tmp_path):
    paths = []
    for result in (_result("seed", 30_000, baselines={"actor_side": {"env_frames_per_sec": 15_000},
                                                      "transport": {"env_frames_per_sec": 60_000}}),
                   _result("gpu", 67_000, cores=55, accelerators={"Tesla P100-PCIE-16GB": 1})):
        paths.append(tmp_path / f"{result['name']}.json")
        paths[-1].write_text(json.dumps(result))
    rows = report.price_rows(report.load_rows([str(p) for p in paths]), pricing, baseline="seed/actor_side")
    by_name = {r.name: r for r in rows}
    assert list(by_name) == ["seed", "seed/actor_side", "seed/transport", "gpu"]
    assert by_name["seed"].ratio == pytest.approx(2.0)
    assert by_name["gpu"].cost_per_billion == pytest.approx(16.884, abs=1e-3)
    table = report.markdown_table(rows, pricing, "seed/actor_side")
    assert "| gpu | 1 x Tesla P100-PCIE-16GB | 4 | 55 | 256 | 67,000 | $4.072 | $16.88 | 4.47x |" in table
    with pytest.raises(ValueError, match="--baseline"):
        report.price_rows(rows, pricing, baseline="nope")


def test_current_table_prices_todays_devices_by_their_driver_names(current):
    assert current.name == "current" and current.as_of and "Google Cloud" in current.source
    assert current.cpu_core == pytest.approx(0.0486)
    expected = {H100: 11.06, "NVIDIA H100 PCIe": 11.06, "NVIDIA H200": 10.60, "NVIDIA A100-SXM4-80GB": 3.93,
                "NVIDIA A100 80GB PCIe": 3.93, "NVIDIA A100-PCIE-40GB": 2.93, "NVIDIA L4": 0.56}
    for device, price in expected.items():
        assert current.accelerator_price(device) == pytest.approx(price), device
    # Whole words only: an L40S is not an L4, a GH200 is not an H200.
    for device in ("NVIDIA L40S", "NVIDIA GH200 480GB", "cuda:0"):
        with pytest.raises(prices.PricingError, match="current price table"):
            current.accelerator_price(device)


def test_pricing_names_and_paths_resolve(tmp_path):
    assert prices.resolve_pricing("paper").path == PRICING
    assert os.path.dirname(PRICING) == os.path.dirname(prices.__file__)  # package data, not a source-tree path
    path = tmp_path / "mine.yaml"
    path.write_text("cpu_core: 0.01\naccelerators:\n  H100: 2.0\n")
    mine = prices.resolve_pricing(str(path))
    assert mine.accelerator_price(H100) == 2.0 and mine.name == str(path)
    with pytest.raises(prices.PricingError, match="--pricing: got 'nope', expected current or paper or an existing"):
        prices.resolve_pricing("nope")


def test_gpu_result_priced_by_the_current_table(current, pricing, tmp_path):
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(_result("r2d2_gpu", 100_000, cores=16, accelerators={H100: 1})))
    rows = report.price_rows(report.load_rows([str(path)]), current, compare=(pricing,))
    # 16 vCPUs x $0.0486 + one H100 x $11.06 = $11.8376/h; at 100,000 FPS: 11.8376 / 3.6e8 x 1e9 = $32.88.
    assert rows[0].cost_per_hour == pytest.approx(11.8376)
    assert rows[0].cost_per_billion == pytest.approx(32.882, abs=1e-3)
    assert rows[0].compared == {"paper": None}  # the 2019 table prices no H100
    table = report.markdown_table(rows, current, "r2d2_gpu", (pricing,))
    assert f"| r2d2_gpu | 1 x {H100} | 4 | 16 | 256 | 100,000 | $11.838 | $32.88 | - | 1.00x |" in table
    assert "Priced with the current price table (Google Cloud" in table
    assert "Compared with the paper price table" in table and f"the paper table has no price for {H100}" in table
    # Priced by the paper's table alone, the same result is an error naming the device and the table.
    with pytest.raises(prices.PricingError, match="no price for device 'NVIDIA H100 80GB HBM3' in the paper"):
        report.price_rows(report.load_rows([str(path)]), pricing)


def test_gpu_result_priced_by_the_paper_table(current, pricing, tmp_path):
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(_result("p100", 67_000, cores=55, accelerators={"Tesla P100-PCIE-16GB": 1})))
    rows = report.price_rows(report.load_rows([str(path)]), pricing, compare=(current,))
    assert rows[0].cost_per_billion == pytest.approx(16.884, abs=1e-3)  # the paper's arithmetic, as above
    assert rows[0].compared == {"current": None}  # no P100 today
    table = report.markdown_table(rows, pricing, "p100", (current,))
    assert "| p100 | 1 x Tesla P100-PCIE-16GB | 4 | 55 | 256 | 67,000 | $4.072 | $16.88 | - | 1.00x |" in table
    assert "Priced with the paper price table (SEED RL paper" in table and "as of 2019-09" in table


def test_cli_on_a_seed_bench_result(tmp_path):
    # Run from a directory outside the repository, with relative output paths.
    completed = subprocess.run(
        [sys.executable, "-m", "seed.bench", "--config=fake_mlp", "--num_actors=1", "--envs_per_actor=8",
         "--duration_s=3", "--warmup_s=1", "--noprogress", "--out=result.json", "--runs_dir=runs"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr[-3000:]

    def report_cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "seed.bench.report", "result.json", *args], cwd=tmp_path,
                              capture_output=True, text=True, timeout=60)

    completed = report_cli("--out=report")  # default: the current table
    assert completed.returncode == 0, completed.stderr
    assert "| fake_mlp | - | 1 |" in completed.stdout and "1.00x" in completed.stdout
    assert "Priced with the current price table" in completed.stdout
    assert os.path.getsize(tmp_path / "report.png") > 1000
    assert "Priced with the current price table" in (tmp_path / "report.md").read_text()
    # Both tables: one more column, and the note naming the comparison table.
    completed = report_cli("--compare_pricing=paper", "--out=both")
    assert completed.returncode == 0, completed.stderr
    assert "| cost per 1B frames (paper prices) |" in completed.stdout
    assert "Compared with the paper price table" in completed.stdout
    # The paper's table: a CPU-only run is priced; an H100 is not, and the error names the device and the file.
    completed = report_cli("--pricing=paper", "--out=paper")
    assert completed.returncode == 0 and "Priced with the paper price table" in completed.stdout
    completed = report_cli("--pricing=paper", "--accelerators=H100:1", "--out=paper")
    assert completed.returncode == 1
    assert "'H100'" in completed.stderr and PRICING in completed.stderr
    completed = report_cli("--accelerators=H100:1", "--out=h100")
    assert completed.returncode == 0 and "| 1 x H100 |" in completed.stdout


def test_cheapest_per_agent_and_env_ignores_the_ceilings(current, tmp_path):
    # The transport and env_only ceilings are faster (so cheaper per frame) but train nothing: never the answer.
    ceilings = {"actor_side": {"env_frames_per_sec": 9_000}, "transport": {"env_frames_per_sec": 90_000},
                "env_only": {"env_frames_per_sec": 200_000}}
    results = [_result("cpu_small", 10_000, cores=2, baselines=ceilings), _result("cpu_big", 30_000, cores=16),
               _result("gpu", 300_000, cores=16, accelerators={H100: 1}), _result("pong", 5_000, cores=2)]
    for result in results:
        result["configuration"].update(agent="vtrace", env="fake:vector")
    results[-1]["configuration"].update(env="atari:Pong")
    paths = []
    for result in results:
        paths.append(tmp_path / f"{result['name']}.json")
        paths[-1].write_text(json.dumps(result))
    rows = report.price_rows(report.load_rows([str(p) for p in paths]), current)
    best = report.cheapest_per_agent(rows)
    # $ per 1B frames: cpu_small 2 x 0.0486 / (10,000 x 3600) x 1e9 = $2.70, cpu_big 16 x 0.0486 / 30,000 -> $7.20,
    # gpu (16 x 0.0486 + 11.06) / 300,000 -> $10.96; actor_side 2 x 0.0486 / 9,000 -> $3.00.
    assert {key: row.name for key, row in best.items()} == {("vtrace", "fake:vector"): "cpu_small",
                                                            ("vtrace", "atari:Pong"): "pong"}
    assert best[("vtrace", "fake:vector")].cost_per_billion == pytest.approx(2 * 0.0486 / (10_000 * 3600) * 1e9)
    text = report.cheapest_table(rows, current)
    assert "| vtrace | fake:vector | cpu_small | 4 x 64 | - | 10,000 | $2.70 | cpu_small/actor_side ($3.00, 1.11x) |" \
        in text
    assert "current prices" in text and "env_only" not in text.split("\n", 1)[1]
    table = report.markdown_table(rows, current, "cpu_small")
    # FPS / env_only: 10,000 / 200,000 for the framework row, and each baseline row over the same env_only.
    assert "| 1.00x | 0.05 |" in table and "| cpu_small/env_only |" in table and "| 1.00 |" in table


def test_a_framework_run_that_never_trained_is_not_the_cheapest(current, tmp_path):
    # Inference alone (e.g. --batch_size=1000000: no training batch ever fills) is faster but trains nothing.
    untrained = _result("inference_only", 50_000)
    untrained["framework"] = {"env_frames_per_sec": 50_000, "train_steps_per_sec": 0.0}
    trained = _result("trains", 20_000)
    trained["framework"] = {"env_frames_per_sec": 20_000, "train_steps_per_sec": 31.0}
    paths = []
    for result in (untrained, trained):
        result["configuration"].update(agent="vtrace", env="fake:vector")
        paths.append(tmp_path / f"{result['name']}.json")
        paths[-1].write_text(json.dumps(result))
    rows = report.price_rows(report.load_rows([str(p) for p in paths]), current)
    assert [(r.name, r.kind) for r in rows] == [("inference_only", "untrained"), ("trains", "framework")]
    assert report.cheapest_per_agent(rows)[("vtrace", "fake:vector")].name == "trains"
    assert "| inference_only |" in report.markdown_table(rows, current, "trains")  # still in the table


RECORDED = os.path.join(os.path.dirname(__file__), "data", "bench")
# Recorded 2026-11-23 on the 2-core dev machine under load (env groups 1 vs 2, 40 s runs, env_only baseline).
EXPECTED_CHEAPEST = {("ppo", "gym:CartPole-v1"): "cartpole_ppo", ("vtrace", "atari:Pong"): "pong_dqn_small_g2",
                     ("vtrace", "fake:vector"): "fake_mlp_g2", ("vtrace", "gym:CartPole-v1"): "cartpole_g1"}


def test_report_on_recorded_results_names_the_cheapest_per_agent(tmp_path):
    """seed-report on real seed-bench result files (tests/data/bench, recorded on the 2-core dev machine)."""
    paths = sorted(os.path.join(RECORDED, name) for name in os.listdir(RECORDED) if name.endswith(".json"))
    completed = subprocess.run([sys.executable, "-m", "seed.bench.report", *paths, f"--out={tmp_path}/report"],
                               capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    rows = report.price_rows(report.load_rows(paths), prices.resolve_pricing("current"))
    cheapest = {}
    for row in rows:  # by hand: the highest-FPS training row per (agent, env) is the cheapest (same 2 CPUs)
        if row.kind in ("framework", "actor_side") and row.fps > cheapest.get((row.agent, row.env), (0, ""))[0]:
            cheapest[(row.agent, row.env)] = (row.fps, row.name)
    lines = completed.stdout.split("Cheapest configuration per agent and env")[1].splitlines()
    for (agent, env), (fps, name) in cheapest.items():
        cost = 2 * 0.0486 / (fps * 3600) * 1e9
        assert any(line.startswith(f"| {agent} | {env} | {name} |") and f"${cost:,.2f} |" in line for line in lines), \
            (agent, env, name, completed.stdout)
    assert EXPECTED_CHEAPEST == {key: name for key, (_, name) in cheapest.items()}
    assert "FPS / env_only" in completed.stdout
