"""`seed-report`: cost and throughput tables (SEED paper Tables 4 and 5) from `seed-bench` result files.

    seed-report bench_results/fake_mlp.json bench_results/pong_vtrace.json --pricing=launch/pricing.yaml \
        --baseline=pong_vtrace/actor_side --out=bench_results/report

Each result file gives one row for the framework and one per measured baseline (named `<name>/actor_side`,
`<name>/transport`); sweep files give one row per point. Columns: configuration, actors, CPUs, envs,
FPS (env frames per second, measured at the actors), cost per hour, cost per 1B frames and the ratio of
FPS to the baseline row (--baseline, default the first row).

  cost per hour      = CPUs x cpu_core price + sum over accelerators of count x price
  cost per 1B frames = cost per hour / (FPS x 3600) x 1e9

CPUs are the machine's cores the run had (os.cpu_count() at bench time) unless --cpus says otherwise;
accelerators are the devices the learner used. A device without a price in the pricing file is an error.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Any

from absl import app, flags

FRAMES_PER_COST_UNIT = 1e9


class PricingError(ValueError):
    """The pricing table is malformed or lacks a price for a device a result used."""


@dataclasses.dataclass
class Pricing:
    cpu_core: float  # per core per hour
    accelerators: dict[str, float]  # device key -> per device per hour
    path: str
    currency: str = "USD"

    def accelerator_price(self, device: str) -> float:
        """The price of `device`: the longest pricing key found in its name, case-insensitively."""
        matches = [key for key in self.accelerators if key.lower() in device.lower()]
        if not matches:
            known = ", ".join(self.accelerators) or "none"
            raise PricingError(f"no price for device {device!r} in {self.path} (priced accelerators: {known}); "
                               f"add a line '  {device}: <price per hour>' under 'accelerators:' in {self.path}")
        return self.accelerators[max(matches, key=len)]


def load_pricing(path: str) -> Pricing:
    import yaml

    if not os.path.exists(path):
        raise PricingError(f"--pricing: {path} does not exist")
    with open(path) as f:
        data = yaml.safe_load(f) or {}
    if not isinstance(data, dict) or "cpu_core" not in data:
        raise PricingError(f"{path}: expected a mapping with cpu_core (price per core per hour) and accelerators")
    accelerators = data.get("accelerators") or {}
    if not isinstance(accelerators, dict):
        raise PricingError(f"{path}: accelerators: expected a mapping of device name to price per hour")
    for name, price in accelerators.items():
        if not isinstance(price, (int, float)) or isinstance(price, bool) or price < 0:
            raise PricingError(f"{path}: accelerators.{name}: got {price!r}, expected a price per hour >= 0")
    cpu = data["cpu_core"]
    if not isinstance(cpu, (int, float)) or isinstance(cpu, bool) or cpu < 0:
        raise PricingError(f"{path}: cpu_core: got {cpu!r}, expected a price per hour >= 0")
    return Pricing(float(cpu), {str(k): float(v) for k, v in accelerators.items()}, path,
                   str(data.get("currency", "USD")))


def cost_per_hour(cpus: float, accelerators: dict[str, int], pricing: Pricing) -> float:
    """cpus x cpu_core price + sum of count x device price."""
    return cpus * pricing.cpu_core + sum(count * pricing.accelerator_price(name)
                                         for name, count in accelerators.items())


def cost_per_billion_frames(hourly_cost: float, fps: float) -> float:
    """The cost of 1e9 env frames at `fps` env frames per second."""
    if fps <= 0:
        raise ValueError(f"fps: got {fps}, expected > 0")
    return hourly_cost / (fps * 3600.0) * FRAMES_PER_COST_UNIT


@dataclasses.dataclass
class Row:
    name: str
    description: str
    actors: int
    cpus: float
    envs: int
    fps: float
    accelerators: dict[str, int]
    cost_per_hour: float | None = None
    cost_per_billion: float | None = None
    ratio: float | None = None


def _rows_of_result(result: dict[str, Any], cpus_override: float | None,
                    accelerators_override: dict[str, int] | None) -> list[Row]:
    c = result["configuration"]
    cpus = cpus_override if cpus_override is not None else float(c["devices"]["cpu_cores"])
    accelerators = accelerators_override if accelerators_override is not None else c["devices"]["accelerators"]
    rows = [Row(result["name"], result.get("description", ""), c["num_actors"], cpus, c["num_envs"],
                result["env_frames_per_sec"], dict(accelerators))]
    for kind, measured in (result.get("baselines") or {}).items():
        if measured:
            # A baseline ran on the same machine with the same devices, so it is charged the same.
            rows.append(Row(f"{result['name']}/{kind}", kind, c["num_actors"], cpus, c["num_envs"],
                            measured["env_frames_per_sec"], dict(accelerators)))
    return rows


def load_rows(paths: list[str], cpus_override: float | None = None,
              accelerators_override: dict[str, int] | None = None) -> list[Row]:
    rows: list[Row] = []
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        schema = str(data.get("schema", ""))
        if schema.endswith("-sweep"):
            for point in data["points"]:
                rows.extend(_rows_of_result(point["result"], cpus_override, accelerators_override))
        elif schema.startswith("seed-bench"):
            rows.extend(_rows_of_result(data, cpus_override, accelerators_override))
        else:
            raise ValueError(f"{path}: not a seed-bench result (schema {schema!r})")
    return rows


def price_rows(rows: list[Row], pricing: Pricing, baseline: str | None = None) -> list[Row]:
    if not rows:
        return rows
    names = [r.name for r in rows]
    if baseline is not None and baseline not in names:
        raise ValueError(f"--baseline: got {baseline!r}, expected one of {', '.join(names)}")
    reference = rows[names.index(baseline)] if baseline else rows[0]
    for row in rows:
        row.cost_per_hour = cost_per_hour(row.cpus, row.accelerators, pricing)
        row.cost_per_billion = cost_per_billion_frames(row.cost_per_hour, row.fps) if row.fps > 0 else None
        row.ratio = row.fps / reference.fps if reference.fps > 0 else None
    return rows


def markdown_table(rows: list[Row], pricing: Pricing, baseline: str) -> str:
    money = "$" if pricing.currency == "USD" else f"{pricing.currency} "
    lines = [f"| configuration | accelerators | actors | CPUs | envs | FPS | cost/hour | cost per 1B frames | "
             f"FPS ratio to {baseline} |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        devices = ", ".join(f"{n} x {k}" for k, n in r.accelerators.items()) or "-"
        cpus = f"{r.cpus:g}"
        lines.append(
            f"| {r.name} | {devices} | {r.actors} | {cpus} | {r.envs} | {r.fps:,.0f} | {money}{r.cost_per_hour:.3f} | "
            f"{'-' if r.cost_per_billion is None else f'{money}{r.cost_per_billion:,.2f}'} | "
            f"{'-' if r.ratio is None else f'{r.ratio:.2f}x'} |")
    lines.append(f"\nPrices: {pricing.path} (cpu core {money}{pricing.cpu_core}/h"
                 + "".join(f", {k} {money}{v}/h" for k, v in pricing.accelerators.items()) + "). "
                 "FPS = env frames per second measured at the actors.")
    return "\n".join(lines)


def chart(rows: list[Row], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r.name for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, max(3.0, 0.45 * len(rows) + 1.5)))
    positions = range(len(rows))
    left.barh(positions, [r.fps for r in rows], color="tab:blue")
    left.set_yticks(list(positions), names, fontsize=8)
    left.invert_yaxis()
    left.set_xlabel("env frames / s")
    costs = [r.cost_per_billion or 0.0 for r in rows]
    right.barh(positions, costs, color="tab:orange")
    right.set_yticks(list(positions), [""] * len(rows))
    right.invert_yaxis()
    right.set_xlabel("cost per 1B frames")
    right.set_xscale("log" if max(costs, default=0) > 0 and min(c for c in costs if c > 0) * 100 < max(costs)
                     else "linear")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_accelerators(values: list[str]) -> dict[str, int] | None:
    """["P100:1", "TPU v3 core:8"] -> {"P100": 1, "TPU v3 core": 8}; [] -> None (use the results')."""
    if not values:
        return None
    out = {}
    for value in values:
        name, sep, count = value.rpartition(":")
        if not sep or not name:
            raise ValueError(f"--accelerators: got {value!r}, expected NAME:COUNT, e.g. P100:1")
        out[name] = int(count)
    return out


FLAGS = flags.FLAGS


def main(argv: list[str]) -> None:
    paths = argv[1:]
    if not paths:
        raise app.UsageError("give one or more seed-bench result files")
    try:
        pricing = load_pricing(FLAGS.pricing)
        accelerators = parse_accelerators(FLAGS.accelerators)
        rows = price_rows(load_rows(paths, FLAGS.cpus, accelerators), pricing, FLAGS.baseline or None)
    except (PricingError, ValueError, OSError, KeyError) as error:
        print(f"seed-report: {error}", file=sys.stderr)
        sys.exit(1)
    baseline = FLAGS.baseline or rows[0].name
    table = markdown_table(rows, pricing, baseline)
    print(table)
    out = FLAGS.out or os.path.join("bench_results", "report")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(f"{out}.md", "w") as f:
        f.write(table + "\n")
    chart(rows, f"{out}.png", f"FPS and cost per 1B frames (baseline {baseline}; prices {pricing.path})")
    print(f"\nwrote {out}.md and {out}.png")


def run() -> None:
    flags.DEFINE_string("pricing", "launch/pricing.yaml", "Prices per hour: cpu_core and accelerators.")
    flags.DEFINE_string("baseline", "", "Row name the FPS ratio is taken against; default the first row.")
    flags.DEFINE_string("out", "", "Output stem: writes <out>.md and <out>.png; default bench_results/report.")
    flags.DEFINE_float("cpus", None, "Price this many CPU cores instead of the cores each run had.")
    flags.DEFINE_list("accelerators", [], "Price these devices instead of the runs', e.g. P100:1.")
    app.run(main)


if __name__ == "__main__":
    run()
