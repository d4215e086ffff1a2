"""seed-report: the cost arithmetic (paper Tables 4 and 5), pricing errors, and the CLI on a seed-bench result."""

import json
import os
import subprocess
import sys

import pytest

from seed import report
from tests.conftest import REPO

PRICING = os.path.join(REPO, "launch", "pricing.yaml")


@pytest.fixture
def pricing():
    return report.load_pricing(PRICING)


def test_shipped_prices_are_the_papers(pricing):
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
    with pytest.raises(report.PricingError) as error:
        report.cost_per_hour(16, {"NVIDIA H100 80GB HBM3": 1}, pricing)
    message = str(error.value)
    assert "NVIDIA H100 80GB HBM3" in message and PRICING in message and "P100" in message


def test_malformed_pricing_is_an_error(tmp_path):
    path = tmp_path / "pricing.yaml"
    path.write_text("accelerators:\n  P100: 1.46\n")
    with pytest.raises(report.PricingError, match="cpu_core"):
        report.load_pricing(str(path))
    path.write_text("cpu_core: 0.05\naccelerators:\n  P100: cheap\n")
    with pytest.raises(report.PricingError, match="accelerators.P100"):
        report.load_pricing(str(path))


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


def test_cli_on_a_seed_bench_result(tmp_path):
    out = tmp_path / "result.json"
    completed = subprocess.run(
        [sys.executable, "-m", "seed.bench", "--config=fake_mlp", "--num_actors=1", "--envs_per_actor=8",
         "--duration_s=3", "--warmup_s=1", "--noprogress", f"--out={out}", f"--runs_dir={tmp_path / 'runs'}"],
        cwd=REPO, capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr[-3000:]
    stem = tmp_path / "report"
    completed = subprocess.run([sys.executable, "-m", "seed.report", str(out), f"--pricing={PRICING}",
                                f"--out={stem}"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert completed.returncode == 0, completed.stderr
    assert "| fake_mlp | - | 1 |" in completed.stdout and "1.00x" in completed.stdout
    assert os.path.getsize(f"{stem}.png") > 1000 and os.path.exists(f"{stem}.md")
    # Pricing a device the table lacks fails loudly, naming the device and the file.
    completed = subprocess.run([sys.executable, "-m", "seed.report", str(out), f"--pricing={PRICING}",
                                "--accelerators=H100:1", f"--out={stem}"],
                               cwd=REPO, capture_output=True, text=True, timeout=60)
    assert completed.returncode == 1
    assert "'H100'" in completed.stderr and PRICING in completed.stderr
