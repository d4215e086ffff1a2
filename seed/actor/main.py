"""`seed-actor`: one actor process running `--envs_per_actor` envs against the learner.

    seed-actor --server_address=unix:logs/run/learner.sock --actor_index=0 --env=gym:CartPole-v1
    seed-actor ... --envs_per_actor=16 --env_groups=2   # two groups of 8 envs, stepped in turn
    (seed/actor/env_groups.py)
"""

from __future__ import annotations

import dataclasses
import signal
import sys

from absl import app, flags

from seed.config import actor_config_class, build_config, define_flags, explicit_flags
from seed.presets import fields_of, preset
from seed.runtime.quick_exit import freeze_objects_at_exit

SUPERSEDED_EXIT_CODE = 3  # a newer actor run took over this actor's index (2: the learner rejected the actor)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    config_class = actor_config_class()  # the actor's flags and every env family's
    explicit = explicit_flags(config_class, flags.FLAGS)
    try:  # the preset's env flags (e.g. the action set) must match the learner's
        actor_fields = {f.name for f in dataclasses.fields(config_class)}
        preset_values = fields_of(preset(explicit.get("preset", "")), actor_fields)
    except ValueError as error:
        print(f"seed-actor: {error}", file=sys.stderr)
        sys.exit(2)
    config = build_config(config_class, preset_values, explicit)
    if config.actor_index < 0:
        print(f"seed-actor: --actor_index: got {config.actor_index}, expected >= 0", file=sys.stderr)
        sys.exit(2)
    if config.env_groups_error():
        print(f"seed-actor: {config.env_groups_error()}", file=sys.stderr)
        sys.exit(2)
    from seed.envs import make_spec

    try:  # a name the env family does not know, in its words, before any env or connection is made
        make_spec(config.env, config.env_options())
    except ValueError as error:
        print(f"seed-actor: {error}", file=sys.stderr)
        sys.exit(2)
    from seed.actor.env_groups import make_actor
    from seed.transport import TransportConfigError
    from seed.transport.link import ConfigurationError, InvalidReplyError, SupersededError

    try:
        actor = make_actor(config)
    except TransportConfigError as error:
        print(f"seed-actor: {error}", file=sys.stderr)
        sys.exit(2)
    signal.signal(signal.SIGTERM, lambda *_: actor.request_stop())
    signal.signal(signal.SIGINT, lambda *_: actor.request_stop())
    try:
        actor.run()
    except ConfigurationError as error:
        hint = ""
        if "num_envs" in str(error) and config.env_groups == 1:
            hint = (f" (this actor sends {config.envs_per_actor} envs per stream: the learner needs the same "
                    "--envs_per_actor and --env_groups)")
        print(f"seed-actor: the learner rejected this actor: {error}{hint}", file=sys.stderr)
        sys.exit(2)
    except InvalidReplyError as error:
        print(f"seed-actor: refused the learner's reply, stepping no env with it: {error}", file=sys.stderr)
        sys.exit(2)
    except SupersededError as error:
        print(f"seed-actor: --actor_index={config.actor_index}: another actor took over this index; exiting "
              f"instead of reconnecting ({error})", file=sys.stderr)
        sys.exit(SUPERSEDED_EXIT_CODE)
    print(f"[actor {config.actor_index}] stopped after {actor.agent_steps:,} agent steps", flush=True)


def run() -> None:
    freeze_objects_at_exit()
    define_flags(actor_config_class())
    app.run(main)


if __name__ == "__main__":
    run()
