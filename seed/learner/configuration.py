"""The learner's configuration: its flags (the framework's and every registered agent's) and their resolution,

    dataclass defaults < the agent's own defaults < the env family's defaults for the agent (envs/<family>.py:
    AGENT_DEFAULTS) < the preset < the flags the user typed,

then the derived values and the framework's and the agent's checks. `seed-learner` (seed/learner/main.py), seed-eval,
the local launcher and seed-bench resolve a configuration here; importing it loads no torch, so `--help` and
`--print_config` stay fast.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from seed import envs
from seed.agents import registry
from seed.config import (
    OPTIMIZERS,
    LearnerConfig,
    ReplayOptions,
    build_config,
    define_flags,
    learner_config_class,
    with_env_options,
)
from seed.presets import preset


def flag_owners() -> dict[str, list[str]]:
    """Every learner flag's name -> the agents whose configuration has it ([] for the framework's and the env
    families' own)."""
    owners: dict[str, list[str]] = {f.name: [] for f in dataclasses.fields(with_env_options(LearnerConfig))}
    for name in registry.names():
        for f in dataclasses.fields(registry.config_class(name)):
            owners.setdefault(f.name, []).append(name)
    return owners


def learner_fields() -> dict[str, dataclasses.Field]:
    """Every learner flag's field: the framework's, every env family's and every registered agent's (each name
    once)."""
    fields = {f.name: f for f in dataclasses.fields(with_env_options(LearnerConfig))}
    for name in registry.names():
        for f in dataclasses.fields(registry.config_class(name)):
            fields.setdefault(f.name, f)
    return fields


def define_learner_flags() -> None:
    """The framework's flags, each env family's (grouped in --helpfull under the family), then each agent's own,
    grouped under the agents that have them."""
    define_flags(LearnerConfig)
    for family, options in envs.option_classes().items():
        define_flags(options, module_name=f"env family flags: {family}")
    owners = flag_owners()
    for group in sorted({tuple(agents) for agents in owners.values() if agents}):
        members = {field for field, agents in owners.items() if tuple(agents) == group}
        define_flags(registry.config_class(group[0]), module_name=f"agent flags: {', '.join(group)}",
                     skip=set(owners) - members)


