"""`seed-learner`: the learner process. `--agent` and `--env` pick everything else.

    seed-learner --agent=vtrace --env=gym:CartPole-v1 --num_actors=2 --envs_per_actor=4
    seed-learner --agent=r2d2 --env=atari:Pong --print_config

The flags and their resolution live in seed/learner/configuration.py; this script only runs them.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from absl import app, flags

from seed.config import LearnerConfig, explicit_flags, to_json
from seed.learner.configuration import define_learner_flags, learner_fields, resolve_config
from seed.runtime.quick_exit import freeze_objects_at_exit

if TYPE_CHECKING:  # imported late: --help and --print_config stay fast
    from seed.transport import TransportSecurity


def transport_security(config: LearnerConfig) -> TransportSecurity:
    """The transport security from the flags, checked against the listen addresses; the token is then blanked
    in `config`, so it never reaches --print_config, logs or the checkpoint (the Learner gets the security)."""
    from seed import transport

    security = transport.TransportSecurity.from_config(config, read_files=not config.print_config)
    transport.check_listen_security(transport.listen_addresses(config.server_address), security)
    if config.auth_token:
        config.auth_token = transport.REDACTED
    return security


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    try:
        config = resolve_config(explicit_flags(learner_fields(), flags.FLAGS))
    except ValueError as error:
        print(f"seed-learner: {error}", file=sys.stderr)
        sys.exit(2)
    try:
        security = transport_security(config)
    except ValueError as error:
        print(f"seed-learner: {error}", file=sys.stderr)
        sys.exit(2)
    if config.print_config:
        extra = type(config).agent_class.describe_config(config)
        print(to_json(config, {"num_envs": config.num_envs, **extra}))
        return
    import torch  # noqa: F401  (imported late so --help and --print_config stay fast)

    from seed.contracts.agent import IncompatibleActionSpace
    from seed.experience.replay import ReplayDoesNotFit
    from seed.learner.checkpointing import CheckpointDoesNotFit
    from seed.learner.learner import Learner
    from seed.learner.supervision import install_signal_handlers

    try:
        learner = Learner(config, security=security)
    except (ReplayDoesNotFit, IncompatibleActionSpace, CheckpointDoesNotFit) as error:
        print(f"seed-learner: {error}", file=sys.stderr)
        sys.exit(2)
    install_signal_handlers(learner.request_stop)
    learner.run()


# OpenMP threads that sleep when idle instead of spinning. A CPU learner's training step and inference batches
# each run torch ops on their own OpenMP team, beside the actors on the same cores; spinning teams take the cores
# from each other. Measured on 2 cores (`--preset=pong_r2d2`, two 60 s rounds): 1.02-1.07 training steps/s and
# 2,957-3,120 FPS with libgomp's default, 1.22-1.30 and 3,602-3,789 with PASSIVE; V-trace Pong unchanged
# (docs/performance/README.md). libgomp reads the variable when torch loads, so it is set here, before anything imports
# torch; the environment's value wins.
OMP_WAIT_POLICY_DEFAULT = "PASSIVE"


def run() -> None:
    freeze_objects_at_exit()
    os.environ.setdefault("OMP_WAIT_POLICY", OMP_WAIT_POLICY_DEFAULT)
    define_learner_flags()
    app.run(main)


if __name__ == "__main__":
    run()
