"""`python -m seed.bench.batch_cost`: one inference batch's cost on one thread, as CPU time and as callgrind's
instruction count."""

import json
import shutil
import subprocess
import sys

import pytest


def _run(tmp_path, *args):
    out = tmp_path / "result.json"
    completed = subprocess.run([sys.executable, "-m", "seed.bench.batch_cost", "--config=fake_mlp", *args,
                                f"--out={out}"], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr[-3000:]
    with open(out) as f:
        return json.load(f), completed.stdout


def test_cpu_time_per_batch_of_the_configured_rows_with_unrolls_emitted(tmp_path):
    result, stdout = _run(tmp_path, "--batches=60", "--repeats=2", "--warmup=10")
    assert result["rows_per_batch"] == 128  # fake_mlp: inference batches of 128 rows, 2 actors of 64 envs
    assert result["cpu_us_per_batch"] > 0 and len(result["rounds"]) == 2
    # 10 + 2 x 60 batches of 2 of the 4 actors: every env took 65 steps, so each completed the unrolls of 21 steps
    # ending at steps 21, 41 and 61 (consecutive unrolls share their bootstrap step).
    assert result["unrolls_emitted"] == 3 * 4 * 64
    assert "CPU us per inference batch of 128 rows" in stdout


def test_a_bad_override_is_refused_naming_it(tmp_path):
    completed = subprocess.run([sys.executable, "-m", "seed.bench.batch_cost", "--set=inference_batch_size"],
                               capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert completed.returncode != 0 and "--set: got 'inference_batch_size', expected flag=value" in completed.stderr


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind not installed (launch/install_test_tools.sh)")
def test_instructions_per_batch_grow_with_the_batch(tmp_path):
    small, _ = _run(tmp_path, "--callgrind", "--batches=20", "--warmup=20", "--set=inference_batch_size=64")
    large, stdout = _run(tmp_path, "--callgrind", "--batches=20", "--warmup=20")
    assert "instructions per inference batch (20 batches, callgrind)" in stdout
    # One actor's rows against two: more work per batch, less than twice (the per-batch overhead is shared).
    assert small["instructions_per_batch"] < large["instructions_per_batch"] < 2 * small["instructions_per_batch"]
