#!/usr/bin/env bash
# One learner plus --num_actors actors on this machine. All flags go to the learner (and env flags to the
# actors too); defaults: --agent=vtrace --env=gym:CartPole-v1 --num_actors=2.
#   launch/local.sh --env=atari:Pong --num_actors=2 --envs_per_actor=4
set -euo pipefail
PYTHON="${PYTHON:-python3}"
exec "$PYTHON" -m seed.local_launcher "$@"
