"""Configuration: one dataclass per role, turned into absl flags by the role's main.

Resolution order for the learner (lowest to highest): the dataclass defaults, the agent's own defaults, the env
family's defaults for the agent (e.g. paper Table 8 for R2D2 on Atari, envs/atari_config.py), the preset, then
flags the user typed (seed/learner/configuration.py). Each env family's own flags are its `Options` dataclass
(envs/<family>.py), composed into the roles' classes by `with_env_options`. `--print_config` prints the
result as JSON. Flags are defined only by `define_flags`, called from a main, never at import time.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, ClassVar

from absl import flags

from seed import envs


def option(default: Any, help: str) -> Any:  # noqa: A002 - mirrors absl's naming
    """A configuration field that becomes the flag --<name> with this default and help."""
    return dataclasses.field(default=default, metadata={"help": help})


_field = option

OPTIMIZERS = ("adam", "clipped_lars")  # --optimizer's choices (seed/training/optimizers.py builds them)


@dataclasses.dataclass
class EnvOptions:
    """Env flags shared by learner and actor (both must build the same spec)."""

    preset: str = _field("", "A named learning configuration (seed/presets.py), e.g. pong_vtrace; flags typed "
                             "beside it win over its values.")
    env: str = _field("gym:CartPole-v1",
                      "FAMILY:NAME, e.g. gym:CartPole-v1, atari:Pong, football:academy_empty_goal_close, fake:vector.")
    envs_per_actor: int = _field(4, "Environments stepped by each actor process (K).")
    env_groups: int = _field(1, "Double-buffered acting: each actor splits its K envs into this many groups of "
                                "K / env_groups, each with its own stream to the learner, and steps one group's "
                                "envs while the others' actions are computed (seed/actor/env_groups.py). The learner "
                                "and every actor need the same value; it must divide --envs_per_actor.")
    seed: int = _field(0, "Base random seed; env i is seeded with seed + env id.")
    action_repeat: int = _field(0, "Env frames per agent step; 0 = the env family's default (Atari 4, others 1).")
    # Each env family's own flags (atari_*, minatar_*, smm_size, ...) are its `Options` (envs/<family>.py), added
    # by `env_options_class`, `actor_config_class` and `learner_config_class`.
    env_option_classes: ClassVar[tuple[type, ...]] = ()  # the families' Options a composed class holds

    def env_options(self) -> dict[str, Any]:
        """The options dict env families receive (everything but preset, env, envs_per_actor and env_groups): the
        shared env flags and every family's own."""
        classes = (EnvOptions, *type(self).env_option_classes)  # never role/secret flags
        options = {f.name: getattr(self, f.name) for c in classes for f in dataclasses.fields(c)}
        for key in ("preset", "env", "envs_per_actor", "env_groups"):
            options.pop(key)
        return {key: value for key, value in options.items() if not (key == "action_repeat" and value == 0)}

    @property
    def envs_per_stream(self) -> int:
        """Envs behind one stream to the learner: envs_per_actor / env_groups (K / G)."""
        return self.envs_per_actor // max(1, self.env_groups)

    def env_groups_error(self) -> str | None:
        """Why --env_groups does not fit --envs_per_actor (a message naming both), or None."""
        if self.env_groups < 1 or self.envs_per_actor % self.env_groups:
            return (f"--env_groups: got {self.env_groups}, expected a divisor of --envs_per_actor "
                    f"({self.envs_per_actor}), >= 1 (each group steps envs_per_actor / env_groups envs)")
        return None


@dataclasses.dataclass
class TransportOptions:
    """Transport security flags shared by learner and actor (see seed/transport/security.py)."""

    tls_cert: str = _field("", "Mutual TLS: this side's PEM certificate (learner: server cert; actor: client cert).")
    tls_key: str = _field("", "Mutual TLS: the PEM private key of --tls_cert.")
    tls_ca: str = _field("", "Mutual TLS: PEM of the CA that signed the other side's certificate.")
    auth_token: str = _field("", "Shared secret the actor sends in the Stream call's metadata and the learner checks; "
                                 "visible in `ps`: prefer --auth_token_file.")
    auth_token_file: str = _field("", "File holding the shared secret (e.g. a mounted Kubernetes Secret).")


