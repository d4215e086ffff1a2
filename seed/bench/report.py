"""`seed-report`: cost and throughput tables (SEED paper Tables 4 and 5) from `seed-bench` result files.

    seed-report bench_results/fake_mlp.json bench_results/pong_vtrace.json \
        --baseline=pong_vtrace/actor_side --out=bench_results/report
    seed-report bench_results/*.json --pricing=paper                 # the SEED paper's 2019 prices
    seed-report bench_results/*.json --compare_pricing=paper         # current prices, plus a paper-price column
    seed-report --curves logs/run-seed0 logs/run-seed1 --out=curves  # learning curves (seed/bench/curves.py)

Each result file gives one row for the framework and one per measured baseline (named `<name>/actor_side`,
`<name>/transport`, `<name>/env_only`); sweep files give one row per point. Columns: configuration, actors,
CPUs, envs, FPS (env frames per second, measured at the actors), cost per hour, cost per 1B frames, the ratio of
FPS to the baseline row (--baseline, default the first row) and, when a result measured the env_only baseline,
each row's FPS as a share of its own result's env_only FPS (the simulator ceiling on the same cores).

Below the table, the cheapest configuration per agent and env: among the rows that train (the framework and
actor_side rows, not the transport and env_only ceilings nor a framework run that made no training step), the one
with the lowest cost per 1B frames under the --pricing table (default: current prices). Per env too, because a
CartPole frame and an Atari frame do not cost the same.

  cost per hour      = CPUs x cpu_core price + sum over accelerators of count x price
  cost per 1B frames = cost per hour / (FPS x 3600) x 1e9

CPUs are the machine's cores the run had (os.cpu_count() at bench time) unless --cpus says otherwise;
accelerators are the devices the learner used. Prices come from --pricing (seed/bench/pricing.py):
`current` (default, today's on-demand prices), `paper` (the SEED paper's 2019 table) or a YAML file; the
report says which table priced it. A device without a price in the --pricing table is an error; in a
--compare_pricing table it shows as "-" with a note.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Any

from absl import app, flags

from seed.bench.pricing import Pricing, PricingError, resolve_pricing
from seed.runtime.quick_exit import freeze_objects_at_exit

FRAMES_PER_COST_UNIT = 1e9


def cost_per_hour(cpus: float, accelerators: dict[str, int], pricing: Pricing) -> float:
    """cpus x cpu_core price + sum of count x device price."""
    return cpus * pricing.cpu_core + sum(count * pricing.accelerator_price(name)
                                         for name, count in accelerators.items())


def cost_per_billion_frames(hourly_cost: float, fps: float) -> float:
    """The cost of 1e9 env frames at `fps` env frames per second."""
    if fps <= 0:
        raise ValueError(f"fps: got {fps}, expected > 0")
    return hourly_cost / (fps * 3600.0) * FRAMES_PER_COST_UNIT


TRAINING_KINDS = ("framework", "actor_side")  # rows that train an agent; transport and env_only are ceilings


@dataclasses.dataclass
class Row:
    name: str
    description: str
    actors: int
    cpus: float
    envs: int
    fps: float
    accelerators: dict[str, int]
    agent: str = "-"
    env: str = "-"
    kind: str = "framework"  # framework, untrained (a framework run that never trained) or the baseline's name
    #                          (actor_side, transport, env_only)
    env_groups: int = 1
    env_only_fps: float | None = None  # the same result's env_only baseline (simulator ceiling), if measured
    cost_per_hour: float | None = None
    cost_per_billion: float | None = None
    ratio: float | None = None
    # cost per 1B frames under each --compare_pricing table (by table name); None where it prices no device
    compared: dict[str, float | None] = dataclasses.field(default_factory=dict)


def _rows_of_result(result: dict[str, Any], cpus_override: float | None,
                    accelerators_override: dict[str, int] | None) -> list[Row]:
    c = result["configuration"]
    cpus = cpus_override if cpus_override is not None else float(c["devices"]["cpu_cores"])
    accelerators = accelerators_override if accelerators_override is not None else c["devices"]["accelerators"]
    baselines = result.get("baselines") or {}
    common = dict(agent=c.get("agent", "-"), env=c.get("env", "-"), env_groups=c.get("env_groups", 1),
                  env_only_fps=baselines.get("env_only") and baselines["env_only"]["env_frames_per_sec"])
    # A framework run whose learner never trained (e.g. --batch_size larger than anything the run produced, to
    # measure inference alone) is a ceiling too, not a configuration to train with.
    trained = (result.get("framework") or {}).get("train_steps_per_sec", result.get("train_steps_per_sec"))
    kind = "framework" if trained is None or trained > 0 else "untrained"
    rows = [Row(result["name"], result.get("description", ""), c["num_actors"], cpus, c["num_envs"],
                result["env_frames_per_sec"], dict(accelerators), **common, kind=kind)]
    for kind, measured in baselines.items():
        if measured:
            # A baseline ran on the same machine with the same devices, so it is charged the same.
            rows.append(Row(f"{result['name']}/{kind}", kind, c["num_actors"], cpus, c["num_envs"],
                            measured["env_frames_per_sec"], dict(accelerators), **common, kind=kind))
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


def price_rows(rows: list[Row], pricing: Pricing, baseline: str | None = None,
               compare: tuple[Pricing, ...] = ()) -> list[Row]:
    """Fills each row's cost per hour and per 1B frames under `pricing`, the FPS ratio to the baseline row,
    and the cost per 1B frames under every `compare` table (None where that table lacks a row's device)."""
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
        for other in compare:
            try:
                hourly = cost_per_hour(row.cpus, row.accelerators, other)
            except PricingError:
                row.compared[other.name] = None
                continue
            row.compared[other.name] = cost_per_billion_frames(hourly, row.fps) if row.fps > 0 else None
    return rows


def _money(pricing: Pricing) -> str:
    return "$" if pricing.currency == "USD" else f"{pricing.currency} "


def _prices_line(pricing: Pricing) -> str:
    money = _money(pricing)
    prices = [f"cpu core {money}{pricing.cpu_core}/h"] + [f"{k} {money}{v}/h" for k, v in pricing.accelerators.items()]
    return f"{pricing.describe()}, {pricing.shown_path}: {', '.join(prices)}"


def markdown_table(rows: list[Row], pricing: Pricing, baseline: str, compare: tuple[Pricing, ...] = ()) -> str:
    """The report table: one row per configuration, costs under `pricing` and a column per `compare` table."""
    money = _money(pricing)
    extra = "".join(f" cost per 1B frames ({other.name} prices) |" for other in compare)
    ceiling = any(r.env_only_fps for r in rows)  # a column of FPS / env_only when some result measured it
    lines = [f"| configuration | accelerators | actors | CPUs | envs | FPS | cost/hour | cost per 1B frames "
             f"({pricing.name} prices) |{extra} "
             f"FPS ratio to {baseline} |" + (" FPS / env_only |" if ceiling else ""),
             "|---|---|---:|---:|---:|---:|---:|---:|" + "---:|" * len(compare) + "---:|"
             + ("---:|" if ceiling else "")]
    unpriced: dict[str, set[str]] = {}
    for r in rows:
        devices = ", ".join(f"{n} x {k}" for k, n in r.accelerators.items()) or "-"
        cpus = f"{r.cpus:g}"
        compared = ""
        for other in compare:
            value = r.compared.get(other.name)
            if value is None:
                unpriced.setdefault(other.name, set()).update(
                    k for k in r.accelerators if other.accelerator_key(k) is None)
            compared += f" {'-' if value is None else f'{_money(other)}{value:,.2f}'} |"
        lines.append(
            f"| {r.name} | {devices} | {r.actors} | {cpus} | {r.envs} | {r.fps:,.0f} | {money}{r.cost_per_hour:.3f} | "
            f"{'-' if r.cost_per_billion is None else f'{money}{r.cost_per_billion:,.2f}'} |{compared} "
            f"{'-' if r.ratio is None else f'{r.ratio:.2f}x'} |"
            + (f" {'-' if not r.env_only_fps else f'{r.fps / r.env_only_fps:.2f}'} |" if ceiling else ""))
    lines.append(f"\nPriced with {_prices_line(pricing)}. FPS = env frames per second measured at the actors.")
    if ceiling:
        lines.append("FPS / env_only: the row's FPS over its result's env_only baseline (the same envs, actor "
                     "processes and cores stepping random actions with no learner): the share of the simulator's "
                     "own limit.")
    for other in compare:
        note = f"\nCompared with {_prices_line(other)}."
        if unpriced.get(other.name):
            note += f" '-': the {other.name} table has no price for {', '.join(sorted(unpriced[other.name]))}."
        lines.append(note)
    return "\n".join(lines)


def cheapest_per_agent(rows: list[Row]) -> dict[tuple[str, str], Row]:
    """{(agent, env): the priced training row (framework or actor_side) with the lowest cost per 1B frames}."""
    best: dict[tuple[str, str], Row] = {}
    for row in rows:
        if row.kind not in TRAINING_KINDS or row.cost_per_billion is None:
            continue
        key = (row.agent, row.env)
        if key not in best or row.cost_per_billion < best[key].cost_per_billion:
            best[key] = row
    return best


def cheapest_table(rows: list[Row], pricing: Pricing) -> str:
    """The cheapest configuration per agent and env, as Markdown (empty when no training row is priced)."""
    best = cheapest_per_agent(rows)
    if not best:
        return ""
    money = _money(pricing)
    lines = [f"Cheapest configuration per agent and env (cost per 1B frames at {pricing.name} prices; training "
             "rows only, the transport and env_only ceilings excluded):",
             "",
             "| agent | env | cheapest configuration | actors x envs | accelerators | FPS | cost per 1B frames | "
             "next cheapest |",
             "|---|---|---|---|---|---:|---:|---|"]
    for (agent, env), row in sorted(best.items()):
        others = sorted((r for r in rows if r.kind in TRAINING_KINDS and (r.agent, r.env) == (agent, env)
                         and r is not row and r.cost_per_billion is not None), key=lambda r: r.cost_per_billion)
        runner_up = (f"{others[0].name} ({money}{others[0].cost_per_billion:,.2f}, "
                     f"{others[0].cost_per_billion / row.cost_per_billion:.2f}x)" if others else "-")
        groups = f" in {row.env_groups} groups" if row.env_groups > 1 and row.kind == "framework" else ""
        devices = ", ".join(f"{n} x {k}" for k, n in row.accelerators.items()) or "-"
        lines.append(f"| {agent} | {env} | {row.name} | {row.actors} x {row.envs // max(1, row.actors)}{groups} | "
                     f"{devices} | {row.fps:,.0f} | {money}{row.cost_per_billion:,.2f} | {runner_up} |")
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


def curves_main(logdirs: list[str]) -> None:
    """`seed-report --curves LOGDIR...`: learning curves and time-to-target table (seed/bench/curves.py)."""
    from seed.bench import curves

    out = os.path.abspath(FLAGS.out or os.path.join("bench_results", "curves"))
    try:
        at_frames = curves.parse_numbers("--at_frames", FLAGS.at_frames, "1e5,1e6") or ()
        text, paths = curves.write_report(logdirs, out, FLAGS.metric, curves.parse_targets(FLAGS.targets),
                                          FLAGS.group_seeds, at_frames)
    except (curves.CurvesError, OSError) as error:
        print(f"seed-report: {error}", file=sys.stderr)
        sys.exit(2)
    print(text)
    print(f"wrote {', '.join(paths)}")


def main(argv: list[str]) -> None:
    paths = argv[1:]
    if FLAGS.curves:
        curves_main(paths)
        return
    if not paths:
        raise app.UsageError("give one or more seed-bench result files")
    try:
        pricing = resolve_pricing(FLAGS.pricing)
        compare = tuple(resolve_pricing(value) for value in FLAGS.compare_pricing if value != FLAGS.pricing)
        accelerators = parse_accelerators(FLAGS.accelerators)
        rows = price_rows(load_rows(paths, FLAGS.cpus, accelerators), pricing, FLAGS.baseline or None, compare)
    except (PricingError, ValueError, OSError, KeyError) as error:
        print(f"seed-report: {error}", file=sys.stderr)
        sys.exit(1)
    baseline = FLAGS.baseline or rows[0].name
    table = markdown_table(rows, pricing, baseline, compare)
    cheapest = cheapest_table(rows, pricing)
    if cheapest:
        table += "\n\n" + cheapest
    print(table)
    out = os.path.abspath(FLAGS.out or os.path.join("bench_results", "report"))
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(f"{out}.md", "w") as f:
        f.write(table + "\n")
    chart(rows, f"{out}.png", f"FPS and cost per 1B frames (baseline {baseline}; {pricing.describe()})")
    print(f"\nwrote {out}.md and {out}.png")


def run() -> None:
    freeze_objects_at_exit()
    flags.DEFINE_string("pricing", "current", "Price table: current (today's on-demand prices, shipped), paper "
                                              "(the SEED paper's 2019 prices, shipped) or the path of a YAML file.")
    flags.DEFINE_list("compare_pricing", [], "Also show the cost per 1B frames under these tables (same values as "
                                             "--pricing), e.g. paper.")
    flags.DEFINE_string("baseline", "", "Row name the FPS ratio is taken against; default the first row.")
    flags.DEFINE_string("out", "", "Output stem: writes <out>.md and <out>.png; default bench_results/report "
                                   "under the directory seed-report is started in. With --curves: the output "
                                   "directory, default bench_results/curves.")
    flags.DEFINE_float("cpus", None, "Price this many CPU cores instead of the cores each run had.")
    flags.DEFINE_list("accelerators", [], "Price these devices instead of the runs', e.g. P100:1.")
    flags.DEFINE_bool("curves", False, "The arguments are learner logdirs: plot their learning curves and tabulate "
                                       "the time to reach --targets (seed/bench/curves.py).")
    flags.DEFINE_string("metric", "", "--curves: the metrics.jsonl key to plot; default eval/return_running_mean_100 "
                                      "where a run logs it, else episode_return_mean.")
    flags.DEFINE_list("targets", [], "--curves: target values, e.g. 0.4,0.8; default per env (Pong 18, Football "
                                     "0.4,0.8, CartPole-v1 450).")
    flags.DEFINE_list("at_frames", [], "--curves: also tabulate each run's metric at these env frames, e.g. "
                                       "1e5,1e6 (for episode_return_mean: the mean of the last 100 training "
                                       "episodes ended by then; seed/bench/curves.py value_at).")
    flags.DEFINE_bool("group_seeds", True, "--curves: draw runs that differ only in --seed as one mean with a "
                                           "min-max band; false draws every run on its own (runs made under "
                                           "different machine load).")
    app.run(main)


if __name__ == "__main__":
    run()
