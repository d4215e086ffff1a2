"""A toy env family that lives outside envs/: one package, registered by importing it (SEED_RL_PLUGINS=tests.toy_env).

tests/test_env_plugins.py trains an agent on it through the real learner and actors and plays it in seed-eval: the
framework reaches it through the registry (envs/__init__.py) only, with no framework file naming it.
"""

from seed import envs

envs.register("toy", envs.Registration("tests.toy_env.family"))
