"""A toy agent that acts on Box action spaces, registered from outside agents/ (SEED_RL_PLUGINS=tests.toy_box_agent).

tests/test_box_actions.py trains it through the real learner on `gym:Pendulum-v1` to check the framework's Box path
(handshake, slab, state table, unroll store, FIFO queue or replay, the training process's batch slots) before any
real continuous agent exists. Two names: `toy_box` trains from the FIFO queue, `toy_box_replay` from the central
replay.
"""

from seed.agents import registry

registry.register("toy_box", registry.Registration("tests.toy_box_agent.agent:ToyBoxAgent",
                                                   "tests.toy_box_agent.config:ToyBoxConfig"))
registry.register("toy_box_replay", registry.Registration("tests.toy_box_agent.agent:ToyBoxReplayAgent",
                                                          "tests.toy_box_agent.config:ToyBoxReplayConfig"))