@dataclasses.dataclass
class ActorConfig(EnvOptions, TransportOptions):
    server_address: str = _field("localhost:8686", "Learner address: host:port or unix:/path/to.sock.")
    actor_index: int = _field(0, "This actor's index; it owns env ids [index*K, (index+1)*K).")
    reconnect_max_backoff_s: float = _field(5.0, "Longest wait between reconnection attempts (seconds).")
    exit_when_done: bool = _field(True, "Exit 0 when the learner says its run is finished (its "
                                        "--total_environment_frames or --max_train_steps reached); false: keep "
                                        "reconnecting. A learner that restarts or is unreachable is always waited for.")
    log_interval_s: float = _field(30.0, "Seconds between actor progress lines on stdout.")
    stats_file: str = _field("", "Append throughput/latency/CPU rows (JSON Lines, see seed/actor/stats.py) here; "
                                 "'' = off. Used by seed-bench.")
    stats_interval_s: float = _field(1.0, "Seconds between rows of --stats_file (one more is written on exit).")
    tls_server_name: str = _field("", "Mutual TLS: the name on the learner's certificate, if not the dialled host.")
    transport: str = _field("auto", "How steps reach the learner: grpc; shm (a unix: --server_address on the "
                                    "learner's host: the actor writes the learner's shared step slab itself, "
                                    "no protobuf or gRPC per step); auto = shm when the address is a unix socket "
                                    "and the learner offers it (see --shm_actors), else grpc.")
    compression: str = _field("none", "none or lz4: compress each step's observations for a learner on another "
                                      "host (agreed at the handshake; the learner decompresses them once). Ignored "
                                      "on a unix socket and the shared-memory path, where it only costs CPU.")


@dataclasses.dataclass
class ReplayOptions:
    """The central prioritized replay's flags (seed/experience/replay.py, seed/experience/priority_refresh.py): part of
    the
    configuration of the agents that train from it (`Agent.uses_replay`: R2D2, MuZero), absent from the others'."""

    burn_in: int = option(0, "Steps at the start of each unroll that only warm up the recurrent state (R2D2); "
                             "MuZero: the look-ahead each sequence shares with the next, >= unroll_steps + "
                             "td_steps - 1.")
    target_update_interval: int = option(2500, "Copy the online network to the target network every N "
                                                "updates (R2D2, MuZero); Priority Refresh bootstraps from "
                                                "the same target version.")
    replay_capacity: int = option(100_000, "Replay capacity in sequences.")
    replay_min_size: int = option(5000, "Sequences in replay before training starts.")
    replay_ratio: float = option(0.75, "Sequences sampled per sequence inserted.")
    priority_exponent: float = option(0.9, "Priority exponent alpha.")
    importance_sampling_exponent: float = option(0.6, "Importance-sampling exponent beta.")
    priority_eta: float = option(0.9, "Sequence priority eta max|delta| + (1 - eta) mean|delta|.")
    priority_refresh_interval_s: float = option(0.0, "Priority Refresh (SpeedyZero): seconds between the starts of "
                                                     "two sweeps that recompute every replay item's priority with "
                                                     "the latest network, on a thread of the learner "
                                                     "(seed/experience/priority_refresh.py); 0 = off. Agents "
                                                     "with a replay.")
    priority_refresh_batch_size: int = option(0, "Priority Refresh: replay items per forward pass; 0 = batch_size.")
    checkpoint_replay: bool = option(False, "Save the replay with each checkpoint (can be many GB).")


def torch_threads(requested: int, cores: int | None = None) -> int:
    """Intra-op threads for one learner process: `requested` (--torch_threads) if > 0, else 1 on a machine of at
    most 4 cores and half the cores above that. The learner's inference and its training process each run this
    many beside the actors; two OpenMP threads per process on 2 cores with the other core busy made one update
    6-32x slower than one thread (compute_cost at load 2: Pong V-trace 584 ms against 95, MuZero on MinAtar 6.3 s
    against 0.7, SAC's 906 ms against 28; the threads wait on each other for a core)."""
    if requested > 0:
        return requested
    cores = cores or os.cpu_count() or 1
    return 1 if cores <= 4 else cores // 2


def burn_in_steps(config: Any) -> int:
    """Steps each stored unroll starts with that only warm up the state: --burn_in for the agents with a replay
    (their configuration has ReplayOptions), 0 for the others."""
    return config.burn_in if isinstance(config, ReplayOptions) else 0


