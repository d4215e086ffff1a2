"""A toy agent that lives outside agents/: one folder, registered by importing it (SEED_RL_PLUGINS=tests.toy_agent).

tests/test_agent_plugins.py trains it through the real learner: the framework reaches it through the registry and
the contract (seed/contracts/agent.py) only, with no framework file naming it.
"""

from seed.agents import registry

registry.register("toy", registry.Registration("tests.toy_agent.agent:ToyAgent", "tests.toy_agent.config:ToyConfig"))
