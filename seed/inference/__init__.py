"""Central inference on the learner: batches of env rows through the agent's `act`, per-env state
tables, the parameters inference acts with, and HTS-RL's rollout gate."""