@dataclasses.dataclass
class LearnerConfig(EnvOptions, TransportOptions):
    """The framework's flags. A resolved configuration is an instance of `learner_config_class(agent)`: these
    fields plus the chosen agent's own (agents/<name>/config.py)."""

    agent_class: ClassVar[Any] = None  # the agent of a class made by learner_config_class; None here
    agent: str = _field("vtrace", "The agent (agents/registry.py): vtrace, r2d2, ppo, muzero or sac; its own flags are "
                                  "listed under its name in --helpfull.")
    logdir: str = _field("", "Where metrics, TensorBoard events and checkpoints go; default logs/<agent>-<env>.")
    server_address: str = _field("unix:{logdir}/learner.sock,127.0.0.1:8686",
                                 "Comma-separated listen addresses (host:port or unix:/path); {logdir} is replaced. "
                                 "Loopback by default; another interface (e.g. 0.0.0.0:8686) needs --auth_token(_file) "
                                 "or --tls_*, or --allow_insecure_remote.")
    allow_insecure_remote: bool = _field(False, "Listen on a non-loopback --server_address without a token or TLS "
                                                "(anyone who reaches the port can drive the learner).")
    num_actors: int = _field(2, "Actor processes the learner accepts (actor_index in [0, num_actors)).")
    shm_actors: bool = _field(True, "Offer actors on this host that dial a unix: address the shared-memory path "
                                    "(they write the step slab themselves; <socket>.shm hands over its "
                                    "descriptors after the same token check). Never offered with mutual TLS.")
    inference_batch_size: int = _field(-1, "Env rows per inference batch; -1 = max(envs_per_actor, num_envs // 2).")
    batch_timeout_ms: float = _field(2.0, "Run a partial inference batch this long after its oldest request.")
    inference_device: str = _field("cpu", "Device for inference: cpu or cuda:N.")
    inference_devices: str = _field("", "Comma-separated inference devices (e.g. cuda:0,cuda:1), one batcher each, "
                                        "actors assigned round-robin; overrides --inference_device.")
    training_device: str = _field("cpu", "Device for training: cpu or cuda:N.")
    training_devices: str = _field("", "Comma-separated training devices (e.g. cuda:0,cuda:1, or cpu,cpu): "
                                       "data-parallel training, one training process per device under "
                                       "torch.distributed (gloo on the CPU, NCCL on CUDA), each on 1/N of every "
                                       "batch with gradients averaged (seed/training/data_parallel.py); needs "
                                       "--training_process and a --batch_size divisible by N; overrides "
                                       "--training_device.")
    cuda_graphs: bool = _field(True, "Replay the inference step as CUDA graphs on GPU inference devices "
                                     "(one graph per padded batch size).")
    total_environment_frames: float = _field(1e9, "Stop after this many env frames (agent steps x action repeat).")
    log_interval_s: float = _field(10.0, "Seconds between progress lines / metrics.jsonl rows.")
    wandb_project: str = _field("", "Weights & Biases: log the configuration, every metrics row (against env frames) "
                                     "and videos to this project ('' = off; needs the wandb extra).")
    wandb_entity: str = _field("", "Weights & Biases: the team or user owning --wandb_project ('' = your default).")
    wandb_mode: str = _field("online", "Weights & Biases: online, offline (written under the logdir or $WANDB_DIR "
                                       "for `wandb sync`) or disabled.")
    checkpoint_interval_s: float = _field(600.0, "Seconds between checkpoints (one is always written on exit).")
    finished_linger_s: float = _field(30.0, "When the run is over (--total_environment_frames or --max_train_steps "
                                            "reached, also by a learner restarted on a finished logdir): keep "
                                            "answering actors 'run finished' (they exit 0) until every actor slot "
                                            "heard it, at most this long (seconds), then exit. Longer than the "
                                            "actors' --reconnect_max_backoff_s, so one that was reconnecting hears "
                                            "it too.")
    keep_checkpoints: int = _field(3, "Checkpoint files kept in the logdir (checkpoint-<n>.pt, newest last); a resume "
                                      "falls back to the previous one if the newest does not load.")
    torch_threads: int = _field(0, "torch intra-op threads of each learner process (inference, training); 0 = "
                                   "automatic: 1 on a machine of at most 4 cores, half the cores above that.")
    training_process: bool = _field(True, "Run the optimizer steps in a process of their own (batches and "
                                          "parameters through shared memory, seed/training/process.py), so "
                                          "training never holds the GIL the inference thread needs. Unless set "
                                          "explicitly: on for training on the CPU; --deterministic and a CUDA "
                                          "--training_device train in the learner process.")
    training_process_timeout_s: float = _field(60.0, "--training_process: the training process counts as hung (the "
                                                     "learner dumps its stacks, kills it and exits non-zero) "
                                                     "when it waits for a command without reporting, or holds "
                                                     "the parameter lock, this long, or when an update takes "
                                                     "longer than this and 10x the slowest update so far (the "
                                                     "first update: 5x this).")
    keep_freed_memory: bool = _field(True, "glibc: serve large host tensors from the heap and keep freed memory for "
                                           "reuse instead of mmap/munmap per training step "
                                           "(seed/runtime/host_memory.py).")
    # Optimisation (shared).
    batch_size: int = _field(32, "Unrolls per training batch.")
    unroll_length: int = _field(100, "Trained steps per unroll (each unroll stores burn_in + unroll_length + 1 steps).")
    learning_rate: float = _field(4.8e-4, "Learning rate (Adam's, or Clipped LARS's base rate gamma).")
    adam_epsilon: float = _field(1e-7, "Adam epsilon.")
    adam_beta1: float = _field(0.9, "Adam beta1.")
    optimizer: str = _field("adam", "adam, or clipped_lars: SpeedyZero's momentum SGD with the LARS trust ratio "
                                    "clipped to <= 1 per weight tensor, biases and norm layers excluded "
                                    "(seed/training/optimizers.py).")
    lars_eta: float = _field(1e-3, "clipped_lars: trust coefficient eta of the weight tensors.")
    lars_bn_bias_eta: float = _field(0.0, "clipped_lars: eta of biases and norm-layer parameters; 0 = plain "
                                          "momentum SGD for them (SpeedyZero's appendix A.3 uses 0.05).")
    weight_decay: float = _field(1e-4, "clipped_lars: weight decay beta of the weight tensors (not of biases and "
                                       "norm layers).")
    momentum: float = _field(0.9, "clipped_lars: momentum mu.")
    lars_warmup_steps: int = _field(0, "clipped_lars: the first N optimizer steps are plain momentum SGD with weight "
                                       "decay (SpeedyZero's warm start), the clipped trust ratio applies after.")
    grad_clip_norm: float = _field(0.0, "Global gradient-norm clip; 0 = off.")
    discounting: float = _field(0.99, "Discount factor.")
    queue_capacity: int = _field(0, "Completed unrolls the FIFO queue holds before inference blocks; 0 = batch_size.")
    sync: str = _field("async", "hts: HTS-RL's synchronous mode (every env fills --sync_every steps with the "
                                "parameters of the previous update while the learner trains on the last rollout: "
                                "a policy lag of exactly one update; --agent=ppo's default); async: SEED's "
                                "asynchronous queue (vtrace, r2d2).")
    sync_every: int = _field(128, "--sync=hts: agent steps per env per rollout (sets --unroll_length).")
    sync_lag: int = _field(1, "--sync=hts: updates the acting parameters are behind the trained ones. 1: HTS-RL's "
                              "one-step delay (actors play rollout r + 1 with the parameters of the update on "
                              "rollout r - 1 while the learner trains on rollout r); 0: synchronous PPO as in "
                              "CleanRL (actors wait at each sync point for the update on the rollout they just "
                              "played: acting and training take turns).")
    deterministic: bool = _field(False, "Bit-identical runs for one seed and config on CPU: counter-based action "
                                        "sampling, fixed inference batch composition, deterministic algorithms, "
                                        "seeded minibatch shuffles. Needs --sync=hts.")
    max_train_steps: int = _field(0, "Stop after this many learner updates (the final checkpoint is exactly that "
                                     "update's parameters); 0 = no limit.")
    max_policy_lag: int = _field(0, "Drop training batches whose oldest step was acted more than this many updates "
                                    "ago (policy_lag_updates); 0 = no bound.")
    num_eval_envs: int = _field(0, "The last N env ids only evaluate: never trained on, they play the evaluation "
                                   "policy (V-trace: sampled, or greedy with --eval_greedy; R2D2: eps = "
                                   "eval_epsilon) and feed eval/return_running_mean_100.")
    # Misc.
    print_config: bool = _field(False, "Print the resolved configuration as JSON and exit.")

    @property
    def num_envs(self) -> int:
        return self.num_actors * self.envs_per_actor

    @property
    def actor_streams(self) -> int:
        """Streams the learner serves: one per env group of each actor (num_actors x env_groups); stream
        a * env_groups + g is group g of actor a and holds env ids [stream * K/G, (stream + 1) * K/G)."""
        return self.num_actors * max(1, self.env_groups)