def resolve_config(explicit: dict[str, Any]) -> LearnerConfig:
    """Dataclass defaults < the agent's own defaults < the env family's for the agent < the preset < flags the user
    typed; then
    derived values and the framework's and the agent's checks. The result holds the framework's fields and the
    chosen agent's only (`learner_config_class`); a flag of another agent is refused naming its agents."""
    preset_values = preset(explicit.get("preset", ""))
    agent_name = explicit.get("agent", preset_values.get("agent", LearnerConfig.agent))
    agent = registry.agent_class(agent_name)
    if agent.uses_replay and not issubclass(agent.config_class, ReplayOptions):
        raise ValueError(f"--agent={agent_name}: trains from the replay (uses_replay), but its configuration "
                         f"{agent.config_class.__name__} lacks the replay's flags; expected it to inherit "
                         "ReplayOptions")
    config_class = learner_config_class(agent)
    _refuse_other_agents_flags(config_class, agent_name, preset_values, explicit)
    base = build_config(config_class, preset_values, explicit)
    family, name = envs.split_env_name(base.env)
    config = build_config(config_class, agent.default_config(family), envs.agent_defaults(base.env, agent_name),
                          preset_values, explicit)
    if not config.logdir:
        config.logdir = f"logs/{config.agent}-{family}-{name}"
    config.server_address = config.server_address.replace("{logdir}", config.logdir)
    if config.inference_batch_size == -1:
        # At least one stream's rows (with --env_groups a stream is one group, not the whole actor: a batch that
        # waited for both groups of an actor would idle the envs double-buffering keeps busy).
        config.inference_batch_size = max(config.envs_per_stream, config.num_envs // 2)
    if (isinstance(config, ReplayOptions) and config.replay_min_size > config.replay_capacity
            and "replay_min_size" not in explicit):
        # A small --replay_capacity (e.g. Atari on a 24 GiB machine) implies a smaller warm-up.
        config.replay_min_size = max(1, config.replay_capacity // 2)
    _derive_sync(config, explicit)
    training_devices = [d.strip() for d in config.training_devices.split(",") if d.strip()]
    if training_devices:  # rank 0 (the only rank with one device) trains on the first device
        config.training_device = training_devices[0]
    if len(training_devices) > 1:  # data-parallel training runs in training processes (seed/training/data_parallel.py)
        if "training_process" not in explicit and "training_process" not in preset_values:
            config.training_process = True
    elif "training_process" not in explicit and "training_process" not in preset_values:
        # Measured on 2 CPU cores (docs/performance/cpu/training_process/): never slower beyond noise, up to 1.8x
        # where the training thread's GIL time held inference back (R2D2's Pong preset: 1.06-1.28x); the GPU path
        # keeps the thread it was measured with.
        config.training_process = not config.deterministic and config.training_device == "cpu"
    if config.queue_capacity == 0:
        config.queue_capacity = config.batch_size
    agent.derive_config(config, explicit)
    validate(config)
    agent.check_config(config)
    check_env(config)
    return config


def check_env(config: LearnerConfig) -> None:
    """Builds --env's spec once, so that a name its family does not know (`--env=atari:Pongg`) is refused while
    the flags resolve, --print_config included, in the family's words (a ValueError naming the flag, the value
    and what is expected). A family whose own package is missing here (ImportError) is not refused: its flags
    still resolve and print, and the run says what to install when it builds the env."""
    try:
        envs.make_spec(config.env, config.env_options())
    except ImportError:
        pass


def _refuse_other_agents_flags(config_class: type, agent_name: str, *layers: dict[str, Any]) -> None:
    """A flag (or preset key) that the chosen agent does not have: an error naming the agents that do."""
    names = {f.name for f in dataclasses.fields(config_class)}
    owners = flag_owners()
    for layer in layers:
        for key in layer:
            if key not in names:
                where = (f"a flag of --agent={' or --agent='.join(owners[key])}" if owners.get(key)
                         else "not a flag of the learner (see seed-learner --helpfull)")
                raise ValueError(f"--{key}: got {layer[key]!r} with --agent={agent_name}, which has no such "
                                 f"setting; {where}")


def _derive_sync(config: LearnerConfig, explicit: dict[str, Any]) -> None:
    """--sync=hts: one rollout of --sync_every steps per env is one unroll, and one training batch holds every
    training env's unroll. --deterministic: inference batches of one actor's K rows (a fixed composition)."""
    derived = []
    if config.sync == "hts":
        derived += [("unroll_length", config.sync_every, "--sync_every with --sync=hts"),
                    ("batch_size", config.num_envs - config.num_eval_envs,
                     "num_envs - num_eval_envs with --sync=hts: one unroll of every training env per batch")]
    if config.deterministic:
        derived.append(("inference_batch_size", config.envs_per_stream,
                        "envs_per_actor / env_groups with --deterministic: one stream's rows per inference batch"))
    for name, value, why in derived:
        if name in explicit and explicit[name] != value:
            raise ValueError(f"--{name}: got {explicit[name]!r}, expected {value} ({why})")
        setattr(config, name, value)


def validate(config: LearnerConfig) -> None:
    checks = [
        ("num_actors", config.num_actors >= 1, ">= 1"),
        ("envs_per_actor", config.envs_per_actor >= 1, ">= 1"),
        ("env_groups", config.env_groups_error() is None,
         f"a divisor of --envs_per_actor ({config.envs_per_actor}), >= 1"),
        ("inference_batch_size", config.inference_batch_size >= 1, ">= 1 or -1 (auto)"),
        ("batch_size", config.batch_size >= 1, ">= 1"),
        ("unroll_length", config.unroll_length >= 1, ">= 1"),
        ("discounting", 0.0 <= config.discounting <= 1.0, "in [0, 1]"),
        ("learning_rate", config.learning_rate > 0, "> 0"),
        ("num_eval_envs", 0 <= config.num_eval_envs < config.num_envs,
         f">= 0 and < num_envs = num_actors x envs_per_actor ({config.num_envs}): at least one env must train"),
        ("keep_checkpoints", config.keep_checkpoints >= 1, ">= 1"),
        ("training_process_timeout_s", config.training_process_timeout_s > 0, "> 0"),
        ("wandb_mode", config.wandb_mode in ("online", "offline", "disabled"), "online, offline or disabled"),
    ]
    checks += [
        ("sync", config.sync in ("hts", "async"), "hts or async"),
        ("sync_every", config.sync_every >= 1, ">= 1"),
        ("sync_lag", config.sync_lag in (0, 1), "0 (synchronous) or 1 (HTS-RL's one-step delay)"),
        ("optimizer", config.optimizer in OPTIMIZERS, " or ".join(OPTIMIZERS)),
        ("max_train_steps", config.max_train_steps >= 0, ">= 0 (0 = no limit)"),
        ("max_policy_lag", config.max_policy_lag >= 0, ">= 0 (0 = no bound)"),
    ]
    for name, ok, expected in checks:
        if not ok:
            raise ValueError(f"--{name}: got {getattr(config, name)!r}, expected {expected}")
    # Sampling goes by p ** alpha: a negative alpha would sample the lowest priorities most.
    if isinstance(config, ReplayOptions) and not config.priority_exponent >= 0:
        raise ValueError(f"--priority_exponent: got {config.priority_exponent!r}, expected >= 0 (0: uniform replay)")
    if config.sync == "async" and config.sync_lag != 1:
        raise ValueError(f"--sync_lag: got {config.sync_lag} with --sync=async, expected 1 (the default): it sets the "
                         "policy lag of --sync=hts")
    if config.sync == "hts" and not type(config).agent_class.supports_sync:
        synchronous = [name for name in registry.names() if registry.agent_class(name).supports_sync]
        raise ValueError(f"--sync=hts: not supported by --agent={config.agent} (it has no synchronous mode); "
                         f"expected --sync=async with it, or --agent={' or --agent='.join(synchronous)}")
    if config.training_process and config.deterministic:
        raise ValueError("--training_process: got true with --deterministic, expected false: a bit-identical run "
                         "trains in the learner process")
    workers = type(config).agent_class.batch_workers(config)
    if workers and not config.training_process:
        raise ValueError(f"--training_process: got false with {workers} batch worker(s) of --agent={config.agent}, "
                         "expected true (the workers hand their batches to the training process)")
    inference_devices = [d.strip() for d in config.inference_devices.split(",") if d.strip()]
    if config.deterministic:
        refusals = [
            ("--sync", config.sync != "hts", f"got --sync={config.sync}, expected --sync=hts (asynchronous "
                                             "updates make the parameters each step sees depend on timing)"),
            ("--inference_devices", len(inference_devices) > 1,
             f"got {config.inference_devices!r}, expected one device (each device batches on its own)"),
            ("--cuda_graphs", config.cuda_graphs and (inference_devices or [config.inference_device])[0] != "cpu",
             "got true on a CUDA inference device, expected --nocuda_graphs (graphs pad batches)"),
        ]
        for name, refused, why in refusals:
            if refused:
                raise ValueError(f"--deterministic: cannot be deterministic with {name}: {why}")
    training_devices = [d.strip() for d in config.training_devices.split(",") if d.strip()]
    if len(training_devices) > 1:
        if not config.training_process:
            raise ValueError(f"--training_devices: got {config.training_devices!r} with --notraining_process, "
                             "expected --training_process (each device trains in a training process of its own)")
        if config.batch_size % len(training_devices):
            raise ValueError(f"--batch_size: got {config.batch_size} with --training_devices="
                             f"{config.training_devices} ({len(training_devices)} devices), expected a multiple of "
                             f"{len(training_devices)} (each device trains on an equal share of every batch)")
        if len({d.split(":")[0] for d in training_devices}) > 1:
            raise ValueError(f"--training_devices: got {config.training_devices!r}, expected all cpu or all cuda:N")
    devices = [("inference_device", config.inference_device), ("training_device", config.training_device)]
    devices += [("training_devices", d) for d in training_devices]
    devices += [("inference_devices", d.strip()) for d in config.inference_devices.split(",") if d.strip()]
    for name, value in devices:
        if not (value == "cpu" or value.startswith("cuda")):
            raise ValueError(f"--{name}: got {value!r}, expected cpu or cuda:N")
