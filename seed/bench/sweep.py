"""Sweeps: one seed-bench run per value of actors, envs per actor, env groups or network width, summarised as a
Markdown table and a plot of env frames per second against the swept value.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from seed.bench.configs import BenchSetup, resolve_learner_config
from seed.bench.results import fmt

SWEEPS = {"actors": "num_actors", "envs_per_actor": "envs_per_actor", "env_groups": "env_groups",
          "network_width": "network_width"}


def sweep_setups(setup: BenchSetup, sweep: str, values: list[int]) -> list[tuple[int, BenchSetup]]:
    """One setup per swept value. network_width on an MLP scales mlp_sizes (width is an image-net flag)."""
    key = SWEEPS[sweep]
    setups = []
    for value in values:
        flags_ = dict(setup.learner_flags)
        if key == "network_width" and setup.config.network == "mlp":
            base = [int(s) for s in str(setup.config.mlp_sizes).split(",") if s]
            flags_["mlp_sizes"] = ",".join(str(s * value) for s in base)
        flags_[key] = value
        config = resolve_learner_config(flags_)
        setups.append((value, dataclasses.replace(setup, name=f"{setup.name}-{sweep}{value}", learner_flags=flags_,
                                                  config=config)))
    return setups


def sweep_table(sweep: str, points: list[dict[str, Any]]) -> str:
    lines = [f"| {sweep} | envs | env frames/s (actors) | env frames/s (learner) | train steps/s | "
             "round trip p50 (ms) | actors waiting | transport ceiling | actor-side | env_only | other load (cores) |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for point in points:
        r = point["result"]
        base = r["baselines"]
        waiting = r["framework"].get("actor_waiting_fraction")
        lines.append(
            f"| {point['value']} | {r['configuration']['num_envs']} | {fmt(r['env_frames_per_sec'])} | "
            f"{fmt(r['env_frames_per_sec_learner'])} | {fmt(r['train_steps_per_sec'], '.1f')} | "
            f"{fmt(r['round_trip_latency_ms_p50'], '.2f')} | "
            f"{fmt(None if waiting is None else 100 * waiting, '.0f')}% | "
            f"{fmt(base['transport'] and base['transport']['env_frames_per_sec'])} | "
            f"{fmt(base['actor_side'] and base['actor_side']['env_frames_per_sec'])} | "
            f"{fmt(base.get('env_only') and base['env_only']['env_frames_per_sec'])} | "
            f"{fmt(r['framework'].get('other_processes_cores'), '.2f')} |")
    return "\n".join(lines)


def sweep_plot(sweep: str, points: list[dict[str, Any]], title: str, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    values = [p["value"] for p in points]
    fig, ax = plt.subplots(figsize=(6, 4))
    baseline_fps = lambda r, kind: r["baselines"].get(kind) and r["baselines"][kind]["env_frames_per_sec"]
    series = [("framework (central inference)", lambda r: r["env_frames_per_sec"]),
              ("transport ceiling", lambda r: baseline_fps(r, "transport")),
              ("actor-side inference", lambda r: baseline_fps(r, "actor_side")),
              ("env_only (simulator ceiling)", lambda r: baseline_fps(r, "env_only"))]
    for label, get in series:
        ys = [get(p["result"]) for p in points]
        if any(y is not None for y in ys):
            ax.plot(values, [np.nan if y is None else y for y in ys], marker="o", label=label)
    ax.set_xlabel(sweep)
    ax.set_ylabel("env frames / s")
    if min(values) > 0 and max(values) >= 8 * min(values):  # powers of two read best on a log axis
        ax.set_xscale("log", base=2)
    ax.set_xticks(values, [str(v) for v in values])
    ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