def with_env_options(config_class: type, name: str = "") -> type:
    """`config_class` (EnvOptions, ActorConfig or a learner configuration) plus every registered env family's own
    flags (`seed.envs.option_classes`: the families' `Options`), one flat dataclass: the flags and --print_config
    show a family's fields beside the framework's. Cached per class and families."""
    options = tuple(envs.option_classes().values())
    key = (config_class, options)
    cached = _COMPOSED_CLASSES.get(key)
    if cached is None:
        taken = {f.name for f in dataclasses.fields(config_class)}
        for option_class in options:
            clash = taken & {f.name for f in dataclasses.fields(option_class)}
            if clash:
                raise ValueError(f"{option_class.__module__}.{option_class.__qualname__}: flags {sorted(clash)} are "
                                 f"{config_class.__name__}'s already; expected an env family's flags of its own")
        cached = dataclasses.make_dataclass(name or config_class.__name__, [], bases=(config_class, *options))
        cached.env_option_classes = options
        cached.__module__ = __name__
        _COMPOSED_CLASSES[key] = cached
    return cached


_COMPOSED_CLASSES: dict[tuple, type] = {}


def env_options_class() -> type:
    """EnvOptions with every env family's flags: what seed-bench's env-only tools define as flags."""
    return with_env_options(EnvOptions)


