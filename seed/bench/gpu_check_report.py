"""`python -m seed.bench.gpu_check_report OUT_DIR`: the report of launch/gpu_check.sh, from what its steps left.

Reads OUT_DIR/steps.tsv (step, exit status, seconds) and each step's files, and writes OUT_DIR/summary.json and
OUT_DIR/report.md: every step's status and time, then its headline numbers beside the targets of the GPU path
(issue 49's table). A missing file is reported as missing, never guessed:

    search_gpu.json          graphed search ms for 256 trees (pUCT, Gumbel)          target <= 25 ms
    r2d2_atari_gpu.json      FPS and FPS / env_only ceiling                          target >= 0.70
    pong_vtrace_gpu.json     FPS, round trip p50                                     target >= 80,000, <= 3.6 ms
    muzero_*.log, muzero_metrics.jsonl
                             Tracebacks, resumed, env frames/s and updates/s while training, the inference
                             thread's wait to hand over unrolls (inference/sink_ms) and what the sink waits for
                             (experience/ratio_wait_ms: the replay ratio, i.e. training)
    learn_metrics.jsonl      the evaluation curve (eval/return_running_mean_100) and its last value: target >= 18
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from typing import Any

TARGETS = {
    "search_ms_256": 25.0,
    "r2d2_fraction_of_ceiling": 0.70,
    "vtrace_fps": 80_000.0,
    "vtrace_round_trip_ms_p50": 3.6,
    "muzero_env_frames_per_sec": 1_000.0,
    "muzero_train_steps_per_sec": 30.0,
    "pong_eval_score": 18.0,
}


def _read_json(path: str) -> dict[str, Any] | None:
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def _read_rows(path: str) -> list[dict[str, Any]]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def read_steps(out_dir: str) -> list[dict[str, Any]]:
    """steps.tsv: [{"step", "exit_code", "seconds"}] in the order they ran."""
    path = os.path.join(out_dir, "steps.tsv")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [{"step": name, "exit_code": int(rc), "seconds": int(seconds)}
                for name, rc, seconds in (line.rstrip("\n").split("\t") for line in f if line.strip())]


def search_summary(out_dir: str) -> dict[str, Any] | None:
    result = _read_json(os.path.join(out_dir, "search_gpu.json"))
    if result is None:
        return None
    rows = {}
    for key, value in result.get("results", {}).items():
        rows[key] = {"graphed_ms": value["graphed"]["search_ms_median"], "eager_ms": value["eager"]["search_ms_median"],
                     "visit_counts_equal": value.get("evaluation_visit_counts_equal")}
    return {"device": result.get("machine", {}).get("device"), "searches": rows}


def bench_summary(out_dir: str, name: str) -> dict[str, Any] | None:
    result = _read_json(os.path.join(out_dir, f"{name}.json"))
    if result is None:
        return None
    ceiling = (result.get("baselines") or {}).get("env_only") or {}
    fps = result.get("env_frames_per_sec")
    ceiling_fps = ceiling.get("env_frames_per_sec")
    gpu = (result.get("gpu") or [{}])[0] or {}
    return {"env_frames_per_sec": fps, "env_only_frames_per_sec": ceiling_fps,
            "fraction_of_ceiling": fps / ceiling_fps if fps and ceiling_fps else None,
            "round_trip_ms_p50": result.get("round_trip_latency_ms_p50"),
            "actor_waiting_fraction": result.get("actor_waiting_fraction"),
            "train_steps_per_sec": result.get("train_steps_per_sec"),
            "gpu_utilization_pct": gpu.get("utilization_pct_mean")}


def _median(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [row[key] for row in rows if isinstance(row.get(key), (int, float))]
    return statistics.median(values) if values else None


def muzero_summary(out_dir: str) -> dict[str, Any] | None:
    logs = [os.path.join(out_dir, name) for name in ("muzero_first.log", "muzero_resumed.log")]
    if not any(os.path.exists(path) for path in logs):
        return None
    tracebacks, resumed = 0, False
    for path in logs:
        if os.path.exists(path):
            with open(path, errors="replace") as f:
                text = f.read()
            tracebacks += text.count("Traceback")
            resumed |= path.endswith("resumed.log") and "resumed from" in text
    rows = _read_rows(os.path.join(out_dir, "muzero_metrics.jsonl"))
    training = [row for row in rows if (row.get("train_steps_per_sec") or 0) > 0]
    return {"tracebacks": tracebacks, "resumed": resumed, "rows_while_training": len(training),
            **{name: _median(training, key) for name, key in (
                ("env_frames_per_sec", "env_frames_per_sec"), ("train_steps_per_sec", "train_steps_per_sec"),
                ("inference_policy_ms", "inference/policy_ms"), ("inference_sink_ms", "inference/sink_ms"),
                ("sink_ratio_wait_ms", "experience/ratio_wait_ms"), ("sink_priorities_ms", "experience/priorities_ms"),
                ("sink_insert_ms", "experience/insert_ms"))}}


def learn_summary(out_dir: str) -> dict[str, Any] | None:
    rows = _read_rows(os.path.join(out_dir, "learn_metrics.jsonl"))
    if not rows:
        return None
    key = "eval/return_running_mean_100"
    curve = [{"time_s": row.get("time_s"), "env_frames": row.get("env_frames"), "score": row[key]}
             for row in rows if isinstance(row.get(key), (int, float))]
    reached = next((point for point in curve if point["score"] >= TARGETS["pong_eval_score"]), None)
    return {"metric": key, "final_score": curve[-1]["score"] if curve else None,
            "final_env_frames": rows[-1].get("env_frames"), "time_s": rows[-1].get("time_s"),
            "reached_target_at": reached, "curve": curve}


def summarise(out_dir: str) -> dict[str, Any]:
    return {"steps": read_steps(out_dir), "targets": TARGETS, "search_gpu": search_summary(out_dir),
            "r2d2_atari_gpu": bench_summary(out_dir, "r2d2_atari_gpu"),
            "pong_vtrace_gpu": bench_summary(out_dir, "pong_vtrace_gpu"),
            "muzero_resume": muzero_summary(out_dir), "learn": learn_summary(out_dir)}


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def _verdict(value: float | None, target: float, at_least: bool) -> str:
    if value is None:
        return "not measured"
    return "met" if (value >= target if at_least else value <= target) else "missed"


def render(summary: dict[str, Any]) -> str:
    lines = ["# GPU check", ""]
    device = (summary.get("search_gpu") or {}).get("device")
    if device:
        lines += [f"Device: {device}", ""]
    lines += ["| step | exit | seconds |", "|---|---:|---:|"]
    lines += ([f"| {s['step']} | {s['exit_code']} | {s['seconds']} |" for s in summary["steps"]]
              or ["| (none ran) | | |"])
    rows = []
    search = summary.get("search_gpu")
    if search:
        for algorithm in ("puct", "gumbel"):
            value = (search["searches"].get(f"{algorithm}_b256") or {}).get("graphed_ms")
            rows.append((f"search, 256 trees, {algorithm} (graphed, ms)", value, "<= 25",
                         _verdict(value, TARGETS["search_ms_256"], at_least=False)))
    r2d2 = summary.get("r2d2_atari_gpu")
    if r2d2:
        rows.append(("r2d2_atari_gpu FPS", r2d2["env_frames_per_sec"], "", ""))
        rows.append(("r2d2_atari_gpu env_only ceiling FPS", r2d2["env_only_frames_per_sec"], "", ""))
        rows.append(("r2d2_atari_gpu FPS / ceiling", r2d2["fraction_of_ceiling"], ">= 0.70",
                     _verdict(r2d2["fraction_of_ceiling"], TARGETS["r2d2_fraction_of_ceiling"], at_least=True)))
    vtrace = summary.get("pong_vtrace_gpu")
    if vtrace:
        rows.append(("pong_vtrace_gpu FPS", vtrace["env_frames_per_sec"], ">= 80,000",
                     _verdict(vtrace["env_frames_per_sec"], TARGETS["vtrace_fps"], at_least=True)))
        rows.append(("pong_vtrace_gpu FPS / env_only ceiling", vtrace["fraction_of_ceiling"], "", ""))
        rows.append(("pong_vtrace_gpu round trip p50 (ms)", vtrace["round_trip_ms_p50"], "<= 3.6",
                     _verdict(vtrace["round_trip_ms_p50"], TARGETS["vtrace_round_trip_ms_p50"], at_least=False)))
    muzero = summary.get("muzero_resume")
    if muzero:
        rows.append(("muzero Tracebacks (both runs)", muzero["tracebacks"], "0",
                     "met" if muzero["tracebacks"] == 0 else "missed"))
        rows.append(("muzero resumed from its checkpoint", muzero["resumed"], "yes",
                     "met" if muzero["resumed"] else "missed"))
        rows.append(("muzero env frames/s while training", muzero["env_frames_per_sec"], ">= 1,000",
                     _verdict(muzero["env_frames_per_sec"], TARGETS["muzero_env_frames_per_sec"], at_least=True)))
        rows.append(("muzero updates/s", muzero["train_steps_per_sec"], ">= 30",
                     _verdict(muzero["train_steps_per_sec"], TARGETS["muzero_train_steps_per_sec"], at_least=True)))
        for label, key in (("muzero inference/policy_ms", "inference_policy_ms"),
                           ("muzero inference/sink_ms (hand-over wait)", "inference_sink_ms"),
                           ("muzero experience/ratio_wait_ms (waiting for training)", "sink_ratio_wait_ms"),
                           ("muzero experience/priorities_ms", "sink_priorities_ms")):
            rows.append((label, muzero[key], "", ""))
    learn = summary.get("learn")
    if learn:
        rows.append(("Pong evaluation score at the end (V-trace, 8 min)", learn["final_score"], ">= 18",
                     _verdict(learn["final_score"], TARGETS["pong_eval_score"], at_least=True)))
        rows.append(("env frames trained", learn["final_env_frames"], "", ""))
    lines += ["", "| measure | value | target | |", "|---|---:|---|---|"]
    lines += [f"| {label} | {_fmt(value, 2 if isinstance(value, float) and abs(value) < 10 else 1)} | {target} | "
              f"{verdict} |" for label, value, target, verdict in rows]
    if learn and learn["curve"]:
        lines += ["", f"Evaluation curve ({learn['metric']}):", "", "| seconds | env frames | score |",
                  "|---:|---:|---:|"]
        lines += [f"| {_fmt(p['time_s'], 0)} | {_fmt(p['env_frames'])} | {_fmt(p['score'], 2)} |"
                  for p in learn["curve"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not os.path.isdir(argv[0]):
        print(f"gpu_check_report: got arguments {argv}, expected one existing result folder", file=sys.stderr)
        return 2
    out_dir = argv[0]
    summary = summarise(out_dir)
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    report = render(summary)
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write(report)
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
