"""The learner process: the builder that wires every part, the training loop, supervision of its
threads and processes, checkpoints, and `seed-learner`."""