def actor_config_class() -> type:
    """ActorConfig with every env family's flags: `seed-actor`'s configuration."""
    return with_env_options(ActorConfig)


def learner_config_class(agent_class: Any) -> type:
    """The resolved configuration's class for an agent: LearnerConfig's framework fields, the agent's own
    (`agent_class.config_class`) and every env family's flags, one flat dataclass, so --print_config shows this
    agent's fields and no other agent's. Cached: one class per agent class (and registered families)."""
    base = _LEARNER_CONFIG_CLASSES.get(agent_class)
    if base is None:
        name = agent_class.config_class.__name__.replace("Config", "") + "LearnerConfig"
        base = dataclasses.make_dataclass(name, [], bases=(agent_class.config_class, LearnerConfig))
        base.agent_class = agent_class
        base.__module__ = __name__
        _LEARNER_CONFIG_CLASSES[agent_class] = base
    return with_env_options(base)


_LEARNER_CONFIG_CLASSES: dict[Any, type] = {}


def _rebuild_learner_config(agent_path: str, values: dict[str, Any]) -> LearnerConfig:
    """Unpickles a resolved configuration (it crosses into the training process by value): the agent class is
    imported again by its path, so a dynamically made class pickles too."""
    import importlib

    if not agent_path:
        return LearnerConfig(**values)
    module, _, qualname = agent_path.partition(":")
    agent_class = importlib.import_module(module)
    for part in qualname.split("."):
        agent_class = getattr(agent_class, part)
    return learner_config_class(agent_class)(**values)


def _reduce_learner_config(config: LearnerConfig) -> tuple:
    agent_class = type(config).agent_class
    path = f"{agent_class.__module__}:{agent_class.__qualname__}" if agent_class is not None else ""
    return _rebuild_learner_config, (path, {f.name: getattr(config, f.name) for f in dataclasses.fields(config)})


LearnerConfig.__reduce__ = _reduce_learner_config


def define_flags(config_class: type, module_name: str | None = None, skip: set[str] | frozenset = frozenset()
                 ) -> None:
    """Defines one absl flag per dataclass field, with the field's default and help; `module_name` groups them
    in --helpfull; fields named in `skip` (defined already) are left out."""
    for f in dataclasses.fields(config_class):
        if f.name in skip:
            continue
        help_text = f.metadata.get("help", f.name)
        extra = {"module_name": module_name} if module_name else {}
        if f.type in ("bool", bool):
            flags.DEFINE_bool(f.name, f.default, help_text, **extra)
        elif f.type in ("int", int):
            flags.DEFINE_integer(f.name, f.default, help_text, **extra)
        elif f.type in ("float", float):
            flags.DEFINE_float(f.name, f.default, help_text, **extra)
        else:
            flags.DEFINE_string(f.name, f.default, help_text, **extra)


def explicit_flags(config_class: type | dict[str, dataclasses.Field], flag_values: flags.FlagValues
                   ) -> dict[str, Any]:
    """The fields (of a dataclass, or a dict of fields) the user set on the command line."""
    names = config_class if isinstance(config_class, dict) else [f.name for f in dataclasses.fields(config_class)]
    return {name: flag_values[name].value for name in names if flag_values[name].present}


def build_config(config_class: type, *layers: dict[str, Any]):
    """Dataclass defaults overridden by each layer in turn; unknown keys are an error naming them."""
    names = {f.name for f in dataclasses.fields(config_class)}
    values: dict[str, Any] = {}
    for layer in layers:
        unknown = set(layer) - names
        if unknown:
            raise ValueError(f"unknown configuration keys {sorted(unknown)}; "
                             f"expected fields of {config_class.__name__}")
        values.update(layer)
    return config_class(**values)


def to_json(config: Any, extra: dict[str, Any] | None = None) -> str:
    return json.dumps({**dataclasses.asdict(config), **(extra or {})}, indent=2, sort_keys=True)
