"""The experiment that decided to build --training_process: fake_mlp's training step, at a target rate, in a
process of its own that the learner never hears from (no batches in, no parameters out), beside a learner that
does not train (`seed-bench --config=fake_mlp --batch_size=1000000`). It costs the cores what a training process
would, without the learner's GIL.

    python busy_training_process.py STEPS_PER_S SECONDS
"""

import sys
import time

import torch

from seed.agents import agent_module
from seed.bench.compute_cost import make_unrolls
from seed.envs import make_spec
from seed.learner_main import resolve_config
from seed.unroll import TrainingBatch


def main(rate: float, seconds: float) -> None:
    torch.set_num_threads(1)
    config = resolve_config(dict(agent="vtrace", env="fake:vector", network="mlp", mlp_sizes="32", use_lstm=False,
                                 unroll_length=20, batch_size=32, fake_episode_length=100, logdir="/tmp/busy"))
    spec = make_spec(config.env, config.env_options())
    agent = agent_module(config.agent).Agent(spec, config)
    batch = TrainingBatch(make_unrolls(agent, spec, config, torch.Generator().manual_seed(0)))
    optimizer = torch.optim.Adam(agent.network.parameters(), lr=1e-4, foreach=True)
    shared = {k: v.clone().share_memory_() for k, v in agent.network.state_dict().items()}
    start, steps = time.monotonic(), 0
    while time.monotonic() - start < seconds:
        time.sleep(max(0.0, start + steps / rate - time.monotonic()))
        out = agent.loss(batch)
        optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        optimizer.step()
        for k, v in agent.network.state_dict().items():  # what publishing parameters would copy
            shared[k].copy_(v)
        steps += 1
    print(f"busy training process: {steps} steps in {seconds} s = {steps / seconds:.0f}/s", flush=True)


if __name__ == "__main__":
    main(float(sys.argv[1]), float(sys.argv[2]))
